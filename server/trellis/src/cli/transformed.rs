//! `trellis validate --show-transformed`: the blueprint as validated after its transforms,
//! each generated resource with the abstract resource it came from, as YAML (text output) or
//! as JSON.

use serde_json::{Map, Value as Json, json};

use super::yaml::{key, nested, scalar};

use crate::check::Checked;
use crate::document::{self, Format};
use crate::source::SourceMap;
use trellis_lang::transform::{self, Derivation};

/// One file's blueprint after its transforms.
pub(super) struct Shown {
    /// The file as named on the command line.
    pub file: String,
    /// The transforms that ran, in order (empty: the blueprint is shown as written).
    pub transforms: Vec<String>,
    pub blueprint: Json,
    pub derivations: Vec<Derivation>,
}

impl Shown {
    /// What `checked` validated for `file`: the transformers' output when the blueprint has
    /// `transform:`, otherwise the document as written. `None` when it cannot be read back.
    pub(super) fn of(sources: &SourceMap, file: &str, checked: &Checked) -> Option<Shown> {
        let src = sources.get(checked.file);
        let blueprint = if checked.transformed {
            serde_json::from_str(&src.text).ok()?
        } else {
            let format = Format::from_path(file);
            let root = document::parse(sources, checked.file, format, &mut Default::default())?;
            transform::to_json(&root)
        };
        Some(Shown {
            file: file.to_owned(),
            transforms: checked
                .blueprint
                .transform
                .iter()
                .map(|t| t.value.clone())
                .collect(),
            blueprint,
            derivations: checked.derivations.clone(),
        })
    }

    /// The abstract resource and transform of a generated resource.
    fn derived(&self, resource: &str) -> Option<&Derivation> {
        transform::derivation_of(&self.derivations, resource)
    }

    /// `{"file", "transforms", "blueprint", "derivedFrom": {generated: {"resource",
    /// "transform"}}}`.
    pub(super) fn to_json(&self) -> Json {
        let mut derived = Map::new();
        if let Some(resources) = self.blueprint.get("resources").and_then(Json::as_object) {
            for name in resources.keys() {
                if let Some(d) = self.derived(name) {
                    derived.insert(
                        name.clone(),
                        json!({ "resource": d.abstract_resource, "transform": d.transform }),
                    );
                }
            }
        }
        json!({
            "file": self.file,
            "transforms": self.transforms,
            "blueprint": self.blueprint,
            "derivedFrom": derived,
        })
    }

    /// The blueprint as YAML, headed by a comment naming the file and its transforms, with a
    /// comment above each generated resource naming the abstract resource it came from.
    pub(super) fn to_yaml(&self) -> String {
        let mut out = if self.transforms.is_empty() {
            format!("# {} (no transform)\n", self.file)
        } else {
            format!(
                "# {} after transform {}\n",
                self.file,
                self.transforms.join(", ")
            )
        };
        let Json::Object(top) = &self.blueprint else {
            scalar(&self.blueprint, &mut out);
            out.push('\n');
            return out;
        };
        for (section, value) in top {
            key(section, &mut out);
            match (section.as_str(), value) {
                ("resources", Json::Object(resources)) if !resources.is_empty() => {
                    out.push('\n');
                    for (name, resource) in resources {
                        if let Some(d) = self.derived(name) {
                            out.push_str(&format!(
                                "  # from {} ({})\n",
                                d.abstract_resource, d.transform
                            ));
                        }
                        out.push_str("  ");
                        key(name, &mut out);
                        nested(resource, 4, &mut out);
                    }
                }
                _ => nested(value, 2, &mut out),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(blueprint: Json, derivations: &[(&str, &str)]) -> Shown {
        Shown {
            file: "app.yaml".into(),
            transforms: vec!["celerity-2023-04-20".into()],
            blueprint,
            derivations: derivations
                .iter()
                .map(|(g, a)| Derivation {
                    generated: (*g).into(),
                    abstract_resource: (*a).into(),
                    transform: "celerity-2023-04-20".into(),
                })
                .collect(),
        }
    }

    #[test]
    fn yaml_names_the_abstract_resource_of_each_generated_one() {
        let s = shown(
            json!({
                "version": "2023-04-20",
                "resources": {
                    "saveOrder_function": {
                        "type": "aws/lambda/function",
                        "metadata": {"labels": {}},
                        "spec": {
                            "handler": "handlers.save_order",
                            "layers": ["a", "b c"],
                            "env": [{"name": "X", "value": "true"}, 3],
                            "memory": 128,
                            "enabled": true,
                            "note": null
                        }
                    },
                    "table": {"type": "aws/dynamodb/table", "spec": {}}
                }
            }),
            &[("saveOrder_function", "saveOrder")],
        );
        assert_eq!(
            s.to_yaml(),
            "# app.yaml after transform celerity-2023-04-20\n\
             version: \"2023-04-20\"\n\
             resources:\n  \
               # from saveOrder (celerity-2023-04-20)\n  \
               saveOrder_function:\n    \
                 type: aws/lambda/function\n    \
                 metadata:\n      \
                   labels: {}\n    \
                 spec:\n      \
                   handler: handlers.save_order\n      \
                   layers:\n        \
                     - a\n        \
                     - \"b c\"\n      \
                   env:\n        \
                     - name: X\n          \
                       value: \"true\"\n        \
                     - 3\n      \
                   memory: 128\n      \
                   enabled: true\n      \
                   note: null\n  \
               table:\n    \
                 type: aws/dynamodb/table\n    \
                 spec: {}\n"
        );
    }

    #[test]
    fn yaml_reads_back_as_the_same_document() {
        let blueprint = json!({
            "version": "2023-04-20",
            "resources": {
                "a": {"type": "x/y", "spec": {"list": [[1, 2], [], {"k": "v: w", "n": [{"m": "#"}]}],
                "s": "multi\nline", "on": "off", "e": ""}}
            }
        });
        let text = shown(blueprint.clone(), &[]).to_yaml();
        let mut sources = SourceMap::new();
        let id = sources.add("back.yaml", text.clone());
        let root = document::parse(&sources, id, Format::Yaml, &mut Default::default())
            .unwrap_or_else(|| panic!("not YAML:\n{text}"));
        assert_eq!(transform::to_json(&root), blueprint, "{text}");
    }

    #[test]
    fn json_maps_each_generated_resource_to_its_abstract_one() {
        let s = shown(
            json!({"resources": {"f": {"type": "aws/lambda/function"}, "t": {"type": "x/y"}}}),
            &[("f", "saveOrder")],
        );
        assert_eq!(
            s.to_json(),
            json!({
                "file": "app.yaml",
                "transforms": ["celerity-2023-04-20"],
                "blueprint": {"resources": {"f": {"type": "aws/lambda/function"}, "t": {"type": "x/y"}}},
                "derivedFrom": {"f": {"resource": "saveOrder", "transform": "celerity-2023-04-20"}},
            })
        );
    }
}

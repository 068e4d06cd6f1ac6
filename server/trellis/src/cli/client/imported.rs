//! What `trellis import` prints: the imported resource as the blueprint should declare it.

use serde_json::{Map, Value as Json, json};
use trellis_proto::engine::v1 as pb;
use trellis_proto::plugin::v1 as pv;
use trellis_proto::plugin::v1::value::Kind;

use super::render::value_json;
use crate::cli::yaml;
use crate::plugins::values::{self, JsonMarks};

/// What a masked secret prints as.
const SENSITIVE: &str = "(sensitive)";

/// `--format json`'s `resource`.
pub(super) fn imported_json(r: &pb::Resource) -> Json {
    json!({
        "name": r.name,
        "type": r.resource_type,
        "externalId": r.external_id,
        "spec": value_json(r.spec.as_ref()),
        "state": value_json(r.state.as_ref()),
    })
}

/// A spec as blueprint text would give it: `${` written `$${` (else it would read as a
/// substitution), a masked secret as `(sensitive)` with its path noted in `secrets`.
fn blueprint_value(v: &pv::Value, path: &str, secrets: &mut Vec<String>) -> Json {
    match &v.kind {
        _ if v.sensitive && v.kind.is_none() => {
            secrets.push(path.to_owned());
            Json::String(SENSITIVE.to_owned())
        }
        Some(Kind::List(l)) => Json::Array(
            l.items
                .iter()
                .enumerate()
                .map(|(i, item)| blueprint_value(item, &format!("{path}[{i}]"), secrets))
                .collect(),
        ),
        Some(Kind::Map(m)) => Json::Object(
            m.entries
                .iter()
                .map(|e| {
                    let inner = format!("{path}.{}", e.key);
                    let value = e
                        .value
                        .as_ref()
                        .map_or(Json::Null, |x| blueprint_value(x, &inner, secrets));
                    (e.key.clone(), value)
                })
                .collect(),
        ),
        Some(Kind::String(s)) => Json::String(s.replace("${", "$${")),
        _ => values::to_json(
            v,
            JsonMarks {
                mask_sensitive: false,
            },
        ),
    }
}

/// The `resources:` entry for the imported resource, headed by comments saying where it
/// came from and what to do with it.
pub(super) fn imported_yaml(instance: &str, r: &pb::Resource) -> String {
    let mut secrets = Vec::new();
    let spec = r
        .spec
        .as_ref()
        .map_or(Json::Null, |s| blueprint_value(s, "spec", &mut secrets));
    let mut out = format!(
        "# Imported {} `{}` into instance `{instance}` as `{}`.\n\
         # Declare it in the blueprint as below: with this spec the next plan shows no change\n\
         # for it, and a deploy of a blueprint without `{}` deletes it.\n",
        r.resource_type, r.external_id, r.name, r.name
    );
    if !secrets.is_empty() {
        out.push_str(&format!(
            "# Secret values are not shown ({}): declare them with secret variables.\n",
            secrets.join(", ")
        ));
    }
    let mut entry = Map::new();
    entry.insert("type".into(), Json::String(r.resource_type.clone()));
    entry.insert("spec".into(), spec);
    let mut resources = Map::new();
    resources.insert(r.name.clone(), Json::Object(entry));
    yaml::key("resources", &mut out);
    yaml::nested(&Json::Object(resources), 2, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::{self, Format};
    use crate::source::SourceMap;
    use trellis_lang::transform;

    fn s(text: &str) -> pv::Value {
        pv::Value {
            kind: Some(Kind::String(text.into())),
            sensitive: false,
        }
    }

    fn map(entries: Vec<(&str, pv::Value)>) -> pv::Value {
        pv::Value {
            kind: Some(Kind::Map(pv::MapValue {
                entries: entries
                    .into_iter()
                    .map(|(k, v)| pv::MapEntry {
                        key: k.into(),
                        value: Some(v),
                    })
                    .collect(),
            })),
            sensitive: false,
        }
    }

    fn resource(spec: pv::Value) -> pb::Resource {
        pb::Resource {
            name: "notes".into(),
            resource_type: "local/file".into(),
            external_id: "/srv/notes.txt".into(),
            spec: Some(spec),
            ..Default::default()
        }
    }

    /// The printed entry read back as a blueprint document.
    fn read_back(text: &str) -> Json {
        let mut sources = SourceMap::new();
        let id = sources.add("imported.yaml", text.to_owned());
        let root = document::parse(&sources, id, Format::Yaml, &mut Default::default())
            .unwrap_or_else(|| panic!("not YAML:\n{text}"));
        transform::to_json(&root)
    }

    #[test]
    fn the_entry_reads_back_as_the_recorded_spec() {
        let spec = map(vec![
            ("path", s("/srv/notes.txt")),
            ("content", s("line: one\n# two\n")),
            ("mode", s("0644")),
        ]);
        let text = imported_yaml("app", &resource(spec));
        assert!(
            text.starts_with(
                "# Imported local/file `/srv/notes.txt` into instance `app` as `notes`."
            ),
            "{text}"
        );
        assert_eq!(
            read_back(&text),
            json!({"resources": {"notes": {"type": "local/file", "spec": {
                "path": "/srv/notes.txt", "content": "line: one\n# two\n", "mode": "0644"}}}})
        );
    }

    #[test]
    fn substitution_syntax_is_escaped_and_secrets_are_named() {
        let masked = pv::Value {
            kind: None,
            sensitive: true,
        };
        let spec = map(vec![("content", s("echo ${HOME}")), ("token", masked)]);
        let text = imported_yaml("app", &resource(spec));
        assert!(text.contains("(spec.token)"), "{text}");
        assert_eq!(
            read_back(&text)["resources"]["notes"]["spec"],
            json!({"content": "echo $${HOME}", "token": "(sensitive)"})
        );
    }
}

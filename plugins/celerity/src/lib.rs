//! Transformer `celerity-2023-04-20`: expands abstract `celerity/*`
//! resources into concrete `aws/*` resources and the labels and annotations
//! that make the AWS provider's links wire them (docs/celerity/README.md).
//!
//! A blueprint opts in with `transform: celerity-2023-04-20`. The transform
//! runs in three passes over the document:
//! 1. every resource in document order: a `celerity/*` one is emitted by its
//!    type's module ([`types`]), any other is carried over unchanged;
//! 2. each type's `finish`, for wiring that spans types;
//! 3. references to abstract fields (`${resources.saveOrder.spec.handlerName}`)
//!    are rewritten to the concrete fields that hold them.
//!
//! Substitutions otherwise pass through as written: the engine evaluates
//! them after the transform.

pub mod model;
mod refs;
pub mod types;

use model::{Input, Out};
use serde_json::Value as Json;
use trellis_plugin_sdk::prelude::*;

pub struct Celerity;

/// The transform of a whole blueprint document.
pub fn transform_doc(mut blueprint: Json) -> Transformed {
    let input = Input::from_doc(&blueprint);
    let mut out = Out::default();
    for r in &input.resources {
        if let Some(kind) = types::kind(&r.ty) {
            (kind.emit)(&input, r, &mut out);
        } else if r.ty.starts_with("celerity/") {
            types::not_supported(r, &mut out);
        } else {
            out.resources
                .insert(r.name.clone(), Json::Object(r.def.clone()));
        }
    }
    for kind in types::KINDS {
        if let Some(finish) = kind.finish {
            finish(&input, &mut out);
        }
    }
    retarget_depends_on(&mut out);
    if let Some(doc) = blueprint.as_object_mut() {
        doc.insert(
            "resources".into(),
            Json::Object(std::mem::take(&mut out.resources)),
        );
        refs::rewrite(doc, &out.aliases);
    }
    Transformed {
        blueprint,
        diagnostics: out.diagnostics,
        derivations: out.derivations,
    }
}

/// `dependsOn` entries that name an abstract resource with no concrete
/// resource of its name (a config stored as parameters, a handlerConfig)
/// name what was derived from it instead, or go when nothing was.
fn retarget_depends_on(out: &mut Out) {
    let names: std::collections::HashSet<String> = out.resources.keys().cloned().collect();
    for def in out.resources.values_mut() {
        let Some(deps) = def.get_mut("dependsOn").and_then(Json::as_array_mut) else {
            continue;
        };
        if deps
            .iter()
            .all(|d| d.as_str().is_none_or(|d| names.contains(d)))
        {
            continue;
        }
        let mut new: Vec<Json> = Vec::new();
        for d in deps.iter() {
            match d.as_str() {
                Some(name) if !names.contains(name) => {
                    for derived in out
                        .derivations
                        .iter()
                        .filter(|x| x.abstract_resource == name)
                    {
                        let g = Json::from(derived.generated_resource.as_str());
                        if !new.contains(&g) {
                            new.push(g);
                        }
                    }
                }
                _ if !new.contains(d) => new.push(d.clone()),
                _ => {}
            }
        }
        *deps = new;
    }
}

#[async_trait]
impl Transformer for Celerity {
    fn name(&self) -> &str {
        "celerity-2023-04-20"
    }

    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }

    fn abstract_resources(&self) -> Vec<AbstractResource> {
        types::KINDS
            .iter()
            .map(|k| AbstractResource::new(k.ty, (k.schema)()).describe(k.description))
            .collect()
    }

    async fn transform(&self, _ctx: &Context, blueprint: Json) -> Result<Transformed> {
        if blueprint.get("resources").is_none_or(|r| !r.is_object()) {
            return Ok(Transformed {
                blueprint,
                ..Transformed::default()
            });
        }
        Ok(transform_doc(blueprint))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn handlers_become_lambda_functions_and_others_pass_through() {
        let out = transform_doc(json!({
            "version": "2023-04-20",
            "transform": "celerity-2023-04-20",
            "resources": {
                "saveOrder": {
                    "type": "celerity/handler",
                    "metadata": {"labels": {"app": "orders"}},
                    "spec": {"codeLocation": "./orders", "handler": "save.handler", "runtime": "python3.12",
                             "environmentVariables": {"TABLE": "${resources.table.spec.name}"}}
                },
                "bad": {"type": "celerity/handler", "spec": {"handler": "x", "runtime": "cobol"}},
                "table": {"type": "aws/dynamodb/table", "spec": {"name": "orders"}},
                "soon": {"type": "celerity/cache", "spec": {}}
            },
            "exports": {"fn": {"type": "string", "field": "resources.saveOrder.spec.handlerName"}},
            "values": {"fn": {"type": "string", "value": "${resources.saveOrder.spec.handlerName}"}}
        }));
        let save = &out.blueprint["resources"]["saveOrder"];
        assert_eq!(save["type"], "aws/lambda/function");
        // No handlerName: the provider derives the function's name.
        assert!(save["spec"].get("functionName").is_none());
        assert_eq!(save["spec"]["codeUri"], "./orders");
        assert_eq!(
            save["spec"]["environment"]["variables"]["TABLE"],
            "${resources.table.spec.name}"
        );
        assert_eq!(save["metadata"]["labels"]["app"], "orders");
        assert_eq!(
            out.blueprint["resources"]["table"]["type"],
            "aws/dynamodb/table"
        );
        assert_eq!(
            out.blueprint["values"]["fn"]["value"],
            "${resources.saveOrder.spec.functionName}"
        );
        assert_eq!(
            out.blueprint["exports"]["fn"]["field"],
            "resources.saveOrder.spec.functionName"
        );
        let codes: Vec<&str> = out.diagnostics.iter().map(|d| d.code.as_str()).collect();
        assert_eq!(
            codes,
            [
                "celerity.schema.not-allowed",
                "celerity.missing-field",
                "celerity.unsupported-type"
            ]
        );
        assert_eq!(out.derivations.len(), 2);
    }

    #[test]
    fn depends_on_an_abstract_resource_without_a_namesake_names_what_came_of_it() {
        let out = transform_doc(json!({
            "version": "2023-04-20",
            "transform": "celerity-2023-04-20",
            "resources": {
                "shared": {"type": "celerity/handlerConfig", "spec": {"codeLocation": "./x"}},
                "settings": {"type": "celerity/config",
                             "spec": {"values": {"a": "1", "b": "2"}, "plaintext": ["a"]}},
                "table": {"type": "celerity/datastore", "spec": {"keys": {"partitionKey": "id"}}},
                "worker": {"type": "aws/lambda/function",
                           "dependsOn": ["settings", "shared", "table"],
                           "spec": {"codeUri": "./w"}}
            }
        }));
        assert_eq!(
            out.blueprint["resources"]["worker"]["dependsOn"],
            json!(["settings_a", "settings_b", "table"])
        );
    }
}

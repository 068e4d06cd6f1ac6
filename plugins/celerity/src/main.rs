//! Transformer `celerity-2023-04-20`: expands abstract `celerity/handler`
//! resources into concrete `aws/lambda/function` resources.
//!
//! A blueprint opts in with `transform: celerity-2023-04-20`. Each
//! `celerity/handler` becomes one `aws/lambda/function` of the same name, so
//! references to it keep working; metadata, `condition`, `each`,
//! `linkSelector` and `dependsOn` are carried over unchanged, and
//! substitutions pass through as written (the engine evaluates them after the
//! transform). Only the handler is supported so far: other `celerity/*` types
//! are reported, not silently dropped.

use serde_json::{Map, Value as Json, json};
use std::process::ExitCode;
use trellis_plugin_sdk::prelude::*;

const HANDLER: &str = "celerity/handler";
const RUNTIMES: &[&str] = &[
    "nodejs20.x",
    "nodejs22.x",
    "python3.12",
    "python3.13",
    "java21",
    "go1.x",
    "provided.al2023",
];

struct Celerity;

fn handler_schema() -> Schema {
    Schema::object()
        .describe("A function that handles requests or events")
        .field(
            "handlerName",
            Field::string().describe("The deployed function name (defaults to the resource name)"),
        )
        .field(
            "codeLocation",
            Field::string()
                .required()
                .describe("Where the handler's code is, e.g. ./orders"),
        )
        .field(
            "handler",
            Field::string()
                .required()
                .describe("The entry point, e.g. save_order.handler"),
        )
        .field(
            "runtime",
            Field::string()
                .required()
                .allowed(RUNTIMES.iter().copied())
                .describe("The language runtime"),
        )
        .field(
            "memory",
            Field::integer().default(512).describe("Memory in MiB"),
        )
        .field(
            "timeout",
            Field::integer().default(30).describe("Timeout in seconds"),
        )
        .field(
            "environmentVariables",
            Field::map(Schema::string()).describe("Environment variables"),
        )
}

/// The concrete lambda function spec for a handler spec.
fn lambda_spec(name: &str, spec: &Map<String, Json>) -> Json {
    let mut out = Map::new();
    out.insert(
        "functionName".into(),
        spec.get("handlerName")
            .cloned()
            .unwrap_or_else(|| json!(name)),
    );
    out.insert(
        "handler".into(),
        spec.get("handler").cloned().unwrap_or(Json::Null),
    );
    out.insert(
        "runtime".into(),
        spec.get("runtime").cloned().unwrap_or(Json::Null),
    );
    out.insert(
        "codeUri".into(),
        spec.get("codeLocation").cloned().unwrap_or(Json::Null),
    );
    out.insert(
        "memorySize".into(),
        spec.get("memory").cloned().unwrap_or(json!(512)),
    );
    out.insert(
        "timeout".into(),
        spec.get("timeout").cloned().unwrap_or(json!(30)),
    );
    if let Some(env) = spec.get("environmentVariables") {
        out.insert("environment".into(), json!({ "variables": env }));
    }
    Json::Object(out)
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
        vec![
            AbstractResource::new(HANDLER, handler_schema())
                .describe("A Celerity handler, deployed as an AWS Lambda function"),
        ]
    }

    async fn transform(&self, _ctx: &Context, mut blueprint: Json) -> Result<Transformed> {
        let mut out = Transformed::default();
        let Some(resources) = blueprint.get_mut("resources").and_then(Json::as_object_mut) else {
            out.blueprint = blueprint;
            return Ok(out);
        };
        for (name, resource) in resources.iter_mut() {
            let Some(def) = resource.as_object_mut() else {
                continue;
            };
            let ty = def
                .get("type")
                .and_then(Json::as_str)
                .unwrap_or_default()
                .to_owned();
            if !ty.starts_with("celerity/") {
                continue;
            }
            let at = || AttrPath::root().field("resources").field(name.as_str());
            if ty != HANDLER {
                out.diagnostics.push(
                    Diagnostic::error(
                        "celerity.unsupported-type",
                        format!("`{ty}` is not supported by this transformer yet"),
                    )
                    .at(at().field("type"))
                    .hint("supported: celerity/handler"),
                );
                continue;
            }
            let spec = def
                .get("spec")
                .and_then(Json::as_object)
                .cloned()
                .unwrap_or_default();
            for required in ["codeLocation", "handler", "runtime"] {
                if !spec.contains_key(required) {
                    out.diagnostics.push(
                        Diagnostic::error(
                            "celerity.missing-field",
                            format!("handler `{name}` needs `{required}`"),
                        )
                        .at(at().field("spec")),
                    );
                }
            }
            if let Some(rt) = spec.get("runtime").and_then(Json::as_str) {
                // Substitutions are resolved later; check only literal runtimes.
                if !rt.contains("${") && !RUNTIMES.contains(&rt) {
                    out.diagnostics.push(
                        Diagnostic::error(
                            "celerity.runtime",
                            format!("runtime `{rt}` is not supported"),
                        )
                        .at(at().field("spec").field("runtime"))
                        .hint(format!("supported: {}", RUNTIMES.join(", "))),
                    );
                }
            }
            def.insert("type".into(), json!("aws/lambda/function"));
            def.insert("spec".into(), lambda_spec(name, &spec));
            out.derivations
                .push(Derivation::new(name.clone(), name.clone()));
        }
        out.blueprint = blueprint;
        Ok(out)
    }
}

fn main() -> ExitCode {
    trellis_plugin_sdk::serve_transformer(Celerity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handlers_become_lambda_functions() {
        let bp = json!({
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
                "table": {"type": "aws/dynamodb/table", "spec": {"name": "orders"}}
            }
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let out = rt
            .block_on(Celerity.transform(&Context::new(Value::Null), bp))
            .unwrap();
        let save = &out.blueprint["resources"]["saveOrder"];
        assert_eq!(save["type"], "aws/lambda/function");
        assert_eq!(save["spec"]["functionName"], "saveOrder");
        assert_eq!(
            save["spec"]["environment"]["variables"]["TABLE"],
            "${resources.table.spec.name}"
        );
        assert_eq!(save["metadata"]["labels"]["app"], "orders");
        assert_eq!(
            out.blueprint["resources"]["table"]["type"],
            "aws/dynamodb/table"
        );
        let codes: Vec<&str> = out.diagnostics.iter().map(|d| d.code.as_str()).collect();
        assert_eq!(codes, ["celerity.missing-field", "celerity.runtime"]);
        assert_eq!(out.derivations.len(), 2);
    }
}

//! `celerity/handler` → `aws/lambda/function` of the same name.

use crate::model::{Input, Out, Resource};
use serde_json::{Map, Value as Json, json};
use trellis_plugin_sdk::prelude::*;

pub const TYPE: &str = "celerity/handler";

pub(crate) const RUNTIMES: &[&str] = &[
    "nodejs20.x",
    "nodejs22.x",
    "python3.12",
    "python3.13",
    "java21",
    "go1.x",
    "provided.al2023",
];

pub fn schema() -> Schema {
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
pub(crate) fn lambda_spec(name: &str, spec: &Map<String, Json>) -> Json {
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

pub fn emit(_input: &Input, r: &Resource, out: &mut Out) {
    let spec = r.spec();
    for required in ["codeLocation", "handler", "runtime"] {
        if !spec.contains_key(required) {
            out.error(
                "missing-field",
                format!("handler `{}` needs `{required}`", r.name),
                r.at().field("spec"),
            );
        }
    }
    if let Some(rt) = spec.get("runtime").and_then(Json::as_str) {
        // Substitutions are resolved later; check only literal runtimes.
        if !rt.contains("${") && !RUNTIMES.contains(&rt) {
            out.error(
                "runtime",
                format!("runtime `{rt}` is not supported"),
                r.spec_at("runtime"),
            )
            .hint = Some(format!("supported: {}", RUNTIMES.join(", ")));
        }
    }
    let lambda = lambda_spec(&r.name, spec);
    out.emit(&r.name, r, "aws/lambda/function", lambda);
    out.alias(
        r,
        "handlerName",
        format!("resources.{}.spec.functionName", r.name),
    );
}

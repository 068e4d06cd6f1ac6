//! `celerity/handler` → `aws/lambda/function` of the same name.
//!
//! The function's settings are the handler's spec over its linked
//! `celerity/handlerConfig` over the blueprint's `metadata.sharedHandlerConfig`
//! over the defaults, field by field ([`resolve`]). The function keeps the
//! handler's labels and `linkSelector`, so the AWS provider's links from
//! `aws/lambda/function` to the tables, buckets, queues, topics, secrets and
//! parameters the handler selects grant access; when it selects any of them
//! the function gets `aws.lambda.function.populateEnvVars: true`, the
//! environment variables the Celerity documentation promises.

use crate::model::{Input, Out, Resource};
use crate::types::handler_config;
use serde_json::{Map, Value as Json, json};
use trellis_plugin_sdk::prelude::*;

pub const TYPE: &str = "celerity/handler";
pub const DESCRIPTION: &str = "A Celerity handler, deployed as an AWS Lambda function";

/// Celerity runtime identifiers and the Lambda runtime each deploys as.
/// Lambda's own identifiers are accepted as written too.
pub(crate) const RUNTIME_MAP: &[(&str, &str)] = &[
    ("nodejs24.x", "nodejs24.x"),
    ("nodejs22.x", "nodejs22.x"),
    ("nodejs20.x", "nodejs20.x"),
    ("python3.13.x", "python3.13"),
    ("python3.12.x", "python3.12"),
    ("python3.13", "python3.13"),
    ("python3.12", "python3.12"),
    ("java21", "java21"),
    ("provided.al2023", "provided.al2023"),
];

pub const DEFAULT_MEMORY: i64 = 512;
pub const DEFAULT_TIMEOUT: i64 = 30;

/// The spec fields a handlerConfig or the shared config can give a handler.
pub(crate) const INHERITED: &[&str] = &[
    "codeLocation",
    "runtime",
    "memory",
    "timeout",
    "tracingEnabled",
    "environmentVariables",
];

/// The abstract types a handler links to for access (the provider's
/// `aws/lambda/function` links to their concrete types).
pub(crate) const BACKING: &[&str] = &[
    "celerity/datastore",
    "celerity/bucket",
    "celerity/queue",
    "celerity/topic",
    "celerity/config",
];

/// The runtime identifiers a handler accepts.
pub(crate) const RUNTIMES: &[&str] = &[
    "nodejs24.x",
    "nodejs22.x",
    "nodejs20.x",
    "python3.13.x",
    "python3.12.x",
    "python3.13",
    "python3.12",
    "java21",
    "provided.al2023",
];

pub(crate) fn runtime_ids() -> impl Iterator<Item = &'static str> {
    RUNTIMES.iter().copied()
}

/// The Lambda runtime of a runtime identifier, when it is one.
pub(crate) fn lambda_runtime(id: &str) -> Option<&'static str> {
    RUNTIME_MAP.iter().find(|(c, _)| *c == id).map(|(_, l)| *l)
}

pub fn schema() -> Schema {
    Schema::object()
        .describe("A function that handles requests or events")
        .field(
            "handlerName",
            Field::string().describe(
                "The deployed function's name (Lambda functionName); derived from the instance and resource name when not set",
            ),
        )
        .field(
            "codeLocation",
            Field::string().describe(
                "Where the handler's code is (a directory relative to the blueprint, a .zip file or s3://bucket/key); may be inherited, must be set at some level",
            ),
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
                .allowed(runtime_ids())
                .describe("The Celerity runtime identifier (python3.13.x → Lambda python3.13); may be inherited, must be set at some level"),
        )
        .field(
            "memory",
            Field::integer().describe(
                "Memory in MB, 128 to 10240 on Lambda; 512 when neither the handler nor what it inherits sets it",
            ),
        )
        .field(
            "timeout",
            Field::integer().describe(
                "Seconds the handler may run, 1 to 900 on Lambda; 30 when neither the handler nor what it inherits sets it",
            ),
        )
        .field(
            "tracingEnabled",
            Field::boolean().describe("X-Ray tracing (Lambda tracing Active); false when not set"),
        )
        .field(
            "environmentVariables",
            Field::map(Schema::string()).describe(
                "Environment variables, merged over the inherited ones key by key",
            ),
        )
}

/// Where a resolved field's value came from, for diagnostics.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Source {
    Handler,
    Config(String),
    Shared,
    Default,
}

/// The handler's spec with the inherited fields filled in: the handler's
/// own value, else the linked handlerConfig's, else the shared config's.
/// `environmentVariables` merge key by key in the same precedence.
pub(crate) fn resolve(input: &Input, r: &Resource, out: &mut Out) -> Map<String, Json> {
    let configs: Vec<&Resource> = input
        .selected_by(r)
        .filter(|c| c.ty == handler_config::TYPE)
        .collect();
    if configs.len() > 1 {
        let names: Vec<&str> = configs.iter().map(|c| c.name.as_str()).collect();
        out.error(
            "handler-config.ambiguous",
            format!(
                "handler `{}` selects {} handlerConfigs ({}); it can inherit from one",
                r.name,
                names.len(),
                names.join(", ")
            ),
            r.at().field("linkSelector"),
        )
        .hint = Some(format!(
            "narrow the linkSelector so it selects one; `{}` is used",
            names[0]
        ));
    }
    let config = configs.first().map(|c| c.spec());
    let shared = input
        .metadata
        .get("sharedHandlerConfig")
        .and_then(Json::as_object);
    let mut spec = r.spec().clone();
    for field in INHERITED {
        if *field == "environmentVariables" {
            let mut env = Map::new();
            for layer in [shared, config, Some(r.spec())].into_iter().flatten() {
                if let Some(vars) = layer.get(*field).and_then(Json::as_object) {
                    env.extend(vars.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
            }
            if !env.is_empty() {
                spec.insert((*field).into(), Json::Object(env));
            }
            continue;
        }
        if spec.contains_key(*field) {
            continue;
        }
        if let Some(v) = config
            .and_then(|c| c.get(*field))
            .or_else(|| shared.and_then(|s| s.get(*field)))
        {
            spec.insert((*field).into(), v.clone());
        }
    }
    spec
}

/// Where `field` of the resolved spec came from.
pub(crate) fn source_of(input: &Input, r: &Resource, field: &str) -> Source {
    if r.spec().contains_key(field) {
        return Source::Handler;
    }
    if let Some(c) = input
        .selected_by(r)
        .find(|c| c.ty == handler_config::TYPE && c.spec().contains_key(field))
    {
        return Source::Config(c.name.clone());
    }
    if input
        .metadata
        .get("sharedHandlerConfig")
        .and_then(|s| s.get(field))
        .is_some()
    {
        return Source::Shared;
    }
    Source::Default
}

/// The path a diagnostic about a resolved field points at: where the value
/// was written.
fn field_at(input: &Input, r: &Resource, field: &str) -> AttrPath {
    match source_of(input, r, field) {
        Source::Config(c) => AttrPath::root()
            .field("resources")
            .field(c)
            .field("spec")
            .field(field),
        Source::Shared => AttrPath::root()
            .field("metadata")
            .field("sharedHandlerConfig")
            .field(field),
        Source::Handler | Source::Default => r.spec_at(field),
    }
}

/// The concrete lambda function spec for a resolved handler spec ([`resolve`]).
/// `_name` is the handler's name: without `handlerName` the provider derives
/// the function's name from the instance and it.
pub(crate) fn lambda_spec(_name: &str, spec: &Map<String, Json>) -> Json {
    let mut out = Map::new();
    if let Some(name) = spec.get("handlerName") {
        out.insert("functionName".into(), name.clone());
    }
    if let Some(code) = spec.get("codeLocation") {
        out.insert("codeUri".into(), code.clone());
    }
    if let Some(h) = spec.get("handler") {
        out.insert("handler".into(), h.clone());
    }
    if let Some(rt) = spec.get("runtime") {
        let mapped = rt
            .as_str()
            .and_then(lambda_runtime)
            .map_or_else(|| rt.clone(), Json::from);
        out.insert("runtime".into(), mapped);
    }
    out.insert(
        "memorySize".into(),
        spec.get("memory").cloned().unwrap_or(json!(DEFAULT_MEMORY)),
    );
    out.insert(
        "timeout".into(),
        spec.get("timeout")
            .cloned()
            .unwrap_or(json!(DEFAULT_TIMEOUT)),
    );
    if spec.get("tracingEnabled") == Some(&Json::Bool(true)) {
        out.insert("tracing".into(), json!("Active"));
    }
    if let Some(env) = spec.get("environmentVariables") {
        out.insert("environment".into(), json!({ "variables": env }));
    }
    Json::Object(out)
}

fn check_range(
    input: &Input,
    r: &Resource,
    spec: &Map<String, Json>,
    field: &str,
    (min, max): (i64, i64),
    unit: &str,
    out: &mut Out,
) {
    if let Some(n) = spec.get(field).and_then(Json::as_i64)
        && !(min..=max).contains(&n)
    {
        out.error(
            "out-of-range",
            format!(
                "`{field}` of handler `{}` is {n} {unit}; AWS Lambda takes {min} to {max}",
                r.name
            ),
            field_at(input, r, field),
        );
    }
}

pub fn emit(input: &Input, r: &Resource, out: &mut Out) {
    out.check_spec(r, &schema());
    let spec = resolve(input, r, out);
    for (field, what) in [
        ("codeLocation", "where its code is"),
        ("runtime", "a runtime"),
    ] {
        if !spec.contains_key(field) {
            out.error(
                "missing-field",
                format!("handler `{}` needs `{field}` ({what})", r.name),
                r.at().field("spec"),
            )
            .hint = Some(format!(
                "set `{field}` on the handler, on a celerity/handlerConfig it selects, or in the blueprint's metadata.sharedHandlerConfig"
            ));
        }
    }
    check_range(input, r, &spec, "memory", (128, 10240), "MB", out);
    check_range(input, r, &spec, "timeout", (1, 900), "seconds", out);

    if spec
        .get("tracingEnabled")
        .and_then(Json::as_str)
        .is_some_and(|s| s.contains("${"))
    {
        out.warning(
            "tracing-substitution",
            "`tracingEnabled` from a substitution cannot choose Lambda's tracing mode; tracing stays off",
            field_at(input, r, "tracingEnabled"),
        )
        .hint = Some("write true or false".into());
    }
    let lambda = lambda_spec(&r.name, &spec);
    out.emit(&r.name, r, "aws/lambda/function", lambda);

    // Links: the selector stays for the provider's links; when it selects
    // only handlerConfigs (resolved here, never emitted), it would select
    // nothing concrete.
    let selected: Vec<&Resource> = input.selected_by(r).collect();
    if !selected.is_empty()
        && selected.iter().all(|s| s.ty == handler_config::TYPE)
        && let Some(def) = out.get_mut(&r.name)
    {
        def.remove("linkSelector");
    }
    if selected.iter().any(|s| BACKING.contains(&s.ty.as_str()))
        && !r
            .annotations()
            .contains_key("aws.lambda.function.populateEnvVars")
    {
        out.set_metadata(
            &r.name,
            "annotations",
            "aws.lambda.function.populateEnvVars",
            json!(true),
        );
    }

    out.alias_fields(r, &[("handlerName", "functionName"), ("id", "arn")]);
}

#[cfg(test)]
mod tests {
    use crate::model::diagnostic_lines;
    use crate::transform_doc;
    use serde_json::{Value, json};

    fn doc(resources: Value, metadata: Value) -> Value {
        json!({"version": "2023-04-20", "transform": "celerity-2023-04-20",
               "metadata": metadata, "resources": resources})
    }

    #[test]
    fn handler_inherits_handler_config_over_shared_config() {
        let out = transform_doc(doc(
            json!({
                "ordersConfig": {
                    "type": "celerity/handlerConfig",
                    "metadata": {"labels": {"handlerGroup": "orders"}},
                    "spec": {"codeLocation": "./orders", "memory": 1024,
                             "environmentVariables": {"LOG": "debug", "REGION": "eu"}}
                },
                "saveOrder": {
                    "type": "celerity/handler",
                    "metadata": {"labels": {"app": "orders"}},
                    "linkSelector": {"byLabel": {"handlerGroup": "orders"}},
                    "spec": {"handler": "save.handler", "handlerName": "SaveOrder-v1",
                             "timeout": 10, "tracingEnabled": true,
                             "environmentVariables": {"LOG": "info"}}
                },
                "listOrders": {
                    "type": "celerity/handler",
                    "spec": {"handler": "list.handler", "codeLocation": "./list"}
                }
            }),
            json!({"sharedHandlerConfig": {
                "runtime": "python3.13.x", "memory": 256, "timeout": 60,
                "environmentVariables": {"STAGE": "${variables.stage}", "REGION": "us"}
            }}),
        ));
        assert!(
            out.diagnostics.is_empty(),
            "{:?}",
            diagnostic_lines(&out.diagnostics)
        );
        // The handlerConfig is not emitted; both handlers are functions.
        insta::assert_json_snapshot!("handler_inheritance", out.blueprint["resources"]);
        let names: Vec<(&str, &str)> = out
            .derivations
            .iter()
            .map(|d| (d.generated_resource.as_str(), d.abstract_resource.as_str()))
            .collect();
        assert_eq!(
            names,
            [("saveOrder", "saveOrder"), ("listOrders", "listOrders")]
        );
    }

    #[test]
    fn handler_links_to_backing_resources_and_aliases_its_fields() {
        let out = transform_doc(json!({
            "version": "2023-04-20",
            "transform": "celerity-2023-04-20",
            "resources": {
                "orders": {"type": "celerity/datastore",
                           "metadata": {"labels": {"app": "orders"}},
                           "spec": {"keys": {"partitionKey": "id"}}},
                "saveOrder": {
                    "type": "celerity/handler",
                    "linkSelector": {"byLabel": {"app": "orders"}},
                    "spec": {"handler": "save.handler", "codeLocation": "./orders",
                             "runtime": "nodejs24.x"}
                },
                "caller": {
                    "type": "aws/lambda/function",
                    "spec": {"codeUri": "./caller",
                             "description": "calls ${resources.saveOrder.spec.handlerName} (${resources.saveOrder.spec.id})"}
                }
            },
            "exports": {"fn": {"type": "string", "field": "resources.saveOrder.spec.id"}}
        }));
        assert!(
            out.diagnostics.is_empty(),
            "{:?}",
            diagnostic_lines(&out.diagnostics)
        );
        let save = &out.blueprint["resources"]["saveOrder"];
        assert_eq!(save["linkSelector"], json!({"byLabel": {"app": "orders"}}));
        assert_eq!(
            save["metadata"]["annotations"]["aws.lambda.function.populateEnvVars"],
            true
        );
        assert_eq!(save["spec"]["runtime"], "nodejs24.x");
        assert_eq!(
            out.blueprint["resources"]["orders"]["metadata"]["labels"]["app"],
            "orders"
        );
        assert_eq!(
            out.blueprint["resources"]["caller"]["spec"]["description"],
            "calls ${resources.saveOrder.spec.functionName} (${resources.saveOrder.spec.arn})"
        );
        assert_eq!(
            out.blueprint["exports"]["fn"]["field"],
            "resources.saveOrder.spec.arn"
        );
    }

    #[test]
    fn handler_diagnostics_point_at_the_field_that_set_the_value() {
        let out = transform_doc(doc(
            json!({
                "big": {
                    "type": "celerity/handlerConfig",
                    "metadata": {"labels": {"g": "big"}},
                    "spec": {"memory": 20000, "runtime": "cobol"}
                },
                "other": {
                    "type": "celerity/handlerConfig",
                    "metadata": {"labels": {"g": "big"}},
                    "spec": {}
                },
                "lonely": {"type": "celerity/handlerConfig", "spec": {"timeout": 5}},
                "a": {
                    "type": "celerity/handler",
                    "linkSelector": {"byLabel": {"g": "big"}},
                    "spec": {"handler": "a.h", "timeout": 901, "tracingEnabled": "${variables.t}"}
                },
                "b": {"type": "celerity/handler", "spec": {"memory": "lots"}}
            }),
            json!({"sharedHandlerConfig": {"runtime": "python2.7", "bogus": 1}}),
        ));
        insta::assert_json_snapshot!("handler_diagnostics", diagnostic_lines(&out.diagnostics));
        // A selector that selects only handlerConfigs is not carried over.
        assert!(
            out.blueprint["resources"]["a"]
                .get("linkSelector")
                .is_none()
        );
    }
}

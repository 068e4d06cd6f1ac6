//! `celerity/api` (HTTP) → `aws/apigatewayv2/api` of the same name; its
//! routes come from the handlers it selects (docs/celerity/api.md).
//!
//! The concrete API selects the functions of its HTTP handlers by a label
//! the transform adds to each (`celerity.api.<api>: "true"`); each function
//! gets the `aws.apigatewayv2.route` annotation from the handler's
//! `celerity.handler.http.method` and `.path`, so the AWS provider's
//! API → function link makes the integration, the route and the invoke
//! permission. WebSocket, custom domains and auth guards have no backing in
//! the AWS provider yet: each is an error at its field.

use std::collections::BTreeMap;

use crate::model::{Input, Out, Resource, add_label, metadata_map, serves};
use serde_json::{Map, Value as Json, json};
use trellis_plugin_sdk::prelude::*;

pub const TYPE: &str = "celerity/api";
pub const DESCRIPTION: &str = "An HTTP API routing to handlers";

/// The function annotation the AWS provider's API → function link reads.
pub const ROUTE_ANNOTATION: &str = "aws.apigatewayv2.route";

/// Methods API Gateway HTTP APIs route (of the Celerity handler's allowed
/// ones, CONNECT and TRACE are not).
const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"];
const CELERITY_ONLY_METHODS: &[&str] = &["CONNECT", "TRACE"];

const CORS_FIELDS: &[&str] = &[
    "allowCredentials",
    "allowOrigins",
    "allowMethods",
    "allowHeaders",
    "exposeHeaders",
    "maxAge",
];

pub fn schema() -> Schema {
    Schema::object()
        .describe(DESCRIPTION)
        .field(
            "protocols",
            Field::array(Schema::any())
                .required()
                .describe("`http` (`websocket` is not supported by the AWS target yet)"),
        )
        .field(
            "cors",
            Field::any().describe("`\"*\"`, an origin, or {allowCredentials, allowOrigins, allowMethods, allowHeaders, exposeHeaders, maxAge}"),
        )
        .field(
            "domain",
            Field::any().describe("A custom domain (not supported by the AWS target yet)"),
        )
        .field(
            "tracingEnabled",
            Field::boolean().describe("HTTP APIs have no stage tracing on AWS: trace the handlers instead"),
        )
        .field(
            "auth",
            Field::any().describe("Auth guards (not supported by the AWS target yet)"),
        )
}

/// The label by which `api`'s concrete API selects its handlers' functions.
pub fn label(api: &str) -> String {
    format!("celerity.api.{api}")
}

/// Whether the API serves HTTP (its `protocols` list `http`), reporting
/// every protocol it cannot serve.
fn http_protocol(r: &Resource, out: &mut Out) -> bool {
    let Some(protocols) = r.spec().get("protocols") else {
        out.error(
            "missing-field",
            format!("api `{}` needs `protocols`", r.name),
            r.at().field("spec"),
        )
        .hint = Some("protocols: [http]".into());
        return false;
    };
    let Some(list) = protocols.as_array() else {
        out.error(
            "invalid-value",
            format!("`protocols` of `{}` must be a list", r.name),
            r.spec_at("protocols"),
        );
        return false;
    };
    let mut http = false;
    for (i, p) in list.iter().enumerate() {
        let at = r.spec_at("protocols").index(i as u64);
        match p {
            Json::String(s) if s == "http" => http = true,
            // `websocket`, or the object form that configures it.
            Json::String(s) if s == "websocket" => websocket_not_supported(r, out, at),
            Json::Object(o) if o.contains_key("websocketConfig") => {
                websocket_not_supported(r, out, at)
            }
            other => {
                out.error(
                    "invalid-value",
                    format!(
                        "protocol {other} of `{}` is not `http` or `websocket`",
                        r.name
                    ),
                    at,
                );
            }
        }
    }
    if !http && !list.is_empty() {
        // Only unsupported protocols: nothing to deploy (reported above).
        return false;
    }
    if list.is_empty() {
        out.error(
            "invalid-value",
            format!("`protocols` of `{}` is empty", r.name),
            r.spec_at("protocols"),
        )
        .hint = Some("protocols: [http]".into());
    }
    http
}

/// `cors` as the concrete `corsConfiguration`.
fn cors(r: &Resource, cors: &Json, out: &mut Out) -> Option<Json> {
    match cors {
        Json::String(origin) => Some(json!({
            "allowOrigins": [origin],
            "allowMethods": ["*"],
            "allowHeaders": ["*"],
        })),
        Json::Object(o) => {
            let mut c = Map::new();
            for (k, v) in o {
                let at = r.spec_at("cors").field(k.as_str());
                if !CORS_FIELDS.contains(&k.as_str()) {
                    out.error(
                        "invalid-value",
                        format!("`cors.{k}` of `{}` is not a CORS setting", r.name),
                        at,
                    )
                    .hint = Some(format!("one of {}", CORS_FIELDS.join(", ")));
                    continue;
                }
                let v = match (k.as_str(), v) {
                    // The documentation's examples write it as a string at times.
                    ("maxAge", Json::String(s)) if !s.contains("${") => match s.parse::<i64>() {
                        Ok(n) => json!(n),
                        Err(_) => {
                            out.error(
                                "invalid-value",
                                format!("`cors.maxAge` of `{}` is not a number of seconds", r.name),
                                at,
                            );
                            continue;
                        }
                    },
                    _ => v.clone(),
                };
                c.insert(k.clone(), v);
            }
            Some(Json::Object(c))
        }
        _ => {
            out.error(
                "invalid-value",
                format!(
                    "`cors` of `{}` must be `\"*\"`, an origin or an object",
                    r.name
                ),
                r.spec_at("cors"),
            );
            None
        }
    }
}

pub fn emit(_input: &Input, r: &Resource, out: &mut Out) {
    let spec = r.spec();
    let http = http_protocol(r, out);
    if spec.contains_key("domain") {
        out.error(
            "not-supported",
            format!("api `{}`: custom domains are not supported by the AWS target yet", r.name),
            r.spec_at("domain"),
        )
        .hint = Some("the AWS provider has no API Gateway domain name or mapping type yet; remove `domain` and use the API's endpoint (`baseUrl`)".into());
    }
    if spec.contains_key("auth") {
        out.error(
            "not-supported",
            format!("api `{}`: auth guards are not supported by the AWS target yet", r.name),
            r.spec_at("auth"),
        )
        .hint = Some("the AWS provider has no API Gateway authorizer type yet; the API would be deployed open, so it is refused".into());
    }
    if spec.get("tracingEnabled") == Some(&Json::Bool(true)) {
        out.warning(
            "not-supported",
            format!(
                "api `{}`: API Gateway HTTP APIs have no stage tracing",
                r.name
            ),
            r.spec_at("tracingEnabled"),
        )
        .hint = Some("set `tracingEnabled` on the handlers: their functions are traced".into());
    }
    if !http {
        return;
    }
    let mut api = Map::new();
    api.insert("protocolType".into(), json!("HTTP"));
    if let Some(c) = spec.get("cors").and_then(|c| cors(r, c, out)) {
        api.insert("corsConfiguration".into(), c);
    }
    let def = out.emit(&r.name, r, "aws/apigatewayv2/api", Json::Object(api));
    def.insert(
        "linkSelector".into(),
        json!({ "byLabel": { label(&r.name): "true" } }),
    );
    out.alias_fields(r, &[("id", "arn"), ("baseUrl", "apiEndpoint")]);
}

/// The route of an HTTP handler (`POST /orders`), reporting what API
/// Gateway cannot route.
fn route(h: &Resource, out: &mut Out) -> Option<String> {
    let ann = h.annotations();
    let at = |key: &str| h.at().field("metadata").field("annotations").field(key);
    let method = match ann.get("celerity.handler.http.method") {
        None => "GET".to_owned(),
        Some(Json::String(m)) => m.to_ascii_uppercase(),
        Some(other) => {
            out.error(
                "invalid-value",
                format!("the HTTP method {other} of `{}` is not a string", h.name),
                at("celerity.handler.http.method"),
            );
            return None;
        }
    };
    let path = match ann.get("celerity.handler.http.path") {
        None => "/".to_owned(),
        Some(Json::String(p)) => p.clone(),
        Some(other) => {
            out.error(
                "invalid-value",
                format!("the HTTP path {other} of `{}` is not a string", h.name),
                at("celerity.handler.http.path"),
            );
            return None;
        }
    };
    let mut ok = true;
    if !method.contains("${") && !METHODS.contains(&method.as_str()) {
        ok = false;
        let d = out.error(
            if CELERITY_ONLY_METHODS.contains(&method.as_str()) {
                "not-supported"
            } else {
                "invalid-value"
            },
            format!(
                "`{}`: API Gateway HTTP APIs cannot route the method `{method}`",
                h.name
            ),
            at("celerity.handler.http.method"),
        );
        d.hint = Some(format!("one of {}", METHODS.join(", ")));
    }
    if !path.contains("${") && !path.starts_with('/') {
        ok = false;
        out.error(
            "invalid-value",
            format!(
                "the HTTP path `{path}` of `{}` does not start with `/`",
                h.name
            ),
            at("celerity.handler.http.path"),
        );
    }
    if ann.contains_key("celerity.handler.guard.protectedBy") {
        ok = false;
        out.error(
            "not-supported",
            format!(
                "`{}`: auth guards are not supported by the AWS target yet",
                h.name
            ),
            at("celerity.handler.guard.protectedBy"),
        )
        .hint = Some(
            "the AWS provider has no API Gateway authorizer type yet; the route would be open"
                .into(),
        );
    }
    ok.then(|| format!("{method} {path}"))
}

/// Each API's HTTP handlers carry the label its API selects and the route.
pub fn finish(input: &Input, out: &mut Out) {
    for api in input.of_type(TYPE) {
        if !out
            .resources
            .get(&api.name)
            .is_some_and(|d| d["type"] == "aws/apigatewayv2/api")
        {
            continue; // not emitted: its errors say why
        }
        let mut routes: BTreeMap<String, String> = BTreeMap::new();
        for h in input.selected_by(api) {
            if h.ty != crate::types::handler::TYPE {
                continue;
            }
            if !serves(h, "celerity.handler.http") {
                if serves(h, "celerity.handler.websocket") {
                    out.error(
                        "not-supported",
                        format!(
                            "`{}`: WebSocket handlers are not supported by the AWS target yet",
                            h.name
                        ),
                        h.at()
                            .field("metadata")
                            .field("annotations")
                            .field("celerity.handler.websocket"),
                    );
                }
                continue;
            }
            let Some(route) = route(h, out) else {
                continue;
            };
            if let Some(other) = routes.get(&route) {
                out.error(
                    "route-conflict",
                    format!(
                        "`{}` and `{other}` both route `{route}` of api `{}`",
                        h.name, api.name
                    ),
                    h.at().field("metadata").field("annotations"),
                )
                .hint = Some("give each handler its own method and path".into());
                continue;
            }
            routes.insert(route.clone(), h.name.clone());
            let Some(def) = out.get_mut(&h.name) else {
                continue;
            };
            let _ = add_label(def, &label(&api.name), &json!("true"));
            metadata_map(def, "annotations").insert(ROUTE_ANNOTATION.into(), json!(route));
        }
        if routes.is_empty() {
            out.warning(
                "no-handler",
                format!("api `{}` routes to no handler", api.name),
                api.at().field("linkSelector"),
            )
            .hint = Some("select celerity/handler resources with `celerity.handler.http.method` and `.path` annotations".into());
        }
    }
}

fn websocket_not_supported(r: &Resource, out: &mut Out, at: AttrPath) {
    out.error(
        "not-supported",
        format!(
            "api `{}`: the WebSocket protocol is not supported by the AWS target yet",
            r.name
        ),
        at,
    )
    .hint = Some("only `http` is deployed; a WebSocket API needs its own transform support".into());
}

#[cfg(test)]
mod tests {
    use crate::model::diagnostic_lines;
    use crate::transform_doc;
    use serde_json::json;

    fn handler(labels: serde_json::Value, annotations: serde_json::Value) -> serde_json::Value {
        json!({
            "type": "celerity/handler",
            "metadata": {"labels": labels, "annotations": annotations},
            "spec": {"codeLocation": "./orders", "handler": "h.handler", "runtime": "python3.12"}
        })
    }

    #[test]
    fn an_http_api_routes_to_its_handlers() {
        let out = transform_doc(json!({
            "version": "2023-04-20",
            "transform": "celerity-2023-04-20",
            "resources": {
                "ordersApi": {
                    "type": "celerity/api",
                    "linkSelector": {"byLabel": {"app": "orders"}},
                    "spec": {
                        "protocols": ["http"],
                        "cors": {"allowOrigins": ["https://example.com"], "allowMethods": ["GET", "POST"], "maxAge": "3600", "allowCredentials": true}
                    }
                },
                "saveOrder": handler(json!({"app": "orders"}),
                    json!({"celerity.handler.http": true, "celerity.handler.http.method": "post", "celerity.handler.http.path": "/orders"})),
                "getOrder": handler(json!({"app": "orders"}),
                    json!({"celerity.handler.http.path": "/orders/{id}"})),
                "worker": handler(json!({"app": "orders"}),
                    json!({"celerity.handler.consumer": true}))
            },
            "exports": {"url": {"type": "string", "field": "resources.ordersApi.spec.baseUrl"}}
        }));
        insta::assert_json_snapshot!("api_http_routes", out.blueprint);
        assert!(
            out.diagnostics.is_empty(),
            "{:?}",
            diagnostic_lines(&out.diagnostics)
        );
    }

    #[test]
    fn what_the_aws_target_cannot_back_is_reported_at_its_field() {
        let out = transform_doc(json!({
            "version": "2023-04-20",
            "transform": "celerity-2023-04-20",
            "resources": {
                "api": {
                    "type": "celerity/api",
                    "linkSelector": {"byLabel": {"app": "x"}},
                    "spec": {
                        "protocols": ["http", "websocket", {"websocketConfig": {"routeKey": "action"}}],
                        "cors": "*",
                        "domain": {"domainName": "api.example.com"},
                        "tracingEnabled": true,
                        "auth": {"defaultGuard": "jwt", "guards": {"jwt": {"type": "jwt"}}}
                    }
                },
                "a": handler(json!({"app": "x"}), json!({"celerity.handler.http.method": "TRACE", "celerity.handler.http.path": "/a"})),
                "b": handler(json!({"app": "x"}), json!({"celerity.handler.http.path": "/b", "celerity.handler.guard.protectedBy": "jwt"})),
                "c": handler(json!({"app": "x"}), json!({"celerity.handler.http.path": "/c"})),
                "d": handler(json!({"app": "x"}), json!({"celerity.handler.http.path": "/c"})),
                "e": handler(json!({"app": "x"}), json!({"celerity.handler.websocket": true})),
                "wsOnly": {"type": "celerity/api", "spec": {"protocols": ["websocket"]}},
                "none": {"type": "celerity/api", "spec": {}}
            }
        }));
        insta::assert_json_snapshot!(
            "api_unsupported_diagnostics",
            diagnostic_lines(&out.diagnostics)
        );
        let res = &out.blueprint["resources"];
        assert_eq!(
            res["api"]["spec"]["corsConfiguration"]["allowOrigins"],
            json!(["*"])
        );
        assert!(res.get("wsOnly").is_none() && res.get("none").is_none());
        assert_eq!(
            res["c"]["metadata"]["annotations"]["aws.apigatewayv2.route"],
            "GET /c"
        );
        assert!(
            res["d"]["metadata"]["annotations"]
                .get("aws.apigatewayv2.route")
                .is_none()
        );
    }
}

//! `aws/apigatewayv2/api`.

use serde_json::json;
use trellis_plugin_sdk::{ErrorClass, Value};

use crate::dynamodb::{codes, covers, recreate_fields, schema_of};
use crate::support::{Moto, boto, current, harness, moto, unique};

const TY: &str = "aws/apigatewayv2/api";

fn get_api(m: &Moto, id: &str) -> Result<serde_json::Value, String> {
    boto(m, "apigatewayv2", "get_api", json!({"ApiId": id}))
}

fn get_stage(m: &Moto, id: &str, stage: &str) -> Result<serde_json::Value, String> {
    boto(
        m,
        "apigatewayv2",
        "get_stage",
        json!({"ApiId": id, "StageName": stage}),
    )
}

/// The ids of the APIs called `name`.
fn apis_named(m: &Moto, name: &str) -> Vec<String> {
    boto(m, "apigatewayv2", "get_apis", json!({})).expect("listed")["Items"]
        .as_array()
        .map(|l| {
            l.iter()
                .filter(|a| a["Name"] == name)
                .filter_map(|a| a["ApiId"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn tags(pairs: &[(&str, &str)]) -> Value {
    Value::List(
        pairs
            .iter()
            .map(|(k, v)| Value::map().with("key", *k).with("value", *v))
            .collect(),
    )
}

#[tokio::test]
async fn an_http_api_is_created_read_updated_and_destroyed() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("orders-api");
    let spec = Value::map()
        .with("name", name.as_str())
        .with("protocolType", "HTTP")
        .with("description", "Orders")
        .with(
            "corsConfiguration",
            Value::map()
                .with("allowOrigins", vec!["https://example.com"])
                .with("allowMethods", vec!["GET", "POST"])
                .with("allowHeaders", vec!["content-type"])
                .with("maxAge", 300)
                .with("allowCredentials", true),
        )
        .with("tags", tags(&[("team", "a"), ("cost", "1")]));
    let a = h
        .create(TY, "ordersApi", spec.clone())
        .await
        .expect("created");
    let id = a.external_id.clone();
    assert_eq!(
        a.state.get("apiId").and_then(Value::as_str),
        Some(id.as_str())
    );
    assert_eq!(
        a.state.get("arn").and_then(Value::as_str),
        Some(format!("arn:aws:apigateway:us-east-1::/apis/{id}").as_str())
    );
    let exec = a
        .state
        .get("executionArn")
        .and_then(Value::as_str)
        .expect("executionArn");
    assert!(
        exec.starts_with("arn:aws:execute-api:us-east-1:") && exec.ends_with(&format!(":{id}")),
        "{exec}"
    );
    let got = get_api(m, &id).expect("exists");
    assert_eq!(
        (&got["Name"], &got["ProtocolType"]),
        (&json!(name), &json!("HTTP"))
    );
    assert_eq!(got["Description"], "Orders");
    assert_eq!(
        got["CorsConfiguration"]["AllowOrigins"],
        json!(["https://example.com"])
    );
    assert_eq!(got["CorsConfiguration"]["MaxAge"], 300);
    assert_eq!(
        a.state.get("apiEndpoint").and_then(Value::as_str),
        got["ApiEndpoint"].as_str()
    );
    assert_eq!(
        (&got["Tags"]["team"], &got["Tags"]["cost"]),
        (&json!("a"), &json!("1"))
    );
    assert_eq!(got["Tags"]["trellis:resource"], "ordersApi");
    // The resource's own stage, deployed automatically.
    let stage = get_stage(m, &id, "$default").expect("the $default stage");
    assert_eq!(stage["AutoDeploy"], true);

    // Nothing changed: the spec reads back as applied.
    let read = h.read(&a).await.expect("read").expect("exists");
    covers(&spec, &read.spec).expect("reads back as applied");
    assert_eq!(
        read.spec.get("stageName").and_then(Value::as_str),
        Some("$default")
    );

    // Drift made outside: a new description.
    boto(
        m,
        "apigatewayv2",
        "update_api",
        json!({"ApiId": id, "Description": "by hand"}),
    )
    .expect("changed");
    let read = h.read(&a).await.expect("read").expect("exists");
    assert_eq!(
        read.spec.get("description").and_then(Value::as_str),
        Some("by hand")
    );
    assert!(covers(&spec, &read.spec).is_err());

    // Update in place: renamed, description and CORS dropped, the endpoint off, another
    // stage (the old one goes), a tag changed and one gone.
    let name2 = unique("orders-api-v2");
    let spec2 = Value::map()
        .with("name", name2.as_str())
        .with("disableExecuteApiEndpoint", true)
        .with("stageName", "prod")
        .with("tags", tags(&[("team", "b")]));
    let a2 = h.update(&a, spec2.clone()).await.expect("updated");
    assert_eq!(a2.external_id, id);
    let got = get_api(m, &id).expect("exists");
    assert_eq!(got["Name"], json!(name2));
    assert!(
        got["Description"].is_null() || got["Description"] == "",
        "{got}"
    );
    assert!(got["CorsConfiguration"].is_null(), "{got}");
    assert_eq!(got["DisableExecuteApiEndpoint"], true);
    assert_eq!(got["Tags"]["team"], "b");
    assert!(got["Tags"].get("cost").is_none(), "{got}");
    assert_eq!(get_stage(m, &id, "prod").expect("prod")["AutoDeploy"], true);
    assert_eq!(
        get_stage(m, &id, "$default").err().as_deref(),
        Some("NotFoundException")
    );
    let read = h.read(&a2).await.expect("read").expect("exists");
    covers(&spec2, &read.spec).expect("reads back as updated");

    h.destroy(&a2).await.expect("destroyed");
    assert_eq!(get_api(m, &id).err().as_deref(), Some("NotFoundException"));
    h.destroy(&a2).await.expect("destroy is idempotent");
    assert!(h.read(&a2).await.expect("read").is_none());
}

#[tokio::test]
async fn a_retried_create_adopts_its_api_by_its_tags_not_by_name() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("retry-api");
    // An API of the same name made outside Trellis: names are not unique in AWS, so it is
    // neither adopted nor a conflict, and it stays as it is.
    let outside = boto(
        m,
        "apigatewayv2",
        "create_api",
        json!({"Name": name, "ProtocolType": "HTTP", "Description": "theirs"}),
    )
    .expect("made outside")["ApiId"]
        .as_str()
        .expect("an id")
        .to_owned();
    let spec = Value::map().with("name", name.as_str());
    let first = h
        .create(TY, "retryApi", spec.clone())
        .await
        .expect("created");
    assert_ne!(first.external_id, outside);
    // The engine lost the answer and retries: the same API, found by its tags.
    let again = h
        .create(TY, "retryApi", spec.clone())
        .await
        .expect("adopted");
    assert_eq!(again.external_id, first.external_id);
    let mut ids = apis_named(m, &name);
    ids.sort();
    let mut want = vec![outside.clone(), first.external_id.clone()];
    want.sort();
    assert_eq!(ids, want, "one API of ours, theirs untouched");
    assert_eq!(
        get_api(m, &outside).expect("theirs")["Description"],
        "theirs"
    );

    // A crash before the id was recorded: read and destroy find it by its tags.
    let mut unrecorded = first.clone();
    unrecorded.external_id.clear();
    let found = h.read(&unrecorded).await.expect("read").expect("found");
    assert_eq!(
        found.external_id.as_deref(),
        Some(first.external_id.as_str())
    );
    // Another resource's unrecorded API does not exist: nothing found, nothing destroyed.
    let never = current(TY, "neverCreated", &Default::default(), spec.clone());
    assert!(h.read(&never).await.expect("read").is_none());
    h.destroy(&never).await.expect("nothing of ours to destroy");
    h.destroy(&unrecorded).await.expect("destroyed by its tags");
    assert_eq!(
        get_api(m, &first.external_id).err().as_deref(),
        Some("NotFoundException")
    );
    assert!(get_api(m, &outside).is_ok(), "theirs stays");
}

#[tokio::test]
async fn validation_names_the_field_and_the_schema_marks_replacements() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let d = h
        .validate(
            TY,
            "api",
            Value::map().with("protocolType", "WEBSOCKET").with(
                "corsConfiguration",
                Value::map()
                    .with("allowOrigins", vec!["*"])
                    .with("allowCredentials", true),
            ),
        )
        .await
        .expect("validated");
    let want = [
        ("aws.apigatewayv2.websocket-unsupported", "protocolType"),
        (
            "aws.apigatewayv2.cors-credentials",
            "corsConfiguration.allowOrigins",
        ),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
    assert_eq!(codes(&d), want);
    let err = h
        .create(
            TY,
            "ws",
            Value::map()
                .with("name", unique("ws"))
                .with("protocolType", "WEBSOCKET"),
        )
        .await
        .expect_err("not supported");
    assert_eq!(err.class, ErrorClass::BadInput);
    assert_eq!(
        err.path.map(|p| p.to_string()).as_deref(),
        Some("protocolType")
    );

    let schema = schema_of(&h, TY).await;
    assert_eq!(recreate_fields(&schema), ["protocolType"]);
    let computed: Vec<&str> = schema
        .fields()
        .iter()
        .filter(|(_, f)| f.is_computed())
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(computed, ["apiId", "apiEndpoint", "arn", "executionArn"]);
}

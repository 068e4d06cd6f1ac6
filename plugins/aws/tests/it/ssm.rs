//! `aws/ssm/parameter`.

use serde_json::json;
use trellis_plugin_sdk::{ErrorClass, Value};

use crate::dynamodb::{codes, covers, recreate_fields, schema_of};
use crate::support::{Moto, boto, current, harness, moto, unique};

const TY: &str = "aws/ssm/parameter";

fn get(m: &Moto, name: &str) -> Result<serde_json::Value, String> {
    boto(
        m,
        "ssm",
        "get_parameter",
        json!({"Name": name, "WithDecryption": true}),
    )
    .map(|p| p["Parameter"].clone())
}

fn meta(m: &Moto, name: &str) -> serde_json::Value {
    boto(
        m,
        "ssm",
        "describe_parameters",
        json!({"ParameterFilters": [{"Key": "Name", "Option": "Equals", "Values": [name]}]}),
    )
    .expect("described")["Parameters"][0]
        .clone()
}

fn tags_of(m: &Moto, name: &str) -> serde_json::Value {
    let out = boto(
        m,
        "ssm",
        "list_tags_for_resource",
        json!({"ResourceType": "Parameter", "ResourceId": name}),
    )
    .expect("tags");
    serde_json::Value::Object(
        out["TagList"]
            .as_array()
            .map(|l| {
                l.iter()
                    .map(|t| {
                        (
                            t["Key"].as_str().unwrap_or_default().to_owned(),
                            t["Value"].clone(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
    )
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
async fn a_parameter_is_created_read_updated_and_destroyed() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = format!("/{}/db/host", unique("orders"));
    let spec = Value::map()
        .with("name", name.as_str())
        .with("type", "String")
        .with("value", "db.internal")
        .with("description", "The database host")
        .with("allowedPattern", "^[a-z0-9.]+$")
        .with("tier", "Standard")
        .with("dataType", "text")
        .with("tags", tags(&[("team", "a"), ("cost", "1")]));
    let p = h.create(TY, "dbHost", spec.clone()).await.expect("created");
    assert_eq!(p.external_id, name);
    let got = get(m, &name).expect("exists");
    assert_eq!(
        (&got["Value"], &got["Type"]),
        (&json!("db.internal"), &json!("String"))
    );
    let md = meta(m, &name);
    assert_eq!(md["Description"], "The database host");
    assert_eq!(md["AllowedPattern"], "^[a-z0-9.]+$");
    let tg = tags_of(m, &name);
    assert_eq!((&tg["team"], &tg["cost"]), (&json!("a"), &json!("1")));
    assert_eq!(tg["trellis:resource"], "dbHost");
    // The ARN is built, without the name's leading slash.
    let arn = p.state.get("arn").and_then(Value::as_str).expect("arn");
    assert!(
        arn.starts_with("arn:aws:ssm:us-east-1:") && arn.ends_with(&format!(":parameter{name}")),
        "{arn}"
    );
    assert!(!arn.contains("parameter//"), "{arn}");
    assert_eq!(p.state.get("version"), Some(&Value::Int(1)));

    // Nothing changed: the spec reads back as applied.
    let read = h.read(&p).await.expect("read").expect("exists");
    covers(&spec, &read.spec).expect("reads back as applied");
    assert!(!read.spec.get("value").is_some_and(Value::is_sensitive));

    // Drift made outside: a new value.
    boto(
        m,
        "ssm",
        "put_parameter",
        json!({"Name": name, "Value": "other.internal", "Overwrite": true}),
    )
    .expect("overwritten");
    let read = h.read(&p).await.expect("read").expect("exists");
    assert_eq!(
        read.spec.get("value").and_then(Value::as_str),
        Some("other.internal")
    );
    assert_eq!(read.state.get("version"), Some(&Value::Int(2)));

    // Update in place: a new value, the description dropped, a tag changed and one gone.
    let spec2 = Value::map()
        .with("name", name.as_str())
        .with("value", "db2.internal")
        .with("tags", tags(&[("team", "b")]));
    let p2 = h.update(&p, spec2.clone()).await.expect("updated");
    assert_eq!(p2.external_id, name);
    assert_eq!(get(m, &name).expect("exists")["Value"], "db2.internal");
    let md = meta(m, &name);
    assert!(md.get("Description").is_none(), "{md}");
    let tg = tags_of(m, &name);
    assert_eq!(tg["team"], "b");
    assert!(tg.get("cost").is_none(), "{tg}");
    assert_eq!(p2.state.get("version"), Some(&Value::Int(3)));
    let read = h.read(&p2).await.expect("read").expect("exists");
    covers(&spec2, &read.spec).expect("reads back as updated");

    // An update that changes nothing writes no new version.
    let p3 = h.update(&p2, spec2.clone()).await.expect("updated");
    assert_eq!(p3.state.get("version"), Some(&Value::Int(3)));

    h.destroy(&p3).await.expect("destroyed");
    assert_eq!(get(m, &name).err().as_deref(), Some("ParameterNotFound"));
    // Destroying what is gone succeeds (a retry after a lost answer).
    h.destroy(&p3).await.expect("destroy is idempotent");
    assert!(h.read(&p3).await.expect("read").is_none());
}

#[tokio::test]
async fn a_secure_string_is_read_back_as_a_secret() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("db-password");
    let spec = Value::map()
        .with("name", name.as_str())
        .with("type", "SecureString")
        .with("value", Value::sensitive("s3cr3t-value"));
    let p = h
        .create(TY, "dbPassword", spec.clone())
        .await
        .expect("created");
    let got = get(m, &name).expect("exists");
    assert_eq!(
        (&got["Value"], &got["Type"]),
        (&json!("s3cr3t-value"), &json!("SecureString"))
    );
    assert!(!p.state.to_string().contains("s3cr3t"), "{}", p.state);
    let read = h.read(&p).await.expect("read").expect("exists");
    let value = read.spec.get("value").expect("a value");
    assert!(value.is_sensitive(), "{value:?}");
    assert_eq!(value.as_str(), Some("s3cr3t-value"));
    covers(&spec, &read.spec).expect("reads back as applied");
    assert!(!format!("{:?}", read.spec).contains("s3cr3t"));
    h.destroy(&p).await.expect("destroyed");
}

#[tokio::test]
async fn a_retried_create_adopts_its_own_parameter_and_refuses_anyone_elses() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("retry");
    let spec = Value::map().with("name", name.as_str()).with("value", "v1");
    let first = h.create(TY, "retry", spec.clone()).await.expect("created");
    // The engine lost the answer and retries: the same parameter, no new version.
    let again = h.create(TY, "retry", spec.clone()).await.expect("adopted");
    assert_eq!(again.external_id, first.external_id);
    assert_eq!(again.state.get("version"), Some(&Value::Int(1)));
    let mut unrecorded = first.clone();
    unrecorded.external_id.clear();
    let found = h.read(&unrecorded).await.expect("read").expect("found");
    assert_eq!(found.external_id.as_deref(), Some(name.as_str()));

    let err = h
        .create(TY, "other", spec.clone())
        .await
        .expect_err("taken");
    assert_eq!(err.class, ErrorClass::Conflict, "{err:?}");
    assert_eq!(err.path.map(|p| p.to_string()).as_deref(), Some("name"));
    assert_eq!(get(m, &name).expect("exists")["Value"], "v1");

    let outside = unique("outside");
    boto(
        m,
        "ssm",
        "put_parameter",
        json!({"Name": outside, "Value": "theirs", "Type": "String"}),
    )
    .expect("made outside");
    let outside_spec = Value::map()
        .with("name", outside.as_str())
        .with("value", "mine");
    let err = h
        .create(TY, "outside", outside_spec.clone())
        .await
        .expect_err("not ours");
    assert_eq!(err.class, ErrorClass::Conflict);
    assert!(
        err.message.contains("not created by Trellis"),
        "{}",
        err.message
    );
    let never = current(TY, "outside", &Default::default(), outside_spec);
    assert!(h.read(&never).await.expect("read").is_none());
    h.destroy(&never).await.expect("nothing of ours to destroy");
    assert_eq!(get(m, &outside).expect("still there")["Value"], "theirs");

    h.destroy(&first).await.expect("destroyed");
}

#[tokio::test]
async fn validation_names_the_field_and_the_schema_marks_replacements() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let d = h
        .validate(
            TY,
            "p",
            Value::map()
                .with("name", "orders/db")
                .with("type", "StringList")
                .with("value", "x".repeat(5000))
                .with("dataType", "aws:ec2:image"),
        )
        .await
        .expect("validated");
    let want = [
        ("aws.ssm.invalid-name", "name"),
        ("aws.ssm.value-too-long", "value"),
        ("aws.ssm.data-type", "dataType"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
    assert_eq!(codes(&d), want);
    let d = h
        .validate(
            TY,
            "p",
            Value::map().with("name", "aws-reserved").with("value", "x"),
        )
        .await
        .expect("validated");
    assert_eq!(
        codes(&d),
        vec![("aws.ssm.invalid-name".to_owned(), "name".to_owned())]
    );

    let schema = schema_of(&h, TY).await;
    assert_eq!(recreate_fields(&schema), ["name"]);
    assert_eq!(
        codes(&schema.check(&Value::map().with("name", "n").with("type", "Secret"))),
        vec![
            ("schema.not-allowed".to_owned(), "type".to_owned()),
            ("schema.required".to_owned(), "value".to_owned()),
        ]
    );
}

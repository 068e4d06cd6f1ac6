//! `aws/secretsmanager/secret`.

use serde_json::json;
use trellis_plugin_sdk::{ErrorClass, Value};

use crate::dynamodb::{codes, covers, recreate_fields, schema_of};
use crate::support::{Moto, boto, current, harness, moto, unique};

const TY: &str = "aws/secretsmanager/secret";

fn describe(m: &Moto, id: &str) -> Result<serde_json::Value, String> {
    boto(
        m,
        "secretsmanager",
        "describe_secret",
        json!({"SecretId": id}),
    )
}

fn value(m: &Moto, id: &str) -> String {
    boto(
        m,
        "secretsmanager",
        "get_secret_value",
        json!({"SecretId": id}),
    )
    .expect("a value")["SecretString"]
        .as_str()
        .expect("a string")
        .to_owned()
}

fn tags_of(d: &serde_json::Value) -> serde_json::Value {
    serde_json::Value::Object(
        d["Tags"]
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
async fn a_secret_is_created_read_updated_and_destroyed() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("ordersApi");
    let spec = Value::map()
        .with("secretName", name.as_str())
        .with("description", "Orders database")
        .with("secretString", Value::sensitive("pw-one"))
        .with("tags", tags(&[("team", "a"), ("cost", "1")]));
    let s = h
        .create(TY, "ordersSecrets", spec.clone())
        .await
        .expect("created");
    let arn = s
        .state
        .get("arn")
        .and_then(Value::as_str)
        .expect("arn")
        .to_owned();
    assert_eq!(s.external_id, arn);
    assert_eq!(
        s.state.get("id").and_then(Value::as_str),
        Some(arn.as_str())
    );
    assert!(
        arn.starts_with("arn:aws:secretsmanager:us-east-1:"),
        "{arn}"
    );
    let d = describe(m, &name).expect("exists");
    assert_eq!((&d["Name"], &d["ARN"]), (&json!(name), &json!(arn)));
    assert_eq!(d["Description"], "Orders database");
    let tg = tags_of(&d);
    assert_eq!((&tg["team"], &tg["cost"]), (&json!("a"), &json!("1")));
    assert_eq!(tg["trellis:resource"], "ordersSecrets");
    assert_eq!(value(m, &name), "pw-one");
    assert!(!s.state.to_string().contains("pw-one"));

    // Nothing changed: the spec reads back as applied, the value as a secret.
    let read = h.read(&s).await.expect("read").expect("exists");
    covers(&spec, &read.spec).expect("reads back as applied");
    let v = read
        .spec
        .get("secretString")
        .expect("the value, as it was set");
    assert!(v.is_sensitive());
    assert!(!format!("{:?}", read.spec).contains("pw-one"));

    // Drift made outside: a new value.
    boto(
        m,
        "secretsmanager",
        "put_secret_value",
        json!({"SecretId": name, "SecretString": "changed-by-hand"}),
    )
    .expect("changed");
    let read = h.read(&s).await.expect("read").expect("exists");
    assert_eq!(
        read.spec.get("secretString").and_then(Value::as_str),
        Some("changed-by-hand")
    );
    assert!(covers(&spec, &read.spec).is_err());

    // Update in place: a new value and description, a tag changed and one gone.
    let spec2 = Value::map()
        .with("secretName", name.as_str())
        .with("description", "Orders database, rotated")
        .with("secretString", Value::sensitive("pw-two"))
        .with("tags", tags(&[("team", "b")]));
    let s2 = h.update(&s, spec2.clone()).await.expect("updated");
    assert_eq!(s2.external_id, arn);
    assert_eq!(value(m, &name), "pw-two");
    let d = describe(m, &name).expect("exists");
    assert_eq!(d["Description"], "Orders database, rotated");
    let tg = tags_of(&d);
    assert_eq!(tg["team"], "b");
    assert!(tg.get("cost").is_none(), "{tg}");
    let read = h.read(&s2).await.expect("read").expect("exists");
    covers(&spec2, &read.spec).expect("reads back as updated");

    // Without recoveryWindowInDays the secret goes at once, so its name is free again.
    h.destroy(&s2).await.expect("destroyed");
    assert_eq!(
        describe(m, &name).err().as_deref(),
        Some("ResourceNotFoundException")
    );
    h.destroy(&s2).await.expect("destroy is idempotent");
    assert!(h.read(&s2).await.expect("read").is_none());
    let again = h
        .create(TY, "ordersSecrets", spec2)
        .await
        .expect("the name is free");
    h.destroy(&again).await.expect("destroyed");
}

#[tokio::test]
async fn a_generated_value_is_made_at_create_and_not_read_back() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("generated");
    let generate = |len: i64| {
        Value::map()
            .with("passwordLength", len)
            .with("excludePunctuation", true)
            .with("secretStringTemplate", r#"{"username": "orders"}"#)
            .with("generateStringKey", "password")
    };
    let spec = Value::map()
        .with("secretName", name.as_str())
        .with("generateSecretString", generate(24));
    let s = h
        .create(TY, "generated", spec.clone())
        .await
        .expect("created");
    let doc: serde_json::Value = serde_json::from_str(&value(m, &name)).expect("JSON");
    assert_eq!(doc["username"], "orders");
    let password = doc["password"].as_str().expect("a password").to_owned();
    assert_eq!(password.len(), 24);
    assert!(
        password.chars().all(char::is_alphanumeric),
        "no punctuation"
    );
    assert!(!s.state.to_string().contains(&password));

    let read = h.read(&s).await.expect("read").expect("exists");
    assert!(read.spec.get("secretString").is_none(), "{:?}", read.spec);
    covers(&spec, &read.spec).expect("reads back as applied");

    // Another field changes: the generated value stays.
    let spec2 = spec.clone().with("description", "generated");
    let s2 = h.update(&s, spec2.clone()).await.expect("updated");
    let doc: serde_json::Value = serde_json::from_str(&value(m, &name)).expect("JSON");
    assert_eq!(doc["password"].as_str(), Some(password.as_str()));
    // The generator's settings change: a new value.
    let spec3 = spec2.with("generateSecretString", generate(30));
    let s3 = h.update(&s2, spec3).await.expect("updated");
    let doc: serde_json::Value = serde_json::from_str(&value(m, &name)).expect("JSON");
    assert_eq!(doc["password"].as_str().map(str::len), Some(30));
    h.destroy(&s3).await.expect("destroyed");
}

#[tokio::test]
async fn a_recovery_window_schedules_deletion_and_a_recreate_restores() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("windowed");
    let spec = Value::map()
        .with("secretName", name.as_str())
        .with("secretString", Value::sensitive("kept"))
        .with("recoveryWindowInDays", 7);
    let s = h
        .create(TY, "windowed", spec.clone())
        .await
        .expect("created");
    h.destroy(&s).await.expect("scheduled for deletion");
    let d = describe(m, &name).expect("still there, scheduled");
    assert!(!d["DeletedDate"].is_null(), "{d}");
    assert!(
        h.read(&s).await.expect("read").is_none(),
        "scheduled is gone"
    );
    h.destroy(&s).await.expect("destroy is idempotent");

    // The same resource deployed again: its own secret comes back.
    let back = h
        .create(TY, "windowed", spec.clone())
        .await
        .expect("restored");
    assert_eq!(back.external_id, s.external_id);
    assert!(describe(m, &name).expect("exists")["DeletedDate"].is_null());
    assert_eq!(value(m, &name), "kept");
    let read = h.read(&back).await.expect("read").expect("exists");
    covers(&spec, &read.spec).expect("reads back as applied");

    let forced = current(
        TY,
        "windowed",
        &back,
        Value::map().with("secretName", name.as_str()),
    );
    h.destroy(&forced).await.expect("destroyed");
    assert_eq!(
        describe(m, &name).err().as_deref(),
        Some("ResourceNotFoundException")
    );
}

#[tokio::test]
async fn a_retried_create_adopts_its_own_secret_and_refuses_anyone_elses() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("retry");
    let spec = Value::map()
        .with("secretName", name.as_str())
        .with("secretString", Value::sensitive("v1"));
    let first = h.create(TY, "retry", spec.clone()).await.expect("created");
    let again = h.create(TY, "retry", spec.clone()).await.expect("adopted");
    assert_eq!(again.external_id, first.external_id);
    let versions = boto(
        m,
        "secretsmanager",
        "list_secret_version_ids",
        json!({"SecretId": name}),
    )
    .expect("versions");
    assert_eq!(versions["Versions"].as_array().map(Vec::len), Some(1));
    let mut unrecorded = first.clone();
    unrecorded.external_id.clear();
    let found = h.read(&unrecorded).await.expect("read").expect("found");
    assert_eq!(
        found.external_id.as_deref(),
        Some(first.external_id.as_str())
    );

    let err = h
        .create(TY, "other", spec.clone())
        .await
        .expect_err("taken");
    assert_eq!(err.class, ErrorClass::Conflict, "{err:?}");
    assert_eq!(
        err.path.map(|p| p.to_string()).as_deref(),
        Some("secretName")
    );
    assert!(!err.message.contains("v1"), "{}", err.message);

    let outside = unique("outside");
    boto(
        m,
        "secretsmanager",
        "create_secret",
        json!({"Name": outside, "SecretString": "theirs"}),
    )
    .expect("made outside");
    let outside_spec = Value::map().with("secretName", outside.as_str());
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
    assert_eq!(value(m, &outside), "theirs");

    h.destroy(&first).await.expect("destroyed");
}

#[tokio::test]
async fn validation_names_the_field_and_the_schema_marks_replacements() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let d = h
        .validate(
            TY,
            "s",
            Value::map()
                .with("secretName", "orders api")
                .with("secretString", Value::sensitive("x"))
                .with(
                    "generateSecretString",
                    Value::map().with("generateStringKey", "password"),
                )
                .with("recoveryWindowInDays", 31),
        )
        .await
        .expect("validated");
    let want = [
        ("aws.secretsmanager.invalid-name", "secretName"),
        ("aws.secretsmanager.value-conflict", "generateSecretString"),
        (
            "aws.secretsmanager.template",
            "generateSecretString.secretStringTemplate",
        ),
        ("aws.out-of-range", "recoveryWindowInDays"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
    assert_eq!(codes(&d), want);
    // The specification's example validates.
    let d = h
        .validate(
            TY,
            "ordersSecrets",
            Value::map().with("secretName", "ordersApi"),
        )
        .await
        .expect("validated");
    assert!(d.is_empty(), "{d:?}");

    let schema = schema_of(&h, TY).await;
    assert_eq!(recreate_fields(&schema), ["secretName"]);
    assert!(
        schema
            .get_field("secretString")
            .is_some_and(|f| f.is_sensitive())
    );
    let computed: Vec<&str> = schema
        .fields()
        .iter()
        .filter(|(_, f)| f.is_computed())
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(computed, ["arn", "id"]);
}

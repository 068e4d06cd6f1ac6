//! `aws/sns/topic`.

use serde_json::json;
use trellis_plugin_sdk::testing::Harness;
use trellis_plugin_sdk::{ErrorClass, Value};

use crate::support::{Moto, boto, harness, moto, unique};

const TYPE: &str = "aws/sns/topic";

fn attrs(m: &Moto, arn: &str) -> serde_json::Value {
    boto(m, "sns", "get_topic_attributes", json!({"TopicArn": arn})).expect("topic exists")
        ["Attributes"]
        .clone()
}

fn tags(m: &Moto, arn: &str) -> Vec<(String, String)> {
    let out = boto(
        m,
        "sns",
        "list_tags_for_resource",
        json!({"ResourceArn": arn}),
    )
    .expect("tags");
    let mut tags: Vec<(String, String)> = out["Tags"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|t| {
            (
                t["Key"].as_str().unwrap_or_default().to_owned(),
                t["Value"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    tags.sort();
    tags
}

fn tag(key: &str, value: &str) -> Value {
    Value::map().with("key", key).with("value", value)
}

/// The fields of `ty` whose change replaces the resource, as the manifest says.
async fn recreate_fields(h: &Harness, ty: &str) -> Vec<String> {
    let m = h.manifest().await.expect("manifest");
    let t = m
        .resource_types
        .iter()
        .find(|t| t.r#type == ty)
        .expect("type in the manifest");
    t.spec_schema
        .as_ref()
        .expect("schema")
        .fields
        .iter()
        .filter(|f| f.must_recreate)
        .map(|f| f.name.clone())
        .collect()
}

#[tokio::test]
async fn a_topic_is_created_read_updated_and_destroyed() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("orders");
    let spec = Value::map()
        .with("topicName", name.as_str())
        .with("displayName", "Orders")
        .with("tags", Value::List(vec![tag("team", "a")]));
    let t = h
        .create(TYPE, "orders", spec.clone())
        .await
        .expect("created");
    let arn = t.external_id.clone();
    assert!(
        arn.starts_with("arn:aws:sns:us-east-1:") && arn.ends_with(&format!(":{name}")),
        "{arn}"
    );
    assert_eq!(
        t.state.get("arn").and_then(Value::as_str),
        Some(arn.as_str())
    );
    assert_eq!(
        t.state.get("topicArn").and_then(Value::as_str),
        Some(arn.as_str())
    );
    assert_eq!(attrs(m, &arn)["DisplayName"], "Orders");
    let tg = tags(m, &arn);
    assert!(tg.contains(&("team".to_owned(), "a".to_owned())), "{tg:?}");
    assert!(
        tg.contains(&("trellis:resource".to_owned(), "orders".to_owned())),
        "{tg:?}"
    );

    // Read: nothing changed, so the spec reads back as applied.
    let read = h.read(&t).await.expect("read").expect("exists");
    for field in ["topicName", "displayName", "tags"] {
        assert_eq!(read.spec.get(field), spec.get(field), "{field}");
    }
    assert_eq!(read.external_id.as_deref(), Some(arn.as_str()));

    // Drift made outside: a second client changes the display name; read reports it.
    boto(
        m,
        "sns",
        "set_topic_attributes",
        json!({"TopicArn": arn, "AttributeName": "DisplayName", "AttributeValue": "Changed"}),
    )
    .expect("set");
    let read = h.read(&t).await.expect("read").expect("exists");
    assert_eq!(
        read.spec.get("displayName").and_then(Value::as_str),
        Some("Changed")
    );

    // Update in place: the display name dropped (back to none), a KMS key set, tags changed.
    let spec2 = Value::map()
        .with("topicName", name.as_str())
        .with("kmsMasterKeyId", "alias/aws/sns")
        .with("tags", Value::List(vec![tag("team", "b")]));
    let t2 = h.update(&t, spec2.clone()).await.expect("updated");
    assert_eq!(t2.external_id, arn);
    let a = attrs(m, &arn);
    assert_eq!(a["DisplayName"], "");
    assert_eq!(a["KmsMasterKeyId"], "alias/aws/sns");
    let tg = tags(m, &arn);
    assert!(tg.contains(&("team".to_owned(), "b".to_owned())), "{tg:?}");
    assert!(!tg.contains(&("team".to_owned(), "a".to_owned())), "{tg:?}");
    let read = h.read(&t2).await.expect("read").expect("exists");
    assert_eq!(read.spec.get("kmsMasterKeyId"), spec2.get("kmsMasterKeyId"));
    assert_eq!(read.spec.get("displayName"), None);

    h.destroy(&t2).await.expect("destroyed");
    assert_eq!(
        boto(m, "sns", "get_topic_attributes", json!({"TopicArn": arn}))
            .err()
            .as_deref(),
        Some("NotFound")
    );
    // Destroying what is gone succeeds (a retry after a lost answer).
    h.destroy(&t2).await.expect("destroy is idempotent");
    assert!(h.read(&t2).await.expect("read").is_none());
}

#[tokio::test]
async fn a_retried_create_adopts_its_own_topic_and_refuses_anyone_elses() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("retry");
    let spec = Value::map().with("topicName", name.as_str());
    let first = h
        .create(TYPE, "retry", spec.clone())
        .await
        .expect("created");
    // The engine lost the answer and retries: the same topic, no error.
    let again = h
        .create(TYPE, "retry", spec.clone())
        .await
        .expect("adopted");
    assert_eq!(again.external_id, first.external_id);
    // A crash before the id was recorded: read by name finds it.
    let mut unrecorded = first.clone();
    unrecorded.external_id.clear();
    let found = h.read(&unrecorded).await.expect("read").expect("found");
    assert_eq!(
        found.external_id.as_deref(),
        Some(first.external_id.as_str())
    );

    // Another resource of the same name: CONFLICT, nothing taken over. CreateTopic alone
    // would have answered with the existing ARN.
    let err = h
        .create(TYPE, "other", spec.clone())
        .await
        .expect_err("taken");
    assert_eq!(err.class, ErrorClass::Conflict, "{err:?}");
    assert!(
        err.message.contains("belongs to resource `retry`"),
        "{}",
        err.message
    );
    // That other resource, never recorded, neither reads nor destroys the topic.
    let mut other = unrecorded.clone();
    other.name = "other".to_owned();
    assert!(h.read(&other).await.expect("read").is_none());
    h.destroy(&other).await.expect("nothing of ours to destroy");
    attrs(m, &first.external_id);

    // One made outside Trellis: CONFLICT too.
    let outside = unique("outside");
    boto(m, "sns", "create_topic", json!({"Name": outside})).expect("made outside");
    let err = h
        .create(
            TYPE,
            "outside",
            Value::map().with("topicName", outside.as_str()),
        )
        .await
        .expect_err("not ours");
    assert_eq!(err.class, ErrorClass::Conflict);
    assert!(
        err.message.contains("not created by Trellis"),
        "{}",
        err.message
    );
    assert_eq!(
        err.path.map(|p| p.to_string()).as_deref(),
        Some("topicName")
    );
    h.destroy(&first).await.expect("destroyed");
}

#[tokio::test]
async fn fifo_topics_and_derived_names() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let spec = Value::map()
        .with("fifoTopic", true)
        .with("contentBasedDeduplication", true);
    let resource = unique("events");
    let t = h
        .create(TYPE, &resource, spec.clone())
        .await
        .expect("created");
    assert!(t.external_id.ends_with(".fifo"), "{}", t.external_id);
    assert!(
        t.external_id.contains(&format!(":{resource}-")),
        "{}",
        t.external_id
    );
    let a = attrs(m, &t.external_id);
    assert_eq!(a["FifoTopic"], "true");
    assert_eq!(a["ContentBasedDeduplication"], "true");
    let read = h.read(&t).await.expect("read").expect("exists");
    assert_eq!(read.spec.get("fifoTopic"), Some(&Value::Bool(true)));
    assert_eq!(
        read.spec.get("contentBasedDeduplication"),
        Some(&Value::Bool(true))
    );

    let spec2 = spec.clone().with("contentBasedDeduplication", false);
    let t2 = h.update(&t, spec2).await.expect("updated");
    assert_eq!(
        attrs(m, &t2.external_id)["ContentBasedDeduplication"],
        "false"
    );
    h.destroy(&t2).await.expect("destroyed");
}

#[tokio::test]
async fn the_name_and_fifo_are_replaced_not_updated() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    assert_eq!(recreate_fields(&h, TYPE).await, ["topicName", "fifoTopic"]);
}

#[tokio::test]
async fn validation_names_the_field() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let codes = |d: Vec<trellis_plugin_sdk::Diagnostic>| -> Vec<(String, String)> {
        d.iter()
            .map(|d| {
                (
                    d.code.clone(),
                    d.path.as_ref().map(ToString::to_string).unwrap_or_default(),
                )
            })
            .collect()
    };
    let d = h
        .validate(
            TYPE,
            "t",
            Value::map()
                .with("topicName", "bad name!")
                .with("contentBasedDeduplication", true),
        )
        .await
        .expect("validated");
    assert_eq!(
        codes(d),
        vec![
            ("aws.sns.invalid-name".to_owned(), "topicName".to_owned()),
            (
                "aws.sns.fifo-only".to_owned(),
                "contentBasedDeduplication".to_owned()
            ),
        ]
    );
    let d = h
        .validate(
            TYPE,
            "t",
            Value::map()
                .with("topicName", "jobs")
                .with("fifoTopic", true),
        )
        .await
        .expect("validated");
    assert_eq!(
        codes(d),
        vec![("aws.sns.fifo-name".to_owned(), "topicName".to_owned())]
    );
    let d = h
        .validate(
            TYPE,
            "t",
            Value::map()
                .with("topicName", "jobs.fifo")
                .with("fifoTopic", true)
                .with("contentBasedDeduplication", true),
        )
        .await
        .expect("validated");
    assert!(d.is_empty(), "{d:?}");
}

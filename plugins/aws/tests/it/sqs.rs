//! `aws/sqs/queue`.

use serde_json::json;
use trellis_plugin_sdk::{ErrorClass, Value};

use crate::support::{boto, harness, moto, unique};

fn attrs(m: &crate::support::Moto, url: &str) -> serde_json::Value {
    boto(
        m,
        "sqs",
        "get_queue_attributes",
        json!({"QueueUrl": url, "AttributeNames": ["All"]}),
    )
    .expect("queue exists")["Attributes"]
        .clone()
}

#[tokio::test]
async fn a_queue_is_created_read_updated_and_destroyed() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("orders");
    let spec = Value::map()
        .with("queueName", name.as_str())
        .with("visibilityTimeout", 45)
        .with(
            "tags",
            Value::List(vec![Value::map().with("key", "team").with("value", "a")]),
        );
    let q = h
        .create("aws/sqs/queue", "orders", spec.clone())
        .await
        .expect("created");
    assert!(q.external_id.ends_with(&name), "{}", q.external_id);
    let arn = q
        .state
        .get("arn")
        .and_then(Value::as_str)
        .expect("arn")
        .to_owned();
    assert!(
        arn.starts_with("arn:aws:sqs:us-east-1:") && arn.ends_with(&name),
        "{arn}"
    );
    assert_eq!(attrs(m, &q.external_id)["VisibilityTimeout"], "45");
    let tags = boto(
        m,
        "sqs",
        "list_queue_tags",
        json!({"QueueUrl": q.external_id}),
    )
    .expect("tags");
    assert_eq!(tags["Tags"]["team"], "a");
    assert_eq!(tags["Tags"]["trellis:resource"], "orders");

    // Read: nothing changed, so the spec reads back as applied.
    let read = h.read(&q).await.expect("read").expect("exists");
    assert_eq!(read.spec.get("visibilityTimeout"), Some(&Value::Int(45)));
    assert_eq!(read.spec.get("tags"), spec.get("tags"));

    // Drift made outside: a second client changes the timeout; read reports it.
    boto(
        m,
        "sqs",
        "set_queue_attributes",
        json!({"QueueUrl": q.external_id, "Attributes": {"VisibilityTimeout": "99"}}),
    )
    .expect("set");
    let read = h.read(&q).await.expect("read").expect("exists");
    assert_eq!(read.spec.get("visibilityTimeout"), Some(&Value::Int(99)));

    // Update in place: a new delay, the timeout dropped (back to AWS's default), a tag removed.
    let spec2 = Value::map()
        .with("queueName", name.as_str())
        .with("delaySeconds", 5);
    let q2 = h.update(&q, spec2).await.expect("updated");
    assert_eq!(q2.external_id, q.external_id);
    let a = attrs(m, &q.external_id);
    assert_eq!(
        (a["DelaySeconds"].as_str(), a["VisibilityTimeout"].as_str()),
        (Some("5"), Some("30"))
    );
    let tags = boto(
        m,
        "sqs",
        "list_queue_tags",
        json!({"QueueUrl": q.external_id}),
    )
    .expect("tags");
    assert!(tags["Tags"].get("team").is_none(), "{tags}");

    h.destroy(&q2).await.expect("destroyed");
    assert_eq!(
        boto(m, "sqs", "get_queue_url", json!({"QueueName": name}))
            .err()
            .as_deref(),
        Some("AWS.SimpleQueueService.NonExistentQueue")
    );
    // Destroying what is gone succeeds (a retry after a lost answer).
    h.destroy(&q2).await.expect("destroy is idempotent");
    assert!(h.read(&q2).await.expect("read").is_none());
}

#[tokio::test]
async fn a_retried_create_adopts_its_own_queue_and_refuses_anyone_elses() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("retry");
    let spec = Value::map().with("queueName", name.as_str());
    let first = h
        .create("aws/sqs/queue", "retry", spec.clone())
        .await
        .expect("created");
    // The engine lost the answer and retries: the same queue, no error.
    let again = h
        .create("aws/sqs/queue", "retry", spec.clone())
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

    // Another resource of the same name: CONFLICT, nothing taken over.
    let err = h
        .create("aws/sqs/queue", "other", spec.clone())
        .await
        .expect_err("taken");
    assert_eq!(err.class, ErrorClass::Conflict, "{err:?}");
    assert!(
        err.message.contains("belongs to resource `retry`"),
        "{}",
        err.message
    );
    // One made outside Trellis: CONFLICT too.
    let outside = unique("outside");
    boto(m, "sqs", "create_queue", json!({"QueueName": outside})).expect("made outside");
    let err = h
        .create(
            "aws/sqs/queue",
            "outside",
            Value::map().with("queueName", outside.as_str()),
        )
        .await
        .expect_err("not ours");
    assert_eq!(err.class, ErrorClass::Conflict);
    assert!(
        err.message.contains("not created by Trellis"),
        "{}",
        err.message
    );
    h.destroy(&first).await.expect("destroyed");
}

#[tokio::test]
async fn fifo_queues_and_derived_names() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let spec = Value::map()
        .with("fifoQueue", true)
        .with("contentBasedDeduplication", true);
    let resource = unique("jobs");
    let q = h
        .create("aws/sqs/queue", &resource, spec)
        .await
        .expect("created");
    assert!(q.external_id.ends_with(".fifo"), "{}", q.external_id);
    assert!(
        q.external_id.contains(&format!("/{resource}-")),
        "{}",
        q.external_id
    );
    let a = attrs(m, &q.external_id);
    assert_eq!(a["FifoQueue"], "true");
    h.destroy(&q).await.expect("destroyed");
}

#[tokio::test]
async fn validation_names_the_field() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let d = h
        .validate(
            "aws/sqs/queue",
            "q",
            Value::map()
                .with("queueName", "jobs")
                .with("fifoQueue", true)
                .with("visibilityTimeout", 50_000),
        )
        .await
        .expect("validated");
    let got: Vec<(String, String)> = d
        .iter()
        .map(|d| {
            (
                d.code.clone(),
                d.path.as_ref().map(ToString::to_string).unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("aws.sqs.fifo-name".to_owned(), "queueName".to_owned()),
            (
                "aws.out-of-range".to_owned(),
                "visibilityTimeout".to_owned()
            ),
        ]
    );
}

#[tokio::test]
async fn throttling_and_5xx_are_transient_and_carry_aws_codes() {
    let Some(m) = moto() else { return };
    let proxy = crate::support::moto::FaultProxy::start(m);
    let h = trellis_plugin_sdk::testing::Harness::provider(
        trellis_provider_aws::AwsProvider::default(),
    )
    .await
    .expect("harness")
    .with_config(
        Value::map()
            .with("region", "us-east-1")
            .with("endpoint", proxy.endpoint.as_str()),
    );
    let spec = Value::map().with("queueName", unique("throttled").as_str());
    proxy.fail("GetQueueUrl", 400, "ThrottlingException", 1);
    let err = h
        .create("aws/sqs/queue", "t", spec.clone())
        .await
        .expect_err("throttled");
    assert_eq!(err.class, ErrorClass::Transient, "{err:?}");
    assert!(
        err.message.contains("ThrottlingException"),
        "{}",
        err.message
    );
    proxy.fail("CreateQueue", 500, "InternalFailure", 1);
    let err = h
        .create("aws/sqs/queue", "t", spec.clone())
        .await
        .expect_err("5xx");
    assert_eq!(err.class, ErrorClass::Transient, "{err:?}");
    // The faults are used up: the next attempt succeeds, and one queue exists.
    let q = h.create("aws/sqs/queue", "t", spec).await.expect("created");
    assert_eq!(proxy.calls("CreateQueue"), 2);
    h.destroy(&q).await.expect("destroyed");
}

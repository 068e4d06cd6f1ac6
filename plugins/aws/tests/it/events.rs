//! `aws/events/rule`.

use serde_json::json;
use trellis_plugin_sdk::testing::Harness;
use trellis_plugin_sdk::{ErrorClass, Value};

use crate::support::{Moto, boto, harness, moto, unique};

const TYPE: &str = "aws/events/rule";

fn describe(m: &Moto, name: &str) -> serde_json::Value {
    boto(m, "events", "describe_rule", json!({"Name": name})).expect("rule exists")
}

fn tags(m: &Moto, arn: &str) -> Vec<(String, String)> {
    let out = boto(
        m,
        "events",
        "list_tags_for_resource",
        json!({"ResourceARN": arn}),
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

fn strings(items: &[&str]) -> Value {
    Value::List(items.iter().map(|s| Value::from(*s)).collect())
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
async fn a_rule_is_created_read_updated_and_destroyed() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("order-created");
    let pattern = Value::map()
        .with("source", strings(&["app.orders"]))
        .with("detail-type", strings(&["OrderCreated"]));
    let spec = Value::map()
        .with("name", name.as_str())
        .with("description", "New orders")
        .with("eventPattern", pattern.clone())
        .with("state", "ENABLED")
        .with("tags", Value::List(vec![tag("team", "a")]));
    let r = h
        .create(TYPE, "orderCreated", spec.clone())
        .await
        .expect("created");
    let arn = r.external_id.clone();
    assert!(
        arn.starts_with("arn:aws:events:us-east-1:") && arn.ends_with(&format!(":rule/{name}")),
        "{arn}"
    );
    assert_eq!(
        r.state.get("arn").and_then(Value::as_str),
        Some(arn.as_str())
    );
    let d = describe(m, &name);
    assert_eq!(d["Description"], "New orders");
    assert_eq!(d["State"], "ENABLED");
    let stored: serde_json::Value =
        serde_json::from_str(d["EventPattern"].as_str().expect("pattern text")).expect("JSON");
    assert_eq!(stored, pattern.to_json());
    let tg = tags(m, &arn);
    assert!(tg.contains(&("team".to_owned(), "a".to_owned())), "{tg:?}");
    assert!(
        tg.contains(&("trellis:resource".to_owned(), "orderCreated".to_owned())),
        "{tg:?}"
    );

    // Read: nothing changed, so the spec reads back as applied.
    let read = h.read(&r).await.expect("read").expect("exists");
    for field in ["name", "description", "eventPattern", "state", "tags"] {
        assert_eq!(read.spec.get(field), spec.get(field), "{field}");
    }
    assert_eq!(
        read.spec.get("eventBusName").and_then(Value::as_str),
        Some("default")
    );

    // The same pattern written with its keys in another order is not drift.
    boto(
        m,
        "events",
        "put_rule",
        json!({
            "Name": name,
            "Description": "New orders",
            "State": "ENABLED",
            "EventPattern": r#"{"detail-type": ["OrderCreated"], "source": ["app.orders"]}"#,
        }),
    )
    .expect("rewritten");
    let read = h.read(&r).await.expect("read").expect("exists");
    assert_eq!(read.spec.get("eventPattern"), Some(&pattern));
    // In the blueprint's key order, too.
    let keys: Vec<&str> = read
        .spec
        .get("eventPattern")
        .and_then(Value::as_map)
        .expect("a map")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["source", "detail-type"]);

    // Drift made outside: the rule disabled, the pattern changed; read reports both.
    boto(m, "events", "disable_rule", json!({"Name": name})).expect("disabled");
    let read = h.read(&r).await.expect("read").expect("exists");
    assert_eq!(
        read.spec.get("state").and_then(Value::as_str),
        Some("DISABLED")
    );
    boto(
        m,
        "events",
        "put_rule",
        json!({"Name": name, "EventPattern": r#"{"source": ["someone.else"]}"#}),
    )
    .expect("changed");
    let read = h.read(&r).await.expect("read").expect("exists");
    assert_eq!(
        read.spec.get("eventPattern"),
        Some(&Value::map().with("source", strings(&["someone.else"])))
    );

    // Update in place: a schedule instead of the pattern, the description dropped, tags changed.
    let spec2 = Value::map()
        .with("name", name.as_str())
        .with("scheduleExpression", "rate(5 minutes)")
        .with("tags", Value::List(vec![tag("team", "b")]));
    let r2 = h.update(&r, spec2.clone()).await.expect("updated");
    assert_eq!(r2.external_id, arn);
    let d = describe(m, &name);
    assert_eq!(d["ScheduleExpression"], "rate(5 minutes)");
    assert_eq!(d["State"], "ENABLED");
    assert!(d.get("EventPattern").is_none(), "{d}");
    assert!(d.get("Description").is_none(), "{d}");
    let tg = tags(m, &arn);
    assert!(tg.contains(&("team".to_owned(), "b".to_owned())), "{tg:?}");
    assert!(!tg.contains(&("team".to_owned(), "a".to_owned())), "{tg:?}");
    let read = h.read(&r2).await.expect("read").expect("exists");
    assert_eq!(
        read.spec.get("scheduleExpression"),
        spec2.get("scheduleExpression")
    );

    // Targets a link (or a person) added: destroy removes them first.
    for batch in [0..7, 7..12] {
        let targets: Vec<serde_json::Value> = batch
            .map(|i| json!({"Id": format!("t{i}"), "Arn": format!("arn:aws:sqs:us-east-1:123456789012:q{i}")}))
            .collect();
        boto(
            m,
            "events",
            "put_targets",
            json!({"Rule": name, "Targets": targets}),
        )
        .expect("targets added");
    }
    h.destroy(&r2).await.expect("destroyed");
    assert_eq!(
        boto(m, "events", "describe_rule", json!({"Name": name}))
            .err()
            .as_deref(),
        Some("ResourceNotFoundException")
    );
    // Destroying what is gone succeeds (a retry after a lost answer).
    h.destroy(&r2).await.expect("destroy is idempotent");
    assert!(h.read(&r2).await.expect("read").is_none());
}

#[tokio::test]
async fn a_retried_create_adopts_its_own_rule_and_refuses_anyone_elses() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("retry");
    let spec = Value::map()
        .with("name", name.as_str())
        .with("scheduleExpression", "rate(1 hour)");
    let first = h
        .create(TYPE, "retry", spec.clone())
        .await
        .expect("created");
    // The engine lost the answer and retries: the same rule, no error.
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

    // Another resource of the same name: CONFLICT; PutRule alone would have replaced it.
    let other_spec = spec.clone().with("scheduleExpression", "rate(2 hours)");
    let err = h
        .create(TYPE, "other", other_spec)
        .await
        .expect_err("taken");
    assert_eq!(err.class, ErrorClass::Conflict, "{err:?}");
    assert!(
        err.message.contains("belongs to resource `retry`"),
        "{}",
        err.message
    );
    assert_eq!(describe(m, &name)["ScheduleExpression"], "rate(1 hour)");
    let mut other = unrecorded.clone();
    other.name = "other".to_owned();
    assert!(h.read(&other).await.expect("read").is_none());
    h.destroy(&other).await.expect("nothing of ours to destroy");
    describe(m, &name);

    // One made outside Trellis: CONFLICT too.
    let outside = unique("outside");
    boto(
        m,
        "events",
        "put_rule",
        json!({"Name": outside, "ScheduleExpression": "rate(1 day)"}),
    )
    .expect("made outside");
    let err = h
        .create(
            TYPE,
            "outside",
            Value::map()
                .with("name", outside.as_str())
                .with("scheduleExpression", "rate(1 day)"),
        )
        .await
        .expect_err("not ours");
    assert_eq!(err.class, ErrorClass::Conflict);
    assert!(
        err.message.contains("not created by Trellis"),
        "{}",
        err.message
    );
    assert_eq!(err.path.map(|p| p.to_string()).as_deref(), Some("name"));
    h.destroy(&first).await.expect("destroyed");
}

#[tokio::test]
async fn rules_on_another_bus_and_derived_names() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let bus = unique("orders-bus");
    boto(m, "events", "create_event_bus", json!({"Name": bus})).expect("bus");
    let resource = unique("audit");
    let spec = Value::map().with("eventBusName", bus.as_str()).with(
        "eventPattern",
        Value::map().with("source", strings(&["app.audit"])),
    );
    let r = h
        .create(TYPE, &resource, spec.clone())
        .await
        .expect("created");
    assert!(
        r.external_id.contains(&format!(":rule/{bus}/{resource}-")),
        "{}",
        r.external_id
    );
    let read = h.read(&r).await.expect("read").expect("exists");
    assert_eq!(read.spec.get("eventBusName"), spec.get("eventBusName"));
    assert_eq!(read.spec.get("eventPattern"), spec.get("eventPattern"));
    h.destroy(&r).await.expect("destroyed");
    assert!(h.read(&r).await.expect("read").is_none());

    // A bus that does not exist is the blueprint's mistake, at the field.
    let err = h
        .create(
            TYPE,
            "lost",
            spec.clone().with("eventBusName", unique("no-such-bus")),
        )
        .await
        .expect_err("no bus");
    assert_eq!(err.class, ErrorClass::BadInput, "{err:?}");
    assert_eq!(
        err.path.map(|p| p.to_string()).as_deref(),
        Some("eventBusName")
    );
}

#[tokio::test]
async fn the_name_and_bus_are_replaced_not_updated() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    assert_eq!(recreate_fields(&h, TYPE).await, ["name", "eventBusName"]);
}

#[tokio::test]
async fn validation_names_the_field() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let check = |spec: Value| {
        let h = &h;
        async move {
            h.validate(TYPE, "r", spec)
                .await
                .expect("validated")
                .iter()
                .map(|d| {
                    (
                        d.code.clone(),
                        d.path.as_ref().map(ToString::to_string).unwrap_or_default(),
                    )
                })
                .collect::<Vec<(String, String)>>()
        }
    };
    let pair = |c: &str, p: &str| (c.to_owned(), p.to_owned());
    assert_eq!(
        check(Value::map().with("description", "nothing to match")).await,
        vec![pair("aws.events.no-trigger", "eventPattern")]
    );
    assert_eq!(
        check(Value::map().with("scheduleExpression", "every 5 minutes")).await,
        vec![pair("aws.events.invalid-schedule", "scheduleExpression")]
    );
    assert_eq!(
        check(
            Value::map()
                .with("scheduleExpression", "rate(5 minutes)")
                .with("eventBusName", "orders")
        )
        .await,
        vec![pair(
            "aws.events.schedule-on-custom-bus",
            "scheduleExpression"
        )]
    );
    assert_eq!(
        check(
            Value::map()
                .with("name", "bad name")
                .with("eventPattern", Value::map())
        )
        .await,
        vec![
            pair("aws.events.invalid-name", "name"),
            pair("aws.events.empty-pattern", "eventPattern"),
        ]
    );
    assert!(
        check(Value::map().with("scheduleExpression", "cron(0 12 * * ? *)"))
            .await
            .is_empty()
    );
}

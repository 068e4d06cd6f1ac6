//! `aws/dynamodb/table`, and helpers the other resource types' tests share.

use serde_json::json;
use trellis_plugin_sdk::testing::Harness;
use trellis_plugin_sdk::{Diagnostic, ErrorClass, Schema, Value};

use crate::support::{Moto, boto, current, harness, moto, unique};

const TY: &str = "aws/dynamodb/table";

/// `Ok` when every field `applied` sets reads back equal in `observed` (fields `observed`
/// adds are not drift); else the first path that differs.
pub(crate) fn covers(applied: &Value, observed: &Value) -> Result<(), String> {
    fn walk(a: &Value, o: Option<&Value>, path: &str) -> Result<(), String> {
        let a = a.revealed();
        let Some(o) = o.map(Value::revealed) else {
            return Err(format!("{path}: missing (applied {a})"));
        };
        match (a, o) {
            (Value::Map(am), Value::Map(om)) => {
                for (k, v) in am {
                    if !v.is_null() {
                        walk(v, om.get(k), &format!("{path}.{k}"))?;
                    }
                }
                Ok(())
            }
            (Value::List(al), Value::List(ol)) if al.len() == ol.len() => {
                for (i, v) in al.iter().enumerate() {
                    walk(v, ol.get(i), &format!("{path}[{i}]"))?;
                }
                Ok(())
            }
            _ if a == o => Ok(()),
            _ => Err(format!("{path}: applied {a}, read {o}")),
        }
    }
    walk(applied, Some(observed), "spec")
}

/// (code, path) of each diagnostic.
pub(crate) fn codes(d: &[Diagnostic]) -> Vec<(String, String)> {
    d.iter()
        .map(|d| {
            (
                d.code.clone(),
                d.path.as_ref().map(ToString::to_string).unwrap_or_default(),
            )
        })
        .collect()
}

/// The spec schema of `ty`, as the manifest sends it to the engine.
pub(crate) async fn schema_of(h: &Harness, ty: &str) -> Schema {
    let m = h.manifest().await.expect("manifest");
    let def = m
        .resource_types
        .into_iter()
        .find(|r| r.r#type == ty)
        .unwrap_or_else(|| panic!("{ty} is in the manifest"));
    Schema::from_proto(def.spec_schema.expect("a spec schema"))
}

/// The names of the fields of `schema` marked must-recreate.
pub(crate) fn recreate_fields(schema: &Schema) -> Vec<&str> {
    schema
        .fields()
        .iter()
        .filter(|(_, f)| f.is_must_recreate())
        .map(|(n, _)| n.as_str())
        .collect()
}

fn tags(pairs: &[(&str, &str)]) -> Value {
    Value::List(
        pairs
            .iter()
            .map(|(k, v)| Value::map().with("key", *k).with("value", *v))
            .collect(),
    )
}

fn attr(name: &str, ty: &str) -> Value {
    Value::map()
        .with("attributeName", name)
        .with("attributeType", ty)
}

fn key(name: &str, kind: &str) -> Value {
    Value::map()
        .with("attributeName", name)
        .with("keyType", kind)
}

fn describe(m: &Moto, name: &str) -> Result<serde_json::Value, String> {
    boto(m, "dynamodb", "describe_table", json!({"TableName": name})).map(|d| d["Table"].clone())
}

fn table_tags(m: &Moto, arn: &str) -> serde_json::Value {
    let out = boto(
        m,
        "dynamodb",
        "list_tags_of_resource",
        json!({"ResourceArn": arn}),
    )
    .expect("tags");
    out["Tags"]
        .as_array()
        .map(|tags| {
            tags.iter()
                .map(|t| {
                    (
                        t["Key"].as_str().unwrap_or_default().to_owned(),
                        t["Value"].clone(),
                    )
                })
                .collect::<serde_json::Map<_, _>>()
        })
        .map(serde_json::Value::Object)
        .unwrap_or_default()
}

/// The specification's example, named `name`.
fn example(name: &str) -> Value {
    Value::map()
        .with(
            "attributeDefinitions",
            Value::List(vec![
                attr("order_id", "N"),
                attr("product_id", "N"),
                attr("amount", "N"),
            ]),
        )
        .with(
            "keySchema",
            Value::List(vec![key("order_id", "HASH"), key("product_id", "RANGE")]),
        )
        .with("tableName", name)
}

#[tokio::test]
async fn the_specification_example_validates_and_creates() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("orders");
    let spec = example(&name);
    let d = h
        .validate(TY, "ordersTable", spec.clone())
        .await
        .expect("validated");
    // `amount` is no key: AWS keeps no definition of it, which is a warning, not an error.
    assert_eq!(
        codes(&d),
        vec![(
            "aws.dynamodb.unused-attribute".to_owned(),
            "attributeDefinitions[2]".to_owned()
        )]
    );
    assert!(
        d.iter()
            .all(|d| d.severity == trellis_plugin_sdk::Severity::Warning)
    );
    assert!(schema_of(&h, TY).await.check(&spec).is_empty());

    let t = h
        .create(TY, "ordersTable", spec.clone())
        .await
        .expect("created");
    assert_eq!(t.external_id, name);
    let d = describe(m, &name).expect("exists");
    assert_eq!(d["TableStatus"], "ACTIVE");
    assert_eq!(
        d["KeySchema"],
        json!([
            {"AttributeName": "order_id", "KeyType": "HASH"},
            {"AttributeName": "product_id", "KeyType": "RANGE"}
        ])
    );
    let mut defs: Vec<&str> = d["AttributeDefinitions"]
        .as_array()
        .expect("definitions")
        .iter()
        .filter_map(|a| a["AttributeName"].as_str())
        .collect();
    defs.sort_unstable();
    assert_eq!(defs, ["order_id", "product_id"]);
    // No provisionedThroughput: on demand.
    assert_eq!(d["BillingModeSummary"]["BillingMode"], "PAY_PER_REQUEST");
    let arn = t.state.get("arn").and_then(Value::as_str).expect("arn");
    assert_eq!(Some(arn), d["TableArn"].as_str());
    assert_eq!(table_tags(m, arn)["trellis:resource"], "ordersTable");

    let read = h.read(&t).await.expect("read").expect("exists");
    covers(&spec, &read.spec).expect("reads back as applied");
    assert_eq!(
        read.spec.get("billingMode").and_then(Value::as_str),
        Some("PAY_PER_REQUEST")
    );
    h.destroy(&t).await.expect("destroyed");
    assert_eq!(
        describe(m, &name).err().as_deref(),
        Some("ResourceNotFoundException")
    );
}

#[tokio::test]
async fn a_table_is_created_read_updated_and_destroyed() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("events");
    let spec = Value::map()
        .with("tableName", name.as_str())
        .with(
            "attributeDefinitions",
            Value::List(vec![attr("id", "S"), attr("customer", "S")]),
        )
        .with("keySchema", Value::List(vec![key("id", "HASH")]))
        .with("billingMode", "PROVISIONED")
        .with(
            "provisionedThroughput",
            Value::map()
                .with("readCapacityUnits", 5)
                .with("writeCapacityUnits", 4),
        )
        .with(
            "globalSecondaryIndexes",
            Value::List(vec![
                Value::map()
                    .with("indexName", "byCustomer")
                    .with("keySchema", Value::List(vec![key("customer", "HASH")]))
                    .with(
                        "projection",
                        Value::map().with("projectionType", "KEYS_ONLY"),
                    )
                    .with(
                        "provisionedThroughput",
                        Value::map()
                            .with("readCapacityUnits", 2)
                            .with("writeCapacityUnits", 1),
                    ),
            ]),
        )
        .with(
            "streamSpecification",
            Value::map().with("streamViewType", "NEW_IMAGE"),
        )
        .with(
            "timeToLiveSpecification",
            Value::map()
                .with("attributeName", "expires")
                .with("enabled", true),
        )
        .with(
            "pointInTimeRecoverySpecification",
            Value::map().with("pointInTimeRecoveryEnabled", true),
        )
        .with("sseSpecification", Value::map().with("sseEnabled", true))
        .with("tableClass", "STANDARD")
        .with("deletionProtectionEnabled", false)
        .with("tags", tags(&[("team", "a"), ("cost", "1")]));
    let t = h.create(TY, "events", spec.clone()).await.expect("created");

    let d = describe(m, &name).expect("exists");
    assert_eq!(d["BillingModeSummary"]["BillingMode"], "PROVISIONED");
    assert_eq!(d["ProvisionedThroughput"]["ReadCapacityUnits"], 5);
    assert_eq!(d["ProvisionedThroughput"]["WriteCapacityUnits"], 4);
    let gsi = &d["GlobalSecondaryIndexes"][0];
    assert_eq!(gsi["IndexName"], "byCustomer");
    assert_eq!(gsi["Projection"]["ProjectionType"], "KEYS_ONLY");
    assert_eq!(gsi["ProvisionedThroughput"]["ReadCapacityUnits"], 2);
    assert_eq!(d["StreamSpecification"]["StreamViewType"], "NEW_IMAGE");
    assert_eq!(d["SSEDescription"]["Status"], "ENABLED");
    let ttl = boto(
        m,
        "dynamodb",
        "describe_time_to_live",
        json!({"TableName": name}),
    )
    .expect("ttl");
    assert_eq!(ttl["TimeToLiveDescription"]["TimeToLiveStatus"], "ENABLED");
    assert_eq!(ttl["TimeToLiveDescription"]["AttributeName"], "expires");
    let backups = boto(
        m,
        "dynamodb",
        "describe_continuous_backups",
        json!({"TableName": name}),
    )
    .expect("backups");
    assert_eq!(
        backups["ContinuousBackupsDescription"]["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"],
        "ENABLED"
    );
    let arn = t
        .state
        .get("arn")
        .and_then(Value::as_str)
        .expect("arn")
        .to_owned();
    let tg = table_tags(m, &arn);
    assert_eq!((&tg["team"], &tg["cost"]), (&json!("a"), &json!("1")));
    assert_eq!(tg["trellis:resource"], "events");
    assert_eq!(
        t.state.get("streamArn").and_then(Value::as_str),
        d["LatestStreamArn"].as_str()
    );

    // Nothing changed: the spec reads back as applied.
    let read = h.read(&t).await.expect("read").expect("exists");
    covers(&spec, &read.spec).expect("reads back as applied");

    // Drift made outside: more capacity, TTL off.
    boto(
        m,
        "dynamodb",
        "update_table",
        json!({"TableName": name, "ProvisionedThroughput": {"ReadCapacityUnits": 9, "WriteCapacityUnits": 4}}),
    )
    .expect("changed");
    boto(
        m,
        "dynamodb",
        "update_time_to_live",
        json!({"TableName": name, "TimeToLiveSpecification": {"AttributeName": "expires", "Enabled": false}}),
    )
    .expect("changed");
    let read = h.read(&t).await.expect("read").expect("exists");
    assert_eq!(
        read.spec
            .get("provisionedThroughput")
            .and_then(|p| p.get("readCapacityUnits")),
        Some(&Value::Int(9))
    );
    assert_eq!(
        read.spec
            .get("timeToLiveSpecification")
            .and_then(|p| p.get("enabled")),
        Some(&Value::Bool(false))
    );
    assert!(covers(&spec, &read.spec).is_err());

    // Update in place: on demand, the index replaced by another (one deletion, one
    // creation), the stream, TTL and backups dropped, deletion protection on, a tag gone.
    let spec2 = Value::map()
        .with("tableName", name.as_str())
        .with(
            "attributeDefinitions",
            Value::List(vec![attr("id", "S"), attr("status", "S")]),
        )
        .with("keySchema", Value::List(vec![key("id", "HASH")]))
        .with(
            "globalSecondaryIndexes",
            Value::List(vec![
                Value::map()
                    .with("indexName", "byStatus")
                    .with("keySchema", Value::List(vec![key("status", "HASH")]))
                    .with("projection", Value::map().with("projectionType", "ALL")),
            ]),
        )
        .with("deletionProtectionEnabled", true)
        .with("tags", tags(&[("team", "b")]));
    let t2 = h.update(&t, spec2.clone()).await.expect("updated");
    assert_eq!(t2.external_id, t.external_id);
    let d = describe(m, &name).expect("exists");
    assert_eq!(d["BillingModeSummary"]["BillingMode"], "PAY_PER_REQUEST");
    let names: Vec<&str> = d["GlobalSecondaryIndexes"]
        .as_array()
        .expect("indexes")
        .iter()
        .filter_map(|i| i["IndexName"].as_str())
        .collect();
    assert_eq!(names, ["byStatus"]);
    assert!(
        d["StreamSpecification"].is_null()
            || d["StreamSpecification"]["StreamEnabled"] == json!(false),
        "{d}"
    );
    assert_eq!(d["DeletionProtectionEnabled"], true);
    let ttl = boto(
        m,
        "dynamodb",
        "describe_time_to_live",
        json!({"TableName": name}),
    )
    .expect("ttl");
    assert_eq!(ttl["TimeToLiveDescription"]["TimeToLiveStatus"], "DISABLED");
    let backups = boto(
        m,
        "dynamodb",
        "describe_continuous_backups",
        json!({"TableName": name}),
    )
    .expect("backups");
    assert_eq!(
        backups["ContinuousBackupsDescription"]["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"],
        "DISABLED"
    );
    let tg = table_tags(m, &arn);
    assert_eq!(tg["team"], "b");
    assert!(tg.get("cost").is_none(), "{tg}");
    assert!(t2.state.get("streamArn").is_none(), "{:?}", t2.state);
    let read = h.read(&t2).await.expect("read").expect("exists");
    covers(&spec2, &read.spec).expect("reads back as updated");

    // Deletion protection holds: destroy says what to do, and the table stays.
    let err = h.destroy(&t2).await.expect_err("protected");
    assert_eq!(err.class, ErrorClass::BadInput, "{err:?}");
    assert_eq!(
        err.path.map(|p| p.to_string()).as_deref(),
        Some("deletionProtectionEnabled")
    );
    assert!(describe(m, &name).is_ok());

    let spec3 = spec2.with("deletionProtectionEnabled", false);
    let t3 = h.update(&t2, spec3).await.expect("unprotected");
    h.destroy(&t3).await.expect("destroyed");
    assert_eq!(
        describe(m, &name).err().as_deref(),
        Some("ResourceNotFoundException")
    );
    // Destroying what is gone succeeds (a retry after a lost answer).
    h.destroy(&t3).await.expect("destroy is idempotent");
    assert!(h.read(&t3).await.expect("read").is_none());
}

#[tokio::test]
async fn a_provisioned_table_changes_capacity_and_gains_an_index() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("capacity");
    let tp = |r: i64, w: i64| {
        Value::map()
            .with("readCapacityUnits", r)
            .with("writeCapacityUnits", w)
    };
    let base = Value::map()
        .with("tableName", name.as_str())
        .with(
            "attributeDefinitions",
            Value::List(vec![attr("pk", "S"), attr("sk", "N"), attr("kind", "S")]),
        )
        .with(
            "keySchema",
            Value::List(vec![key("pk", "HASH"), key("sk", "RANGE")]),
        )
        .with("provisionedThroughput", tp(1, 1));
    let t = h
        .create(TY, "capacity", base.clone())
        .await
        .expect("created");
    let d = describe(m, &name).expect("exists");
    // provisionedThroughput without billingMode: PROVISIONED.
    assert_eq!(d["BillingModeSummary"]["BillingMode"], "PROVISIONED");

    let spec2 = base.with("provisionedThroughput", tp(3, 2)).with(
        "globalSecondaryIndexes",
        Value::List(vec![
            Value::map()
                .with("indexName", "byKind")
                .with(
                    "keySchema",
                    Value::List(vec![key("kind", "HASH"), key("sk", "RANGE")]),
                )
                .with(
                    "projection",
                    Value::map()
                        .with("projectionType", "INCLUDE")
                        .with("nonKeyAttributes", vec!["total"]),
                )
                .with("provisionedThroughput", tp(1, 1)),
        ]),
    );
    let t2 = h.update(&t, spec2.clone()).await.expect("updated");
    let d = describe(m, &name).expect("exists");
    assert_eq!(d["ProvisionedThroughput"]["ReadCapacityUnits"], 3);
    assert_eq!(d["ProvisionedThroughput"]["WriteCapacityUnits"], 2);
    let gsi = &d["GlobalSecondaryIndexes"][0];
    assert_eq!(gsi["IndexName"], "byKind");
    assert_eq!(gsi["Projection"]["NonKeyAttributes"], json!(["total"]));
    let read = h.read(&t2).await.expect("read").expect("exists");
    covers(&spec2, &read.spec).expect("reads back as updated");
    h.destroy(&t2).await.expect("destroyed");
}

#[tokio::test]
async fn a_retried_create_adopts_its_own_table_and_refuses_anyone_elses() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("retry");
    let spec = example(&name);
    let first = h.create(TY, "retry", spec.clone()).await.expect("created");
    // The engine lost the answer and retries: the same table, no error.
    let again = h.create(TY, "retry", spec.clone()).await.expect("adopted");
    assert_eq!(again.external_id, first.external_id);
    assert_eq!(again.state.get("arn"), first.state.get("arn"));
    // A crash before the id was recorded: read by name finds it.
    let mut unrecorded = first.clone();
    unrecorded.external_id.clear();
    let found = h.read(&unrecorded).await.expect("read").expect("found");
    assert_eq!(found.external_id.as_deref(), Some(name.as_str()));

    // Another resource of the same name: CONFLICT at the name, nothing taken over.
    let err = h
        .create(TY, "other", spec.clone())
        .await
        .expect_err("taken");
    assert_eq!(err.class, ErrorClass::Conflict, "{err:?}");
    assert_eq!(
        err.path.map(|p| p.to_string()).as_deref(),
        Some("tableName")
    );
    assert!(
        err.message.contains("belongs to resource `retry`"),
        "{}",
        err.message
    );

    // One made outside Trellis: CONFLICT too; an unrecorded destroy leaves it alone.
    let outside = unique("outside");
    boto(
        m,
        "dynamodb",
        "create_table",
        json!({
            "TableName": outside,
            "AttributeDefinitions": [{"AttributeName": "id", "AttributeType": "S"}],
            "KeySchema": [{"AttributeName": "id", "KeyType": "HASH"}],
            "BillingMode": "PAY_PER_REQUEST"
        }),
    )
    .expect("made outside");
    let outside_spec = Value::map()
        .with("tableName", outside.as_str())
        .with("attributeDefinitions", Value::List(vec![attr("id", "S")]))
        .with("keySchema", Value::List(vec![key("id", "HASH")]));
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
    assert!(describe(m, &outside).is_ok(), "someone else's table stays");

    h.destroy(&first).await.expect("destroyed");
}

#[tokio::test]
async fn validation_names_the_field_and_the_schema_marks_replacements() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let d = h
        .validate(
            TY,
            "t",
            Value::map()
                .with("tableName", "ab")
                .with("attributeDefinitions", Value::List(vec![attr("id", "S")]))
                .with(
                    "keySchema",
                    Value::List(vec![key("id", "HASH"), key("sk", "HASH")]),
                )
                .with("billingMode", "PROVISIONED")
                .with(
                    "globalSecondaryIndexes",
                    Value::List(vec![
                        Value::map()
                            .with("indexName", "byId")
                            .with("keySchema", Value::List(vec![key("id", "HASH")])),
                    ]),
                ),
        )
        .await
        .expect("validated");
    let want = [
        ("aws.dynamodb.invalid-name", "tableName"),
        ("aws.dynamodb.key-schema", "keySchema[1].keyType"),
        (
            "aws.dynamodb.undefined-attribute",
            "keySchema[1].attributeName",
        ),
        ("aws.dynamodb.billing-mode", "billingMode"),
        ("aws.dynamodb.billing-mode", "globalSecondaryIndexes[0]"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
    assert_eq!(codes(&d), want);

    // What the schema itself checks (the engine runs it): attribute types are S, N or B.
    let schema = schema_of(&h, TY).await;
    let bad = example("orders").with(
        "attributeDefinitions",
        Value::List(vec![attr("order_id", "X"), attr("product_id", "N")]),
    );
    assert_eq!(
        codes(&schema.check(&bad)),
        vec![(
            "schema.not-allowed".to_owned(),
            "attributeDefinitions[0].attributeType".to_owned()
        )]
    );
    assert_eq!(
        recreate_fields(&schema),
        ["tableName", "keySchema", "localSecondaryIndexes"]
    );
    let computed: Vec<&str> = schema
        .fields()
        .iter()
        .filter(|(_, f)| f.is_computed())
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(computed, ["arn", "streamArn"]);
}

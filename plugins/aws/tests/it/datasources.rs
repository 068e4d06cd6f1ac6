//! Data sources `aws/lambda/function`, `aws/dynamodb/table` and `aws/vpc`, with the
//! engine's own filter and export code (trellis-lang) applied to what they fetch, as at
//! plan time.

use serde_json::json;
use trellis_lang::datasource::{self as engine, Export, ExportType, Operator};
use trellis_lang::eval::value::Value as EValue;
use trellis_plugin_sdk::testing::Harness;
use trellis_plugin_sdk::{Filter, Value};
use trellis_provider_aws::AwsProvider;

use crate::support::{Moto, boto, config, harness, moto, unique};

fn filter(field: &str, op: &str, search: impl Into<Value>) -> Filter {
    Filter {
        field: field.to_owned(),
        operator: op.to_owned(),
        search: search.into(),
    }
}

fn engine_value(v: &Value) -> EValue {
    EValue::from_json(&v.to_json())
}

/// What the engine does with the items: the first that matches every filter, and the
/// exports read from it (name, type, aliasFor), as JSON. `Ok(None)`: nothing matched.
fn select(
    items: &[Value],
    filters: &[Filter],
    exports: &[(&str, ExportType, Option<&str>)],
) -> Result<Option<serde_json::Value>, String> {
    let items: Vec<EValue> = items.iter().map(engine_value).collect();
    let filters: Vec<engine::Filter> = filters
        .iter()
        .map(|f| {
            let op = Operator::parse(&f.operator).expect("an operator");
            engine::Filter::new(f.field.clone(), op, engine_value(&f.search))
        })
        .collect();
    let Some(item) = engine::select(&items, &filters).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let exports: Vec<Export> = exports
        .iter()
        .map(|(name, ty, alias)| {
            let x = Export::new(*name, *ty);
            match alias {
                Some(a) => x.alias_for(*a),
                None => x,
            }
        })
        .collect();
    let out = engine::export(item, &exports).map_err(|e| e.to_string())?;
    Ok(Some(serde_json::Value::Object(
        out.into_iter()
            .map(|(k, v)| (k, v.to_json().unwrap_or_default()))
            .collect(),
    )))
}

fn field<'a>(item: &'a Value, key: &str) -> &'a Value {
    item.get(key)
        .unwrap_or_else(|| panic!("no `{key}` in {item:?}"))
}

fn text<'a>(item: &'a Value, key: &str) -> &'a str {
    field(item, key).as_str().expect("a string")
}

fn named<'a>(items: &'a [Value], key: &str, name: &str) -> Option<&'a Value> {
    items
        .iter()
        .find(|i| i.get(key).and_then(Value::as_str) == Some(name))
}

/// The fields a data source type declares for filters and for exports.
async fn declared(h: &Harness, ty: &str) -> (Vec<String>, Vec<String>) {
    let manifest = h.manifest().await.expect("manifest");
    let def = manifest
        .data_source_types
        .iter()
        .find(|d| d.r#type == ty)
        .unwrap_or_else(|| panic!("{ty} is declared"));
    (
        def.filter_fields.iter().map(|f| f.name.clone()).collect(),
        def.exports.iter().map(|f| f.name.clone()).collect(),
    )
}

// ---------------------------------------------------------------------------
// aws/lambda/function
// ---------------------------------------------------------------------------

/// An execution role and a function (an empty zip: moto never runs it).
fn function(m: &Moto, name: &str, tags: serde_json::Value) -> String {
    let role = boto(
        m,
        "iam",
        "create_role",
        json!({
            "RoleName": name,
            "AssumeRolePolicyDocument": json!({
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}]
            }).to_string(),
        }),
    )
    .expect("role")["Role"]["Arn"]
        .as_str()
        .expect("role arn")
        .to_owned();
    // The smallest zip file: an end-of-central-directory record, all ASCII bytes.
    let zip = format!("PK\u{5}\u{6}{}", "\u{0}".repeat(18));
    boto(
        m,
        "lambda",
        "create_function",
        json!({
            "FunctionName": name,
            "Runtime": "python3.12",
            "Role": role,
            "Handler": "app.handler",
            "Code": {"ZipFile": zip},
            "Timeout": 7,
            "MemorySize": 256,
            "Architectures": ["arm64"],
            "Description": "saves orders",
            "Tags": tags,
        }),
    )
    .expect("function")["FunctionArn"]
        .as_str()
        .expect("function arn")
        .to_owned()
}

#[tokio::test]
async fn functions_are_fetched_with_their_fields() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let prefix = unique("dsfn");
    let a = format!("{prefix}-a");
    let b = format!("{prefix}-b");
    let tag = unique("team");
    let arn_a = function(m, &a, json!({ tag.as_str(): "orders" }));
    function(m, &b, json!({}));

    // No filter: every function, by name, with its configuration and no tags.
    let items = h.fetch("aws/lambda/function", vec![]).await.expect("fetch");
    let names: Vec<&str> = items.iter().map(|i| text(i, "functionName")).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "in a stable order");
    let item = named(&items, "functionName", &a).expect("function a");
    assert_eq!(text(item, "arn"), arn_a);
    assert_eq!(text(item, "runtime"), "python3.12");
    assert_eq!(text(item, "handler"), "app.handler");
    assert!(text(item, "role").ends_with(&format!(":role/{a}")));
    assert_eq!(field(item, "timeout"), &Value::Int(7));
    assert_eq!(field(item, "memorySize"), &Value::Int(256));
    assert_eq!(field(item, "architectures"), &Value::from(vec!["arm64"]));
    assert_eq!(text(item, "description"), "saves orders");
    assert_eq!(text(item, "packageType"), "Zip");
    assert_eq!(item.get("tags"), None, "tags only when a filter reads them");
    assert!(named(&items, "functionName", &b).is_some());

    // A filter on tags: each function's tags are read, and the engine picks the tagged one.
    let filters = vec![filter("tags", "has key", tag.as_str())];
    let items = h
        .fetch("aws/lambda/function", filters.clone())
        .await
        .expect("fetch");
    let tags_b = field(named(&items, "functionName", &b).expect("b"), "tags");
    assert_eq!(tags_b, &Value::map());
    let exports = [
        ("functionName", ExportType::String, None),
        ("functionArn", ExportType::String, Some("arn")),
        ("architectures", ExportType::Array, None),
        ("memorySize", ExportType::Integer, None),
    ];
    assert_eq!(
        select(&items, &filters, &exports),
        Ok(Some(json!({
            "functionName": a,
            "functionArn": arn_a,
            "architectures": ["arm64"],
            "memorySize": 256,
        })))
    );

    // A first filter `functionName = x` reads that function alone, tags included.
    let items = h
        .fetch(
            "aws/lambda/function",
            vec![filter("functionName", "=", a.as_str())],
        )
        .await
        .expect("fetch");
    assert_eq!(items.len(), 1);
    assert_eq!(
        field(&items[0], "tags"),
        &Value::map().with(tag.as_str(), "orders")
    );
    // `in`, and names that cannot exist: no error, nothing found.
    let items = h
        .fetch(
            "aws/lambda/function",
            vec![filter(
                "functionName",
                "in",
                vec![b.as_str(), "no-such-function-x", "not a name!"],
            )],
        )
        .await
        .expect("fetch");
    let names: Vec<&str> = items.iter().map(|i| text(i, "functionName")).collect();
    assert_eq!(names, [b.as_str()]);
    // A first filter on another string field narrows what is returned, never dropping a match.
    let items = h
        .fetch(
            "aws/lambda/function",
            vec![filter("functionName", "starts with", prefix.as_str())],
        )
        .await
        .expect("fetch");
    let names: Vec<&str> = items.iter().map(|i| text(i, "functionName")).collect();
    assert_eq!(names, [a.as_str(), b.as_str()]);

    let (filterable, exportable) = declared(&h, "aws/lambda/function").await;
    assert!(filterable.contains(&"tags".to_owned()));
    assert!(
        !exportable.contains(&"tags".to_owned()),
        "a map cannot be exported"
    );
    assert!(exportable.contains(&"arn".to_owned()));
}

// ---------------------------------------------------------------------------
// aws/dynamodb/table
// ---------------------------------------------------------------------------

#[tokio::test]
async fn tables_are_fetched_with_their_fields() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let prefix = unique("dstable");
    let orders = format!("{prefix}-orders");
    let events = format!("{prefix}-events");
    let tag = unique("team");
    boto(
        m,
        "dynamodb",
        "create_table",
        json!({
            "TableName": orders,
            "KeySchema": [
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            "AttributeDefinitions": [
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "N"},
            ],
            "BillingMode": "PAY_PER_REQUEST",
            "StreamSpecification": {"StreamEnabled": true, "StreamViewType": "NEW_IMAGE"},
            "Tags": [{"Key": tag, "Value": "orders"}],
        }),
    )
    .expect("orders table");
    boto(
        m,
        "dynamodb",
        "create_table",
        json!({
            "TableName": events,
            "KeySchema": [{"AttributeName": "id", "KeyType": "HASH"}],
            "AttributeDefinitions": [{"AttributeName": "id", "AttributeType": "S"}],
            "ProvisionedThroughput": {"ReadCapacityUnits": 1, "WriteCapacityUnits": 1},
        }),
    )
    .expect("events table");
    let described = boto(
        m,
        "dynamodb",
        "describe_table",
        json!({"TableName": orders}),
    )
    .expect("described");

    let items = h.fetch("aws/dynamodb/table", vec![]).await.expect("fetch");
    let t = named(&items, "tableName", &orders).expect("orders");
    assert_eq!(text(t, "arn"), described["Table"]["TableArn"]);
    assert_eq!(text(t, "streamArn"), described["Table"]["LatestStreamArn"]);
    assert_eq!(
        field(t, "keySchema"),
        &Value::List(vec![
            Value::map()
                .with("attributeName", "pk")
                .with("keyType", "HASH"),
            Value::map()
                .with("attributeName", "sk")
                .with("keyType", "RANGE"),
        ])
    );
    assert_eq!(
        field(t, "attributeDefinitions"),
        &Value::List(vec![
            Value::map()
                .with("attributeName", "pk")
                .with("attributeType", "S"),
            Value::map()
                .with("attributeName", "sk")
                .with("attributeType", "N"),
        ])
    );
    assert_eq!(text(t, "partitionKey"), "pk");
    assert_eq!(text(t, "sortKey"), "sk");
    assert_eq!(text(t, "billingMode"), "PAY_PER_REQUEST");
    assert_eq!(field(t, "itemCount"), &Value::Int(0));
    assert_eq!(text(t, "status"), "ACTIVE");
    assert_eq!(t.get("tags"), None, "tags only when a filter reads them");
    let e = named(&items, "tableName", &events).expect("events");
    assert_eq!(text(e, "billingMode"), "PROVISIONED");
    assert_eq!(e.get("sortKey"), None);
    assert_eq!(e.get("streamArn"), None);

    // `tableName = x` first: that table alone.
    let filters = vec![filter("tableName", "=", orders.as_str())];
    let items = h
        .fetch("aws/dynamodb/table", filters.clone())
        .await
        .expect("fetch");
    let names: Vec<&str> = items.iter().map(|i| text(i, "tableName")).collect();
    assert_eq!(names, [orders.as_str()]);
    assert_eq!(
        select(
            &items,
            &filters,
            &[
                ("table", ExportType::String, Some("arn")),
                ("stream", ExportType::String, Some("streamArn")),
            ]
        ),
        Ok(Some(json!({
            "table": described["Table"]["TableArn"],
            "stream": described["Table"]["LatestStreamArn"],
        })))
    );
    let items = h
        .fetch(
            "aws/dynamodb/table",
            vec![filter("tableName", "=", "no-such-table-x")],
        )
        .await
        .expect("fetch");
    assert!(items.is_empty());

    // A filter on a name prefix, then on tags: both tables come back with their tags, and
    // the engine selects the tagged one.
    let filters = vec![
        filter("tableName", "starts with", prefix.as_str()),
        filter("tags", "has key", tag.as_str()),
    ];
    let items = h
        .fetch("aws/dynamodb/table", filters.clone())
        .await
        .expect("fetch");
    let names: Vec<&str> = items.iter().map(|i| text(i, "tableName")).collect();
    assert_eq!(names, [events.as_str(), orders.as_str()]);
    assert_eq!(
        field(&items[1], "tags"),
        &Value::map().with(tag.as_str(), "orders")
    );
    assert_eq!(
        select(&items, &filters, &[("tableName", ExportType::String, None)]),
        Ok(Some(json!({ "tableName": orders })))
    );
    // The key schema is a filter field: `keySchema[1].attributeName = sk`.
    let filters = vec![
        filter("tableName", "starts with", prefix.as_str()),
        filter("keySchema[1].attributeName", "=", "sk"),
    ];
    let items = h
        .fetch("aws/dynamodb/table", filters.clone())
        .await
        .expect("fetch");
    assert_eq!(
        select(
            &items,
            &filters,
            &[("partitionKey", ExportType::String, None)]
        ),
        Ok(Some(json!({ "partitionKey": "pk" })))
    );
}

// ---------------------------------------------------------------------------
// aws/vpc
// ---------------------------------------------------------------------------

/// The harness in another region (moto has a default VPC in every region).
async fn harness_in(m: &Moto, region: &str) -> Harness {
    Harness::provider(AwsProvider::default())
        .await
        .expect("harness")
        .with_config(config(m).with("region", region))
}

#[tokio::test]
async fn the_specifications_subnet_filters_find_the_default_vpc() {
    let Some(m) = moto() else { return };
    let h = harness_in(m, "eu-west-1").await;

    let items = h
        .fetch("aws/vpc", vec![filter("isDefault", "=", true)])
        .await
        .expect("fetch");
    assert_eq!(items.len(), 1, "{items:?}");
    let default = &items[0];
    let vpc = text(default, "vpcId").to_owned();
    assert!(vpc.starts_with("vpc-"));
    assert_eq!(text(default, "cidrBlock"), "172.31.0.0/16");
    assert_eq!(
        text(default, "arn"),
        format!(
            "arn:aws:ec2:eu-west-1:{}:vpc/{vpc}",
            text(default, "ownerId")
        )
    );
    assert_eq!(
        field(default, "availabilityZones"),
        &Value::from(vec!["eu-west-1a", "eu-west-1b", "eu-west-1c"])
    );
    let subnets = field(default, "subnets").as_list().expect("subnets");
    assert_eq!(subnets.len(), 3);
    assert!(
        subnets
            .iter()
            .all(|s| s.as_str().is_some_and(|s| s.starts_with("subnet-")))
    );
    assert_eq!(field(default, "subnetIds"), field(default, "subnets"));
    let groups = field(default, "securityGroups").as_list().expect("groups");
    assert!(!groups.is_empty(), "moto gives each VPC a default group");
    assert_eq!(field(default, "tags"), &Value::map());

    // The specification's example: `subnets[].availabilityZone in [eu-west-1a, eu-west-1b]`,
    // exporting `vpc` as an alias for `vpcId`; and its `subnets[0]` form.
    let exports = [("vpc", ExportType::String, Some("vpcId"))];
    for path in ["subnets[].availabilityZone", "subnets[0].availabilityZone"] {
        let filters = vec![filter(path, "in", vec!["eu-west-1a", "eu-west-1b"])];
        let items = h.fetch("aws/vpc", filters.clone()).await.expect("fetch");
        let subnet = &field(&items[0], "subnets").as_list().expect("subnets")[0];
        assert_eq!(text(subnet, "availabilityZone"), "eu-west-1a");
        assert!(text(subnet, "subnetId").starts_with("subnet-"));
        assert_eq!(text(subnet, "cidrBlock").split('/').nth(1), Some("20"));
        assert_eq!(
            select(&items, &filters, &exports),
            Ok(Some(json!({ "vpc": vpc })))
        );
        // Zones of another region: nothing matches.
        let filters = vec![filter(path, "in", vec!["us-east-1a"])];
        let items = h.fetch("aws/vpc", filters.clone()).await.expect("fetch");
        assert_eq!(select(&items, &filters, &exports), Ok(None));
    }

    let (filterable, exportable) = declared(&h, "aws/vpc").await;
    for f in ["tags", "subnets", "vpcId", "isDefault"] {
        assert!(filterable.contains(&f.to_owned()), "{f}");
    }
    for x in [
        "vpcId",
        "subnets",
        "securityGroups",
        "subnetIds",
        "securityGroupIds",
    ] {
        assert!(exportable.contains(&x.to_owned()), "{x}");
    }
}

#[tokio::test]
async fn the_specifications_tag_filter_exports_subnets_and_security_groups() {
    let Some(m) = moto() else { return };
    // boto3 works in us-east-1, as does the default harness.
    let h = harness(m).await;
    let environment = unique("env");
    let vpc = boto(
        m,
        "ec2",
        "create_vpc",
        json!({
            "CidrBlock": "10.42.0.0/16",
            "TagSpecifications": [{"ResourceType": "vpc", "Tags": [{"Key": environment, "Value": "yes"}]}],
        }),
    )
    .expect("vpc")["Vpc"]["VpcId"]
        .as_str()
        .expect("vpc id")
        .to_owned();
    let subnet = |cidr: &str, zone: &str| {
        boto(
            m,
            "ec2",
            "create_subnet",
            json!({"VpcId": vpc, "CidrBlock": cidr, "AvailabilityZone": zone}),
        )
        .expect("subnet")["Subnet"]["SubnetId"]
            .as_str()
            .expect("subnet id")
            .to_owned()
    };
    // Created out of zone order: the data source lists them by zone.
    let in_b = subnet("10.42.1.0/24", "us-east-1b");
    let in_a = subnet("10.42.0.0/24", "us-east-1a");
    let groups = boto(
        m,
        "ec2",
        "describe_security_groups",
        json!({"Filters": [{"Name": "vpc-id", "Values": [vpc]}]}),
    )
    .expect("groups");
    let mut group_ids: Vec<&str> = groups["SecurityGroups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter_map(|g| g["GroupId"].as_str())
        .collect();
    group_ids.sort_unstable();
    assert!(!group_ids.is_empty());

    // The specification's example: `tags has key ${variables.environment}`, exporting
    // `subnets` and `securityGroups` as arrays and `vpc` as an alias for `vpcId`.
    let filters = vec![filter("tags", "has key", environment.as_str())];
    let items = h.fetch("aws/vpc", filters.clone()).await.expect("fetch");
    assert_eq!(items.len(), 1, "narrowed by tag key: {items:?}");
    assert_eq!(
        field(&items[0], "tags"),
        &Value::map().with(environment.as_str(), "yes")
    );
    let exports = [
        ("subnets", ExportType::Array, None),
        ("securityGroups", ExportType::Array, None),
        ("vpc", ExportType::String, Some("vpcId")),
    ];
    assert_eq!(
        select(&items, &filters, &exports),
        Ok(Some(json!({
            "subnets": [in_a, in_b],
            "securityGroups": group_ids,
            "vpc": vpc,
        })))
    );

    // The tag filter first narrows; a filter into subnets after it makes them objects,
    // while `subnetIds` stays exportable.
    let filters = vec![
        filter("tags", "has key", environment.as_str()),
        filter("subnets[0].availabilityZone", "=", "us-east-1a"),
        filter("securityGroups[0].groupName", "=", "default"),
    ];
    let items = h.fetch("aws/vpc", filters.clone()).await.expect("fetch");
    let subnets = field(&items[0], "subnets").as_list().expect("subnets");
    assert_eq!(subnets.len(), 2);
    assert_eq!(text(&subnets[0], "subnetId"), in_a);
    assert_eq!(text(&subnets[0], "availabilityZone"), "us-east-1a");
    assert_eq!(text(&subnets[0], "cidrBlock"), "10.42.0.0/24");
    assert_eq!(field(&subnets[0], "defaultForAz"), &Value::Bool(false));
    assert_eq!(text(&subnets[1], "subnetId"), in_b);
    let group = &field(&items[0], "securityGroups")
        .as_list()
        .expect("groups")[0];
    assert_eq!(text(group, "groupId"), group_ids[0]);
    assert_eq!(text(group, "groupName"), "default");
    assert_eq!(
        select(
            &items,
            &filters,
            &[
                ("subnetIds", ExportType::Array, None),
                ("vpc", ExportType::String, Some("vpcId")),
            ]
        ),
        Ok(Some(json!({ "subnetIds": [in_a, in_b], "vpc": vpc })))
    );
    // Exporting `subnets` while filtering into them is the engine's error, not a silent
    // wrong value.
    assert!(select(&items, &filters, &[("subnets", ExportType::Array, None)]).is_err());

    // `vpcId = x` and `vpcId in [..]` first: DescribeVpcs is asked for that VPC alone.
    for f in [
        filter("vpcId", "=", vpc.as_str()),
        filter("vpcId", "in", vec![vpc.as_str(), "vpc-00000000000000000"]),
    ] {
        let items = h.fetch("aws/vpc", vec![f]).await.expect("fetch");
        let ids: Vec<&str> = items.iter().map(|i| text(i, "vpcId")).collect();
        assert_eq!(ids, [vpc.as_str()]);
        assert_eq!(
            field(&items[0], "subnetIds"),
            &Value::from(vec![in_a.as_str(), in_b.as_str()])
        );
    }
    let items = h
        .fetch("aws/vpc", vec![filter("cidrBlock", "=", "10.42.0.0/16")])
        .await
        .expect("fetch");
    assert!(items.iter().any(|i| text(i, "vpcId") == vpc));
    assert!(items.iter().all(|i| text(i, "cidrBlock") == "10.42.0.0/16"));

    // Without a filter every VPC comes, by id, the default one among them.
    let items = h.fetch("aws/vpc", vec![]).await.expect("fetch");
    let ids: Vec<&str> = items.iter().map(|i| text(i, "vpcId")).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(ids, sorted);
    assert!(ids.contains(&vpc.as_str()));
    assert!(
        items
            .iter()
            .any(|i| field(i, "isDefault") == &Value::Bool(true))
    );
}

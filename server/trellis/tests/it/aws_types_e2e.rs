//! End to end, every resource type of the AWS provider in one blueprint: the real `trellis
//! serve` with the real `trellis-provider-aws` plugin calling moto, driven by the real CLI.
//! Each type is created, read (no drift), updated in place, some recreated; changes made with
//! boto3 are drift; destroy leaves nothing, the function's own execution role included.
//! boto3 (a second client) checks what AWS has at every step.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::aws_moto::{Moto, boto, moto, unique};
use crate::engine_common::{Engine, write};
use crate::plugins_common::TempDir;

/// The AWS names of the blueprint's resources (moto is shared by the whole test binary).
struct Names {
    table: String,
    table_renamed: String,
    jobs: String,
    jobs_renamed: String,
    inbox: String,
    inbox_renamed: String,
    topic: String,
    bucket: String,
    secret: String,
    parameter: String,
    role: String,
    function: String,
    rule: String,
    rule_renamed: String,
    api: String,
}

impl Names {
    fn new() -> Names {
        Names {
            table: unique("types-orders"),
            table_renamed: unique("types-orders-v2"),
            jobs: unique("types-jobs"),
            jobs_renamed: unique("types-jobs-v2"),
            inbox: unique("types-inbox"),
            inbox_renamed: unique("types-inbox-v2"),
            topic: unique("types-events"),
            bucket: unique("types-assets"),
            secret: unique("types-db-password"),
            parameter: format!("/trellis-types/{}", unique("feature")),
            role: unique("types-deployer"),
            function: unique("types-worker"),
            rule: unique("types-nightly"),
            rule_renamed: unique("types-nightly-v2"),
            api: unique("types-api"),
        }
    }
}

/// The three versions of the blueprint.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Version {
    /// Every type, as first deployed.
    First,
    /// One updatable field (or more) of every type changed.
    Updated,
    /// Updated, and the names of the table, both queues and the rule changed (must
    /// recreate; the mapping of the `inbox` queue must follow it).
    Renamed,
}

/// The blueprint at `version`: one resource of every type the provider has.
fn blueprint<'a>(n: &'a Names, version: Version) -> String {
    use Version::*;
    let updated = version >= Updated;
    let pick = |first: &'static str, later: &'static str| if updated { later } else { first };
    let name = |first: &'a str, renamed: &'a str| {
        if version == Renamed { renamed } else { first }
    };
    let table = name(&n.table, &n.table_renamed);
    let jobs = name(&n.jobs, &n.jobs_renamed);
    let inbox = name(&n.inbox, &n.inbox_renamed);
    let rule = name(&n.rule, &n.rule_renamed);
    let billing = if updated {
        "billingMode: PROVISIONED\n      provisionedThroughput:\n        readCapacityUnits: 2\n        writeCapacityUnits: 3"
    } else {
        "billingMode: PAY_PER_REQUEST"
    };
    let team = pick("core", "platform");
    let visibility = pick("60", "90");
    let display = pick("Orders v1", "Orders v2");
    let secret_description = pick("Database password", "Database password (v2)");
    let value = pick("v1", "v2");
    let role_description = pick("Deploys things", "Deploys things, carefully");
    let timeout = pick("10", "20");
    let schedule = pick("rate(5 minutes)", "rate(10 minutes)");
    let rule_state = pick("ENABLED", "DISABLED");
    let api_description = pick("The orders API", "The orders API, version 2");
    let batch = pick("5", "8");
    let (function, topic, bucket, secret, parameter, role, api) = (
        &n.function,
        &n.topic,
        &n.bucket,
        &n.secret,
        &n.parameter,
        &n.role,
        &n.api,
    );
    format!(
        r#"version: 2023-04-20
resources:
  orders:
    type: aws/dynamodb/table
    spec:
      tableName: {table}
      attributeDefinitions:
        - attributeName: id
          attributeType: S
      keySchema:
        - attributeName: id
          keyType: HASH
      {billing}
      tags:
        - key: team
          value: {team}
  jobs:
    type: aws/sqs/queue
    spec:
      queueName: {jobs}
      visibilityTimeout: {visibility}
  inbox:
    type: aws/sqs/queue
    spec:
      queueName: {inbox}
      visibilityTimeout: 60
  events:
    type: aws/sns/topic
    spec:
      topicName: {topic}
      displayName: {display}
  assets:
    type: aws/s3/bucket
    spec:
      bucketName: {bucket}
      forceDestroy: true
      tags:
        - key: team
          value: {team}
  dbPassword:
    type: aws/secretsmanager/secret
    spec:
      secretName: {secret}
      description: {secret_description}
      generateSecretString:
        passwordLength: 24
        excludePunctuation: true
  feature:
    type: aws/ssm/parameter
    spec:
      name: {parameter}
      value: {value}
      description: A feature flag
  deployer:
    type: aws/iam/role
    spec:
      roleName: {role}
      description: {role_description}
      assumeRolePolicyDocument:
        Version: "2012-10-17"
        Statement:
          - Effect: Allow
            Principal:
              Service: lambda.amazonaws.com
            Action: sts:AssumeRole
      policies:
        - policyName: read-queues
          policyDocument:
            Version: "2012-10-17"
            Statement:
              - Effect: Allow
                Action: sqs:ReceiveMessage
                Resource: "*"
  worker:
    type: aws/lambda/function
    spec:
      functionName: {function}
      codeUri: code
      handler: handler.handler
      runtime: python3.12
      timeout: {timeout}
  nightly:
    type: aws/events/rule
    spec:
      name: {rule}
      description: Every now and then
      scheduleExpression: "{schedule}"
      state: {rule_state}
  httpApi:
    type: aws/apigatewayv2/api
    spec:
      name: {api}
      description: {api_description}
  trigger:
    type: aws/lambda/eventSourceMapping
    spec:
      functionName: ${{resources.worker.spec.functionName}}
      eventSourceArn: ${{resources.inbox.spec.arn}}
      batchSize: {batch}
"#
    )
}

/// A boto3 call that must succeed.
fn aws(m: &Moto, service: &str, operation: &str, params: Value) -> Value {
    let what = format!("{service} {operation} {params}");
    boto(m, service, operation, params).unwrap_or_else(|code| panic!("{what}: {code}"))
}

/// Asserts that a boto3 call fails with the error code saying the thing is not there.
fn assert_gone(m: &Moto, service: &str, operation: &str, params: Value, not_found: &str) {
    let what = format!("{service} {operation} {params}");
    assert_eq!(
        boto(m, service, operation, params).err().as_deref(),
        Some(not_found),
        "{what}: still there"
    );
}

fn queue_url(m: &Moto, name: &str) -> String {
    aws(m, "sqs", "get_queue_url", json!({"QueueName": name}))["QueueUrl"]
        .as_str()
        .expect("a URL")
        .to_owned()
}

fn queue_attrs(m: &Moto, name: &str) -> Value {
    let url = queue_url(m, name);
    aws(
        m,
        "sqs",
        "get_queue_attributes",
        json!({"QueueUrl": url, "AttributeNames": ["All"]}),
    )["Attributes"]
        .clone()
}

/// `[{Key, Value}]` (or SQS's map) as sorted pairs.
fn tag_pairs(tags: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = match tags {
        Value::Array(list) => list
            .iter()
            .map(|t| {
                (
                    t["Key"].as_str().unwrap_or_default().to_owned(),
                    t["Value"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect(),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect(),
        _ => Vec::new(),
    };
    out.sort();
    out
}

fn has_tag(tags: &Value, key: &str, value: &str) -> bool {
    tag_pairs(tags).iter().any(|(k, v)| k == key && v == value)
}

/// The ARN of the topic named `name`, if there is one.
fn topic_arn(m: &Moto, name: &str) -> Option<String> {
    aws(m, "sns", "list_topics", json!({}))["Topics"]
        .as_array()
        .expect("topics")
        .iter()
        .filter_map(|t| t["TopicArn"].as_str())
        .find(|arn| arn.rsplit(':').next() == Some(name))
        .map(str::to_owned)
}

/// The HTTP APIs named `name`.
fn apis_named(m: &Moto, name: &str) -> Vec<Value> {
    aws(m, "apigatewayv2", "get_apis", json!({}))["Items"]
        .as_array()
        .expect("apis")
        .iter()
        .filter(|a| a["Name"] == name)
        .cloned()
        .collect()
}

/// The event source mappings of function `name`.
fn mappings_of(m: &Moto, function: &str) -> Vec<Value> {
    aws(
        m,
        "lambda",
        "list_event_source_mappings",
        json!({"FunctionName": function}),
    )["EventSourceMappings"]
        .as_array()
        .expect("mappings")
        .clone()
}

/// The ARNs moto's tagging API knows with the ownership tag of instance `id` (it covers
/// DynamoDB, SQS, SNS, SSM and Secrets Manager, not every service).
fn tagged_with(m: &Moto, id: &str) -> Vec<String> {
    aws(
        m,
        "resourcegroupstaggingapi",
        "get_resources",
        json!({"TagFilters": [{"Key": "trellis:instance", "Values": [id]}]}),
    )["ResourceTagMappingList"]
        .as_array()
        .expect("list")
        .iter()
        .map(|r| r["ResourceARN"].as_str().expect("arn").to_owned())
        .collect()
}

/// A drifted field: its path, the value recorded, the value found.
type Drifted = (&'static str, Value, Value);

/// The planned change of resource `name` in a plan's JSON.
fn planned<'a>(plan: &'a Value, name: &str) -> &'a Value {
    plan["changeSet"]["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("no resources in {plan}"))
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not in the plan: {plan}"))
}

/// The paths of a planned change's fields.
fn paths(change: &Value) -> BTreeSet<String> {
    change["fields"]
        .as_array()
        .unwrap_or_else(|| panic!("no fields: {change}"))
        .iter()
        .map(|f| f["path"].as_str().expect("path").to_owned())
        .collect()
}

fn deploy(engine: &Engine, file: &str) {
    let out = engine.cli(&["deploy", file, "--instance", "types"]);
    assert!(
        out.status.success(),
        "deploy {file}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn assert_no_drift(engine: &Engine, when: &str) {
    let (code, drift) = engine.json(&["drift", "--instance", "types"]);
    assert_eq!(code, 0, "{when}: drift where there is none: {drift}");
    assert_eq!(drift["drifted"], false, "{when}: {drift}");
}

#[test]
fn every_resource_type_is_created_read_updated_recreated_drifted_and_destroyed() {
    let Some(m) = moto() else { return };
    let dir = TempDir::new("aws-types-e2e");
    let root = dir.path();
    let n = Names::new();
    // The blueprint at the engine's working directory (the root) and the code beside it:
    // `codeUri: code` is the same directory relative to either.
    write(
        &root.join("code/handler.py"),
        "def handler(event, context):\n    return {\"records\": len(event.get(\"Records\", []))}\n",
    );
    write(&root.join("all.yaml"), &blueprint(&n, Version::First));
    let engine = crate::aws_e2e::engine(root, m);

    // 1. Create: one resource of every type.
    deploy(&engine, "all.yaml");
    let inst = engine.instance("types");
    let resources = inst["resources"].as_object().expect("resources");
    assert_eq!(resources.len(), 12, "{inst}");
    for (name, r) in resources {
        assert_eq!(r["status"], "CREATED", "{name}: {r}");
    }
    let instance_id = inst["id"].as_str().expect("instance id").to_owned();

    // 2. What AWS has, field by field.
    let table = aws(
        m,
        "dynamodb",
        "describe_table",
        json!({"TableName": n.table}),
    )["Table"]
        .clone();
    assert_eq!(
        table["KeySchema"],
        json!([{"AttributeName": "id", "KeyType": "HASH"}]),
        "{table}"
    );
    assert_eq!(
        table["BillingModeSummary"]["BillingMode"], "PAY_PER_REQUEST",
        "{table}"
    );
    let table_tags = aws(
        m,
        "dynamodb",
        "list_tags_of_resource",
        json!({"ResourceArn": table["TableArn"]}),
    )["Tags"]
        .clone();
    assert!(has_tag(&table_tags, "team", "core"), "{table_tags}");
    // The ownership tags: this instance's `orders`.
    assert!(
        has_tag(&table_tags, "trellis:instance", &instance_id),
        "{table_tags}"
    );
    assert!(
        has_tag(&table_tags, "trellis:resource", "orders"),
        "{table_tags}"
    );

    assert_eq!(queue_attrs(m, &n.jobs)["VisibilityTimeout"], "60");
    let jobs_tags = aws(
        m,
        "sqs",
        "list_queue_tags",
        json!({"QueueUrl": queue_url(m, &n.jobs)}),
    )["Tags"]
        .clone();
    assert!(
        has_tag(&jobs_tags, "trellis:resource", "jobs"),
        "{jobs_tags}"
    );
    let inbox_arn = queue_attrs(m, &n.inbox)["QueueArn"]
        .as_str()
        .expect("arn")
        .to_owned();

    let topic = topic_arn(m, &n.topic).expect("the topic exists");
    let topic_attrs =
        aws(m, "sns", "get_topic_attributes", json!({"TopicArn": topic}))["Attributes"].clone();
    assert_eq!(topic_attrs["DisplayName"], "Orders v1", "{topic_attrs}");

    aws(m, "s3", "head_bucket", json!({"Bucket": n.bucket}));
    let bucket_tags =
        aws(m, "s3", "get_bucket_tagging", json!({"Bucket": n.bucket}))["TagSet"].clone();
    assert!(has_tag(&bucket_tags, "team", "core"), "{bucket_tags}");

    let secret = aws(
        m,
        "secretsmanager",
        "describe_secret",
        json!({"SecretId": n.secret}),
    );
    assert_eq!(secret["Description"], "Database password", "{secret}");
    let value = aws(
        m,
        "secretsmanager",
        "get_secret_value",
        json!({"SecretId": n.secret}),
    )["SecretString"]
        .as_str()
        .expect("a generated value")
        .to_owned();
    assert_eq!(value.len(), 24, "the generated password's length");
    assert!(
        value.chars().all(char::is_alphanumeric),
        "no punctuation in the generated password"
    );

    let parameter =
        aws(m, "ssm", "get_parameter", json!({"Name": n.parameter}))["Parameter"].clone();
    assert_eq!(parameter["Value"], "v1", "{parameter}");
    assert_eq!(parameter["Type"], "String", "{parameter}");

    let role = aws(m, "iam", "get_role", json!({"RoleName": n.role}))["Role"].clone();
    assert_eq!(role["Description"], "Deploys things", "{role}");
    let inline = aws(
        m,
        "iam",
        "get_role_policy",
        json!({"RoleName": n.role, "PolicyName": "read-queues"}),
    )["PolicyDocument"]
        .to_string();
    assert!(inline.contains("sqs:ReceiveMessage"), "{inline}");

    let cfg = aws(
        m,
        "lambda",
        "get_function_configuration",
        json!({"FunctionName": n.function}),
    );
    assert_eq!(cfg["Timeout"], 10, "{cfg}");
    assert_eq!(cfg["Runtime"], "python3.12", "{cfg}");
    assert_eq!(cfg["Handler"], "handler.handler", "{cfg}");
    let function_arn = cfg["FunctionArn"].as_str().expect("arn").to_owned();
    // No `role`: the function has an execution role of its own, recorded in its state.
    let owned_role = cfg["Role"]
        .as_str()
        .and_then(|r| r.rsplit('/').next())
        .expect("a role")
        .to_owned();
    assert_eq!(
        inst["resources"]["worker"]["state"]["ownedRole"],
        owned_role.as_str(),
        "{inst}"
    );
    let attached = aws(
        m,
        "iam",
        "list_attached_role_policies",
        json!({"RoleName": owned_role}),
    )["AttachedPolicies"]
        .to_string();
    assert!(
        attached.contains("AWSLambdaBasicExecutionRole"),
        "{attached}"
    );

    let rule = aws(m, "events", "describe_rule", json!({"Name": n.rule}));
    assert_eq!(rule["ScheduleExpression"], "rate(5 minutes)", "{rule}");
    assert_eq!(rule["State"], "ENABLED", "{rule}");
    assert_eq!(rule["Description"], "Every now and then", "{rule}");

    let apis = apis_named(m, &n.api);
    assert_eq!(apis.len(), 1, "{apis:?}");
    assert_eq!(apis[0]["Description"], "The orders API", "{apis:?}");
    assert_eq!(apis[0]["ProtocolType"], "HTTP", "{apis:?}");
    let api_id = apis[0]["ApiId"].as_str().expect("id").to_owned();

    let mappings = mappings_of(m, &n.function);
    assert_eq!(mappings.len(), 1, "{mappings:?}");
    assert_eq!(mappings[0]["BatchSize"], 5, "{mappings:?}");
    assert_eq!(
        mappings[0]["EventSourceArn"],
        inbox_arn.as_str(),
        "{mappings:?}"
    );
    assert_eq!(
        mappings[0]["FunctionArn"],
        function_arn.as_str(),
        "{mappings:?}"
    );
    let mapping_uuid = mappings[0]["UUID"].as_str().expect("uuid").to_owned();
    assert_eq!(
        inst["resources"]["trigger"]["externalId"],
        mapping_uuid.as_str(),
        "{inst}"
    );

    // Read: every type reads back as deployed, and planning again changes nothing.
    assert_no_drift(&engine, "after create");
    let (code, plan) = engine.json(&["plan", "all.yaml", "--instance", "types"]);
    assert_eq!(code, 0, "{plan}");
    for r in plan["changeSet"]["resources"].as_array().expect("list") {
        assert_eq!(r["action"], "NO_CHANGE", "{r}");
    }

    // 3. Update: one updatable field (or more) of every type; each an UPDATE in place.
    write(&root.join("all.yaml"), &blueprint(&n, Version::Updated));
    let (code, plan) = engine.json(&["plan", "all.yaml", "--instance", "types"]);
    assert_eq!(code, 0, "{plan}");
    let expected: [(&str, &[&str]); 11] = [
        (
            "orders",
            &[
                "spec.billingMode",
                "spec.provisionedThroughput",
                "spec.tags[0].value",
            ],
        ),
        ("jobs", &["spec.visibilityTimeout"]),
        ("events", &["spec.displayName"]),
        ("assets", &["spec.tags[0].value"]),
        ("dbPassword", &["spec.description"]),
        ("feature", &["spec.value"]),
        ("deployer", &["spec.description"]),
        ("worker", &["spec.timeout"]),
        ("nightly", &["spec.scheduleExpression", "spec.state"]),
        ("httpApi", &["spec.description"]),
        ("trigger", &["spec.batchSize"]),
    ];
    for (name, fields) in expected {
        let change = planned(&plan, name);
        assert_eq!(change["action"], "UPDATE", "{name}: {change}");
        let want: BTreeSet<String> = fields.iter().map(|f| (*f).to_owned()).collect();
        assert_eq!(paths(change), want, "{name}: {change}");
        for f in change["fields"].as_array().expect("fields") {
            assert_eq!(f["mustRecreate"], false, "{name}: {f}");
        }
    }
    assert_eq!(planned(&plan, "inbox")["action"], "NO_CHANGE", "{plan}");
    deploy(&engine, "all.yaml");

    // The new values are live, on the same resources.
    let table = aws(
        m,
        "dynamodb",
        "describe_table",
        json!({"TableName": n.table}),
    )["Table"]
        .clone();
    assert_eq!(
        table["BillingModeSummary"]["BillingMode"], "PROVISIONED",
        "{table}"
    );
    assert_eq!(
        table["ProvisionedThroughput"]["ReadCapacityUnits"], 2,
        "{table}"
    );
    assert_eq!(
        table["ProvisionedThroughput"]["WriteCapacityUnits"], 3,
        "{table}"
    );
    let table_tags = aws(
        m,
        "dynamodb",
        "list_tags_of_resource",
        json!({"ResourceArn": table["TableArn"]}),
    )["Tags"]
        .clone();
    assert!(has_tag(&table_tags, "team", "platform"), "{table_tags}");
    assert!(!has_tag(&table_tags, "team", "core"), "{table_tags}");
    assert_eq!(queue_attrs(m, &n.jobs)["VisibilityTimeout"], "90");
    let topic_attrs =
        aws(m, "sns", "get_topic_attributes", json!({"TopicArn": topic}))["Attributes"].clone();
    assert_eq!(topic_attrs["DisplayName"], "Orders v2", "{topic_attrs}");
    let bucket_tags =
        aws(m, "s3", "get_bucket_tagging", json!({"Bucket": n.bucket}))["TagSet"].clone();
    assert!(has_tag(&bucket_tags, "team", "platform"), "{bucket_tags}");
    assert!(!has_tag(&bucket_tags, "team", "core"), "{bucket_tags}");
    let secret = aws(
        m,
        "secretsmanager",
        "describe_secret",
        json!({"SecretId": n.secret}),
    );
    assert_eq!(secret["Description"], "Database password (v2)", "{secret}");
    let same_value = aws(
        m,
        "secretsmanager",
        "get_secret_value",
        json!({"SecretId": n.secret}),
    )["SecretString"]
        .clone();
    assert_eq!(
        same_value,
        value.as_str(),
        "a description change keeps the value"
    );
    let parameter =
        aws(m, "ssm", "get_parameter", json!({"Name": n.parameter}))["Parameter"].clone();
    assert_eq!(parameter["Value"], "v2", "{parameter}");
    let role = aws(m, "iam", "get_role", json!({"RoleName": n.role}))["Role"].clone();
    assert_eq!(role["Description"], "Deploys things, carefully", "{role}");
    let cfg = aws(
        m,
        "lambda",
        "get_function_configuration",
        json!({"FunctionName": n.function}),
    );
    assert_eq!(cfg["Timeout"], 20, "{cfg}");
    assert_eq!(cfg["FunctionArn"], function_arn.as_str(), "{cfg}");
    let rule = aws(m, "events", "describe_rule", json!({"Name": n.rule}));
    assert_eq!(rule["ScheduleExpression"], "rate(10 minutes)", "{rule}");
    assert_eq!(rule["State"], "DISABLED", "{rule}");
    let api = aws(m, "apigatewayv2", "get_api", json!({"ApiId": api_id}));
    assert_eq!(api["Description"], "The orders API, version 2", "{api}");
    let mapping = aws(
        m,
        "lambda",
        "get_event_source_mapping",
        json!({"UUID": mapping_uuid}),
    );
    assert_eq!(mapping["BatchSize"], 8, "{mapping}");
    assert_no_drift(&engine, "after the update");

    // 4. Recreate: new names for the table, both queues and the rule. The mapping's source
    // is the `inbox` queue's ARN, known only once the new queue exists: it is recreated too.
    write(&root.join("all.yaml"), &blueprint(&n, Version::Renamed));
    let (code, plan) = engine.json(&["plan", "all.yaml", "--instance", "types"]);
    assert_eq!(code, 0, "{plan}");
    let recreated = [
        ("orders", "spec.tableName"),
        ("jobs", "spec.queueName"),
        ("inbox", "spec.queueName"),
        ("nightly", "spec.name"),
        ("trigger", "spec.eventSourceArn"),
    ];
    for (name, field) in recreated {
        let change = planned(&plan, name);
        assert_eq!(change["action"], "RECREATE", "{name}: {change}");
        let forcing: Vec<&Value> = change["fields"]
            .as_array()
            .expect("fields")
            .iter()
            .filter(|f| f["mustRecreate"] == true)
            .collect();
        assert_eq!(forcing.len(), 1, "{name}: {change}");
        assert_eq!(forcing[0]["path"], field, "{name}: {change}");
    }
    for r in plan["changeSet"]["resources"].as_array().expect("list") {
        let name = r["name"].as_str().unwrap_or_default();
        if !recreated.iter().any(|(n, _)| *n == name) {
            assert_eq!(r["action"], "NO_CHANGE", "{r}");
        }
    }
    deploy(&engine, "all.yaml");
    // The old ones are gone, the new ones exist with the blueprint's settings.
    assert_gone(
        m,
        "dynamodb",
        "describe_table",
        json!({"TableName": n.table}),
        "ResourceNotFoundException",
    );
    let table = aws(
        m,
        "dynamodb",
        "describe_table",
        json!({"TableName": n.table_renamed}),
    )["Table"]
        .clone();
    assert_eq!(
        table["BillingModeSummary"]["BillingMode"], "PROVISIONED",
        "{table}"
    );
    for old in [&n.jobs, &n.inbox] {
        assert_gone(
            m,
            "sqs",
            "get_queue_url",
            json!({"QueueName": old}),
            "AWS.SimpleQueueService.NonExistentQueue",
        );
    }
    assert_eq!(queue_attrs(m, &n.jobs_renamed)["VisibilityTimeout"], "90");
    let new_inbox_arn = queue_attrs(m, &n.inbox_renamed)["QueueArn"]
        .as_str()
        .expect("arn")
        .to_owned();
    assert_gone(
        m,
        "events",
        "describe_rule",
        json!({"Name": n.rule}),
        "ResourceNotFoundException",
    );
    let rule = aws(
        m,
        "events",
        "describe_rule",
        json!({"Name": n.rule_renamed}),
    );
    assert_eq!(rule["ScheduleExpression"], "rate(10 minutes)", "{rule}");
    assert_eq!(rule["State"], "DISABLED", "{rule}");
    // The function has one mapping, a new one, from the new queue.
    assert_gone(
        m,
        "lambda",
        "get_event_source_mapping",
        json!({"UUID": mapping_uuid}),
        "ResourceNotFoundException",
    );
    let mappings = mappings_of(m, &n.function);
    assert_eq!(mappings.len(), 1, "{mappings:?}");
    assert_eq!(
        mappings[0]["EventSourceArn"],
        new_inbox_arn.as_str(),
        "{mappings:?}"
    );
    assert_eq!(mappings[0]["BatchSize"], 8, "{mappings:?}");
    let mapping_uuid = mappings[0]["UUID"].as_str().expect("uuid").to_owned();
    let inst = engine.instance("types");
    assert_eq!(
        inst["resources"]["orders"]["externalId"],
        n.table_renamed.as_str(),
        "{inst}"
    );
    assert_eq!(
        inst["resources"]["trigger"]["externalId"],
        mapping_uuid.as_str(),
        "{inst}"
    );
    assert_no_drift(&engine, "after the recreate");

    // 5. A change made with boto3 to every type (but the `inbox` queue) is drift, named by
    // resource and field.
    aws(
        m,
        "dynamodb",
        "update_table",
        json!({
            "TableName": n.table_renamed,
            "ProvisionedThroughput": {"ReadCapacityUnits": 5, "WriteCapacityUnits": 6}
        }),
    );
    aws(
        m,
        "sqs",
        "set_queue_attributes",
        json!({
            "QueueUrl": queue_url(m, &n.jobs_renamed),
            "Attributes": {"VisibilityTimeout": "5"}
        }),
    );
    aws(
        m,
        "sns",
        "set_topic_attributes",
        json!({"TopicArn": topic, "AttributeName": "DisplayName", "AttributeValue": "By hand"}),
    );
    // The bucket's tags with `team` changed (the ownership tags kept).
    let tags: Vec<Value> =
        aws(m, "s3", "get_bucket_tagging", json!({"Bucket": n.bucket}))["TagSet"]
            .as_array()
            .expect("tags")
            .iter()
            .map(|t| {
                if t["Key"] == "team" {
                    json!({"Key": "team", "Value": "ops"})
                } else {
                    t.clone()
                }
            })
            .collect();
    aws(
        m,
        "s3",
        "put_bucket_tagging",
        json!({"Bucket": n.bucket, "Tagging": {"TagSet": tags}}),
    );
    aws(
        m,
        "secretsmanager",
        "update_secret",
        json!({"SecretId": n.secret, "Description": "By hand"}),
    );
    aws(
        m,
        "ssm",
        "put_parameter",
        json!({
            "Name": n.parameter,
            "Value": "changed by hand",
            "Description": "A feature flag",
            "Type": "String",
            "Overwrite": true
        }),
    );
    aws(
        m,
        "iam",
        "update_role",
        json!({"RoleName": n.role, "Description": "By hand"}),
    );
    aws(
        m,
        "lambda",
        "update_function_configuration",
        json!({"FunctionName": n.function, "Timeout": 30}),
    );
    aws(m, "events", "enable_rule", json!({"Name": n.rule_renamed}));
    aws(
        m,
        "apigatewayv2",
        "update_api",
        json!({"ApiId": api_id, "Description": "By hand"}),
    );
    aws(
        m,
        "lambda",
        "update_event_source_mapping",
        json!({"UUID": mapping_uuid, "BatchSize": 3}),
    );
    let (code, drift) = engine.json(&["drift", "--instance", "types"]);
    assert_eq!(code, 3, "{drift}");
    assert_eq!(drift["drifted"], true, "{drift}");
    // Resource → (path, recorded, found) of each drifted field.
    let expected: Vec<(&str, Vec<Drifted>)> = vec![
        (
            "orders",
            vec![
                (
                    "spec.provisionedThroughput.readCapacityUnits",
                    json!(2),
                    json!(5),
                ),
                (
                    "spec.provisionedThroughput.writeCapacityUnits",
                    json!(3),
                    json!(6),
                ),
            ],
        ),
        (
            "jobs",
            vec![("spec.visibilityTimeout", json!(90), json!(5))],
        ),
        (
            "events",
            vec![("spec.displayName", json!("Orders v2"), json!("By hand"))],
        ),
        (
            "assets",
            vec![("spec.tags[0].value", json!("platform"), json!("ops"))],
        ),
        (
            "dbPassword",
            vec![(
                "spec.description",
                json!("Database password (v2)"),
                json!("By hand"),
            )],
        ),
        (
            "feature",
            vec![("spec.value", json!("v2"), json!("changed by hand"))],
        ),
        (
            "deployer",
            vec![(
                "spec.description",
                json!("Deploys things, carefully"),
                json!("By hand"),
            )],
        ),
        ("worker", vec![("spec.timeout", json!(20), json!(30))]),
        (
            "nightly",
            vec![("spec.state", json!("DISABLED"), json!("ENABLED"))],
        ),
        (
            "httpApi",
            vec![(
                "spec.description",
                json!("The orders API, version 2"),
                json!("By hand"),
            )],
        ),
        ("trigger", vec![("spec.batchSize", json!(8), json!(3))]),
    ];
    let drifted = drift["resources"].as_array().expect("resources");
    let names: BTreeSet<&str> = drifted
        .iter()
        .map(|r| r["name"].as_str().expect("name"))
        .collect();
    let want: BTreeSet<&str> = expected.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        names, want,
        "the `inbox` queue alone is as deployed: {drift}"
    );
    for (name, fields) in &expected {
        let r = drifted
            .iter()
            .find(|r| r["name"] == *name)
            .expect("drifted");
        assert_eq!(r["kind"], "CHANGED", "{r}");
        let mut found: Vec<(String, Value, Value)> = r["fields"]
            .as_array()
            .expect("fields")
            .iter()
            .map(|f| {
                (
                    f["path"].as_str().expect("path").to_owned(),
                    f["previous"].clone(),
                    f["new"].clone(),
                )
            })
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        let want: Vec<(String, Value, Value)> = fields
            .iter()
            .map(|(p, a, b)| ((*p).to_owned(), a.clone(), b.clone()))
            .collect();
        assert_eq!(found, want, "{name}: {r}");
    }

    // Reapplying the blueprint's specs puts every field back.
    let out = engine.cli(&["reconcile", "--instance", "types", "--mode", "reapply"]);
    assert!(
        out.status.success(),
        "reconcile: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_drift(&engine, "after reconcile --mode reapply");
    assert_eq!(queue_attrs(m, &n.jobs_renamed)["VisibilityTimeout"], "90");
    let parameter =
        aws(m, "ssm", "get_parameter", json!({"Name": n.parameter}))["Parameter"].clone();
    assert_eq!(parameter["Value"], "v2", "{parameter}");
    let rule = aws(
        m,
        "events",
        "describe_rule",
        json!({"Name": n.rule_renamed}),
    );
    assert_eq!(rule["State"], "DISABLED", "{rule}");
    let mapping = aws(
        m,
        "lambda",
        "get_event_source_mapping",
        json!({"UUID": mapping_uuid}),
    );
    assert_eq!(mapping["BatchSize"], 8, "{mapping}");

    // 6. Destroy leaves nothing: every resource, and the function's own role and policies.
    let tagged = tagged_with(m, &instance_id);
    for name in [
        &n.table_renamed,
        &n.jobs_renamed,
        &n.inbox_renamed,
        &n.topic,
        &n.secret,
    ] {
        assert!(
            tagged.iter().any(|arn| arn.contains(name.as_str())),
            "{name} carries the instance's tag: {tagged:?}"
        );
    }
    let out = engine.cli(&["destroy", "--instance", "types"]);
    assert!(
        out.status.success(),
        "destroy: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for table in [&n.table, &n.table_renamed] {
        assert_gone(
            m,
            "dynamodb",
            "describe_table",
            json!({"TableName": table}),
            "ResourceNotFoundException",
        );
    }
    for queue in [&n.jobs, &n.jobs_renamed, &n.inbox, &n.inbox_renamed] {
        assert_gone(
            m,
            "sqs",
            "get_queue_url",
            json!({"QueueName": queue}),
            "AWS.SimpleQueueService.NonExistentQueue",
        );
    }
    assert_eq!(topic_arn(m, &n.topic), None, "the topic is gone");
    assert_gone(m, "s3", "head_bucket", json!({"Bucket": n.bucket}), "404");
    assert_gone(
        m,
        "secretsmanager",
        "describe_secret",
        json!({"SecretId": n.secret}),
        "ResourceNotFoundException",
    );
    assert_gone(
        m,
        "ssm",
        "get_parameter",
        json!({"Name": n.parameter}),
        "ParameterNotFound",
    );
    for role in [&n.role, &owned_role] {
        assert_gone(
            m,
            "iam",
            "get_role",
            json!({"RoleName": role}),
            "NoSuchEntity",
        );
        assert_gone(
            m,
            "iam",
            "list_role_policies",
            json!({"RoleName": role}),
            "NoSuchEntity",
        );
        assert_gone(
            m,
            "iam",
            "list_attached_role_policies",
            json!({"RoleName": role}),
            "NoSuchEntity",
        );
    }
    // The managed policy the owned role had is attached to nothing of this test.
    let entities = aws(
        m,
        "iam",
        "list_entities_for_policy",
        json!({"PolicyArn": "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"}),
    );
    assert!(
        !entities.to_string().contains(&owned_role),
        "{owned_role} is still attached: {entities}"
    );
    assert_gone(
        m,
        "lambda",
        "get_function",
        json!({"FunctionName": n.function}),
        "ResourceNotFoundException",
    );
    for rule in [&n.rule, &n.rule_renamed] {
        assert_gone(
            m,
            "events",
            "describe_rule",
            json!({"Name": rule}),
            "ResourceNotFoundException",
        );
    }
    assert_eq!(
        apis_named(m, &n.api),
        Vec::<Value>::new(),
        "the API is gone"
    );
    assert_gone(
        m,
        "apigatewayv2",
        "get_api",
        json!({"ApiId": api_id}),
        "NotFoundException",
    );
    assert_gone(
        m,
        "lambda",
        "get_event_source_mapping",
        json!({"UUID": mapping_uuid}),
        "ResourceNotFoundException",
    );
    for source in [&inbox_arn, &new_inbox_arn] {
        let left = aws(
            m,
            "lambda",
            "list_event_source_mappings",
            json!({"EventSourceArn": source}),
        )["EventSourceMappings"]
            .clone();
        assert_eq!(left, json!([]), "no mapping of {source} is left");
    }
    // Nothing with the instance's ownership tag is left, as far as the tagging API sees.
    assert_eq!(tagged_with(m, &instance_id), Vec::<String>::new());
    let inst = engine.json(&["instance", "types"]).1;
    assert_eq!(inst["status"], "DESTROYED", "{inst}");
}

//! The celerity transformer end to end against moto: handlers, their handlerConfig, and the backing types (datastore, queue, topic, bucket, config) with the access links the transform declares.

use serde_json::{Value, json};

use crate::aws_moto::{moto, unique};
use crate::celerity_common::{boto_script, engine};
use crate::engine_common::write;
use crate::plugins_common::TempDir;

const CHECK_DEPLOYED: &str = r#"
lam, iam, ddb, sqs, sns, s3, sm = (client(s) for s in
    ["lambda", "iam", "dynamodb", "sqs", "sns", "s3", "secretsmanager"])
cfg = lam.get_function_configuration(FunctionName=names["function"])
out["function"] = {k: cfg.get(k) for k in ["Runtime", "Handler", "MemorySize", "Timeout"]}
out["tracing"] = cfg.get("TracingConfig", {}).get("Mode")
out["env"] = cfg.get("Environment", {}).get("Variables", {})
role = cfg["Role"].rsplit("/", 1)[1]
out["role"] = role
out["policies"] = {p: json.dumps(iam.get_role_policy(RoleName=role, PolicyName=p)["PolicyDocument"])
                   for p in iam.list_role_policies(RoleName=role)["PolicyNames"]}
t = ddb.describe_table(TableName=names["table"])["Table"]
out["table"] = {"arn": t["TableArn"], "keys": t["KeySchema"], "attrs": t["AttributeDefinitions"],
                "gsis": [{"name": g["IndexName"], "keys": g["KeySchema"]}
                         for g in t.get("GlobalSecondaryIndexes", [])]}
out["ttl"] = ddb.describe_time_to_live(TableName=names["table"])["TimeToLiveDescription"]
url = sqs.get_queue_url(QueueName=names["queue"])["QueueUrl"]
out["queue"] = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
dlq = sqs.get_queue_url(QueueName=names["dlq"])["QueueUrl"]
out["dlq_arn"] = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
out["topics"] = [x["TopicArn"] for x in sns.list_topics()["Topics"]]
out["bucket"] = not gone(lambda: s3.head_bucket(Bucket=names["bucket"]))
out["secret"] = sm.get_secret_value(SecretId=names["secret"])["SecretString"]
params = client("ssm").get_parameters(
    Names=["/%s/region" % names["store"], "/%s/token" % names["store"]], WithDecryption=True)
out["parameters"] = {p["Name"]: [p["Type"], p["Value"]] for p in params["Parameters"]}
"#;

const CHECK_DESTROYED: &str = r#"
lam, iam, ddb, sqs, sns, s3, sm = (client(s) for s in
    ["lambda", "iam", "dynamodb", "sqs", "sns", "s3", "secretsmanager"])
out["function"] = gone(lambda: lam.get_function(FunctionName=names["function"]))
out["role"] = gone(lambda: iam.get_role(RoleName=names["role"]))
out["table"] = gone(lambda: ddb.describe_table(TableName=names["table"]))
out["queue"] = gone(lambda: sqs.get_queue_url(QueueName=names["queue"]))
out["dlq"] = gone(lambda: sqs.get_queue_url(QueueName=names["dlq"]))
out["topic"] = not any(x["TopicArn"].endswith(":" + names["topic"]) for x in sns.list_topics()["Topics"])
out["bucket"] = gone(lambda: s3.head_bucket(Bucket=names["bucket"]))
out["secret"] = gone(lambda: sm.describe_secret(SecretId=names["secret"]))
out["parameters"] = client("ssm").get_parameters(
    Names=["/%s/region" % names["store"], "/%s/token" % names["store"]])["Parameters"] == []
"#;

#[test]
fn a_handler_with_its_config_and_backing_resources_deploys_links_and_destroys() {
    let Some(m) = moto() else { return };
    let dir = TempDir::new("celerity-backing-e2e");
    let root = dir.path();
    let p = unique("cel");
    let names = json!({
        "function": format!("{p}-save-order"),
        "table": format!("{p}-orders"),
        "queue": format!("{p}-jobs"),
        "dlq": format!("{p}-jobs-dlq"),
        "topic": format!("{p}-events"),
        "bucket": format!("{p}-uploads"),
        "secret": format!("{p}-secrets"),
        "store": format!("{p}-settings"),
    });
    let n = |k: &str| names[k].as_str().expect("name").to_owned();
    std::fs::create_dir_all(root.join("handlers")).expect("code dir");
    write(
        &root.join("handlers/orders.py"),
        "def save(event, context):\n    return {\"statusCode\": 201}\n",
    );
    write(
        &root.join("app.yaml"),
        &format!(
            r#"version: 2023-04-20
transform: celerity-2023-04-20
metadata:
  sharedHandlerConfig:
    runtime: python3.12.x
    timeout: 20
    environmentVariables:
      STAGE: test
      LOG_LEVEL: warn
resources:
  ordersConfig:
    type: celerity/handlerConfig
    metadata:
      labels: {{app: orders}}
    spec:
      codeLocation: handlers
      memory: 256
      environmentVariables:
        LOG_LEVEL: debug
  saveOrder:
    type: celerity/handler
    metadata:
      labels: {{role: api}}
    linkSelector:
      byLabel: {{app: orders}}
    spec:
      handlerName: {function}
      handler: orders.save
      tracingEnabled: true
      environmentVariables:
        TABLE_NAME: ${{resources.orders.spec.name}}
  orders:
    type: celerity/datastore
    metadata:
      labels: {{app: orders}}
    spec:
      name: {table}
      keys: {{partitionKey: id, sortKey: createdAt}}
      schema:
        fields:
          id: {{type: string}}
          createdAt: {{type: number}}
          customerId: {{type: string}}
      indexes:
        - name: byCustomer
          fields: [customerId, createdAt]
      timeToLive: {{fieldName: expiresAt, enabled: true}}
  jobs:
    type: celerity/queue
    metadata:
      labels: {{app: orders}}
      annotations:
        celerity.queue.deadLetterMaxAttempts: 3
    linkSelector:
      byLabel: {{deadLetters: jobs}}
    spec:
      name: {queue}
      visibilityTimeout: 45
  jobsDeadLetters:
    type: celerity/queue
    metadata:
      labels: {{deadLetters: jobs}}
    spec:
      name: {dlq}
  events:
    type: celerity/topic
    metadata:
      labels: {{app: orders}}
    spec:
      name: {topic}
  uploads:
    type: celerity/bucket
    metadata:
      labels: {{app: orders}}
    spec:
      name: {bucket}
  secrets:
    type: celerity/config
    metadata:
      labels: {{app: orders}}
    spec:
      name: {secret}
      values:
        apiKey: k-123
        retries: 3
  settings:
    type: celerity/config
    metadata:
      labels: {{app: orders}}
    spec:
      name: {store}
      plaintext: [region]
      values:
        region: eu-west-1
        token: t-456
exports:
  functionName:
    type: string
    field: resources.saveOrder.spec.handlerName
"#,
            function = n("function"),
            table = n("table"),
            queue = n("queue"),
            dlq = n("dlq"),
            topic = n("topic"),
            bucket = n("bucket"),
            secret = n("secret"),
            store = n("store"),
        ),
    );
    let engine = engine(root, m);
    let out = engine.cli(&["deploy", "app.yaml", "--instance", "cel"]);
    assert!(out.status.success(), "{out:?}");

    // The export names the function through the alias of `handlerName`.
    let inst = engine.instance("cel");
    assert_eq!(
        inst["exports"]["functionName"],
        n("function").as_str(),
        "the export holds the function's name: {inst}"
    );

    let got = boto_script(m, &names, CHECK_DEPLOYED);
    // The function: handler spec over handlerConfig over sharedHandlerConfig.
    assert_eq!(
        got["function"],
        json!({"Runtime": "python3.12", "Handler": "orders.save", "MemorySize": 256, "Timeout": 20}),
        "{got}"
    );
    assert_eq!(got["tracing"], "Active", "{got}");
    let env = &got["env"];
    assert_eq!(env["STAGE"], "test", "{env}");
    assert_eq!(env["LOG_LEVEL"], "debug", "{env}");
    assert_eq!(env["TABLE_NAME"], n("table").as_str(), "{env}");
    // populateEnvVars: one variable per linked resource.
    assert_eq!(env["ORDERS"], n("table").as_str(), "{env}");
    assert_eq!(env["UPLOADS"], n("bucket").as_str(), "{env}");
    assert!(
        env["JOBS"]
            .as_str()
            .is_some_and(|u| u.ends_with(&n("queue"))),
        "{env}"
    );
    assert!(
        env["EVENTS"]
            .as_str()
            .is_some_and(|a| a.ends_with(&n("topic"))),
        "{env}"
    );
    assert!(
        env["SECRETS"]
            .as_str()
            .is_some_and(|a| a.contains(&n("secret"))),
        "{env}"
    );
    // The links' inline policies on the function's role, each naming its resource.
    let policies = got["policies"].as_object().expect("policies");
    let table_arn = got["table"]["arn"].as_str().expect("table arn");
    for (resource, needle) in [
        ("orders", table_arn.to_owned()),
        ("uploads", n("bucket")),
        ("jobs", n("queue")),
        ("events", n("topic")),
        ("secrets", n("secret")),
    ] {
        let doc = policies
            .get(&format!("trellis-link-{resource}"))
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no link policy for {resource}: {policies:?}"));
        assert!(doc.contains(&needle), "{resource}: {doc}");
    }
    assert!(
        !policies.contains_key("trellis-link-jobsDeadLetters"),
        "the handler does not select the dead-letter queue: {policies:?}"
    );
    // The table: keys, the index, the attribute types from the schema, TTL.
    assert_eq!(
        got["table"]["keys"],
        json!([{"AttributeName": "id", "KeyType": "HASH"}, {"AttributeName": "createdAt", "KeyType": "RANGE"}]),
        "{got}"
    );
    assert_eq!(
        got["table"]["gsis"],
        json!([{"name": "byCustomer", "keys": [
            {"AttributeName": "customerId", "KeyType": "HASH"},
            {"AttributeName": "createdAt", "KeyType": "RANGE"}]}]),
        "{got}"
    );
    let attrs = got["table"]["attrs"].as_array().expect("attrs");
    assert!(
        attrs.contains(&json!({"AttributeName": "createdAt", "AttributeType": "N"})),
        "{attrs:?}"
    );
    assert_eq!(got["ttl"]["AttributeName"], "expiresAt", "{got}");
    assert_eq!(got["ttl"]["TimeToLiveStatus"], "ENABLED", "{got}");
    // The queue: its visibility timeout and the dead-letter queue's redrive policy.
    assert_eq!(got["queue"]["VisibilityTimeout"], "45", "{got}");
    let redrive: Value = serde_json::from_str(
        got["queue"]["RedrivePolicy"]
            .as_str()
            .expect("redrive policy"),
    )
    .expect("json");
    assert_eq!(redrive["deadLetterTargetArn"], got["dlq_arn"], "{redrive}");
    assert_eq!(
        redrive["maxReceiveCount"].to_string().trim_matches('"'),
        "3"
    );
    // The topic, the bucket, the secret holding the config's values as JSON.
    assert!(
        got["topics"].as_array().expect("topics").iter().any(|t| t
            .as_str()
            .is_some_and(|t| t.ends_with(&format!(":{}", n("topic"))))),
        "{got}"
    );
    assert_eq!(got["bucket"], true, "{got}");
    let secret: Value =
        serde_json::from_str(got["secret"].as_str().expect("secret string")).expect("json");
    assert_eq!(secret, json!({"apiKey": "k-123", "retries": 3}));
    // The config with `plaintext`: one parameter per key, String for the plaintext one; the
    // handler links to each (a policy, and a variable holding the parameter's name).
    let (region, token) = (
        format!("/{}/region", n("store")),
        format!("/{}/token", n("store")),
    );
    assert_eq!(
        got["parameters"],
        json!({region.clone(): ["String", "eu-west-1"], token.clone(): ["SecureString", "t-456"]}),
        "{got}"
    );
    for (resource, name) in [("settings_region", &region), ("settings_token", &token)] {
        let doc = policies
            .get(&format!("trellis-link-{resource}"))
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no link policy for {resource}: {policies:?}"));
        assert!(
            doc.contains(name.trim_start_matches('/')),
            "{resource}: {doc}"
        );
        assert!(
            env.as_object()
                .expect("env")
                .values()
                .any(|v| v == name.as_str()),
            "no variable names {name}: {env}"
        );
    }

    // Destroy leaves nothing, the function's own role included.
    let out = engine.cli(&["destroy", "--instance", "cel"]);
    assert!(out.status.success(), "{out:?}");
    let mut names = names;
    names["role"] = got["role"].clone();
    let gone = boto_script(m, &names, CHECK_DESTROYED);
    for (what, is_gone) in gone.as_object().expect("object") {
        assert_eq!(
            is_gone,
            &json!(true),
            "{what} is left after destroy: {gone}"
        );
    }
}

//! End to end, the AWS provider: the real `trellis serve` launches the real
//! `trellis-provider-aws` plugin, configured by the engine's config file to call moto (an AWS
//! emulator); the real CLI deploys, checks drift and destroys; boto3 checks what exists.

use std::path::Path;

use serde_json::{Value, json};

use std::time::{Duration, Instant};

use crate::aws_moto::{CREDENTIALS, FaultProxy, Moto, boto, moto, unique};
use crate::engine_common::{Engine, PATIENCE, cli_in_background, plugin_dir, write};
use crate::plugins_common::{TempDir, workspace_binary};

/// An engine whose plugins include `aws`, configured for `moto`.
pub(crate) fn engine(root: &Path, moto: &Moto) -> Engine {
    engine_at(root, &moto.endpoint)
}

/// An engine whose plugins include `aws`, configured to call AWS at `endpoint`.
pub(crate) fn engine_at(root: &Path, endpoint: &str) -> Engine {
    let aws = workspace_binary(
        "trellis-provider-aws",
        "trellis-provider-aws",
        "TRELLIS_TEST_AWS",
    );
    let link = plugin_dir(root).join("trellis-provider-aws");
    if !link.exists() {
        std::os::unix::fs::symlink(aws, link).expect("link the aws plugin");
    }
    write(
        &root.join("engine.toml"),
        &format!("[providers.aws]\nregion = \"us-east-1\"\nendpoint = \"{endpoint}\"\n"),
    );
    let mut b = Engine::builder(root).args(&["--config", "engine.toml"]);
    // Credentials reach the plugin through the standard chain (here, the environment the
    // engine passes on), never through the blueprint or the engine config.
    for (k, v) in CREDENTIALS {
        b = b.env(k, v);
    }
    b.start()
}

fn queue_attrs(m: &Moto, name: &str) -> Value {
    let url = boto(m, "sqs", "get_queue_url", json!({"QueueName": name})).expect("queue exists")
        ["QueueUrl"]
        .clone();
    boto(
        m,
        "sqs",
        "get_queue_attributes",
        json!({"QueueUrl": url, "AttributeNames": ["All"]}),
    )
    .expect("attributes")["Attributes"]
        .clone()
}

#[test]
fn queues_deploy_drift_and_destroy_through_the_engine() {
    let Some(m) = moto() else { return };
    let dir = TempDir::new("aws-e2e");
    let root = dir.path();
    let engine = engine(root, m);
    let jobs = unique("jobs");
    let dlq = unique("jobs-dlq");
    write(
        &root.join("queues.yaml"),
        &format!(
            r#"version: 2023-04-20
resources:
  deadLetters:
    type: aws/sqs/queue
    spec:
      queueName: {dlq}
  jobs:
    type: aws/sqs/queue
    spec:
      queueName: {jobs}
      visibilityTimeout: 60
      redrivePolicy:
        deadLetterTargetArn: ${{resources.deadLetters.spec.arn}}
        maxReceiveCount: 3
exports:
  jobsUrl:
    type: string
    field: resources.jobs.spec.queueUrl
"#
        ),
    );
    let out = engine.cli(&["deploy", "queues.yaml", "--instance", "q"]);
    assert!(out.status.success(), "{out:?}");

    // What AWS has: both queues, the redrive policy naming the dead-letter queue's ARN.
    let dlq_arn = queue_attrs(m, &dlq)["QueueArn"]
        .as_str()
        .expect("arn")
        .to_owned();
    let a = queue_attrs(m, &jobs);
    assert_eq!(a["VisibilityTimeout"], "60");
    let redrive: Value =
        serde_json::from_str(a["RedrivePolicy"].as_str().expect("redrive")).expect("json");
    assert_eq!(redrive["deadLetterTargetArn"], dlq_arn.as_str());
    let exports = engine.json(&["instance", "q"]).1;
    assert!(
        exports.to_string().contains(&format!("/{jobs}")),
        "the export holds the queue URL: {exports}"
    );

    // Nothing changed: no drift, and a plan of the same blueprint changes nothing.
    let (code, drift) = engine.json(&["drift", "--instance", "q"]);
    assert_eq!(code, 0, "{drift}");

    // A change made outside with a second client is drift, named by field.
    let url = boto(m, "sqs", "get_queue_url", json!({"QueueName": jobs})).expect("url")["QueueUrl"]
        .clone();
    boto(
        m,
        "sqs",
        "set_queue_attributes",
        json!({"QueueUrl": url, "Attributes": {"VisibilityTimeout": "5"}}),
    )
    .expect("changed outside");
    let (code, drift) = engine.json(&["drift", "--instance", "q"]);
    assert_eq!(code, 3, "{drift}");
    assert!(drift.to_string().contains("visibilityTimeout"), "{drift}");

    let out = engine.cli(&["destroy", "--instance", "q"]);
    assert!(out.status.success(), "{out:?}");
    for name in [&jobs, &dlq] {
        assert_eq!(
            boto(m, "sqs", "get_queue_url", json!({"QueueName": name}))
                .err()
                .as_deref(),
            Some("AWS.SimpleQueueService.NonExistentQueue"),
            "{name} is gone"
        );
    }
}

fn queue_blueprint(root: &Path, file: &str, name: &str) {
    write(
        &root.join(file),
        &format!(
            "version: 2023-04-20\nresources:\n  work:\n    type: aws/sqs/queue\n    spec:\n      queueName: {name}\n"
        ),
    );
}

#[test]
fn throttled_and_failing_calls_are_retried_by_the_engine() {
    let Some(m) = moto() else { return };
    let proxy = FaultProxy::start(m);
    let dir = TempDir::new("aws-e2e-retry");
    let root = dir.path();
    let engine = engine_at(root, &proxy.endpoint);
    let name = unique("retried");
    queue_blueprint(root, "q.yaml", &name);
    proxy.fail("CreateQueue", 400, "ThrottlingException", 1);
    proxy.fail("CreateQueue", 503, "ServiceUnavailable", 1);
    let out = engine.cli(&["deploy", "q.yaml", "--instance", "r"]);
    assert!(out.status.success(), "{out:?}");
    // Two refused attempts and the one that went through, all from the engine's retries.
    assert_eq!(proxy.calls("CreateQueue"), 3);
    let queues = boto(m, "sqs", "list_queues", json!({"QueueNamePrefix": name})).expect("list");
    assert_eq!(
        queues["QueueUrls"].as_array().map(Vec::len),
        Some(1),
        "{queues}"
    );
    let out = engine.cli(&["destroy", "--instance", "r"]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn a_deploy_killed_mid_create_recovers_without_a_second_queue() {
    let Some(m) = moto() else { return };
    let proxy = FaultProxy::start(m);
    let dir = TempDir::new("aws-e2e-kill");
    let root = dir.path();
    let mut engine = engine_at(root, &proxy.endpoint);
    let name = unique("killed");
    queue_blueprint(root, "q.yaml", &name);
    // CreateQueue reaches moto two seconds late: the engine dies while it is in flight.
    proxy.delay("CreateQueue", 2.0, 1);
    let mut client = cli_in_background(
        &engine,
        &["deploy", "q.yaml", "--instance", "k"],
        "k",
        "resource.create_requested",
    );
    let limit = Instant::now() + PATIENCE;
    while proxy.calls("CreateQueue") == 0 {
        assert!(Instant::now() < limit, "CreateQueue never sent");
        std::thread::sleep(Duration::from_millis(50));
    }
    engine.kill9();
    let _ = client.wait();
    // The call the engine never heard back from still creates the queue.
    while boto(m, "sqs", "get_queue_url", json!({"QueueName": name})).is_err() {
        assert!(Instant::now() < limit, "the delayed create never landed");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(engine);

    let engine = engine_at(root, &proxy.endpoint);
    let inst = engine.instance("k");
    assert_eq!(inst["status"], "INTERRUPTED", "{inst}");
    // Deploying again adopts the queue the interrupted create made (its ownership tags say
    // it is this instance's `work`): no CONFLICT, no second queue.
    let out = engine.cli(&["deploy", "q.yaml", "--instance", "k"]);
    assert!(out.status.success(), "{out:?}");
    let queues = boto(m, "sqs", "list_queues", json!({"QueueNamePrefix": name})).expect("list");
    assert_eq!(
        queues["QueueUrls"].as_array().map(Vec::len),
        Some(1),
        "{queues}"
    );
    let inst = engine.instance("k");
    assert!(
        inst.to_string().contains(&format!("/{name}")),
        "the queue URL is recorded: {inst}"
    );
    let out = engine.cli(&["destroy", "--instance", "k"]);
    assert!(out.status.success(), "{out:?}");
    assert!(boto(m, "sqs", "get_queue_url", json!({"QueueName": name})).is_err());
}

/// Copies `examples/<rel>` (a file or a directory) under `root`.
fn copy_example(root: &Path, rel: &str) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(rel);
    let to = root.join("examples").join(rel);
    if from.is_dir() {
        std::fs::create_dir_all(&to).expect("dir");
        for e in std::fs::read_dir(&from).expect("read dir") {
            let e = e.expect("entry");
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    } else {
        std::fs::create_dir_all(to.parent().expect("parent")).expect("dir");
        std::fs::copy(&from, &to).expect("copy");
    }
}

#[test]
fn the_readme_orders_api_example_deploys_links_and_destroys() {
    let Some(m) = moto() else { return };
    let dir = TempDir::new("aws-e2e-orders");
    let root = dir.path();
    copy_example(root, "orders-api.yaml");
    copy_example(root, "orders-api");
    let engine = engine(root, m);
    // The README's blueprint as written: environment `staging`, names `orders-staging-*`
    // (one moto per test binary, and no other test uses them).
    let out = engine.cli(&["deploy", "examples/orders-api.yaml", "--instance", "o"]);
    assert!(out.status.success(), "{out:?}");
    let prefix_staging = "orders-staging";

    // The table, the two buckets and the debug bucket exist.
    let table = boto(
        m,
        "dynamodb",
        "describe_table",
        json!({"TableName": format!("{prefix_staging}-orders")}),
    )
    .expect("table")["Table"]["TableArn"]
        .as_str()
        .expect("arn")
        .to_owned();
    for b in ["orders-0", "invoices-1", "debug"] {
        boto(
            m,
            "s3",
            "head_bucket",
            json!({"Bucket": format!("{prefix_staging}-{b}")}),
        )
        .expect("bucket");
    }
    // The function: its variables from the blueprint, the secret one included.
    let name = format!("{prefix_staging}-save-order");
    let cfg = boto(
        m,
        "lambda",
        "get_function_configuration",
        json!({"FunctionName": name}),
    )
    .expect("function");
    let vars = &cfg["Environment"]["Variables"];
    assert_eq!(vars["TABLE"], format!("{prefix_staging}-orders"), "{vars}");
    assert_eq!(
        vars["FIRST_BUCKET"],
        format!("{prefix_staging}-orders-0"),
        "{vars}"
    );
    assert_eq!(vars["DATABASE_PASSWORD"], "change-me", "{vars}");
    // Its own role, and the links' policies naming the table and the buckets it selects.
    let role = cfg["Role"]
        .as_str()
        .expect("role")
        .rsplit('/')
        .next()
        .expect("name")
        .to_owned();
    let policies = boto(m, "iam", "list_role_policies", json!({"RoleName": role}))
        .expect("policies")["PolicyNames"]
        .clone();
    let names: Vec<&str> = policies
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|p| p.as_str())
        .collect();
    assert!(names.contains(&"trellis-link-ordersTable"), "{policies}");
    let doc = boto(
        m,
        "iam",
        "get_role_policy",
        json!({"RoleName": role, "PolicyName": "trellis-link-ordersTable"}),
    )
    .expect("policy")["PolicyDocument"]
        .to_string();
    assert!(doc.contains(&table), "{doc}");
    assert!(
        names
            .iter()
            .filter(|n| n.starts_with("trellis-link-buckets"))
            .count()
            == 2,
        "{policies}"
    );

    // Nothing drifted.
    let (code, drift) = engine.json(&["drift", "--instance", "o"]);
    assert_eq!(code, 0, "{drift}");

    // Destroy leaves nothing: function, its role, table, buckets.
    let out = engine.cli(&["destroy", "--instance", "o"]);
    assert!(out.status.success(), "{out:?}");
    assert!(boto(m, "lambda", "get_function", json!({"FunctionName": name})).is_err());
    assert!(
        boto(m, "iam", "get_role", json!({"RoleName": role})).is_err(),
        "the owned role is gone"
    );
    assert!(
        boto(
            m,
            "dynamodb",
            "describe_table",
            json!({"TableName": format!("{prefix_staging}-orders")})
        )
        .is_err()
    );
    for b in ["orders-0", "invoices-1", "debug"] {
        assert!(
            boto(
                m,
                "s3",
                "head_bucket",
                json!({"Bucket": format!("{prefix_staging}-{b}")})
            )
            .is_err()
        );
    }
}

/// The AWS names of `examples/events-app.yaml` deployed with `prefix`.
struct EventsApp {
    topic: String,
    queue: String,
    api: String,
    function: String,
}

impl EventsApp {
    fn new(prefix: &str) -> EventsApp {
        EventsApp {
            topic: format!("{prefix}-events"),
            queue: format!("{prefix}-inbox"),
            api: format!("{prefix}-api"),
            function: format!("{prefix}-worker"),
        }
    }
}

/// The ARN of the topic named `name`, if it exists.
fn topic_arn(m: &Moto, name: &str) -> Option<String> {
    let topics = boto(m, "sns", "list_topics", json!({})).expect("topics")["Topics"].clone();
    topics
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|t| t["TopicArn"].as_str())
        .find(|arn| arn.rsplit(':').next() == Some(name))
        .map(str::to_owned)
}

/// The id of the HTTP API named `name`, if it exists.
fn api_id(m: &Moto, name: &str) -> Option<String> {
    let apis = boto(m, "apigatewayv2", "get_apis", json!({})).expect("apis")["Items"].clone();
    apis.as_array()
        .expect("list")
        .iter()
        .find(|a| a["Name"] == name)
        .and_then(|a| a["ApiId"].as_str())
        .map(str::to_owned)
}

#[test]
fn the_events_app_example_deploys_its_links_and_destroys() {
    let Some(m) = moto() else { return };
    let dir = TempDir::new("aws-e2e-events");
    let root = dir.path();
    // The blueprint and its code side by side in the engine's working directory, so that
    // `codeUri: events-app` names the code relative to the blueprint file and to the engine.
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    std::fs::copy(
        examples.join("events-app.yaml"),
        root.join("events-app.yaml"),
    )
    .expect("copy the blueprint");
    std::fs::create_dir_all(root.join("events-app")).expect("dir");
    for e in std::fs::read_dir(examples.join("events-app")).expect("read dir") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), root.join("events-app").join(e.file_name())).expect("copy");
    }
    let engine = engine(root, m);
    // The blueprint as written, its names prefixed for this test (moto is shared).
    let prefix = unique("events-app");
    let names = EventsApp::new(&prefix);
    let var = format!("prefix={prefix}");
    let out = engine.cli(&[
        "deploy",
        "events-app.yaml",
        "--instance",
        "ev",
        "--var",
        &var,
    ]);
    assert!(out.status.success(), "{out:?}");

    // The engine's record: four resources and three links, all created.
    let inst = engine.instance("ev");
    let links = inst["links"].as_array().expect("links");
    let mut pairs: Vec<(&str, &str, &str)> = links
        .iter()
        .map(|l| {
            assert_eq!(l["status"], "CREATED", "{l}");
            (
                l["resourceA"].as_str().unwrap_or(""),
                l["resourceB"].as_str().unwrap_or(""),
                l["linkType"].as_str().unwrap_or(""),
            )
        })
        .collect();
    pairs.sort_unstable();
    assert_eq!(
        pairs,
        [
            ("events", "inbox", "aws/sns/topic::aws/sqs/queue"),
            (
                "httpApi",
                "worker",
                "aws/apigatewayv2/api::aws/lambda/function"
            ),
            ("inbox", "worker", "aws/sqs/queue::aws/lambda/function"),
        ],
        "{inst}"
    );

    // The resources.
    let topic = topic_arn(m, &names.topic).expect("the topic exists");
    let queue = queue_attrs(m, &names.queue);
    let queue_arn = queue["QueueArn"].as_str().expect("queue arn").to_owned();
    assert_eq!(queue["VisibilityTimeout"], "60");
    let api = api_id(m, &names.api).expect("the API exists");
    let cfg = boto(
        m,
        "lambda",
        "get_function_configuration",
        json!({"FunctionName": names.function}),
    )
    .expect("the function exists");
    let function_arn = cfg["FunctionArn"].as_str().expect("arn").to_owned();
    assert_eq!(cfg["Handler"], "handler.handler");
    // No `role` in the blueprint: the function's own execution role.
    let role = cfg["Role"]
        .as_str()
        .expect("role")
        .rsplit('/')
        .next()
        .expect("name")
        .to_owned();
    boto(m, "iam", "get_role", json!({"RoleName": role})).expect("the function's own role");
    assert_eq!(
        inst["exports"]["topicArn"], topic,
        "the export holds the topic's ARN: {inst}"
    );
    assert!(
        inst["exports"]["apiEndpoint"]
            .as_str()
            .is_some_and(|e| e.contains(&api)),
        "the export holds the API's endpoint: {inst}"
    );

    // Topic → queue: the queue subscribes, and its policy lets the topic send.
    let subs = boto(
        m,
        "sns",
        "list_subscriptions_by_topic",
        json!({"TopicArn": topic}),
    )
    .expect("subscriptions")["Subscriptions"]
        .clone();
    let subs = subs.as_array().expect("list");
    assert_eq!(subs.len(), 1, "{subs:?}");
    assert_eq!(subs[0]["Protocol"], "sqs", "{subs:?}");
    assert_eq!(subs[0]["Endpoint"], queue_arn.as_str(), "{subs:?}");
    let policy: Value =
        serde_json::from_str(queue["Policy"].as_str().expect("a queue policy")).expect("json");
    let statement = policy["Statement"]
        .as_array()
        .expect("statements")
        .iter()
        .find(|s| s["Principal"]["Service"] == "sns.amazonaws.com")
        .unwrap_or_else(|| panic!("no statement for SNS: {policy}"));
    assert_eq!(statement["Action"], "sqs:SendMessage", "{statement}");
    assert_eq!(statement["Resource"], queue_arn.as_str(), "{statement}");
    assert_eq!(
        statement["Condition"]["ArnEquals"]["aws:SourceArn"],
        topic.as_str(),
        "{statement}"
    );

    // Queue → function: one event source mapping with the queue's batch size, and receive
    // rights on the function's role.
    let mappings = boto(
        m,
        "lambda",
        "list_event_source_mappings",
        json!({"FunctionName": function_arn, "EventSourceArn": queue_arn}),
    )
    .expect("mappings")["EventSourceMappings"]
        .clone();
    let mappings = mappings.as_array().expect("list");
    assert_eq!(mappings.len(), 1, "{mappings:?}");
    assert_eq!(mappings[0]["BatchSize"], 5, "{mappings:?}");
    let receive = boto(
        m,
        "iam",
        "get_role_policy",
        json!({"RoleName": role, "PolicyName": "trellis-trigger-inbox"}),
    )
    .expect("the trigger's policy")["PolicyDocument"]
        .to_string();
    assert!(
        receive.contains("sqs:ReceiveMessage") && receive.contains(&queue_arn),
        "{receive}"
    );

    // API → function: an AWS_PROXY integration, the annotation's route to it, and the
    // invoke permission for this API.
    let integrations = boto(m, "apigatewayv2", "get_integrations", json!({"ApiId": api}))
        .expect("integrations")["Items"]
        .clone();
    let integration = integrations
        .as_array()
        .expect("list")
        .iter()
        .find(|i| i["IntegrationUri"] == function_arn.as_str())
        .unwrap_or_else(|| panic!("no integration with the function: {integrations}"))
        .clone();
    assert_eq!(integration["IntegrationType"], "AWS_PROXY", "{integration}");
    assert_eq!(integration["PayloadFormatVersion"], "2.0", "{integration}");
    let routes =
        boto(m, "apigatewayv2", "get_routes", json!({"ApiId": api})).expect("routes")["Items"]
            .clone();
    let route = routes
        .as_array()
        .expect("list")
        .iter()
        .find(|r| r["RouteKey"] == "POST /events")
        .unwrap_or_else(|| panic!("no route POST /events: {routes}"));
    assert_eq!(
        route["Target"],
        format!(
            "integrations/{}",
            integration["IntegrationId"].as_str().expect("id")
        ),
        "{route}"
    );
    let policy = boto(
        m,
        "lambda",
        "get_policy",
        json!({"FunctionName": names.function}),
    )
    .expect("the function's policy")["Policy"]
        .clone();
    let policy: Value = serde_json::from_str(policy.as_str().expect("json text")).expect("json");
    let invoke = policy["Statement"]
        .as_array()
        .expect("statements")
        .iter()
        .find(|s| s["Principal"]["Service"] == "apigateway.amazonaws.com")
        .unwrap_or_else(|| panic!("no invoke permission for API Gateway: {policy}"));
    assert_eq!(invoke["Action"], "lambda:InvokeFunction", "{invoke}");
    assert!(
        invoke["Condition"].to_string().contains(&api),
        "the permission is for this API: {invoke}"
    );

    // Nothing drifted.
    let (code, drift) = engine.json(&["drift", "--instance", "ev"]);
    assert_eq!(code, 0, "{drift}");

    // Destroy leaves nothing: the links' effects, the four resources, the function's role.
    let out = engine.cli(&["destroy", "--instance", "ev"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(topic_arn(m, &names.topic), None, "the topic is gone");
    assert_eq!(
        boto(m, "sqs", "get_queue_url", json!({"QueueName": names.queue}))
            .err()
            .as_deref(),
        Some("AWS.SimpleQueueService.NonExistentQueue"),
        "the queue is gone"
    );
    assert_eq!(api_id(m, &names.api), None, "the API is gone");
    assert!(
        boto(
            m,
            "lambda",
            "get_function",
            json!({"FunctionName": names.function})
        )
        .is_err(),
        "the function is gone"
    );
    assert!(
        boto(m, "iam", "get_role", json!({"RoleName": role})).is_err(),
        "the function's own role is gone"
    );
    let mappings = boto(
        m,
        "lambda",
        "list_event_source_mappings",
        json!({"EventSourceArn": queue_arn}),
    )
    .expect("mappings")["EventSourceMappings"]
        .clone();
    assert_eq!(mappings.as_array().map(Vec::len), Some(0), "{mappings}");
    let subs =
        boto(m, "sns", "list_subscriptions", json!({})).expect("subscriptions")["Subscriptions"]
            .clone();
    assert!(
        !subs.to_string().contains(&queue_arn),
        "no subscription of the queue is left: {subs}"
    );
}

/// The AWS provider passes `trellis plugins check`, its cases against moto: a queue and a
/// bucket through create, read, a repeated create with the same key, update, destroy, read.
#[test]
fn plugins_check_passes_the_aws_provider() {
    let Some(m) = moto() else { return };
    let root = TempDir::new("aws-check");
    let aws = workspace_binary(
        "trellis-provider-aws",
        "trellis-provider-aws",
        "TRELLIS_TEST_AWS",
    );
    let queue = unique("check-q");
    let bucket = unique("check-b");
    write(
        &root.join("cases.yaml"),
        &format!(
            "- type: aws/sqs/queue\n  config: {{region: us-east-1, endpoint: \"{e}\"}}\n  spec: {{queueName: {queue}, visibilityTimeout: 30}}\n  update: {{queueName: {queue}, visibilityTimeout: 45}}\n- type: aws/s3/bucket\n  config: {{region: us-east-1, endpoint: \"{e}\"}}\n  spec: {{bucketName: {bucket}}}\n",
            e = m.endpoint
        ),
    );
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_trellis"));
    cmd.args(["plugins", "check", "--format", "json", "--cases"])
        .arg(root.join("cases.yaml"))
        .arg(&aws);
    for (k, v) in CREDENTIALS {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(out.status.code(), Some(0), "{v}");
    assert_eq!(v["findings"], 0, "{v}");
}

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
fn engine(root: &Path, moto: &Moto) -> Engine {
    engine_at(root, &moto.endpoint)
}

/// An engine whose plugins include `aws`, configured to call AWS at `endpoint`.
fn engine_at(root: &Path, endpoint: &str) -> Engine {
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

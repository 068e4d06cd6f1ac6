//! End to end, the AWS provider: the real `trellis serve` launches the real
//! `trellis-provider-aws` plugin, configured by the engine's config file to call moto (an AWS
//! emulator); the real CLI deploys, checks drift and destroys; boto3 checks what exists.

use std::path::Path;

use serde_json::{Value, json};

use crate::aws_moto::{CREDENTIALS, Moto, boto, moto, unique};
use crate::engine_common::{Engine, plugin_dir, write};
use crate::plugins_common::{TempDir, workspace_binary};

/// An engine whose plugins include `aws`, configured for `moto`.
fn engine(root: &Path, moto: &Moto) -> Engine {
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
        &format!(
            "[providers.aws]\nregion = \"us-east-1\"\nendpoint = \"{}\"\n",
            moto.endpoint
        ),
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

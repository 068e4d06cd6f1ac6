//! `aws/lambda/function` and `aws/lambda/eventSourceMapping`. moto runs functions only in
//! Docker, so nothing here invokes one: creates, reads, updates and deletes only.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;
use trellis_plugin_sdk::proto as pb;
use trellis_plugin_sdk::testing::Harness;
use trellis_plugin_sdk::{ErrorClass, Resource, ResourceState, Severity, Value};
use trellis_provider_aws::config::ClientCache;
use trellis_provider_aws::event_source_mapping::EventSourceMapping;
use trellis_provider_aws::lambda::Function;

use crate::iam::{assert_reads_back, trust};
use crate::support::{Moto, boto, harness, moto, outside_queue, unique};

const BASIC: &str = "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole";

/// A directory holding a small handler; `body` is what it returns.
fn code_dir(body: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "trellis-lambda-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(d.join("lib")).expect("dir");
    std::fs::write(
        d.join("handler.py"),
        format!("from lib import util\n\ndef handler(event, context):\n    return {body:?}\n"),
    )
    .expect("handler");
    std::fs::write(d.join("lib/util.py"), "X = 1\n").expect("lib");
    d
}

fn function(m: &Moto, name: &str) -> serde_json::Value {
    boto(m, "lambda", "get_function", json!({"FunctionName": name})).expect("function exists")
}

/// A role made with boto3 (not Trellis's): its ARN.
fn outside_role(m: &Moto, name: &str) -> String {
    let out = boto(
        m,
        "iam",
        "create_role",
        json!({"RoleName": name, "AssumeRolePolicyDocument": trust("lambda.amazonaws.com").to_json().to_string()}),
    )
    .expect("role created");
    out["Role"]["Arn"].as_str().expect("arn").to_owned()
}

/// ApplyResource with its progress messages.
async fn apply(
    h: &Harness,
    ty: &str,
    name: &str,
    current: Option<&ResourceState>,
    spec: Value,
) -> (Vec<String>, trellis_plugin_sdk::Result<ResourceState>) {
    let out = h
        .apply_with(pb::ApplyResourceRequest {
            context: Some(h.call_context()),
            current: current.map(ResourceState::to_proto),
            resource_type: ty.to_owned(),
            resource_name: name.to_owned(),
            desired_spec: Some(spec.to_proto()),
        })
        .await
        .expect("apply");
    (
        out.progress.into_iter().map(|(m, _)| m).collect(),
        out.result,
    )
}

fn text<'a>(r: &'a ResourceState, key: &str) -> &'a str {
    r.state.get(key).and_then(Value::as_str).unwrap_or("")
}

#[tokio::test]
async fn a_function_from_a_directory_owns_its_role_and_is_updated_and_destroyed() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("saveOrder");
    let dir = code_dir("v1");
    let env = Value::map()
        .with("DATABASE_HOST", "db.internal")
        .with("DATABASE_PORT", 5432)
        .with("DATABASE_PASSWORD", Value::sensitive("hunter2"));
    let spec = Value::map()
        .with("functionName", name.as_str())
        .with("codeUri", dir.to_str().expect("utf-8"))
        .with("handler", "handler.handler")
        .with("runtime", "python3.12")
        .with("tracing", "Active")
        .with("architectures", "arm64")
        .with("timeout", 120)
        .with("memorySize", 256)
        .with("description", "saves orders")
        .with("environment", Value::map().with("variables", env))
        .with(
            "tags",
            Value::List(vec![Value::map().with("key", "team").with("value", "a")]),
        );
    let f = h
        .create("aws/lambda/function", "saveOrder", spec.clone())
        .await
        .expect("created");
    assert_eq!(f.external_id, name);
    let role = format!("{name}-role");
    assert_eq!(text(&f, "ownedRole"), role);
    assert_eq!(
        text(&f, "arn"),
        format!("arn:aws:lambda:us-east-1:123456789012:function:{name}")
    );

    let got = function(m, &name);
    let cfg = &got["Configuration"];
    assert_eq!(cfg["Handler"], "handler.handler");
    assert_eq!(cfg["Runtime"], "python3.12");
    assert_eq!(cfg["Timeout"], 120);
    assert_eq!(cfg["MemorySize"], 256);
    assert_eq!(cfg["Description"], "saves orders");
    assert_eq!(cfg["TracingConfig"]["Mode"], "Active");
    assert_eq!(cfg["Architectures"], json!(["arm64"]));
    assert_eq!(
        cfg["Environment"]["Variables"],
        json!({"DATABASE_HOST": "db.internal", "DATABASE_PORT": "5432", "DATABASE_PASSWORD": "hunter2"})
    );
    assert_eq!(cfg["Role"], text(&f, "roleArn"));
    assert_eq!(cfg["CodeSha256"], text(&f, "codeSha256"));
    assert_eq!(got["Tags"]["team"], "a");
    assert_eq!(got["Tags"]["trellis:resource"], "saveOrder");

    // The function's own role: the trust policy for Lambda, the basic execution policy, ours.
    let r =
        boto(m, "iam", "get_role", json!({"RoleName": role})).expect("own role")["Role"].clone();
    assert_eq!(r["Arn"], text(&f, "roleArn"));
    assert_eq!(
        r["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]["Service"],
        "lambda.amazonaws.com"
    );
    assert!(
        r["Tags"]
            .as_array()
            .expect("tags")
            .contains(&json!({"Key": "trellis:resource", "Value": "saveOrder"}))
    );
    let attached = boto(
        m,
        "iam",
        "list_attached_role_policies",
        json!({"RoleName": role}),
    )
    .expect("attached");
    assert_eq!(attached["AttachedPolicies"][0]["PolicyArn"], BASIC);

    // Read: nothing changed, so the spec reads back as applied (the secret still marked).
    let read = h.read(&f).await.expect("read").expect("exists");
    assert_reads_back(&read.spec, &spec);
    assert_eq!(read.state, f.state);

    // Drift made outside: timeout and a variable changed; a link's variable added.
    boto(
        m,
        "lambda",
        "update_function_configuration",
        json!({"FunctionName": name, "Timeout": 99, "Environment": {"Variables": {
            "DATABASE_HOST": "elsewhere", "DATABASE_PORT": "5432",
            "DATABASE_PASSWORD": "hunter2", "ORDERS_TABLE": "orders"}}}),
    )
    .expect("changed");
    let read = h.read(&f).await.expect("read").expect("exists");
    assert_eq!(read.spec.get("timeout"), Some(&Value::Int(99)));
    let vars = read
        .spec
        .get("environment")
        .and_then(|e| e.get("variables"))
        .expect("variables");
    assert_eq!(vars.get("DATABASE_HOST"), Some(&Value::from("elsewhere")));
    assert_eq!(vars.get("DATABASE_PORT"), Some(&Value::Int(5432)));
    // A variable the blueprint does not know could be anything: it is masked.
    assert!(vars.get("ORDERS_TABLE").is_some_and(Value::is_sensitive));

    // Code changed outside (from S3): read shows codeUri differing.
    let bucket = unique("drift-code");
    boto(m, "s3", "create_bucket", json!({"Bucket": bucket})).expect("bucket");
    boto(
        m,
        "s3",
        "put_object",
        json!({"Bucket": bucket, "Key": "other.zip", "Body": "other code"}),
    )
    .expect("object");
    boto(
        m,
        "lambda",
        "update_function_code",
        json!({"FunctionName": name, "S3Bucket": bucket, "S3Key": "other.zip"}),
    )
    .expect("code changed");
    let read = h.read(&f).await.expect("read").expect("exists");
    let uri = read
        .spec
        .get("codeUri")
        .and_then(Value::as_str)
        .expect("codeUri");
    assert!(uri.contains("changed outside"), "{uri}");

    // Update in place: new code and configuration; the password dropped, a variable added;
    // the link's variable stays; the tag goes.
    std::fs::write(
        dir.join("handler.py"),
        "def handler(event, context):\n    return 2\n",
    )
    .expect("new code");
    let spec2 = Value::map()
        .with("functionName", name.as_str())
        .with("codeUri", dir.to_str().expect("utf-8"))
        .with("handler", "handler.main")
        .with("runtime", "python3.12")
        .with("architectures", "arm64")
        .with("timeout", 60)
        .with(
            "environment",
            Value::map().with(
                "variables",
                Value::map()
                    .with("DATABASE_HOST", "db.internal")
                    .with("DATABASE_PORT", 5432)
                    .with("STAGE", "prod"),
            ),
        );
    let (progress, f2) = apply(
        &h,
        "aws/lambda/function",
        "saveOrder",
        Some(&f),
        spec2.clone(),
    )
    .await;
    let f2 = f2.expect("updated");
    assert!(
        progress.iter().any(|p| p.contains("updating the code")),
        "{progress:?}"
    );
    let got = function(m, &name);
    let cfg = &got["Configuration"];
    assert_eq!(cfg["Handler"], "handler.main");
    assert_eq!(cfg["Timeout"], 60);
    assert_eq!(cfg["MemorySize"], 128);
    assert_eq!(cfg["Description"], "");
    assert_eq!(
        cfg["Environment"]["Variables"],
        json!({"DATABASE_HOST": "db.internal", "DATABASE_PORT": "5432", "STAGE": "prod", "ORDERS_TABLE": "orders"})
    );
    assert_eq!(cfg["CodeSha256"], text(&f2, "codeSha256"));
    assert_ne!(text(&f2, "codeSha256"), text(&f, "codeSha256"));
    assert!(got["Tags"].get("team").is_none(), "{}", got["Tags"]);
    // Unchanged but for the link's variable (drift only for a link that does not own it).
    let read = h.read(&f2).await.expect("read").expect("exists");
    let mut rest = spec2.clone();
    if let Value::Map(m) = &mut rest {
        m.shift_remove("environment");
    }
    assert_reads_back(&read.spec, &rest);
    let vars = read
        .spec
        .get("environment")
        .and_then(|e| e.get("variables"))
        .and_then(Value::as_map)
        .expect("variables");
    let keys: Vec<&str> = vars.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["DATABASE_HOST", "DATABASE_PORT", "STAGE", "ORDERS_TABLE"]
    );
    assert_eq!(vars.get("DATABASE_PORT"), Some(&Value::Int(5432)));

    // The same code again: nothing is uploaded.
    let spec3 = spec2.clone().with("timeout", 61);
    let (progress, f3) = apply(&h, "aws/lambda/function", "saveOrder", Some(&f2), spec3).await;
    let f3 = f3.expect("updated");
    assert!(
        !progress.iter().any(|p| p.contains("updating the code")),
        "{progress:?}"
    );
    assert_eq!(text(&f3, "codeSha256"), text(&f2, "codeSha256"));

    // Destroy: the function and its role go; again is fine.
    h.destroy(&f3).await.expect("destroyed");
    assert_eq!(
        boto(m, "lambda", "get_function", json!({"FunctionName": name}))
            .err()
            .as_deref(),
        Some("ResourceNotFoundException")
    );
    assert_eq!(
        boto(m, "iam", "get_role", json!({"RoleName": role}))
            .err()
            .as_deref(),
        Some("NoSuchEntity")
    );
    h.destroy(&f3).await.expect("destroy is idempotent");
    assert!(h.read(&f3).await.expect("read").is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn code_from_s3_and_a_given_role_and_switching_roles() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("fromS3");
    let given = outside_role(m, &unique("given"));
    let bucket = unique("code");
    boto(m, "s3", "create_bucket", json!({"Bucket": bucket})).expect("bucket");
    for (key, body) in [("v1.zip", "code one"), ("v2.zip", "code two")] {
        boto(
            m,
            "s3",
            "put_object",
            json!({"Bucket": bucket, "Key": key, "Body": body}),
        )
        .expect("object");
    }
    let spec = Value::map()
        .with("functionName", name.as_str())
        .with("codeUri", format!("s3://{bucket}/v1.zip"))
        .with("handler", "index.handler")
        .with("runtime", "nodejs20.x")
        .with("role", given.as_str())
        .with("architectures", Value::from(vec!["x86_64"]))
        .with("reservedConcurrentExecutions", 5);
    let f = h
        .create("aws/lambda/function", "fromS3", spec.clone())
        .await
        .expect("created");
    assert_eq!(text(&f, "roleArn"), given);
    assert!(f.state.get("ownedRole").is_none(), "{:?}", f.state);
    let got = function(m, &name);
    assert_eq!(
        got["Configuration"]["CodeSha256"],
        trellis_provider_aws::code::sha256_base64(b"code one")
    );
    assert_eq!(got["Concurrency"]["ReservedConcurrentExecutions"], 5);
    assert_eq!(
        boto(
            m,
            "iam",
            "get_role",
            json!({"RoleName": format!("{name}-role")})
        )
        .err()
        .as_deref(),
        Some("NoSuchEntity"),
        "no role of its own"
    );
    let read = h.read(&f).await.expect("read").expect("exists");
    assert_reads_back(&read.spec, &spec);

    // Other code in S3, and no `role`: the function gets a role of its own.
    let spec2 = Value::map()
        .with("functionName", name.as_str())
        .with("codeUri", format!("s3://{bucket}/v2.zip"))
        .with("handler", "index.handler")
        .with("runtime", "nodejs20.x");
    let f2 = h.update(&f, spec2).await.expect("updated");
    let own = format!("{name}-role");
    assert_eq!(text(&f2, "ownedRole"), own);
    let got = function(m, &name);
    assert_eq!(got["Configuration"]["Role"], text(&f2, "roleArn"));
    assert_eq!(
        got["Configuration"]["CodeSha256"],
        trellis_provider_aws::code::sha256_base64(b"code two")
    );
    assert!(got.get("Concurrency").is_none(), "{got}");
    boto(m, "iam", "get_role", json!({"RoleName": own})).expect("own role made");

    // Back to the given role: the own role goes, the given one stays.
    let f3 = h.update(&f2, spec.clone()).await.expect("updated");
    assert_eq!(text(&f3, "roleArn"), given);
    assert_eq!(
        boto(m, "iam", "get_role", json!({"RoleName": own}))
            .err()
            .as_deref(),
        Some("NoSuchEntity")
    );
    h.destroy(&f3).await.expect("destroyed");
    let given_name = given.rsplit('/').next().expect("name");
    boto(m, "iam", "get_role", json!({"RoleName": given_name})).expect("the given role stays");
}

#[tokio::test]
async fn a_retried_create_adopts_its_own_function_and_refuses_anyone_elses() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("retryFn");
    let dir = code_dir("retry");
    let spec = Value::map()
        .with("functionName", name.as_str())
        .with("codeUri", dir.to_str().expect("utf-8"))
        .with("handler", "handler.handler")
        .with("runtime", "python3.12");
    let first = h
        .create("aws/lambda/function", "retryFn", spec.clone())
        .await
        .expect("created");
    let again = h
        .create("aws/lambda/function", "retryFn", spec.clone())
        .await
        .expect("adopted");
    assert_eq!(again.external_id, first.external_id);
    assert_eq!(again.state, first.state);
    // A crash before the id was recorded: read by name finds it, and its own role.
    let mut unrecorded = first.clone();
    unrecorded.external_id.clear();
    unrecorded.state = Value::Null;
    let found = h.read(&unrecorded).await.expect("read").expect("found");
    assert_eq!(found.external_id.as_deref(), Some(name.as_str()));
    assert_eq!(
        found.state.get("ownedRole").and_then(Value::as_str),
        Some(format!("{name}-role").as_str())
    );

    // Another resource of the same name: CONFLICT; its destroy touches nothing.
    let err = h
        .create("aws/lambda/function", "other", spec.clone())
        .await
        .expect_err("taken");
    assert_eq!(err.class, ErrorClass::Conflict, "{err:?}");
    assert!(
        err.message.contains("belongs to resource `retryFn`"),
        "{}",
        err.message
    );
    let mut other = unrecorded.clone();
    other.name = "other".to_owned();
    h.destroy(&other).await.expect("nothing of its own");
    function(m, &name);
    boto(
        m,
        "iam",
        "get_role",
        json!({"RoleName": format!("{name}-role")}),
    )
    .expect("role stays");

    // One made outside Trellis: CONFLICT too.
    let outside = unique("outsideFn");
    let role = outside_role(m, &unique("outside-fn-role"));
    let bucket = unique("outside-code");
    boto(m, "s3", "create_bucket", json!({"Bucket": bucket})).expect("bucket");
    boto(
        m,
        "s3",
        "put_object",
        json!({"Bucket": bucket, "Key": "c.zip", "Body": "code"}),
    )
    .expect("object");
    boto(
        m,
        "lambda",
        "create_function",
        json!({"FunctionName": outside, "Role": role, "Runtime": "python3.12",
               "Handler": "h.h", "Code": {"S3Bucket": bucket, "S3Key": "c.zip"}}),
    )
    .expect("made outside");
    let err = h
        .create(
            "aws/lambda/function",
            "outsideFn",
            spec.clone().with("functionName", outside.as_str()),
        )
        .await
        .expect_err("not ours");
    assert_eq!(err.class, ErrorClass::Conflict);
    assert!(
        err.message.contains("not created by Trellis"),
        "{}",
        err.message
    );

    // Destroying the unrecorded resource (a create cut short) finds both by name.
    h.destroy(&unrecorded).await.expect("destroyed");
    assert!(boto(m, "lambda", "get_function", json!({"FunctionName": name})).is_err());
    assert_eq!(
        boto(
            m,
            "iam",
            "get_role",
            json!({"RoleName": format!("{name}-role")})
        )
        .err()
        .as_deref(),
        Some("NoSuchEntity")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_role_lambda_cannot_assume_yet_is_waited_for() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("lateRole");
    let role = unique("late");
    let dir = code_dir("late");
    let spec = Value::map()
        .with("functionName", name.as_str())
        .with("codeUri", dir.to_str().expect("utf-8"))
        .with("handler", "handler.handler")
        .with("runtime", "python3.12")
        .with(
            "role",
            format!("arn:aws:iam::123456789012:role/{role}").as_str(),
        );
    // Lambda refuses a role it cannot assume yet (as it does for seconds after IAM makes
    // one); the role appears while the create keeps trying.
    let maker = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(3));
        outside_role(m, &role);
    });
    let (progress, f) = apply(&h, "aws/lambda/function", "lateRole", None, spec).await;
    maker.join().expect("role made");
    let f = f.expect("created once the role exists");
    assert!(
        progress
            .iter()
            .any(|p| p.contains("not usable by Lambda yet")),
        "{progress:?}"
    );
    h.destroy(&f).await.expect("destroyed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn function_name_replaces_the_function_and_validation_names_the_field() {
    let schema = Function {
        clients: Arc::new(ClientCache::default()),
    }
    .schema();
    assert!(
        schema
            .get_field("functionName")
            .is_some_and(|f| f.is_must_recreate())
    );
    assert!(
        !schema
            .get_field("codeUri")
            .is_some_and(|f| f.is_must_recreate())
    );
    for computed in ["arn", "roleArn", "codeSha256", "ownedRole"] {
        assert!(
            schema.get_field(computed).is_some_and(|f| f.is_computed()),
            "{computed}"
        );
    }

    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let d = h
        .validate(
            "aws/lambda/function",
            "f",
            Value::map()
                .with("functionName", "bad name")
                .with("codeUri", "s3://bucket")
                .with("runtime", "cobol85")
                .with("architectures", "sparc")
                .with("timeout", 0)
                .with("memorySize", 64)
                .with("role", "admin")
                .with(
                    "environment",
                    Value::map().with(
                        "variables",
                        Value::map()
                            .with("AWS_REGION", "x")
                            .with("NESTED", Value::map().with("a", 1)),
                    ),
                ),
        )
        .await
        .expect("validated");
    let got: Vec<(String, String, Severity)> = d
        .iter()
        .map(|d| {
            (
                d.code.clone(),
                d.path.as_ref().map(ToString::to_string).unwrap_or_default(),
                d.severity,
            )
        })
        .collect();
    let want = [
        ("aws.lambda.invalid-name", "functionName", Severity::Error),
        ("aws.lambda.code-uri", "codeUri", Severity::Error),
        ("aws.lambda.handler-required", "handler", Severity::Error),
        ("aws.lambda.unknown-runtime", "runtime", Severity::Warning),
        ("aws.out-of-range", "timeout", Severity::Error),
        ("aws.out-of-range", "memorySize", Severity::Error),
        ("aws.lambda.architectures", "architectures", Severity::Error),
        ("aws.lambda.role-arn", "role", Severity::Error),
        (
            "aws.lambda.environment-key",
            "environment.variables.AWS_REGION",
            Severity::Error,
        ),
        (
            "aws.lambda.environment-value",
            "environment.variables.NESTED",
            Severity::Error,
        ),
    ];
    assert_eq!(
        got,
        want.iter()
            .map(|(c, p, s)| ((*c).to_owned(), (*p).to_owned(), *s))
            .collect::<Vec<_>>()
    );
    // A good spec has nothing to say.
    let d = h
        .validate(
            "aws/lambda/function",
            "f",
            Value::map()
                .with("codeUri", "./orders")
                .with("handler", "save_order.handler")
                .with("runtime", "python3.9")
                .with("tracing", "Active")
                .with("architectures", "arm64")
                .with("timeout", 120),
        )
        .await
        .expect("validated");
    assert!(d.is_empty(), "{d:?}");
}

#[tokio::test]
async fn a_queue_triggers_a_function_through_a_mapping() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("worker");
    let dir = code_dir("worker");
    let f = h
        .create(
            "aws/lambda/function",
            "worker",
            Value::map()
                .with("functionName", name.as_str())
                .with("codeUri", dir.to_str().expect("utf-8"))
                .with("handler", "handler.handler")
                .with("runtime", "python3.12"),
        )
        .await
        .expect("function");
    let queue = unique("jobs");
    let (_, queue_arn) = outside_queue(m, &queue);
    let spec = Value::map()
        .with("functionName", name.as_str())
        .with("eventSourceArn", queue_arn.as_str())
        .with("batchSize", 5)
        .with("maximumBatchingWindowInSeconds", 2)
        .with(
            "functionResponseTypes",
            Value::from(vec!["ReportBatchItemFailures"]),
        );
    let esm = h
        .create("aws/lambda/eventSourceMapping", "jobsTrigger", spec.clone())
        .await
        .expect("created");
    let uuid = esm.external_id.clone();
    assert_eq!(text(&esm, "uuid"), uuid);
    assert!(text(&esm, "arn").ends_with(&uuid), "{:?}", esm.state);
    let got = boto(
        m,
        "lambda",
        "get_event_source_mapping",
        json!({"UUID": uuid}),
    )
    .expect("mapping");
    assert_eq!(got["BatchSize"], 5);
    assert_eq!(got["State"], "Enabled");
    assert_eq!(got["MaximumBatchingWindowInSeconds"], 2);
    assert_eq!(
        got["FunctionResponseTypes"],
        json!(["ReportBatchItemFailures"])
    );
    assert_eq!(got["FunctionArn"], text(&f, "arn"));
    assert_eq!(got["EventSourceArn"], queue_arn);

    let read = h.read(&esm).await.expect("read").expect("exists");
    assert_reads_back(&read.spec, &spec);

    // Drift made outside.
    boto(
        m,
        "lambda",
        "update_event_source_mapping",
        json!({"UUID": uuid, "BatchSize": 7}),
    )
    .expect("changed");
    let read = h.read(&esm).await.expect("read").expect("exists");
    assert_eq!(read.spec.get("batchSize"), Some(&Value::Int(7)));

    // Update in place: disabled, the batch size dropped (SQS's default, 10).
    let spec2 = Value::map()
        .with("functionName", name.as_str())
        .with("eventSourceArn", queue_arn.as_str())
        .with("enabled", false);
    let esm2 = h.update(&esm, spec2.clone()).await.expect("updated");
    assert_eq!(esm2.external_id, uuid);
    let got = boto(
        m,
        "lambda",
        "get_event_source_mapping",
        json!({"UUID": uuid}),
    )
    .expect("mapping");
    assert_eq!(got["BatchSize"], 10);
    assert_eq!(got["State"], "Disabled");
    let read = h.read(&esm2).await.expect("read").expect("exists");
    assert_reads_back(&read.spec, &spec2);

    // A retried create adopts it; another resource for the same pair is a CONFLICT.
    let again = h
        .create(
            "aws/lambda/eventSourceMapping",
            "jobsTrigger",
            spec2.clone(),
        )
        .await
        .expect("adopted");
    assert_eq!(again.external_id, uuid);
    let err = h
        .create("aws/lambda/eventSourceMapping", "other", spec2.clone())
        .await
        .expect_err("taken");
    assert_eq!(err.class, ErrorClass::Conflict, "{err:?}");
    // A crash before the id was recorded: read finds it by function and source.
    let mut unrecorded = esm2.clone();
    unrecorded.external_id.clear();
    let found = h.read(&unrecorded).await.expect("read").expect("found");
    assert_eq!(found.external_id.as_deref(), Some(uuid.as_str()));

    // One made outside Trellis for another queue: CONFLICT too.
    let other_queue = unique("other-jobs");
    let (_, other_arn) = outside_queue(m, &other_queue);
    boto(
        m,
        "lambda",
        "create_event_source_mapping",
        json!({"FunctionName": name, "EventSourceArn": other_arn}),
    )
    .expect("made outside");
    let err = h
        .create(
            "aws/lambda/eventSourceMapping",
            "outside",
            Value::map()
                .with("functionName", name.as_str())
                .with("eventSourceArn", other_arn.as_str()),
        )
        .await
        .expect_err("not ours");
    assert_eq!(err.class, ErrorClass::Conflict);
    assert!(
        err.message.contains("not created by Trellis"),
        "{}",
        err.message
    );

    h.destroy(&esm2).await.expect("destroyed");
    assert_eq!(
        boto(
            m,
            "lambda",
            "get_event_source_mapping",
            json!({"UUID": uuid})
        )
        .err()
        .as_deref(),
        Some("ResourceNotFoundException")
    );
    h.destroy(&esm2).await.expect("destroy is idempotent");
    assert!(h.read(&esm2).await.expect("read").is_none());
    h.destroy(&f).await.expect("function destroyed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn mapping_ends_replace_it_and_validation_names_the_field() {
    let schema = EventSourceMapping {
        clients: Arc::new(ClientCache::default()),
    }
    .schema();
    for field in ["functionName", "eventSourceArn", "startingPosition"] {
        assert!(
            schema
                .get_field(field)
                .is_some_and(|f| f.is_must_recreate()),
            "{field}"
        );
    }
    for field in ["batchSize", "enabled"] {
        assert!(
            !schema
                .get_field(field)
                .is_some_and(|f| f.is_must_recreate()),
            "{field}"
        );
    }
    for computed in ["uuid", "arn"] {
        assert!(schema.get_field(computed).is_some_and(|f| f.is_computed()));
    }

    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let d = h
        .validate(
            "aws/lambda/eventSourceMapping",
            "e",
            Value::map()
                .with("functionName", "f")
                .with("eventSourceArn", "arn:aws:sqs:us-east-1:123456789012:q")
                .with("startingPosition", "LATEST")
                .with("batchSize", 0)
                .with("maximumBatchingWindowInSeconds", 301),
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
    let want = [
        ("aws.lambda.starting-position", "startingPosition"),
        ("aws.out-of-range", "batchSize"),
        ("aws.out-of-range", "maximumBatchingWindowInSeconds"),
    ];
    assert_eq!(
        got,
        want.iter()
            .map(|(c, p)| ((*c).to_owned(), (*p).to_owned()))
            .collect::<Vec<_>>()
    );
    let d = h
        .validate(
            "aws/lambda/eventSourceMapping",
            "e",
            Value::map().with("functionName", "f").with(
                "eventSourceArn",
                "arn:aws:kinesis:us-east-1:123456789012:stream/s",
            ),
        )
        .await
        .expect("validated");
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].code, "aws.lambda.starting-position");
}

/// Under the engine, `codeUri` arrives as an asset URI with the path of the engine's copy in
/// the call's context; a `file://` URI (a file on the engine's host) is refused.
#[tokio::test]
async fn code_comes_from_the_engine_s_asset_copy_and_file_uris_are_refused() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("fromAsset");
    let dir = code_dir("asset");
    let uri = format!("asset:sha256:{}/code", "ab".repeat(32));
    let spec = |code: &str| {
        Value::map()
            .with("functionName", name.as_str())
            .with("codeUri", code)
            .with("handler", "handler.handler")
            .with("runtime", "python3.12")
    };
    let mut context = h.call_context();
    context
        .local_assets
        .insert(uri.clone(), dir.to_str().expect("utf-8").to_owned());
    let out = h
        .apply_with(pb::ApplyResourceRequest {
            context: Some(context),
            current: None,
            resource_type: "aws/lambda/function".into(),
            resource_name: "fromAsset".into(),
            desired_spec: Some(spec(&uri).to_proto()),
        })
        .await
        .expect("apply");
    let f = out.result.expect("created from the asset's copy");
    let sha = function(m, &name)["Configuration"]["CodeSha256"].clone();
    let packed = trellis_provider_aws::code::pack_dir(&dir).expect("pack");
    assert_eq!(
        sha,
        json!(trellis_provider_aws::code::sha256_base64(&packed))
    );
    // The same URI without the engine's copy in the context: nothing to read.
    let e = apply(&h, "aws/lambda/function", "again", None, spec(&uri))
        .await
        .1
        .expect_err("no copy sent");
    assert_eq!(e.class, ErrorClass::BadInput, "{e:?}");
    assert!(e.message.contains("sent no content"), "{e:?}");
    let secret = format!("file://{}", dir.display());
    let e = apply(&h, "aws/lambda/function", "file", None, spec(&secret))
        .await
        .1
        .expect_err("file:// refused");
    assert_eq!(e.class, ErrorClass::BadInput, "{e:?}");
    h.destroy(&f).await.expect("destroyed");
}

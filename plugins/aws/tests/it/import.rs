//! ImportResource: resources made outside Trellis (with boto3) import as a blueprint would
//! declare them, under the id create would report, and the spec imported is one that changes
//! nothing: read with it reports it again, and an update with it makes no change.

use serde_json::json;
use trellis_plugin_sdk::proto as pb;
use trellis_plugin_sdk::testing::Harness;
use trellis_plugin_sdk::{ErrorClass, ReadState, ResourceState, Severity, Value};

use crate::dynamodb::schema_of;
use crate::iam::trust;
use crate::support::{Moto, boto, harness, moto, outside_queue, outside_queue_as, unique};

const IMPORTABLE: [&str; 11] = [
    "aws/apigatewayv2/api",
    "aws/dynamodb/table",
    "aws/events/rule",
    "aws/iam/role",
    "aws/lambda/eventSourceMapping",
    "aws/lambda/function",
    "aws/s3/bucket",
    "aws/secretsmanager/secret",
    "aws/sns/topic",
    "aws/sqs/queue",
    "aws/ssm/parameter",
];

fn tags(pairs: &[(&str, &str)]) -> Value {
    Value::List(
        pairs
            .iter()
            .map(|(k, v)| Value::map().with("key", *k).with("value", *v))
            .collect(),
    )
}

fn text<'a>(v: &'a serde_json::Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_else(|| panic!("`{key}` in {v}"))
}

/// The import of `id`, which must exist.
async fn import(h: &Harness, ty: &str, name: &str, id: &str) -> ReadState {
    h.import(ty, name, id)
        .await
        .unwrap_or_else(|e| panic!("importing {id}: {e:?}"))
        .unwrap_or_else(|| panic!("{id} exists"))
}

/// Each id imports as `first` does: the same id, the same spec.
async fn assert_same_import(h: &Harness, ty: &str, first: &ReadState, ids: &[&str]) {
    for id in ids {
        let again = import(h, ty, "imported", id).await;
        assert_eq!(again.external_id, first.external_id, "imported by {id}");
        assert_eq!(again.spec, first.spec, "imported by {id}");
    }
}

/// What the contract asks of an import: a spec the schema and the provider accept, without
/// computed fields; read with it (and the id) reports it again; an update with it changes
/// nothing (no progress: no call that changes anything waits) and reads back the same.
/// Returns the resource after the update.
async fn assert_round_trip(h: &Harness, ty: &str, imported: &ReadState) -> ResourceState {
    let id = imported.external_id.clone().expect("import reports the id");
    let schema = schema_of(h, ty).await;
    let problems = schema.check(&imported.spec);
    assert!(problems.is_empty(), "{problems:?}");
    for (field, f) in schema.fields() {
        if f.is_computed() {
            assert!(imported.spec.get(field).is_none(), "computed `{field}`");
        }
    }
    let errors: Vec<_> = h
        .validate(ty, "imported", imported.spec.clone())
        .await
        .expect("validate")
        .into_iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    assert!(errors.is_empty(), "{errors:?}");

    let current = ResourceState {
        resource_type: ty.to_owned(),
        name: "imported".to_owned(),
        external_id: id.clone(),
        spec: imported.spec.clone(),
        state: imported.state.clone(),
    };
    let read = h.read(&current).await.expect("read").expect("exists");
    assert_eq!(read.spec, imported.spec, "read after import: drift");
    assert_eq!(read.external_id.as_deref(), Some(id.as_str()));

    let out = h
        .apply_with(pb::ApplyResourceRequest {
            context: Some(h.call_context()),
            current: Some(current.to_proto()),
            resource_type: ty.to_owned(),
            resource_name: "imported".to_owned(),
            desired_spec: Some(imported.spec.to_proto()),
        })
        .await
        .expect("apply");
    assert!(
        out.progress.is_empty(),
        "the update changed: {:?}",
        out.progress
    );
    let updated = out.result.expect("updated");
    assert_eq!(updated.external_id, id);
    let read = h.read(&updated).await.expect("read").expect("exists");
    assert_eq!(read.spec, imported.spec, "read after the update");
    updated
}

async fn assert_not_found(h: &Harness, ty: &str, ids: &[&str]) {
    for id in ids {
        let got = h.import(ty, "missing", id).await;
        assert!(matches!(got, Ok(None)), "{id}: {got:?}");
    }
}

async fn assert_bad_id(h: &Harness, ty: &str, id: &str) {
    let err = h.import(ty, "bad", id).await.expect_err("refused");
    assert_eq!(err.class, ErrorClass::BadInput, "{id}: {}", err.message);
}

/// A role made with boto3, as a function's: its ARN.
fn outside_role(m: &Moto) -> String {
    let out = boto(
        m,
        "iam",
        "create_role",
        json!({"RoleName": unique("imp-fn-role"),
               "AssumeRolePolicyDocument": trust("lambda.amazonaws.com").to_json().to_string()}),
    )
    .expect("role");
    text(&out["Role"], "Arn").to_owned()
}

/// A function made with boto3, with its code from S3.
struct OutsideFunction {
    name: String,
    arn: String,
    role: String,
    sha: String,
    /// Holds `c.zip` (the function's code) and `other.zip`.
    bucket: String,
}

fn outside_function(m: &Moto) -> OutsideFunction {
    let role = outside_role(m);
    let bucket = unique("imp-code");
    boto(m, "s3", "create_bucket", json!({"Bucket": bucket})).expect("bucket");
    for (key, body) in [("c.zip", "code"), ("other.zip", "other code")] {
        boto(
            m,
            "s3",
            "put_object",
            json!({"Bucket": bucket, "Key": key, "Body": body}),
        )
        .expect("object");
    }
    let name = unique("impFn");
    let out = boto(
        m,
        "lambda",
        "create_function",
        json!({"FunctionName": name, "Role": role, "Runtime": "python3.12", "Handler": "h.handler",
               "Code": {"S3Bucket": bucket, "S3Key": "c.zip"}, "Timeout": 30, "MemorySize": 256,
               "Description": "made outside", "Environment": {"Variables": {"STAGE": "prod"}},
               "Tags": {"team": "a"}}),
    )
    .expect("function");
    OutsideFunction {
        name,
        arn: text(&out, "FunctionArn").to_owned(),
        role,
        sha: text(&out, "CodeSha256").to_owned(),
        bucket,
    }
}

#[tokio::test]
async fn the_manifest_marks_every_importable_type() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    assert!(h.capabilities().import_resource);
    let hs = h.handshake().await.expect("handshake");
    assert!(hs.capabilities.is_some_and(|c| c.import_resource));
    let manifest = h.manifest().await.expect("manifest");
    let mut importable: Vec<&str> = manifest
        .resource_types
        .iter()
        .filter(|r| r.importable)
        .map(|r| r.r#type.as_str())
        .collect();
    importable.sort_unstable();
    assert_eq!(importable, IMPORTABLE);
    for r in &manifest.resource_types {
        assert!(
            r.description.contains("Importable by"),
            "{}: the description names the ids import takes",
            r.r#type
        );
    }
}

#[tokio::test]
async fn a_queue_imports_by_url_name_or_arn() {
    const TY: &str = "aws/sqs/queue";
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("imp-queue");
    let (url, arn) = outside_queue_as(
        m,
        json!({"QueueName": name, "Attributes": {"VisibilityTimeout": "45", "DelaySeconds": "5"},
               "tags": {"team": "a"}}),
    );

    let got = import(&h, TY, "orders", &name).await;
    assert_eq!(got.external_id.as_deref(), Some(url.as_str()));
    assert_eq!(got.spec.get("queueName"), Some(&Value::from(name.as_str())));
    assert_eq!(got.spec.get("visibilityTimeout"), Some(&Value::Int(45)));
    assert_eq!(got.spec.get("delaySeconds"), Some(&Value::Int(5)));
    assert_eq!(got.spec.get("tags"), Some(&tags(&[("team", "a")])));
    assert_eq!(got.state.get("arn"), Some(&Value::from(arn.as_str())));
    // Import changes nothing: no ownership tags.
    let have = boto(m, "sqs", "list_queue_tags", json!({"QueueUrl": url})).expect("tags");
    assert_eq!(have["Tags"], json!({"team": "a"}));
    assert_same_import(&h, TY, &got, &[&url, &arn]).await;

    assert_round_trip(&h, TY, &got).await;
    assert_eq!(
        boto(
            m,
            "sqs",
            "get_queue_attributes",
            json!({"QueueUrl": url, "AttributeNames": ["All"]})
        )
        .expect("attributes")["Attributes"]["VisibilityTimeout"],
        "45"
    );

    // A FIFO queue: its FIFO settings are in the spec, and valid.
    let fifo = format!("{}.fifo", unique("imp-fifo"));
    boto(
        m,
        "sqs",
        "create_queue",
        json!({"QueueName": fifo,
               "Attributes": {"FifoQueue": "true", "ContentBasedDeduplication": "true"}}),
    )
    .expect("queue");
    let got = import(&h, TY, "fifo", &fifo).await;
    assert_eq!(got.spec.get("fifoQueue"), Some(&Value::Bool(true)));
    assert_eq!(
        got.spec.get("contentBasedDeduplication"),
        Some(&Value::Bool(true))
    );
    assert_round_trip(&h, TY, &got).await;

    let missing = unique("imp-no-queue");
    assert_not_found(
        &h,
        TY,
        &[
            &missing,
            &url.replace(&name, &missing),
            &arn.replace(&name, &missing),
        ],
    )
    .await;
    assert_bad_id(&h, TY, &arn.replace("123456789012", "210987654321")).await;
    assert_bad_id(&h, TY, &arn.replace("us-east-1", "eu-west-1")).await;
    assert_bad_id(
        &h,
        TY,
        &format!("https://sqs.eu-west-1.amazonaws.com/123456789012/{name}"),
    )
    .await;
    assert_bad_id(&h, TY, "  ").await;
}

#[tokio::test]
async fn a_bucket_imports_by_name_arn_or_uri() {
    const TY: &str = "aws/s3/bucket";
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("imp-bucket");
    boto(m, "s3", "create_bucket", json!({"Bucket": name})).expect("bucket");
    boto(
        m,
        "s3",
        "put_bucket_versioning",
        json!({"Bucket": name, "VersioningConfiguration": {"Status": "Enabled"}}),
    )
    .expect("versioning");
    boto(
        m,
        "s3",
        "put_public_access_block",
        json!({"Bucket": name, "PublicAccessBlockConfiguration": {
            "BlockPublicAcls": true, "BlockPublicPolicy": false,
            "IgnorePublicAcls": true, "RestrictPublicBuckets": false}}),
    )
    .expect("public access block");
    boto(
        m,
        "s3",
        "put_bucket_tagging",
        json!({"Bucket": name, "Tagging": {"TagSet": [{"Key": "team", "Value": "a"}]}}),
    )
    .expect("tags");

    let got = import(&h, TY, "assets", &name).await;
    assert_eq!(got.external_id.as_deref(), Some(name.as_str()));
    assert_eq!(
        got.spec.get("bucketName"),
        Some(&Value::from(name.as_str()))
    );
    assert_eq!(
        got.spec.get("versioningConfiguration"),
        Some(&Value::map().with("status", "Enabled"))
    );
    assert_eq!(
        got.spec.get("publicAccessBlockConfiguration"),
        Some(
            &Value::map()
                .with("blockPublicAcls", true)
                .with("blockPublicPolicy", false)
                .with("ignorePublicAcls", true)
                .with("restrictPublicBuckets", false)
        )
    );
    assert_eq!(got.spec.get("tags"), Some(&tags(&[("team", "a")])));
    assert!(got.spec.get("forceDestroy").is_none());
    let have = boto(m, "s3", "get_bucket_tagging", json!({"Bucket": name})).expect("tags");
    assert_eq!(have["TagSet"], json!([{"Key": "team", "Value": "a"}]));
    assert_same_import(
        &h,
        TY,
        &got,
        &[&format!("arn:aws:s3:::{name}"), &format!("s3://{name}/")],
    )
    .await;

    assert_round_trip(&h, TY, &got).await;

    let missing = unique("imp-no-bucket");
    assert_not_found(&h, TY, &[&missing, &format!("arn:aws:s3:::{missing}")]).await;
    assert_bad_id(&h, TY, &format!("s3://{name}/some/key")).await;
}

#[tokio::test]
async fn a_topic_imports_by_arn_or_name() {
    const TY: &str = "aws/sns/topic";
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("imp-topic");
    let arn = boto(
        m,
        "sns",
        "create_topic",
        json!({"Name": name, "Attributes": {"DisplayName": "Orders"},
               "Tags": [{"Key": "team", "Value": "a"}]}),
    )
    .expect("topic")["TopicArn"]
        .as_str()
        .expect("arn")
        .to_owned();

    let got = import(&h, TY, "events", &name).await;
    assert_eq!(got.external_id.as_deref(), Some(arn.as_str()));
    assert_eq!(got.spec.get("topicName"), Some(&Value::from(name.as_str())));
    assert_eq!(got.spec.get("displayName"), Some(&Value::from("Orders")));
    assert_eq!(got.spec.get("tags"), Some(&tags(&[("team", "a")])));
    assert_same_import(&h, TY, &got, &[&arn]).await;

    assert_round_trip(&h, TY, &got).await;

    let missing = unique("imp-no-topic");
    assert_not_found(&h, TY, &[&missing, &arn.replace(&name, &missing)]).await;
    assert_bad_id(&h, TY, &format!("{arn}:a-subscription-id")).await;
}

#[tokio::test]
async fn a_table_imports_by_name_or_arn_with_its_indexes_stream_ttl_and_key() {
    const TY: &str = "aws/dynamodb/table";
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("imp-table");
    let out = boto(
        m,
        "dynamodb",
        "create_table",
        json!({
            "TableName": name,
            "AttributeDefinitions": [
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "g", "AttributeType": "N"}
            ],
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
            "BillingMode": "PROVISIONED",
            "ProvisionedThroughput": {"ReadCapacityUnits": 5, "WriteCapacityUnits": 4},
            "GlobalSecondaryIndexes": [{
                "IndexName": "byG",
                "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
                "ProvisionedThroughput": {"ReadCapacityUnits": 1, "WriteCapacityUnits": 1}
            }],
            "StreamSpecification": {"StreamEnabled": true, "StreamViewType": "NEW_IMAGE"},
            "SSESpecification": {"Enabled": true, "SSEType": "KMS"},
            "Tags": [{"Key": "team", "Value": "a"}]
        }),
    )
    .expect("table");
    let arn = text(&out["TableDescription"], "TableArn").to_owned();
    boto(
        m,
        "dynamodb",
        "update_time_to_live",
        json!({"TableName": name,
               "TimeToLiveSpecification": {"AttributeName": "expires", "Enabled": true}}),
    )
    .expect("ttl");

    let got = import(&h, TY, "orders", &name).await;
    assert_eq!(got.external_id.as_deref(), Some(name.as_str()));
    let spec = &got.spec;
    assert_eq!(spec.get("tableName"), Some(&Value::from(name.as_str())));
    assert_eq!(spec.get("billingMode"), Some(&Value::from("PROVISIONED")));
    assert_eq!(
        spec.get("provisionedThroughput"),
        Some(
            &Value::map()
                .with("readCapacityUnits", 5)
                .with("writeCapacityUnits", 4)
        )
    );
    let gsis = spec
        .get("globalSecondaryIndexes")
        .and_then(Value::as_list)
        .expect("indexes");
    assert_eq!(gsis.len(), 1);
    assert_eq!(gsis[0].get("indexName"), Some(&Value::from("byG")));
    assert_eq!(
        gsis[0].get("projection"),
        Some(&Value::map().with("projectionType", "KEYS_ONLY"))
    );
    assert_eq!(
        spec.get("streamSpecification"),
        Some(&Value::map().with("streamViewType", "NEW_IMAGE"))
    );
    assert_eq!(
        spec.get("timeToLiveSpecification"),
        Some(
            &Value::map()
                .with("attributeName", "expires")
                .with("enabled", true)
        )
    );
    // The key as AWS names it: read reports it only when the applied spec names one.
    let sse = spec.get("sseSpecification").expect("encryption");
    assert_eq!(sse.get("sseEnabled"), Some(&Value::Bool(true)));
    assert_eq!(sse.get("sseType"), Some(&Value::from("KMS")));
    assert!(
        sse.get("kmsMasterKeyId")
            .and_then(Value::as_str)
            .is_some_and(|k| k.starts_with("arn:aws:kms:")),
        "{sse:?}"
    );
    assert_eq!(spec.get("tags"), Some(&tags(&[("team", "a")])));
    assert_same_import(&h, TY, &got, &[&arn]).await;

    assert_round_trip(&h, TY, &got).await;

    let missing = unique("imp-no-table");
    assert_not_found(&h, TY, &[&missing, &arn.replace(&name, &missing)]).await;
    assert_bad_id(&h, TY, &format!("{arn}/stream/2024")).await;
}

#[tokio::test]
async fn parameters_import_by_name_or_arn_and_a_secure_string_stays_secret() {
    const TY: &str = "aws/ssm/parameter";
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let path = format!("/{}/db/password", unique("imp"));
    boto(
        m,
        "ssm",
        "put_parameter",
        json!({"Name": path, "Value": "s3cr3t", "Type": "SecureString",
               "Description": "the database's", "Tags": [{"Key": "team", "Value": "a"}]}),
    )
    .expect("parameter");

    let got = import(&h, TY, "dbPassword", &path).await;
    assert_eq!(got.external_id.as_deref(), Some(path.as_str()));
    let spec = &got.spec;
    assert_eq!(spec.get("name"), Some(&Value::from(path.as_str())));
    assert_eq!(spec.get("type"), Some(&Value::from("SecureString")));
    let value = spec.get("value").expect("value");
    assert!(value.is_sensitive(), "{value:?}");
    assert_eq!(value.as_str(), Some("s3cr3t"));
    assert_eq!(
        spec.get("description"),
        Some(&Value::from("the database's"))
    );
    assert_eq!(spec.get("tags"), Some(&tags(&[("team", "a")])));
    // A path's ARN drops the leading `/`.
    let arn = format!("arn:aws:ssm:us-east-1:123456789012:parameter{path}");
    assert_same_import(&h, TY, &got, &[&arn]).await;
    assert_round_trip(&h, TY, &got).await;

    // A plain name, a String.
    let plain = unique("imp-plain");
    boto(
        m,
        "ssm",
        "put_parameter",
        json!({"Name": plain, "Value": "a,b", "Type": "StringList"}),
    )
    .expect("parameter");
    let got = import(&h, TY, "plain", &plain).await;
    assert_eq!(got.spec.get("value"), Some(&Value::from("a,b")));
    assert_eq!(got.spec.get("type"), Some(&Value::from("StringList")));
    assert_same_import(
        &h,
        TY,
        &got,
        &[&format!(
            "arn:aws:ssm:us-east-1:123456789012:parameter/{plain}"
        )],
    )
    .await;
    assert_round_trip(&h, TY, &got).await;

    let missing = unique("imp-no-param");
    assert_not_found(
        &h,
        TY,
        &[
            &missing,
            &format!("arn:aws:ssm:us-east-1:123456789012:parameter/{missing}"),
        ],
    )
    .await;
    assert_bad_id(&h, TY, "arn:aws:ssm:us-east-1:123456789012:document/x").await;
}

#[tokio::test]
async fn a_role_imports_by_name_or_arn_without_links_policies() {
    const TY: &str = "aws/iam/role";
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("imp-role");
    let policy = |action: &str| {
        json!({"Version": "2012-10-17",
               "Statement": [{"Effect": "Allow", "Action": action, "Resource": "*"}]})
    };
    let managed = boto(
        m,
        "iam",
        "create_policy",
        json!({"PolicyName": unique("imp-managed"),
               "PolicyDocument": policy("s3:GetObject").to_string()}),
    )
    .expect("policy")["Policy"]["Arn"]
        .as_str()
        .expect("arn")
        .to_owned();
    let arn = boto(
        m,
        "iam",
        "create_role",
        json!({"RoleName": name, "Path": "/svc/",
               "AssumeRolePolicyDocument": trust("lambda.amazonaws.com").to_json().to_string(),
               "Description": "made outside", "MaxSessionDuration": 7200,
               "Tags": [{"Key": "team", "Value": "a"}]}),
    )
    .expect("role")["Role"]["Arn"]
        .as_str()
        .expect("arn")
        .to_owned();
    boto(
        m,
        "iam",
        "attach_role_policy",
        json!({"RoleName": name, "PolicyArn": managed}),
    )
    .expect("attached");
    for (policy_name, action) in [
        ("reads", "sqs:ReceiveMessage"),
        ("trellis-link", "sns:Publish"),
    ] {
        boto(
            m,
            "iam",
            "put_role_policy",
            json!({"RoleName": name, "PolicyName": policy_name,
                   "PolicyDocument": policy(action).to_string()}),
        )
        .expect("inline policy");
    }

    let got = import(&h, TY, "worker", &name).await;
    assert_eq!(got.external_id.as_deref(), Some(name.as_str()));
    let spec = &got.spec;
    assert_eq!(spec.get("roleName"), Some(&Value::from(name.as_str())));
    assert_eq!(spec.get("path"), Some(&Value::from("/svc/")));
    assert_eq!(
        spec.get("assumeRolePolicyDocument"),
        Some(&trust("lambda.amazonaws.com"))
    );
    assert_eq!(spec.get("description"), Some(&Value::from("made outside")));
    assert_eq!(spec.get("maxSessionDuration"), Some(&Value::Int(7200)));
    assert_eq!(
        spec.get("managedPolicyArns"),
        Some(&Value::from(vec![managed.clone()]))
    );
    // The link's `trellis-` policy is not the role's.
    assert_eq!(
        spec.get("policies"),
        Some(&Value::List(vec![
            Value::map().with("policyName", "reads").with(
                "policyDocument",
                Value::from_json(policy("sqs:ReceiveMessage"))
            )
        ]))
    );
    assert_eq!(spec.get("tags"), Some(&tags(&[("team", "a")])));
    assert_same_import(&h, TY, &got, &[&arn]).await;

    assert_round_trip(&h, TY, &got).await;
    let kept = boto(m, "iam", "list_role_policies", json!({"RoleName": name})).expect("policies");
    assert_eq!(kept["PolicyNames"], json!(["reads", "trellis-link"]));

    let missing = unique("imp-no-role");
    assert_not_found(&h, TY, &[&missing, &arn.replace(&name, &missing)]).await;
    assert_bad_id(&h, TY, &managed).await;
}

#[tokio::test]
async fn a_function_imports_with_its_deployed_code_and_role() {
    const TY: &str = "aws/lambda/function";
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let f = outside_function(m);
    let (name, sha) = (f.name.as_str(), f.sha.as_str());

    let got = import(&h, TY, "worker", name).await;
    assert_eq!(got.external_id.as_deref(), Some(name));
    let spec = &got.spec;
    assert_eq!(spec.get("functionName"), Some(&Value::from(name)));
    assert_eq!(
        spec.get("codeUri"),
        Some(&Value::from(format!("deployed://{sha}")))
    );
    assert_eq!(spec.get("role"), Some(&Value::from(f.role.as_str())));
    assert_eq!(spec.get("handler"), Some(&Value::from("h.handler")));
    assert_eq!(spec.get("runtime"), Some(&Value::from("python3.12")));
    assert_eq!(spec.get("timeout"), Some(&Value::Int(30)));
    assert_eq!(spec.get("memorySize"), Some(&Value::Int(256)));
    assert_eq!(spec.get("description"), Some(&Value::from("made outside")));
    // Any variable may be a secret.
    let stage = spec
        .get("environment")
        .and_then(|e| e.get("variables"))
        .and_then(|v| v.get("STAGE"))
        .expect("STAGE");
    assert!(stage.is_sensitive());
    assert_eq!(stage.as_str(), Some("prod"));
    assert_eq!(spec.get("tags"), Some(&tags(&[("team", "a")])));
    assert_eq!(got.state.get("codeSha256"), Some(&Value::from(sha)));
    assert!(got.state.get("ownedRole").is_none());
    assert_same_import(&h, TY, &got, &[&f.arn]).await;

    let updated = assert_round_trip(&h, TY, &got).await;
    let now = boto(m, "lambda", "get_function", json!({"FunctionName": name})).expect("function");
    assert_eq!(text(&now["Configuration"], "CodeSha256"), sha);
    assert_eq!(text(&now["Configuration"], "Role"), f.role);

    // `deployed://` has nothing to upload: not for another architecture, nor for a new
    // function (refused before its own role is made).
    let arm = got
        .spec
        .clone()
        .with("architectures", Value::from(vec!["arm64"]));
    let err = h.update(&updated, arm).await.expect_err("refused");
    assert_eq!(err.class, ErrorClass::BadInput, "{}", err.message);
    assert_eq!(err.path.map(|p| p.to_string()).as_deref(), Some("codeUri"));
    let other = unique("impFnNew");
    let mut fresh = got.spec.clone().with("functionName", other.as_str());
    if let Value::Map(fields) = &mut fresh {
        fields.shift_remove("role");
    }
    let err = h.create(TY, "fresh", fresh).await.expect_err("refused");
    assert_eq!(err.class, ErrorClass::BadInput, "{}", err.message);
    assert_eq!(err.path.map(|p| p.to_string()).as_deref(), Some("codeUri"));
    assert!(
        boto(
            m,
            "iam",
            "get_role",
            json!({"RoleName": format!("{other}-role")})
        )
        .is_err(),
        "no role was made for it"
    );

    // Code changed outside: read says so, and an update does not pretend it did not.
    boto(
        m,
        "lambda",
        "update_function_code",
        json!({"FunctionName": name, "S3Bucket": f.bucket, "S3Key": "other.zip"}),
    )
    .expect("new code");
    let read = h.read(&updated).await.expect("read").expect("exists");
    assert_ne!(read.spec.get("codeUri"), got.spec.get("codeUri"));
    let err = h
        .update(&updated, got.spec.clone())
        .await
        .expect_err("refused");
    assert_eq!(err.class, ErrorClass::BadInput, "{}", err.message);
    assert!(err.message.contains("its code is now"), "{}", err.message);

    assert_bad_id(&h, TY, &format!("{}:live", f.arn)).await;
    assert_bad_id(&h, TY, &f.role).await;
    let missing = unique("impNoFn");
    assert_not_found(&h, TY, &[&missing, &f.arn.replace(name, &missing)]).await;
}

#[tokio::test]
async fn a_mapping_imports_by_uuid_or_arn() {
    const TY: &str = "aws/lambda/eventSourceMapping";
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let f = outside_function(m);
    let queue = unique("imp-source");
    let (_, source) = outside_queue(m, &queue);
    let out = boto(
        m,
        "lambda",
        "create_event_source_mapping",
        json!({"FunctionName": f.name, "EventSourceArn": source, "BatchSize": 5,
               "Enabled": false, "Tags": {"team": "a"}}),
    )
    .expect("mapping");
    let uuid = text(&out, "UUID").to_owned();
    let arn = text(&out, "EventSourceMappingArn").to_owned();

    let got = import(&h, TY, "trigger", &uuid).await;
    assert_eq!(got.external_id.as_deref(), Some(uuid.as_str()));
    let spec = &got.spec;
    assert_eq!(spec.get("functionName"), Some(&Value::from(f.arn.as_str())));
    assert_eq!(
        spec.get("eventSourceArn"),
        Some(&Value::from(source.as_str()))
    );
    assert_eq!(spec.get("batchSize"), Some(&Value::Int(5)));
    assert_eq!(spec.get("enabled"), Some(&Value::Bool(false)));
    assert_eq!(spec.get("tags"), Some(&tags(&[("team", "a")])));
    assert_same_import(&h, TY, &got, &[&arn]).await;

    assert_round_trip(&h, TY, &got).await;

    let missing = "00000000-0000-4000-8000-000000000000";
    assert_not_found(&h, TY, &[missing, &arn.replace(&uuid, missing)]).await;
    assert_bad_id(&h, TY, &f.arn).await;
}

#[tokio::test]
async fn a_secret_imports_by_name_or_arn_with_its_value_kept_secret() {
    const TY: &str = "aws/secretsmanager/secret";
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("imp-secret");
    let arn = boto(
        m,
        "secretsmanager",
        "create_secret",
        json!({"Name": name, "SecretString": "hunter2", "Description": "the database's",
               "KmsKeyId": "alias/imported", "Tags": [{"Key": "team", "Value": "a"}]}),
    )
    .expect("secret")["ARN"]
        .as_str()
        .expect("arn")
        .to_owned();

    let got = import(&h, TY, "dbPassword", &name).await;
    assert_eq!(got.external_id.as_deref(), Some(arn.as_str()));
    let spec = &got.spec;
    assert_eq!(spec.get("secretName"), Some(&Value::from(name.as_str())));
    let value = spec.get("secretString").expect("the value");
    assert!(value.is_sensitive());
    assert_eq!(value.as_str(), Some("hunter2"));
    assert_eq!(
        spec.get("description"),
        Some(&Value::from("the database's"))
    );
    assert_eq!(spec.get("kmsKeyId"), Some(&Value::from("alias/imported")));
    assert_eq!(spec.get("tags"), Some(&tags(&[("team", "a")])));
    for f in ["generateSecretString", "recoveryWindowInDays"] {
        assert!(spec.get(f).is_none(), "{f}");
    }
    assert_same_import(&h, TY, &got, &[&arn]).await;

    assert_round_trip(&h, TY, &got).await;
    let versions = boto(
        m,
        "secretsmanager",
        "list_secret_version_ids",
        json!({"SecretId": name}),
    )
    .expect("versions");
    assert_eq!(
        versions["Versions"].as_array().map(Vec::len),
        Some(1),
        "no new value: {versions}"
    );

    // No value (none was ever put): nothing to report, nothing to change.
    let empty = unique("imp-empty-secret");
    boto(m, "secretsmanager", "create_secret", json!({"Name": empty})).expect("secret");
    let got = import(&h, TY, "empty", &empty).await;
    assert!(got.spec.get("secretString").is_none(), "{:?}", got.spec);
    assert_round_trip(&h, TY, &got).await;

    let missing = unique("imp-no-secret");
    assert_not_found(&h, TY, &[&missing, &arn.replace(&name, &missing)]).await;
    assert_bad_id(&h, TY, "arn:aws:sqs:us-east-1:123456789012:q").await;
}

#[tokio::test]
async fn rules_import_by_arn_name_or_bus_and_name() {
    const TY: &str = "aws/events/rule";
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let pattern = json!({"source": ["orders"], "detail-type": ["placed"]});

    let name = unique("imp-rule");
    let arn = boto(
        m,
        "events",
        "put_rule",
        json!({"Name": name, "EventPattern": pattern.to_string(), "State": "DISABLED",
               "Description": "made outside", "Tags": [{"Key": "team", "Value": "a"}]}),
    )
    .expect("rule")["RuleArn"]
        .as_str()
        .expect("arn")
        .to_owned();
    let got = import(&h, TY, "placed", &name).await;
    assert_eq!(got.external_id.as_deref(), Some(arn.as_str()));
    let spec = &got.spec;
    assert_eq!(spec.get("name"), Some(&Value::from(name.as_str())));
    assert_eq!(spec.get("eventBusName"), Some(&Value::from("default")));
    assert_eq!(
        spec.get("eventPattern"),
        Some(&Value::from_json(pattern.clone()))
    );
    assert_eq!(spec.get("state"), Some(&Value::from("DISABLED")));
    assert_eq!(spec.get("description"), Some(&Value::from("made outside")));
    assert_eq!(spec.get("tags"), Some(&tags(&[("team", "a")])));
    assert_same_import(&h, TY, &got, &[&arn, &format!("default|{name}")]).await;
    assert_round_trip(&h, TY, &got).await;

    // A schedule on another bus.
    let bus = unique("imp-bus");
    boto(m, "events", "create_event_bus", json!({"Name": bus})).expect("bus");
    let other = unique("imp-bus-rule");
    let other_arn = boto(
        m,
        "events",
        "put_rule",
        json!({"Name": other, "EventBusName": bus, "EventPattern": pattern.to_string()}),
    )
    .expect("rule")["RuleArn"]
        .as_str()
        .expect("arn")
        .to_owned();
    let got = import(&h, TY, "onBus", &format!("{bus}|{other}")).await;
    assert_eq!(got.external_id.as_deref(), Some(other_arn.as_str()));
    assert_eq!(
        got.spec.get("eventBusName"),
        Some(&Value::from(bus.as_str()))
    );
    assert_same_import(&h, TY, &got, &[&other_arn]).await;
    assert_round_trip(&h, TY, &got).await;

    let missing = unique("imp-no-rule");
    assert_not_found(
        &h,
        TY,
        &[
            &missing,
            &arn.replace(&name, &missing),
            &format!("{bus}|{missing}"),
        ],
    )
    .await;
    // The rule is on another bus than the one named.
    assert_not_found(&h, TY, &[&other]).await;
}

#[tokio::test]
async fn an_api_imports_by_id_arn_or_endpoint_with_the_stage_it_is_served_from() {
    const TY: &str = "aws/apigatewayv2/api";
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let make = |stages: &[&str]| {
        let out = boto(
            m,
            "apigatewayv2",
            "create_api",
            json!({"Name": unique("imp-api"), "ProtocolType": "HTTP",
                   "Description": "made outside",
                   "CorsConfiguration": {"AllowOrigins": ["https://a.example"], "MaxAge": 60},
                   "Tags": {"team": "a"}}),
        )
        .expect("api");
        let id = text(&out, "ApiId").to_owned();
        for stage in stages {
            boto(
                m,
                "apigatewayv2",
                "create_stage",
                json!({"ApiId": id, "StageName": stage}),
            )
            .expect("stage");
        }
        (id, text(&out, "ApiEndpoint").to_owned())
    };
    let arn = |id: &str| format!("arn:aws:apigateway:us-east-1::/apis/{id}");

    let (id, endpoint) = make(&["$default", "v1"]);
    let got = import(&h, TY, "api", &id).await;
    assert_eq!(got.external_id.as_deref(), Some(id.as_str()));
    let spec = &got.spec;
    assert_eq!(spec.get("protocolType"), Some(&Value::from("HTTP")));
    assert_eq!(spec.get("description"), Some(&Value::from("made outside")));
    assert_eq!(
        spec.get("corsConfiguration"),
        Some(
            &Value::map()
                .with("allowOrigins", Value::from(vec!["https://a.example"]))
                .with("maxAge", 60)
        )
    );
    assert_eq!(spec.get("stageName"), Some(&Value::from("$default")));
    assert_eq!(spec.get("tags"), Some(&tags(&[("team", "a")])));
    assert_same_import(
        &h,
        TY,
        &got,
        &[&arn(&id), &endpoint, &format!("{endpoint}/")],
    )
    .await;
    assert_round_trip(&h, TY, &got).await;

    // Served from a stage of its own: the only one, or the one a stage's ARN names.
    let (one, _) = make(&["prod"]);
    let got = import(&h, TY, "one", &one).await;
    assert_eq!(got.spec.get("stageName"), Some(&Value::from("prod")));
    assert_round_trip(&h, TY, &got).await;
    let (two, _) = make(&["prod", "test"]);
    assert_bad_id(&h, TY, &two).await;
    let got = import(&h, TY, "two", &format!("{}/stages/test", arn(&two))).await;
    assert_eq!(got.external_id.as_deref(), Some(two.as_str()));
    assert_eq!(got.spec.get("stageName"), Some(&Value::from("test")));
    assert_round_trip(&h, TY, &got).await;
    // Without a stage the spec would make one.
    let (none, _) = make(&[]);
    assert_bad_id(&h, TY, &none).await;

    assert_not_found(
        &h,
        TY,
        &[
            "nosuchapi",
            &arn("nosuchapi"),
            &format!("{}/stages/gone", arn(&two)),
        ],
    )
    .await;
    assert_bad_id(&h, TY, &format!("{}/routes/r1", arn(&id))).await;
}

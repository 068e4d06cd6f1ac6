//! `aws/s3/bucket`.

use std::process::Command;

use serde_json::json;
use trellis_plugin_sdk::testing::Harness;
use trellis_plugin_sdk::{ErrorClass, Value};
use trellis_provider_aws::AwsProvider;

use crate::support::{Moto, boto, harness, moto, unique};

const TYPE: &str = "aws/s3/bucket";

fn tags(m: &Moto, bucket: &str) -> Vec<(String, String)> {
    let out = boto(m, "s3", "get_bucket_tagging", json!({"Bucket": bucket})).expect("tags");
    let mut tags: Vec<(String, String)> = out["TagSet"]
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

fn exists(m: &Moto, bucket: &str) -> bool {
    boto(m, "s3", "head_bucket", json!({"Bucket": bucket})).is_ok()
}

fn put(m: &Moto, bucket: &str, key: &str) {
    boto(
        m,
        "s3",
        "put_object",
        json!({"Bucket": bucket, "Key": key, "Body": "x"}),
    )
    .expect("object written");
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

fn all_blocked(on: bool) -> Value {
    Value::map()
        .with("blockPublicAcls", on)
        .with("blockPublicPolicy", on)
        .with("ignorePublicAcls", on)
        .with("restrictPublicBuckets", on)
}

#[tokio::test]
async fn a_bucket_is_created_read_updated_and_destroyed() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("assets");
    let encryption = Value::map().with(
        "serverSideEncryptionConfiguration",
        Value::List(vec![
            Value::map()
                .with(
                    "serverSideEncryptionByDefault",
                    Value::map()
                        .with("sseAlgorithm", "aws:kms")
                        .with("kmsMasterKeyId", "alias/assets"),
                )
                .with("bucketKeyEnabled", true),
        ]),
    );
    let spec = Value::map()
        .with("bucketName", name.as_str())
        .with(
            "versioningConfiguration",
            Value::map().with("status", "Enabled"),
        )
        .with("publicAccessBlockConfiguration", all_blocked(true))
        .with("bucketEncryption", encryption)
        .with("tags", Value::List(vec![tag("team", "a")]));
    let b = h
        .create(TYPE, "assets", spec.clone())
        .await
        .expect("created");
    assert_eq!(b.external_id, name);
    let st = |k: &str| b.state.get(k).and_then(Value::as_str).map(str::to_owned);
    assert_eq!(st("arn"), Some(format!("arn:aws:s3:::{name}")));
    assert_eq!(st("domainName"), Some(format!("{name}.s3.amazonaws.com")));
    assert_eq!(
        st("regionalDomainName"),
        Some(format!("{name}.s3.us-east-1.amazonaws.com"))
    );
    let v = boto(m, "s3", "get_bucket_versioning", json!({"Bucket": name})).expect("versioning");
    assert_eq!(v["Status"], "Enabled");
    let p = boto(m, "s3", "get_public_access_block", json!({"Bucket": name})).expect("block");
    assert_eq!(
        p["PublicAccessBlockConfiguration"],
        json!({"BlockPublicAcls": true, "IgnorePublicAcls": true, "BlockPublicPolicy": true, "RestrictPublicBuckets": true})
    );
    let e = boto(m, "s3", "get_bucket_encryption", json!({"Bucket": name})).expect("encryption");
    let rule = &e["ServerSideEncryptionConfiguration"]["Rules"][0];
    assert_eq!(
        rule["ApplyServerSideEncryptionByDefault"],
        json!({"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": "alias/assets"})
    );
    assert_eq!(rule["BucketKeyEnabled"], true);
    let tg = tags(m, &name);
    assert!(tg.contains(&("team".to_owned(), "a".to_owned())), "{tg:?}");
    assert!(
        tg.contains(&("trellis:resource".to_owned(), "assets".to_owned())),
        "{tg:?}"
    );

    // Read: nothing changed, so the spec reads back as applied.
    let read = h.read(&b).await.expect("read").expect("exists");
    for field in [
        "bucketName",
        "versioningConfiguration",
        "publicAccessBlockConfiguration",
        "bucketEncryption",
        "tags",
    ] {
        assert_eq!(read.spec.get(field), spec.get(field), "{field}");
    }

    // Drift made outside: versioning suspended, the public access block removed.
    boto(
        m,
        "s3",
        "put_bucket_versioning",
        json!({"Bucket": name, "VersioningConfiguration": {"Status": "Suspended"}}),
    )
    .expect("suspended");
    boto(
        m,
        "s3",
        "delete_public_access_block",
        json!({"Bucket": name}),
    )
    .expect("unblocked");
    let read = h.read(&b).await.expect("read").expect("exists");
    assert_eq!(
        read.spec.get("versioningConfiguration"),
        Some(&Value::map().with("status", "Suspended"))
    );
    assert_eq!(
        read.spec.get("publicAccessBlockConfiguration"),
        Some(&all_blocked(false))
    );

    // Update in place: versioning back on, the block and the encryption dropped (back to
    // a new bucket's: all blocked, no configuration), tags changed.
    let spec2 = Value::map()
        .with("bucketName", name.as_str())
        .with(
            "versioningConfiguration",
            Value::map().with("status", "Enabled"),
        )
        .with("tags", Value::List(vec![tag("team", "b")]));
    let b2 = h.update(&b, spec2).await.expect("updated");
    assert_eq!(b2.external_id, name);
    let v = boto(m, "s3", "get_bucket_versioning", json!({"Bucket": name})).expect("versioning");
    assert_eq!(v["Status"], "Enabled");
    let p = boto(m, "s3", "get_public_access_block", json!({"Bucket": name})).expect("block");
    assert_eq!(
        p["PublicAccessBlockConfiguration"]["BlockPublicPolicy"],
        true
    );
    assert_eq!(
        boto(m, "s3", "get_bucket_encryption", json!({"Bucket": name}))
            .err()
            .as_deref(),
        Some("ServerSideEncryptionConfigurationNotFoundError")
    );
    let tg = tags(m, &name);
    assert!(tg.contains(&("team".to_owned(), "b".to_owned())), "{tg:?}");
    assert!(!tg.contains(&("team".to_owned(), "a".to_owned())), "{tg:?}");

    h.destroy(&b2).await.expect("destroyed");
    assert!(!exists(m, &name));
    // Destroying what is gone succeeds (a retry after a lost answer).
    h.destroy(&b2).await.expect("destroy is idempotent");
    assert!(h.read(&b2).await.expect("read").is_none());
}

#[tokio::test]
async fn a_bucket_with_objects_is_kept_unless_force_destroy() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("full");
    let spec = Value::map().with("bucketName", name.as_str());
    let b = h.create(TYPE, "full", spec.clone()).await.expect("created");
    put(m, &name, "a.txt");
    let err = h.destroy(&b).await.expect_err("not empty");
    assert_eq!(err.class, ErrorClass::Conflict, "{err:?}");
    assert!(err.message.contains("forceDestroy"), "{}", err.message);
    assert!(exists(m, &name), "the bucket is kept");

    // forceDestroy: every version and delete marker goes, then the bucket.
    let spec2 = spec.clone().with("forceDestroy", true).with(
        "versioningConfiguration",
        Value::map().with("status", "Enabled"),
    );
    let b2 = h.update(&b, spec2.clone()).await.expect("updated");
    put(m, &name, "a.txt");
    put(m, &name, "b.txt");
    boto(
        m,
        "s3",
        "delete_object",
        json!({"Bucket": name, "Key": "b.txt"}),
    )
    .expect("a delete marker");
    let read = h.read(&b2).await.expect("read").expect("exists");
    assert_eq!(read.spec.get("forceDestroy"), Some(&Value::Bool(true)));
    h.destroy(&b2).await.expect("emptied and destroyed");
    assert!(!exists(m, &name));
}

#[tokio::test]
async fn force_destroy_pages_through_many_versions() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("many");
    let spec = Value::map()
        .with("bucketName", name.as_str())
        .with("forceDestroy", true)
        .with(
            "versioningConfiguration",
            Value::map().with("status", "Enabled"),
        );
    let b = h.create(TYPE, "many", spec).await.expect("created");
    // 1300 versions and 50 delete markers: more than one page of ListObjectVersions.
    let script = r#"
import sys, boto3
c = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1",
                 aws_access_key_id="testing", aws_secret_access_key="testing")
for i in range(650):
    for _ in range(2):
        c.put_object(Bucket=sys.argv[2], Key=f"k{i:04}", Body=b"x")
for i in range(50):
    c.delete_object(Bucket=sys.argv[2], Key=f"k{i:04}")
n = c.list_object_versions(Bucket=sys.argv[2])
print(len(n.get("Versions", [])) + len(n.get("DeleteMarkers", [])), n["IsTruncated"])
"#;
    let out = Command::new("python3")
        .args(["-c", script, &m.endpoint, &name])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1000 True");
    h.destroy(&b).await.expect("emptied and destroyed");
    assert!(!exists(m, &name));
}

#[tokio::test]
async fn a_retried_create_adopts_its_own_bucket_and_refuses_anyone_elses() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("retry");
    let spec = Value::map().with("bucketName", name.as_str());
    let first = h
        .create(TYPE, "retry", spec.clone())
        .await
        .expect("created");
    // The engine lost the answer and retries: the same bucket, no error.
    let again = h
        .create(TYPE, "retry", spec.clone())
        .await
        .expect("adopted");
    assert_eq!(again.external_id, first.external_id);
    // A crash before the id was recorded: read by name finds it.
    let mut unrecorded = first.clone();
    unrecorded.external_id.clear();
    let found = h.read(&unrecorded).await.expect("read").expect("found");
    assert_eq!(found.external_id.as_deref(), Some(name.as_str()));

    // Another resource of the same name: CONFLICT (in us-east-1 CreateBucket alone would
    // have succeeded).
    let err = h
        .create(TYPE, "other", spec.clone())
        .await
        .expect_err("taken");
    assert_eq!(err.class, ErrorClass::Conflict, "{err:?}");
    assert!(
        err.message.contains("belongs to resource `retry`"),
        "{}",
        err.message
    );
    let mut other = unrecorded.clone();
    other.name = "other".to_owned();
    assert!(h.read(&other).await.expect("read").is_none());
    h.destroy(&other).await.expect("nothing of ours to destroy");
    assert!(exists(m, &name));

    // One made outside Trellis (no tags at all): CONFLICT too.
    let outside = unique("outside");
    boto(m, "s3", "create_bucket", json!({"Bucket": outside})).expect("made outside");
    let err = h
        .create(
            TYPE,
            "outside",
            Value::map().with("bucketName", outside.as_str()),
        )
        .await
        .expect_err("not ours");
    assert_eq!(err.class, ErrorClass::Conflict);
    assert!(
        err.message.contains("not created by Trellis"),
        "{}",
        err.message
    );
    assert_eq!(
        err.path.map(|p| p.to_string()).as_deref(),
        Some("bucketName")
    );
    h.destroy(&first).await.expect("destroyed");
}

#[tokio::test]
async fn buckets_outside_us_east_1_name_their_region() {
    let Some(m) = moto() else { return };
    let h = Harness::provider(AwsProvider::default())
        .await
        .expect("harness")
        .with_config(
            Value::map()
                .with("region", "eu-west-1")
                .with("endpoint", m.endpoint.as_str()),
        );
    // A derived name: lowercase, from the resource's name.
    let resource = unique("Logs_Bucket");
    let b = h
        .create(TYPE, &resource, Value::map())
        .await
        .expect("created");
    let name = b.external_id.clone();
    assert!(
        name.starts_with(&resource.to_lowercase().replace('_', "-")),
        "{name}"
    );
    assert!(
        name.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'),
        "{name}"
    );
    let loc = boto(m, "s3", "get_bucket_location", json!({"Bucket": name})).expect("location");
    assert_eq!(loc["LocationConstraint"], "eu-west-1");
    assert_eq!(
        b.state.get("regionalDomainName").and_then(Value::as_str),
        Some(format!("{name}.s3.eu-west-1.amazonaws.com").as_str())
    );
    // A retry there finds it too.
    let again = h
        .create(TYPE, &resource, Value::map())
        .await
        .expect("adopted");
    assert_eq!(again.external_id, name);
    h.destroy(&b).await.expect("destroyed");
    assert!(!exists(m, &name));
}

#[tokio::test]
async fn the_name_is_replaced_not_updated() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    assert_eq!(recreate_fields(&h, TYPE).await, ["bucketName"]);
}

#[tokio::test]
async fn validation_names_the_field() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let by_default = |alg: &str| {
        Value::map().with(
            "serverSideEncryptionByDefault",
            Value::map()
                .with("sseAlgorithm", alg)
                .with("kmsMasterKeyId", "alias/k"),
        )
    };
    let d = h
        .validate(
            TYPE,
            "b",
            Value::map().with("bucketName", "Bad_Name").with(
                "bucketEncryption",
                Value::map().with(
                    "serverSideEncryptionConfiguration",
                    Value::List(vec![by_default("AES256"), by_default("aws:kms")]),
                ),
            ),
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
    assert_eq!(
        got,
        vec![
            ("aws.s3.invalid-name".to_owned(), "bucketName".to_owned()),
            (
                "aws.s3.one-encryption-rule".to_owned(),
                "bucketEncryption.serverSideEncryptionConfiguration".to_owned()
            ),
            (
                "aws.s3.kms-key-without-kms".to_owned(),
                "bucketEncryption.serverSideEncryptionConfiguration[0].serverSideEncryptionByDefault.kmsMasterKeyId".to_owned()
            ),
        ]
    );
}

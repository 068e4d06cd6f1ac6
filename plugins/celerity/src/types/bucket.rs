//! `celerity/bucket` → `aws/s3/bucket` of the same name.
//!
//! Encryption and versioning map onto the bucket; CORS, lifecycle rules,
//! access logging, replication and website hosting have no field on the AWS
//! provider's bucket yet and are reported where they are written.

use crate::model::{Input, Out, Resource};
use crate::types::{queue, topic};
use serde_json::{Map, Value as Json, json};
use trellis_plugin_sdk::prelude::*;

pub const TYPE: &str = "celerity/bucket";
pub const DESCRIPTION: &str = "An object storage bucket, deployed as an S3 bucket";

fn transition() -> Schema {
    Schema::object()
        .field(
            "targetStorageClass",
            Field::string().required().allowed(["cool", "archive"]),
        )
        .field("transitionInDays", Field::integer().required())
}

pub fn schema() -> Schema {
    Schema::object()
        .describe("An object storage bucket")
        .field(
            "name",
            Field::string().describe(
                "The bucket's name (globally unique); derived from the instance and resource name when not set",
            ),
        )
        .field(
            "encryption",
            Field::object(
                Schema::object()
                    .field(
                        "encryptionKeyId",
                        Field::string().describe("A KMS key (id or ARN); objects are encrypted with aws:kms"),
                    )
                    .field(
                        "encryptionAlgorithm",
                        Field::string()
                            .allowed(["AES256", "aws:kms", "aws:kms:dsse"])
                            .describe("AES256 (SSE-S3) unless a key is given (aws:kms)"),
                    ),
            )
            .describe("Default encryption of new objects"),
        )
        .field(
            "cors",
            Field::object(
                Schema::object().field(
                    "corsRules",
                    Field::array(
                        Schema::object()
                            .field("id", Field::string())
                            .field("allowedOrigins", Field::array(Schema::string()))
                            .field("allowedHeaders", Field::array(Schema::string()))
                            .field("allowedMethods", Field::array(Schema::string()))
                            .field("exposedHeaders", Field::array(Schema::string()))
                            .field("maxAge", Field::integer()),
                    ),
                ),
            )
            .describe("CORS rules (not supported on AWS yet)"),
        )
        .field(
            "lifecycle",
            Field::object(
                Schema::object().field(
                    "rules",
                    Field::array(
                        Schema::object()
                            .field("id", Field::string().required())
                            .field("enabled", Field::boolean().required())
                            .field(
                                "abortIncompleteMultipartUpload",
                                Field::object(
                                    Schema::object().field("daysAfterInitiation", Field::integer()),
                                ),
                            )
                            .field("expirationDate", Field::string())
                            .field("expirationInDays", Field::integer())
                            .field(
                                "noncurrentVersionExpiration",
                                Field::object(
                                    Schema::object().field("noncurrentDays", Field::integer()),
                                ),
                            )
                            .field("noncurrentVersionTransitions", Field::array(transition()))
                            .field("prefix", Field::string())
                            .field("transitions", Field::array(transition())),
                    ),
                ),
            )
            .describe("Lifecycle rules (not supported on AWS yet)"),
        )
        .field(
            "logging",
            Field::object(
                Schema::object()
                    .field("destinationBucket", Field::string())
                    .field("logFilePrefix", Field::string()),
            )
            .describe("Access logging (not supported on AWS yet)"),
        )
        .field(
            "versioning",
            Field::object(
                Schema::object().field(
                    "status",
                    Field::string().allowed(["Enabled", "Suspended"]),
                ),
            )
            .describe("Object versioning; off when not set"),
        )
        .field(
            "replication",
            Field::object(
                Schema::object()
                    .field("enabled", Field::boolean())
                    .field("regions", Field::array(Schema::string())),
            )
            .describe("Cross-region replication (not supported on AWS yet)"),
        )
        .field(
            "website",
            Field::object(
                Schema::object()
                    .field("mainPageDocument", Field::string())
                    .field("notFoundDocument", Field::string()),
            )
            .describe("Static website hosting (not supported on AWS yet)"),
        )
}

pub fn emit(input: &Input, r: &Resource, out: &mut Out) {
    out.check_spec(r, &schema());
    let spec = r.spec();
    let mut b = Map::new();
    if let Some(name) = spec.get("name") {
        b.insert("bucketName".into(), name.clone());
    }
    if let Some(enc) = spec.get("encryption").and_then(Json::as_object) {
        let key = enc.get("encryptionKeyId");
        let algorithm = enc
            .get("encryptionAlgorithm")
            .cloned()
            .unwrap_or_else(|| json!(if key.is_some() { "aws:kms" } else { "AES256" }));
        if key.is_some() && algorithm == json!("AES256") {
            out.error(
                "bucket.encryption",
                "AES256 (SSE-S3) encryption takes no key; use aws:kms with `encryptionKeyId`",
                r.spec_at("encryption").field("encryptionAlgorithm"),
            );
        }
        let mut by_default = Map::new();
        by_default.insert("sseAlgorithm".into(), algorithm);
        if let Some(k) = key {
            by_default.insert("kmsMasterKeyId".into(), k.clone());
        }
        b.insert(
            "bucketEncryption".into(),
            json!({"serverSideEncryptionConfiguration": [
                {"serverSideEncryptionByDefault": by_default}
            ]}),
        );
    }
    if let Some(status) = spec.get("versioning").and_then(|v| v.get("status")) {
        b.insert(
            "versioningConfiguration".into(),
            json!({ "status": status }),
        );
    }
    for (field, what) in [
        ("cors", "CORS rules"),
        ("lifecycle", "lifecycle rules"),
        ("logging", "access logging"),
        ("replication", "replication"),
        ("website", "website hosting"),
    ] {
        if spec.get(field).is_some_and(|v| !v.is_null()) {
            out.warning(
                "bucket.not-supported",
                format!("`{field}` ({what}) of bucket `{}` is not supported on AWS yet; the bucket is deployed without it", r.name),
                r.spec_at(field),
            )
            .hint = Some("the aws/s3/bucket resource type has no field for it yet".into());
        }
    }

    // Notifications to queues and topics have no provider link yet; to a
    // consumer's handler they do (`aws/s3/bucket` → `aws/lambda/function`).
    let selected: Vec<&Resource> = input.selected_by(r).collect();
    for s in selected
        .iter()
        .filter(|s| s.ty == queue::TYPE || s.ty == topic::TYPE)
    {
        out.warning(
            "bucket.notifications",
            format!(
                "bucket `{}` links to {} `{}`: object notifications to queues and topics are not supported on AWS yet",
                r.name, s.ty, s.name
            ),
            r.at().field("linkSelector"),
        )
        .hint = Some("link the bucket to a celerity/consumer instead: its handler is notified".into());
    }
    out.emit(&r.name, r, "aws/s3/bucket", Json::Object(b));
    if !selected.is_empty()
        && selected
            .iter()
            .all(|s| s.ty == queue::TYPE || s.ty == topic::TYPE)
        && let Some(def) = out.get_mut(&r.name)
    {
        def.remove("linkSelector");
    }
    out.alias_fields(r, &[("name", "bucketName"), ("id", "arn")]);
}

#[cfg(test)]
mod tests {
    use crate::model::diagnostic_lines;
    use crate::transform_doc;
    use serde_json::json;

    #[test]
    fn bucket_encryption_versioning_and_what_is_not_backed() {
        let out = transform_doc(json!({
            "version": "2023-04-20",
            "transform": "celerity-2023-04-20",
            "resources": {
                "uploads": {
                    "type": "celerity/bucket",
                    "metadata": {"labels": {"app": "files"}},
                    "linkSelector": {"byLabel": {"notify": "uploads"}},
                    "spec": {
                        "name": "uploads",
                        "encryption": {"encryptionKeyId": "alias/uploads"},
                        "versioning": {"status": "Enabled"},
                        "cors": {"corsRules": [{"allowedOrigins": ["*"], "allowedMethods": ["GET"]}]},
                        "lifecycle": {"rules": [{"id": "old", "enabled": true, "expirationInDays": 30}]},
                        "website": {"mainPageDocument": "index.html"}
                    }
                },
                "plain": {"type": "celerity/bucket", "spec": {"encryption": {}}},
                "bad": {"type": "celerity/bucket",
                        "spec": {"encryption": {"encryptionKeyId": "k", "encryptionAlgorithm": "AES256"},
                                 "versioning": {"status": "On"}}},
                "inbox": {"type": "celerity/queue", "metadata": {"labels": {"notify": "uploads"}}, "spec": {}},
                "reader": {
                    "type": "aws/lambda/function",
                    "spec": {"codeUri": "./r", "description": "${resources.uploads.spec.name} ${resources.uploads.spec.id}"}
                }
            }
        }));
        insta::assert_json_snapshot!("bucket", out.blueprint["resources"]);
        insta::assert_json_snapshot!("bucket_diagnostics", diagnostic_lines(&out.diagnostics));
    }
}

//! `celerity/topic` → `aws/sns/topic` of the same name.

use crate::model::{Input, Out, Resource};
use serde_json::{Map, Value as Json, json};
use trellis_plugin_sdk::prelude::*;

pub const TYPE: &str = "celerity/topic";
pub const DESCRIPTION: &str = "A pub/sub topic, deployed as an SNS topic";

pub fn schema() -> Schema {
    Schema::object()
        .describe("A pub/sub topic")
        .field(
            "name",
            Field::string().describe(
                "The topic's name (`.fifo` is added to a FIFO topic's name when missing); derived from the instance and resource name when not set",
            ),
        )
        .field(
            "fifo",
            Field::boolean()
                .default(false)
                .describe("A FIFO topic: messages in order, without duplicates"),
        )
        .field(
            "encryptionKeyId",
            Field::string().describe("The KMS key (id, alias or ARN) that encrypts messages at rest"),
        )
}

pub fn emit(_input: &Input, r: &Resource, out: &mut Out) {
    out.check_spec(r, &schema());
    let spec = r.spec();
    let fifo = spec.get("fifo").and_then(Json::as_bool) == Some(true);
    let mut t = Map::new();
    if let Some(name) = spec.get("name") {
        let name = match name.as_str() {
            Some(n) if fifo && !n.contains("${") && !n.ends_with(".fifo") => {
                json!(format!("{n}.fifo"))
            }
            _ => name.clone(),
        };
        t.insert("topicName".into(), name);
    }
    if let Some(f) = spec.get("fifo")
        && f != &Json::Bool(false)
    {
        t.insert("fifoTopic".into(), f.clone());
    }
    if let Some(k) = spec.get("encryptionKeyId") {
        t.insert("kmsMasterKeyId".into(), k.clone());
    }
    for key in [
        "celerity.topic.bucket.events",
        "celerity.topic.bucket.filterPrefix",
        "celerity.topic.bucket.filterSuffix",
    ] {
        if r.annotations().contains_key(key) {
            out.warning(
                "topic.bucket-events",
                "bucket notifications to topics are not supported on AWS yet; the annotation has no effect",
                r.at().field("metadata").field("annotations").field(key),
            );
        }
    }
    out.emit(&r.name, r, "aws/sns/topic", Json::Object(t));
    out.alias_fields(r, &[("name", "topicName"), ("id", "topicArn")]);
}

#[cfg(test)]
mod tests {
    use crate::model::diagnostic_lines;
    use crate::transform_doc;
    use serde_json::json;

    #[test]
    fn topic_standard_and_fifo() {
        let out = transform_doc(json!({
            "version": "2023-04-20",
            "transform": "celerity-2023-04-20",
            "resources": {
                "events": {"type": "celerity/topic", "metadata": {"labels": {"app": "orders"}},
                           "spec": {"name": "events", "encryptionKeyId": "alias/events"}},
                "ordered": {"type": "celerity/topic", "spec": {"name": "ordered", "fifo": true},
                            "metadata": {"annotations": {"celerity.topic.bucket.events": "created"}}},
                "reader": {
                    "type": "aws/lambda/function",
                    "spec": {"codeUri": "./r", "description": "${resources.events.spec.id} ${resources.ordered.spec.name}"}
                }
            }
        }));
        insta::assert_json_snapshot!("topic", out.blueprint["resources"]);
        insta::assert_json_snapshot!("topic_diagnostics", diagnostic_lines(&out.diagnostics));
    }
}

//! `celerity/queue` → `aws/sqs/queue` of the same name.
//!
//! A queue whose `linkSelector` selects another queue uses it as its
//! dead-letter queue: the redrive policy names the other queue's ARN by
//! reference, and `celerity.queue.deadLetterMaxAttempts` is its
//! `maxReceiveCount`. (The provider has no queue-to-queue link, so the
//! transform writes the policy itself.)

use crate::model::{Input, Out, Resource};
use crate::types::topic;
use serde_json::{Map, Value as Json, json};
use trellis_plugin_sdk::prelude::*;

pub const TYPE: &str = "celerity/queue";
pub const DESCRIPTION: &str = "A message queue, deployed as an SQS queue";

/// `maxReceiveCount` when `celerity.queue.deadLetterMaxAttempts` is not set.
pub const DEFAULT_MAX_ATTEMPTS: i64 = 5;

pub fn schema() -> Schema {
    Schema::object()
        .describe("A message queue")
        .field(
            "name",
            Field::string().describe(
                "The queue's name (`.fifo` is added to a FIFO queue's name when missing); derived from the instance and resource name when not set",
            ),
        )
        .field(
            "fifo",
            Field::boolean()
                .default(false)
                .describe("A FIFO queue: messages in order, without duplicates"),
        )
        .field(
            "visibilityTimeout",
            Field::integer()
                .describe("Seconds a received message stays hidden from other consumers, 0 to 43200"),
        )
        .field(
            "encryptionKeyId",
            Field::string().describe("The KMS key (id, alias or ARN) that encrypts messages at rest"),
        )
}

fn is_fifo(r: &Resource) -> Option<bool> {
    match r.spec().get("fifo") {
        None => Some(false),
        Some(v) => v.as_bool(),
    }
}

pub fn emit(input: &Input, r: &Resource, out: &mut Out) {
    out.check_spec(r, &schema());
    let spec = r.spec();
    let fifo = is_fifo(r);
    let mut q = Map::new();
    if let Some(name) = spec.get("name") {
        let name = match (name.as_str(), fifo) {
            (Some(n), Some(true)) if !n.contains("${") && !n.ends_with(".fifo") => {
                json!(format!("{n}.fifo"))
            }
            _ => name.clone(),
        };
        q.insert("queueName".into(), name);
    }
    if let Some(f) = spec.get("fifo")
        && f != &Json::Bool(false)
    {
        q.insert("fifoQueue".into(), f.clone());
    }
    if let Some(v) = spec.get("visibilityTimeout") {
        if let Some(n) = v.as_i64()
            && !(0..=43200).contains(&n)
        {
            out.error(
                "out-of-range",
                format!(
                    "`visibilityTimeout` of queue `{}` is {n}; SQS takes 0 to 43200 seconds",
                    r.name
                ),
                r.spec_at("visibilityTimeout"),
            );
        }
        q.insert("visibilityTimeout".into(), v.clone());
    }
    if let Some(k) = spec.get("encryptionKeyId") {
        q.insert("kmsMasterKeyId".into(), k.clone());
    }

    // Links out: a queue is a dead-letter queue; a topic would be a
    // forwarding target, which needs a function AWS does not give.
    let selected: Vec<&Resource> = input.selected_by(r).collect();
    let dlqs: Vec<&&Resource> = selected.iter().filter(|s| s.ty == TYPE).collect();
    let selector_at = r.at().field("linkSelector");
    match dlqs.as_slice() {
        [] => {}
        [dlq] => {
            if let (Some(a), Some(b)) = (fifo, is_fifo(dlq))
                && a != b
            {
                out.error(
                    "queue.dead-letter-fifo",
                    format!(
                        "queue `{}` is {} but its dead-letter queue `{}` is {}; SQS needs both FIFO or both standard",
                        r.name,
                        if a { "FIFO" } else { "standard" },
                        dlq.name,
                        if b { "FIFO" } else { "standard" }
                    ),
                    selector_at.clone(),
                );
            }
            let attempts = r
                .annotations()
                .get("celerity.queue.deadLetterMaxAttempts")
                .cloned()
                .unwrap_or(json!(DEFAULT_MAX_ATTEMPTS));
            q.insert(
                "redrivePolicy".into(),
                json!({
                    "deadLetterTargetArn": format!("${{resources.{}.spec.arn}}", dlq.name),
                    "maxReceiveCount": attempts,
                }),
            );
        }
        many => {
            let names: Vec<&str> = many.iter().map(|d| d.name.as_str()).collect();
            out.error(
                "queue.dead-letter-ambiguous",
                format!(
                    "queue `{}` selects {} queues ({}); a queue has one dead-letter queue",
                    r.name,
                    names.len(),
                    names.join(", ")
                ),
                selector_at.clone(),
            );
        }
    }
    if r.annotations()
        .contains_key("celerity.queue.deadLetterMaxAttempts")
        && dlqs.is_empty()
    {
        out.warning(
            "queue.no-dead-letter",
            format!(
                "queue `{}` sets deadLetterMaxAttempts but selects no queue to be its dead-letter queue",
                r.name
            ),
            r.at()
                .field("metadata")
                .field("annotations")
                .field("celerity.queue.deadLetterMaxAttempts"),
        );
    }
    for t in selected.iter().filter(|s| s.ty == topic::TYPE) {
        out.warning(
            "queue.forward-to-topic",
            format!(
                "queue `{}` links to topic `{}`: forwarding a queue's messages to a topic is not supported on AWS yet",
                r.name, t.name
            ),
            selector_at.clone(),
        )
        .hint = Some("have a handler consume the queue and publish to the topic".into());
    }
    for key in [
        "celerity.queue.bucket.events",
        "celerity.queue.bucket.filterPrefix",
        "celerity.queue.bucket.filterSuffix",
    ] {
        if r.annotations().contains_key(key) {
            out.warning(
                "queue.bucket-events",
                "bucket notifications to queues are not supported on AWS yet; the annotation has no effect",
                r.at().field("metadata").field("annotations").field(key),
            );
        }
    }

    out.emit(&r.name, r, "aws/sqs/queue", Json::Object(q));
    // What the selector selected is realised here (dead-letter queue) or
    // reported; when it selects nothing else, it would only make the
    // provider look for queue-to-queue links.
    if !selected.is_empty()
        && selected.iter().all(|s| s.ty == TYPE || s.ty == topic::TYPE)
        && let Some(def) = out.get_mut(&r.name)
    {
        def.remove("linkSelector");
    }
    out.alias_fields(
        r,
        &[("name", "queueName"), ("id", "arn"), ("url", "queueUrl")],
    );
}

#[cfg(test)]
mod tests {
    use crate::model::diagnostic_lines;
    use crate::transform_doc;
    use serde_json::{Value, json};

    fn doc(resources: Value) -> Value {
        json!({"version": "2023-04-20", "transform": "celerity-2023-04-20", "resources": resources})
    }

    #[test]
    fn queue_fifo_and_dead_letter_queue() {
        let out = transform_doc(doc(json!({
            "orders": {
                "type": "celerity/queue",
                "metadata": {"labels": {"app": "orders"},
                             "annotations": {"celerity.queue.deadLetterMaxAttempts": 4}},
                "linkSelector": {"byLabel": {"dlq": "orders"}},
                "spec": {"name": "orders", "fifo": true, "visibilityTimeout": 60,
                         "encryptionKeyId": "alias/orders"}
            },
            "ordersDlq": {
                "type": "celerity/queue",
                "metadata": {"labels": {"dlq": "orders"}},
                "spec": {"name": "orders-dlq.fifo", "fifo": true}
            },
            "plain": {"type": "celerity/queue", "spec": {}},
            "reader": {
                "type": "aws/lambda/function",
                "spec": {"codeUri": "./r", "description": "${resources.orders.spec.url} ${resources.orders.spec.id} ${resources.orders.spec.name}"}
            }
        })));
        assert!(
            out.diagnostics.is_empty(),
            "{:?}",
            diagnostic_lines(&out.diagnostics)
        );
        insta::assert_json_snapshot!("queue_fifo_dead_letter", out.blueprint["resources"]);
    }

    #[test]
    fn queue_diagnostics() {
        let out = transform_doc(doc(json!({
            "a": {
                "type": "celerity/queue",
                "linkSelector": {"byLabel": {"g": "x"}},
                "spec": {"fifo": true, "visibilityTimeout": 50000}
            },
            "b": {"type": "celerity/queue", "metadata": {"labels": {"g": "x"}}, "spec": {}},
            "c": {"type": "celerity/queue", "metadata": {"labels": {"g": "x"}}, "spec": {}},
            "t": {"type": "celerity/topic", "metadata": {"labels": {"g": "x"}}, "spec": {}},
            "d": {
                "type": "celerity/queue",
                "metadata": {"annotations": {"celerity.queue.deadLetterMaxAttempts": 2,
                                             "celerity.queue.bucket.events": "created"}},
                "spec": {"fifo": "yes"}
            },
            "e": {
                "type": "celerity/queue",
                "linkSelector": {"byLabel": {"dlq": "std"}},
                "spec": {"fifo": true}
            },
            "f": {"type": "celerity/queue", "metadata": {"labels": {"dlq": "std"}}, "spec": {}}
        })));
        insta::assert_json_snapshot!("queue_diagnostics", diagnostic_lines(&out.diagnostics));
    }
}

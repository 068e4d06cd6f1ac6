//! `celerity/consumer`: absorbed into its source and its handlers' functions
//! (docs/celerity/consumer.md).
//!
//! A consumer has no concrete resource of its own unless its source is a
//! topic. The source that selects it (a queue, a datastore or a bucket; a
//! `celerity/*` one or the concrete `aws/*` resource) is made to select the
//! consumer's handlers' functions instead, and the AWS provider's link from
//! the source to the function does the wiring:
//! - the source keeps its own `linkSelector` (a queue's also picks its
//!   dead-letter queue) and each function gets the labels it selects by;
//!   a source without a selector gets one on a generated label,
//!   `celerity.consumer.<consumer>: "true"`;
//! - the consumer's settings become annotations on the source
//!   (`aws.sqs.queue.batchSize`, ...) and, for a datastore, a stream on the table.
//!
//! A topic delivers through a queue of the consumer's own (`<consumer>_queue`,
//! with a dead-letter queue `<consumer>_dlq` unless
//! `celerity.consumer.deadLetterQueue: false`): the topic selects the queue
//! by the labels it selected the consumer by, and the queue selects the
//! functions by the generated label.

use std::collections::BTreeSet;

use crate::model::{Input, Out, Resource, add_label, emitted_selector, metadata_map, serves};
use serde_json::{Map, Value as Json, json};
use trellis_plugin_sdk::prelude::*;

pub const TYPE: &str = "celerity/consumer";
pub const DESCRIPTION: &str =
    "A consumer of messages from a queue, topic, datastore stream or bucket";

/// Annotations the AWS provider's links read on the source.
pub const SQS_BATCH_SIZE: &str = "aws.sqs.queue.batchSize";
pub const SQS_PARTIAL_FAILURES: &str = "aws.sqs.queue.reportBatchItemFailures";
pub const STREAM_BATCH_SIZE: &str = "aws.dynamodb.table.batchSize";
pub const STREAM_PARTIAL_FAILURES: &str = "aws.dynamodb.table.reportBatchItemFailures";
pub const STREAM_STARTING_POSITION: &str = "aws.dynamodb.table.startingPosition";
pub const BUCKET_EVENTS: &str = "aws.s3.bucket.events";

/// Lambda's largest SQS batch without a batching window.
const SQS_BATCH_WITHOUT_WINDOW: i64 = 10;
const DEFAULT_MAX_RECEIVES: i64 = 10;

pub fn schema() -> Schema {
    Schema::object()
        .describe(DESCRIPTION)
        .field(
            "sourceId",
            Field::string().describe("An external source (not supported by the AWS target yet); link a queue, datastore, bucket or topic instead"),
        )
        .field(
            "batchSize",
            Field::integer().describe("Messages or records per invocation (queues: 1 to 10; streams: 1 to 10000)"),
        )
        .field(
            "visibilityTimeout",
            Field::integer().describe("Seconds a received message stays hidden (set on the source queue, 0 to 43200)"),
        )
        .field(
            "waitTimeSeconds",
            Field::integer().describe("Long polling wait (no effect on the AWS serverless target)"),
        )
        .field(
            "partialFailures",
            Field::boolean()
                .default(false)
                .describe("Let the handler report the failed messages of a batch, so only those are retried"),
        )
        .field(
            "routingKey",
            Field::string()
                .default("event")
                .describe("The message field that routes to handlers (done by the Celerity runtime)"),
        )
        .field(
            "externalEvents",
            Field::map(Schema::any()).describe("Events of cloud services outside the blueprint (not supported by the AWS target yet)"),
        )
}

/// The kinds of source a consumer is linked from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Queue,
    Datastore,
    Bucket,
    Topic,
}

impl Kind {
    fn of(ty: &str) -> Option<Kind> {
        Some(match ty {
            "celerity/queue" | "aws/sqs/queue" => Kind::Queue,
            "celerity/datastore" | "aws/dynamodb/table" => Kind::Datastore,
            "celerity/bucket" | "aws/s3/bucket" => Kind::Bucket,
            "celerity/topic" | "aws/sns/topic" => Kind::Topic,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Queue => "queue",
            Kind::Datastore => "datastore",
            Kind::Bucket => "bucket",
            Kind::Topic => "topic",
        }
    }
}

/// The label by which a source generated for `consumer` selects its functions.
pub fn label(consumer: &str) -> String {
    format!("celerity.consumer.{consumer}")
}

fn int(r: &Resource, field: &str, out: &mut Out, range: (i64, i64)) -> Option<i64> {
    let v = r.spec().get(field)?;
    if v.as_str().is_some_and(|s| s.contains("${")) {
        return None;
    }
    match v.as_i64() {
        Some(n) if (range.0..=range.1).contains(&n) => Some(n),
        _ => {
            out.error(
                "invalid-value",
                format!(
                    "`{field}` of `{}` must be a whole number from {} to {}",
                    r.name, range.0, range.1
                ),
                r.spec_at(field),
            );
            None
        }
    }
}

fn flag(v: Option<&Json>) -> Option<bool> {
    match v? {
        Json::Bool(b) => Some(*b),
        Json::String(s) if s == "true" => Some(true),
        Json::String(s) if s == "false" => Some(false),
        _ => None,
    }
}

fn annotation_at(r: &Resource, key: &str) -> AttrPath {
    r.at().field("metadata").field("annotations").field(key)
}

pub fn emit(_input: &Input, r: &Resource, out: &mut Out) {
    let spec = r.spec();
    if spec.contains_key("sourceId") {
        out.error(
            "not-supported",
            format!("consumer `{}`: a `sourceId` outside the blueprint is not supported by the AWS target yet", r.name),
            r.spec_at("sourceId"),
        )
        .hint = Some("the transform cannot grant the function's role access to a source it does not deploy; declare the queue or topic in this blueprint and let it select the consumer".into());
    }
    if spec.contains_key("externalEvents") {
        out.error(
            "not-supported",
            format!(
                "consumer `{}`: `externalEvents` are not supported by the AWS target yet",
                r.name
            ),
            r.spec_at("externalEvents"),
        )
        .hint = Some(
            "declare the bucket or datastore in this blueprint and let it select the consumer"
                .into(),
        );
    }
    if spec.contains_key("waitTimeSeconds") {
        out.warning(
            "not-supported",
            format!("consumer `{}`: `waitTimeSeconds` has no effect on the AWS serverless target", r.name),
            r.spec_at("waitTimeSeconds"),
        )
        .hint = Some("Lambda's poller long-polls the queue itself; set `receiveMessageWaitTimeSeconds` on the queue for other readers".into());
    }
    if spec.get("routingKey").is_some_and(|k| k != "event") {
        out.warning(
            "not-supported",
            format!("consumer `{}`: `routingKey` is applied by the Celerity handler runtime, not by AWS", r.name),
            r.spec_at("routingKey"),
        )
        .hint = Some("nothing is deployed for it; the handler code routes by this field".into());
    }
    if r.selector().is_none() {
        out.error(
            "no-handler",
            format!(
                "consumer `{}` has no linkSelector, so it has no handler",
                r.name
            ),
            r.at(),
        )
        .hint = Some("select the handlers with `linkSelector.byLabel`".into());
    }
}

/// The sources of a consumer, one kind only, disambiguated by the
/// `celerity.consumer.<kind>` annotations; None after reporting a problem.
fn sources<'a>(
    input: &'a Input,
    c: &'a Resource,
    out: &mut Out,
) -> Option<(Kind, Vec<&'a Resource>)> {
    let mut linked: Vec<(Kind, &Resource)> = input
        .selecting(c)
        .filter_map(|s| Kind::of(&s.ty).map(|k| (k, s)))
        .collect();
    for kind in [Kind::Queue, Kind::Datastore, Kind::Bucket] {
        let key = format!("celerity.consumer.{}", kind.name());
        if let Some(want) = c.annotations().get(&key) {
            let want = want.as_str().unwrap_or_default();
            if !linked.iter().any(|(k, s)| *k == kind && s.name == want) {
                out.error(
                    "invalid-value",
                    format!(
                        "consumer `{}`: no {} `{want}` links to it",
                        c.name,
                        kind.name()
                    ),
                    annotation_at(c, &key),
                );
                return None;
            }
            linked.retain(|(k, s)| *k != kind || s.name == want);
        }
    }
    let kinds: BTreeSet<Kind> = linked.iter().map(|(k, _)| *k).collect();
    if kinds.len() > 1 {
        let names: Vec<String> = linked
            .iter()
            .map(|(_, s)| format!("`{}`", s.name))
            .collect();
        out.error(
            "ambiguous-source",
            format!(
                "consumer `{}` is linked from more than one kind of source: {}",
                c.name,
                names.join(", ")
            ),
            c.at().field("metadata").field("labels"),
        )
        .hint = Some("a consumer has one kind of source; give each source its own consumer".into());
        return None;
    }
    let kind = *kinds.first()?;
    let list: Vec<&Resource> = linked.into_iter().map(|(_, s)| s).collect();
    if list.len() > 1 && kind != Kind::Topic {
        let names: Vec<String> = list.iter().map(|s| format!("`{}`", s.name)).collect();
        out.error(
            "ambiguous-source",
            format!(
                "consumer `{}` is linked from {} {}s: {}",
                c.name,
                list.len(),
                kind.name(),
                names.join(", ")
            ),
            c.at().field("metadata").field("labels"),
        )
        .hint = Some(format!(
            "name the one to consume with the annotation `celerity.consumer.{}`",
            kind.name()
        ));
        return None;
    }
    Some((kind, list))
}

/// Labels every handler function gets, and makes sure `source` selects by
/// them: its own selector's, or a generated one when it has none.
fn selection_labels(out: &mut Out, source: &str, consumer: &str) -> Option<Map<String, Json>> {
    let def = out.get_mut(source)?;
    if let Some(sel) = emitted_selector(def) {
        return Some(sel);
    }
    let mut sel = Map::new();
    sel.insert(label(consumer), json!("true"));
    def.insert("linkSelector".into(), json!({ "byLabel": sel.clone() }));
    Some(sel)
}

fn label_handlers(out: &mut Out, c: &Resource, handlers: &[&Resource], labels: &Map<String, Json>) {
    for h in handlers {
        let Some(def) = out.get_mut(&h.name) else {
            continue;
        };
        let mut conflicts = Vec::new();
        for (k, v) in labels {
            if let Err(had) = add_label(def, k, v) {
                conflicts.push(format!("`{k}` is {had}, the source selects {v}"));
            }
        }
        if !conflicts.is_empty() {
            out.error(
                "label-conflict",
                format!(
                    "handler `{}` cannot be selected by the source of consumer `{}`: {}",
                    h.name,
                    c.name,
                    conflicts.join("; ")
                ),
                h.at().field("metadata").field("labels"),
            );
        }
    }
}

fn set_annotation(out: &mut Out, resource: &str, key: &str, value: Json) {
    if let Some(def) = out.get_mut(resource) {
        metadata_map(def, "annotations").insert(key.into(), value);
    }
}

/// A queue's `visibilityTimeout` from the consumer's, unless the queue sets its own.
fn visibility(out: &mut Out, c: &Resource, queue: &str, timeout: Option<i64>) {
    let Some(t) = timeout else { return };
    let Some(spec) = out
        .get_mut(queue)
        .and_then(|d| d.get_mut("spec"))
        .and_then(Json::as_object_mut)
    else {
        return;
    };
    match spec.get("visibilityTimeout") {
        None => {
            spec.insert("visibilityTimeout".into(), json!(t));
        }
        Some(v) if v.as_i64() == Some(t) => {}
        Some(v) => {
            let v = v.clone();
            out.warning(
                "conflict",
                format!("consumer `{}`: queue `{queue}` sets its own visibility timeout ({v}), which stays", c.name),
                c.spec_at("visibilityTimeout"),
            )
            .hint = Some("set it in one place".into());
        }
    }
}

/// Lambda refuses to map a queue whose visibility timeout is shorter than
/// the function's timeout: reported here, at the consumer, before a deploy fails.
fn check_visibility(out: &mut Out, c: &Resource, queue: &str, handlers: &[&Resource]) {
    let timeout_of = |out: &Out, name: &str, field: &str, default: i64| {
        out.resources
            .get(name)
            .and_then(|d| d.get("spec"))
            .map_or(Some(default), |s| match s.get(field) {
                None => Some(default),
                Some(v) => v.as_i64(),
            })
    };
    // SQS's default visibility timeout and the handler's default timeout.
    let Some(visible) = timeout_of(out, queue, "visibilityTimeout", 30) else {
        return;
    };
    for h in handlers {
        if let Some(t) = timeout_of(out, &h.name, "timeout", 30)
            && t > visible
        {
            out.error(
                "invalid-value",
                format!("consumer `{}`: queue `{queue}` hides a message for {visible} s, less than handler `{}`'s timeout of {t} s, and Lambda refuses that mapping", c.name, h.name),
                c.spec_at("visibilityTimeout"),
            )
            .hint = Some(format!("set `visibilityTimeout` to at least {t} (AWS advises six times the function's timeout)"));
        }
    }
}

/// Settings that a push source (a bucket) has no use for.
fn not_for_push(c: &Resource, out: &mut Out, kind: Kind) {
    for field in ["batchSize", "visibilityTimeout"] {
        if c.spec().contains_key(field) {
            out.warning(
                "not-supported",
                format!("consumer `{}`: `{field}` has no effect for a {} source (each event invokes the handler)", c.name, kind.name()),
                c.spec_at(field),
            );
        }
    }
    if c.spec().get("partialFailures") == Some(&Json::Bool(true)) {
        out.warning(
            "not-supported",
            format!(
                "consumer `{}`: `partialFailures` has no effect for a {} source",
                c.name,
                kind.name()
            ),
            c.spec_at("partialFailures"),
        );
    }
}

/// `created,deleted` → `s3:ObjectCreated:*,s3:ObjectRemoved:*`.
fn bucket_events(c: &Resource, out: &mut Out) -> Option<String> {
    let key = "celerity.consumer.bucket.events";
    let raw = match c.annotations().get(key) {
        None => return None,
        Some(Json::String(s)) => s.clone(),
        Some(_) => {
            out.error(
                "invalid-value",
                format!("`{key}` of `{}` must be a string", c.name),
                annotation_at(c, key),
            );
            return None;
        }
    };
    let mut events = Vec::new();
    for e in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match e {
            "created" => events.push("s3:ObjectCreated:*"),
            "deleted" => events.push("s3:ObjectRemoved:*"),
            "metadataUpdated" => {
                out.error(
                    "not-supported",
                    format!(
                        "consumer `{}`: S3 has no notification for metadata updates",
                        c.name
                    ),
                    annotation_at(c, key),
                )
                .hint = Some("use `created` and `deleted`".into());
            }
            other => {
                out.error(
                    "invalid-value",
                    format!(
                        "`{other}` of `{key}` is not `created`, `deleted` or `metadataUpdated`"
                    ),
                    annotation_at(c, key),
                );
            }
        }
    }
    (!events.is_empty()).then(|| events.join(","))
}

pub fn finish(input: &Input, out: &mut Out) {
    for c in input.of_type(TYPE) {
        let handlers: Vec<&Resource> = input
            .selected_by(c)
            .filter(|h| {
                h.ty == crate::types::handler::TYPE && serves(h, "celerity.handler.consumer")
            })
            .collect();
        if c.selector().is_some() && handlers.is_empty() {
            out.error(
                "no-handler",
                format!("consumer `{}` selects no handler", c.name),
                c.at().field("linkSelector"),
            )
            .hint = Some("give a celerity/handler the selector's labels (a handler with `celerity.handler.*` markers needs `celerity.handler.consumer: true`)".into());
        }
        let Some((kind, sources)) = sources(input, c, out) else {
            if !c.spec().contains_key("sourceId")
                && !c.spec().contains_key("externalEvents")
                && input.selecting(c).all(|s| Kind::of(&s.ty).is_none())
            {
                out.error(
                    "no-source",
                    format!("consumer `{}` has no source: no queue, datastore, bucket or topic selects it", c.name),
                    c.at(),
                )
                .hint = Some("give the consumer labels a celerity/queue, datastore, bucket or topic selects".into());
            }
            continue;
        };
        let batch_range = match kind {
            Kind::Datastore => (1, 10_000),
            _ => (1, SQS_BATCH_WITHOUT_WINDOW),
        };
        let batch = int(c, "batchSize", out, batch_range);
        let visibility_timeout = int(c, "visibilityTimeout", out, (0, 43_200));
        let partial = c.spec().get("partialFailures") == Some(&Json::Bool(true));
        match kind {
            Kind::Queue => {
                let q = &sources[0].name;
                if let Some(labels) = selection_labels(out, q, &c.name) {
                    label_handlers(out, c, &handlers, &labels);
                }
                if let Some(b) = batch {
                    set_annotation(out, q, SQS_BATCH_SIZE, json!(b));
                }
                if partial {
                    set_annotation(out, q, SQS_PARTIAL_FAILURES, json!(true));
                }
                visibility(out, c, q, visibility_timeout);
                check_visibility(out, c, q, &handlers);
            }
            Kind::Datastore => {
                let t = &sources[0].name;
                if let Some(labels) = selection_labels(out, t, &c.name) {
                    label_handlers(out, c, &handlers, &labels);
                }
                if let Some(spec) = out
                    .get_mut(t)
                    .and_then(|d| d.get_mut("spec"))
                    .and_then(Json::as_object_mut)
                {
                    spec.entry("streamSpecification")
                        .or_insert_with(|| json!({"streamViewType": "NEW_AND_OLD_IMAGES"}));
                }
                if let Some(b) = batch {
                    set_annotation(out, t, STREAM_BATCH_SIZE, json!(b));
                }
                if partial {
                    set_annotation(out, t, STREAM_PARTIAL_FAILURES, json!(true));
                }
                let key = "celerity.consumer.datastore.startFromBeginning";
                let start = if flag(c.annotations().get(key)) == Some(true) {
                    "TRIM_HORIZON"
                } else {
                    "LATEST"
                };
                set_annotation(out, t, STREAM_STARTING_POSITION, json!(start));
                if c.spec().contains_key("visibilityTimeout") {
                    out.warning(
                        "not-supported",
                        format!("consumer `{}`: `visibilityTimeout` has no effect for a datastore stream", c.name),
                        c.spec_at("visibilityTimeout"),
                    );
                }
            }
            Kind::Bucket => {
                let b = &sources[0].name;
                not_for_push(c, out, kind);
                if let Some(labels) = selection_labels(out, b, &c.name) {
                    label_handlers(out, c, &handlers, &labels);
                }
                if let Some(events) = bucket_events(c, out) {
                    set_annotation(out, b, BUCKET_EVENTS, json!(events));
                }
            }
            Kind::Topic => topic_queue(
                input,
                c,
                &sources,
                &handlers,
                batch,
                visibility_timeout,
                partial,
                out,
            ),
        }
    }
}

/// A topic's consumer: a queue of its own that the topics select, and its
/// dead-letter queue.
#[allow(clippy::too_many_arguments)]
fn topic_queue(
    _input: &Input,
    c: &Resource,
    topics: &[&Resource],
    handlers: &[&Resource],
    batch: Option<i64>,
    visibility_timeout: Option<i64>,
    partial: bool,
    out: &mut Out,
) {
    // The labels the topics select the queue by: those they selected the consumer by.
    let mut topic_labels = Map::new();
    for t in topics {
        let sel = out
            .resources
            .get(&t.name)
            .and_then(Json::as_object)
            .and_then(emitted_selector)
            .or_else(|| t.selector().cloned())
            .unwrap_or_default();
        topic_labels.extend(sel);
    }
    let queue_name = format!("{}_queue", c.name);
    let dlq_name = format!("{}_dlq", c.name);
    let ann = c.annotations();
    let dlq = flag(ann.get("celerity.consumer.deadLetterQueue")) != Some(false);
    let max_receives = match ann.get("celerity.consumer.deadLetterQueueMaxAttempts") {
        None => DEFAULT_MAX_RECEIVES,
        Some(v) => match v
            .as_i64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        {
            Some(n) if n >= 1 => n,
            _ => {
                out.error(
                    "invalid-value",
                    format!("`celerity.consumer.deadLetterQueueMaxAttempts` of `{}` must be a whole number of at least 1", c.name),
                    annotation_at(c, "celerity.consumer.deadLetterQueueMaxAttempts"),
                );
                DEFAULT_MAX_RECEIVES
            }
        },
    };
    if dlq {
        let def = out.emit(&dlq_name, c, "aws/sqs/queue", json!({}));
        // Nothing selects it and it selects nothing.
        def.remove("metadata");
        def.remove("linkSelector");
    }
    let mut spec = Map::new();
    if let Some(t) = visibility_timeout {
        spec.insert("visibilityTimeout".into(), json!(t));
    }
    if dlq {
        spec.insert(
            "redrivePolicy".into(),
            json!({
                "deadLetterTargetArn": format!("${{resources.{dlq_name}.spec.arn}}"),
                "maxReceiveCount": max_receives,
            }),
        );
    }
    let def = out.emit(&queue_name, c, "aws/sqs/queue", Json::Object(spec));
    def.insert("metadata".into(), json!({ "labels": topic_labels }));
    def.insert(
        "linkSelector".into(),
        json!({ "byLabel": { label(&c.name): "true" } }),
    );
    if let Some(b) = batch {
        set_annotation(out, &queue_name, SQS_BATCH_SIZE, json!(b));
    }
    if partial {
        set_annotation(out, &queue_name, SQS_PARTIAL_FAILURES, json!(true));
    }
    let mut labels = Map::new();
    labels.insert(label(&c.name), json!("true"));
    label_handlers(out, c, handlers, &labels);
    out.alias(
        c,
        "subscriberId",
        format!("resources.{queue_name}.spec.arn"),
    );
}

#[cfg(test)]
mod tests {
    use crate::model::diagnostic_lines;
    use crate::transform_doc;
    use serde_json::{Value, json};

    fn handler(labels: Value) -> Value {
        json!({
            "type": "celerity/handler",
            "metadata": {"labels": labels},
            "spec": {"codeLocation": "./orders", "handler": "h.handler", "runtime": "python3.12"}
        })
    }

    fn doc(resources: Value) -> Value {
        json!({"version": "2023-04-20", "transform": "celerity-2023-04-20", "resources": resources})
    }

    #[test]
    fn a_queue_selects_its_consumers_handler() {
        let out = transform_doc(doc(json!({
            "orders": {
                "type": "aws/sqs/queue",
                "linkSelector": {"byLabel": {"consumes": "orders"}},
                "spec": {}
            },
            "ordersConsumer": {
                "type": "celerity/consumer",
                "metadata": {"labels": {"consumes": "orders"}},
                "linkSelector": {"byLabel": {"handles": "orders"}},
                "spec": {"batchSize": 5, "visibilityTimeout": 90, "partialFailures": true}
            },
            "processOrder": handler(json!({"handles": "orders"}))
        })));
        insta::assert_json_snapshot!("consumer_queue", out.blueprint["resources"]);
        assert!(
            out.diagnostics.is_empty(),
            "{:?}",
            diagnostic_lines(&out.diagnostics)
        );
    }

    #[test]
    fn a_topic_fans_out_through_a_queue_per_consumer() {
        let out = transform_doc(doc(json!({
            "events": {
                "type": "aws/sns/topic",
                "linkSelector": {"byLabel": {"subscribes": "events"}},
                "spec": {}
            },
            "audit": {
                "type": "celerity/consumer",
                "metadata": {"labels": {"subscribes": "events"}},
                "linkSelector": {"byLabel": {"role": "audit"}},
                "spec": {"batchSize": 10, "visibilityTimeout": 60}
            },
            "notify": {
                "type": "celerity/consumer",
                "metadata": {"labels": {"subscribes": "events"}, "annotations": {"celerity.consumer.deadLetterQueue": false}},
                "linkSelector": {"byLabel": {"role": "notify"}},
                "spec": {}
            },
            "auditor": handler(json!({"role": "audit"})),
            "notifier": handler(json!({"role": "notify"}))
        })));
        insta::assert_json_snapshot!("consumer_topic_fan_out", out.blueprint["resources"]);
        assert!(
            out.diagnostics.is_empty(),
            "{:?}",
            diagnostic_lines(&out.diagnostics)
        );
    }

    #[test]
    fn a_datastore_stream_and_a_bucket() {
        let out = transform_doc(doc(json!({
            "orders": {
                "type": "aws/dynamodb/table",
                "linkSelector": {"byLabel": {"stream": "orders"}},
                "spec": {"tableName": "orders"}
            },
            "uploads": {"type": "aws/s3/bucket", "linkSelector": {"byLabel": {"files": "uploads"}}, "spec": {}},
            "changes": {
                "type": "celerity/consumer",
                "metadata": {"labels": {"stream": "orders"},
                             "annotations": {"celerity.consumer.datastore.startFromBeginning": true}},
                "linkSelector": {"byLabel": {"role": "changes"}},
                "spec": {"batchSize": 500, "partialFailures": true}
            },
            "onUpload": {
                "type": "celerity/consumer",
                "metadata": {"labels": {"files": "uploads"},
                             "annotations": {"celerity.consumer.bucket.events": "created,deleted"}},
                "linkSelector": {"byLabel": {"role": "files"}},
                "spec": {}
            },
            "onChange": handler(json!({"role": "changes"})),
            "onFile": handler(json!({"role": "files"}))
        })));
        insta::assert_json_snapshot!("consumer_stream_and_bucket", out.blueprint["resources"]);
        // The bucket has no selector and selects nothing: its consumer has no source.
        insta::assert_json_snapshot!(
            "consumer_stream_and_bucket_diagnostics",
            diagnostic_lines(&out.diagnostics)
        );
    }

    #[test]
    fn what_the_aws_target_cannot_back_is_reported_at_its_field() {
        let out = transform_doc(doc(json!({
            "q1": {"type": "aws/sqs/queue", "linkSelector": {"byLabel": {"c": "x"}}, "spec": {"visibilityTimeout": 30}},
            "q2": {"type": "aws/sqs/queue", "linkSelector": {"byLabel": {"c": "x"}}, "spec": {}},
            "b": {"type": "aws/s3/bucket", "linkSelector": {"byLabel": {"c": "y"}}, "spec": {}},
            "ambiguous": {
                "type": "celerity/consumer",
                "metadata": {"labels": {"c": "x"}},
                "linkSelector": {"byLabel": {"h": "1"}},
                "spec": {"batchSize": 50}
            },
            "chosen": {
                "type": "celerity/consumer",
                "metadata": {"labels": {"c": "x"}, "annotations": {"celerity.consumer.queue": "q1"}},
                "linkSelector": {"byLabel": {"h": "1"}},
                "spec": {"batchSize": 50, "visibilityTimeout": 60, "waitTimeSeconds": 20, "routingKey": "type"}
            },
            "pushed": {
                "type": "celerity/consumer",
                "metadata": {"labels": {"c": "y"}, "annotations": {"celerity.consumer.bucket.events": "created,metadataUpdated"}},
                "linkSelector": {"byLabel": {"h": "2"}},
                "spec": {"batchSize": 5, "partialFailures": true}
            },
            "external": {
                "type": "celerity/consumer",
                "linkSelector": {"byLabel": {"h": "1"}},
                "spec": {"sourceId": "celerity::topic::arn:aws:sns:us-east-1:1:t", "externalEvents": {"x": {"sourceType": "dbStream"}}}
            },
            "orphan": {"type": "celerity/consumer", "spec": {}},
            "h1": handler(json!({"h": "1", "c": "other"})),
            "h2": handler(json!({"h": "2"})),
            "slowQueue": {"type": "aws/sqs/queue", "linkSelector": {"byLabel": {"c": "slow"}}, "spec": {}},
            "slow": {
                "type": "celerity/consumer",
                "metadata": {"labels": {"c": "slow"}},
                "linkSelector": {"byLabel": {"h": "slow"}},
                "spec": {"visibilityTimeout": 60}
            },
            "slowHandler": {
                "type": "celerity/handler",
                "metadata": {"labels": {"h": "slow"}},
                "spec": {"codeLocation": "./orders", "handler": "h.handler", "runtime": "python3.12", "timeout": 120}
            }
        })));
        insta::assert_json_snapshot!(
            "consumer_unsupported_diagnostics",
            diagnostic_lines(&out.diagnostics)
        );
    }
}

//! `aws/sqs/queue` (CloudFormation `AWS::SQS::Queue`).

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_sqs::types::QueueAttributeName as A;
use trellis_plugin_sdk::prelude::*;

use crate::common::{self, NameStyle};
use crate::config::{ClientCache, Clients};
use crate::error::sdk;

pub struct Queue {
    pub clients: Arc<ClientCache>,
}

/// How a spec field is written as a queue attribute.
#[derive(Clone, Copy)]
enum Kind {
    Int,
    Bool,
    Text,
    Json,
}

/// Spec field, attribute, kind, AWS's default (what removing the field restores).
const ATTRIBUTES: &[(&str, &str, Kind, Option<&str>)] = &[
    ("delaySeconds", "DelaySeconds", Kind::Int, Some("0")),
    (
        "maximumMessageSize",
        "MaximumMessageSize",
        Kind::Int,
        // 1 MiB: the largest and the default since August 2025 (was 256 KiB).
        Some("1048576"),
    ),
    (
        "messageRetentionPeriod",
        "MessageRetentionPeriod",
        Kind::Int,
        Some("345600"),
    ),
    (
        "receiveMessageWaitTimeSeconds",
        "ReceiveMessageWaitTimeSeconds",
        Kind::Int,
        Some("0"),
    ),
    (
        "visibilityTimeout",
        "VisibilityTimeout",
        Kind::Int,
        Some("30"),
    ),
    (
        "contentBasedDeduplication",
        "ContentBasedDeduplication",
        Kind::Bool,
        None,
    ),
    ("deduplicationScope", "DeduplicationScope", Kind::Text, None),
    (
        "fifoThroughputLimit",
        "FifoThroughputLimit",
        Kind::Text,
        None,
    ),
    ("kmsMasterKeyId", "KmsMasterKeyId", Kind::Text, None),
    (
        "kmsDataKeyReusePeriodSeconds",
        "KmsDataKeyReusePeriodSeconds",
        Kind::Int,
        Some("300"),
    ),
    (
        "sqsManagedSseEnabled",
        "SqsManagedSseEnabled",
        Kind::Bool,
        None,
    ),
    ("redrivePolicy", "RedrivePolicy", Kind::Json, Some("")),
    ("redriveAllowPolicy", "RedriveAllowPolicy", Kind::Json, None),
];

const MAX_NAME: usize = 80;

fn queue_name(ctx: &Context, spec: &Spec<'_>, name: &str) -> Result<String> {
    let fifo = spec.opt_bool("fifoQueue")?.unwrap_or(false);
    if spec.get("queueName").is_some() {
        return Ok(spec.get_str("queueName")?.to_owned());
    }
    if fifo {
        let base = common::derived_name(ctx.instance_id(), name, MAX_NAME - 5, NameStyle::Standard);
        Ok(format!("{base}.fifo"))
    } else {
        common::physical_name(ctx, spec, "queueName", name, MAX_NAME, NameStyle::Standard)
    }
}

/// The attributes a spec sets, as SQS takes them.
fn attributes(spec: &Spec<'_>) -> Result<HashMap<A, String>> {
    let mut out = HashMap::new();
    if spec.opt_bool("fifoQueue")?.unwrap_or(false) {
        out.insert(A::FifoQueue, "true".to_owned());
    }
    for (field, attr, kind, _) in ATTRIBUTES {
        let Some(v) = spec.get(field) else { continue };
        let text = match kind {
            Kind::Int => spec.get_i64(field)?.to_string(),
            Kind::Bool => spec.get_bool(field)?.to_string(),
            Kind::Text => spec.get_str(field)?.to_owned(),
            Kind::Json => common::json_text(v),
        };
        out.insert(A::from(*attr), text);
    }
    Ok(out)
}

/// The spec as SQS reports it.
fn spec_of(
    name: &str,
    attrs: &HashMap<A, String>,
    tags: &[(String, String)],
    applied: &Spec<'_>,
) -> Value {
    let mut spec = Value::map().with("queueName", name);
    if attrs.get(&A::FifoQueue).is_some_and(|v| v == "true") {
        spec.insert("fifoQueue", true);
    } else if applied.get("fifoQueue").is_some() {
        spec.insert("fifoQueue", false);
    }
    for (field, attr, kind, _) in ATTRIBUTES {
        let Some(text) = attrs.get(&A::from(*attr)) else {
            continue;
        };
        let v = match kind {
            Kind::Int => text
                .parse::<i64>()
                .map_or_else(|_| Value::from(text.as_str()), Value::Int),
            Kind::Bool => Value::Bool(text == "true"),
            Kind::Text => Value::from(text.as_str()),
            Kind::Json if text.is_empty() => continue,
            Kind::Json => json_like(common::json_value(text), applied.get(field)),
        };
        spec.insert(*field, v);
    }
    common::put(&mut spec, "tags", common::tags_value(tags, applied));
    spec
}

/// SQS returns `maxReceiveCount` as a number or a string depending on how it was set;
/// report it the way the blueprint wrote it, so the same policy is not drift.
fn json_like(found: Value, applied: Option<&Value>) -> Value {
    let (Value::Map(mut found), Some(Value::Map(applied))) =
        (found.clone(), applied.map(Value::revealed))
    else {
        return found;
    };
    for (k, v) in found.iter_mut() {
        match (applied.get(k).map(Value::revealed), &*v) {
            (Some(Value::Int(_)), Value::String(s)) => {
                if let Ok(n) = s.parse() {
                    *v = Value::Int(n);
                }
            }
            (Some(Value::String(_)), Value::Int(n)) => *v = Value::from(n.to_string()),
            _ => {}
        }
    }
    Value::Map(found)
}

async fn url_of(c: &Clients, name: &str) -> Result<Option<String>> {
    match c.sqs.get_queue_url().queue_name(name).send().await {
        Ok(out) => Ok(out.queue_url),
        Err(e) => {
            let e = sdk(format!("finding queue {name}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

/// The queue an import id names: its URL (`https://sqs.<region>.amazonaws.com/<account>/<name>`),
/// its ARN or its name. The provider manages its own account's queues only.
async fn name_of_import_id(c: &Clients, id: &str) -> Result<String> {
    if let Some(arn) = common::import_arn(c, id, "sqs").await? {
        return Ok(arn.resource.to_owned());
    }
    let Some((_, rest)) = id.split_once("://") else {
        return Ok(id.to_owned());
    };
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    // `sqs.<region>.amazonaws.com`: queues are looked up by name in the provider's region.
    if let Some(region) = host.strip_prefix("sqs.").and_then(|h| h.split('.').next())
        && region != c.region
    {
        return Err(PluginError::bad_input(format!(
            "queue `{id}` is in region {region}, while the provider is configured for {}",
            c.region
        )));
    }
    let mut parts = path.split('/').filter(|p| !p.is_empty());
    let (Some(account), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(PluginError::bad_input(format!(
            "`{id}` is not a queue URL (`https://sqs.<region>.amazonaws.com/<account>/<name>`)"
        )));
    };
    let ours = c.account().await?;
    if account != ours {
        return Err(PluginError::bad_input(format!(
            "queue `{id}` is of account {account}, while the provider's credentials are of account {ours}"
        )));
    }
    Ok(name.to_owned())
}

async fn tags_of(c: &Clients, url: &str) -> Result<Vec<(String, String)>> {
    let out = c
        .sqs
        .list_queue_tags()
        .queue_url(url)
        .send()
        .await
        .map_err(|e| sdk(format!("reading the tags of queue {url}"), e))?;
    let mut tags: Vec<(String, String)> = out.tags.unwrap_or_default().into_iter().collect();
    tags.sort();
    Ok(tags)
}

async fn attributes_of(c: &Clients, url: &str) -> Result<HashMap<A, String>> {
    let out = c
        .sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(A::All)
        .send()
        .await
        .map_err(|e| sdk(format!("reading queue {url}"), e))?;
    Ok(out.attributes.unwrap_or_default())
}

fn state(url: &str, attrs: &HashMap<A, String>) -> Value {
    let mut s = Value::map().with("queueUrl", url);
    common::put(&mut s, "arn", attrs.get(&A::QueueArn).map(String::as_str));
    s
}

/// Sets the desired attributes (those the spec dropped go back to AWS's defaults) and tags.
async fn converge(
    ctx: &Context,
    c: &Clients,
    url: &str,
    spec: &Spec<'_>,
    before: Option<&Spec<'_>>,
    name: &str,
) -> Result<()> {
    let mut attrs = attributes(spec)?;
    attrs.remove(&A::FifoQueue);
    if let Some(before) = before {
        for (field, attr, _, default) in ATTRIBUTES {
            if spec.get(field).is_none()
                && before.get(field).is_some()
                && let Some(d) = default
            {
                attrs.insert(A::from(*attr), (*d).to_owned());
            }
        }
    }
    if !attrs.is_empty() {
        c.sqs
            .set_queue_attributes()
            .queue_url(url)
            .set_attributes(Some(attrs))
            .send()
            .await
            .map_err(|e| sdk(format!("updating queue {url}"), e))?;
    }
    let want = common::all_tags(ctx, spec, name)?;
    let have = tags_of(c, url).await?;
    let (set, remove) = common::tag_diff(&have, &want);
    if !set.is_empty() {
        c.sqs
            .tag_queue()
            .queue_url(url)
            .set_tags(Some(set.into_iter().collect()))
            .send()
            .await
            .map_err(|e| sdk(format!("tagging queue {url}"), e))?;
    }
    if !remove.is_empty() {
        c.sqs
            .untag_queue()
            .queue_url(url)
            .set_tag_keys(Some(remove))
            .send()
            .await
            .map_err(|e| sdk(format!("untagging queue {url}"), e))?;
    }
    Ok(())
}

#[async_trait]
impl Resource for Queue {
    fn type_name(&self) -> &str {
        "aws/sqs/queue"
    }

    fn description(&self) -> &str {
        "An SQS queue (standard or FIFO). Importable by its URL, name or ARN."
    }

    fn schema(&self) -> Schema {
        let int = |d: &str| Field::integer().describe(d.to_owned());
        Schema::object()
            .describe("An SQS queue; fields as CloudFormation's AWS::SQS::Queue in lowerCamelCase")
            .field("queueName", Field::string().must_recreate().describe("Up to 80 letters, digits, `-` and `_` (FIFO: ending in `.fifo`). Derived from the instance and resource name when not set."))
            .field("fifoQueue", Field::boolean().must_recreate().describe("A FIFO queue"))
            .field("contentBasedDeduplication", Field::boolean().describe("FIFO: deduplicate by a hash of the body"))
            .field("deduplicationScope", Field::string().allowed(["messageGroup", "queue"]).describe("FIFO: messageGroup or queue"))
            .field("fifoThroughputLimit", Field::string().allowed(["perQueue", "perMessageGroupId"]).describe("FIFO: perQueue or perMessageGroupId"))
            .field("delaySeconds", int("Delivery delay, 0 to 900 seconds"))
            .field("maximumMessageSize", int("Largest message, 1024 to 1048576 bytes (1 MiB, the default)"))
            .field("messageRetentionPeriod", int("Seconds a message is kept, 60 to 1209600"))
            .field("receiveMessageWaitTimeSeconds", int("Long polling wait, 0 to 20 seconds"))
            .field("visibilityTimeout", int("Seconds a received message stays hidden, 0 to 43200"))
            .field("kmsMasterKeyId", Field::string().describe("KMS key for server-side encryption"))
            .field("kmsDataKeyReusePeriodSeconds", int("Seconds a data key is reused, 60 to 86400"))
            .field("sqsManagedSseEnabled", Field::boolean().describe("Server-side encryption with SQS-owned keys"))
            .field(
                "redrivePolicy",
                Field::object(
                    Schema::object()
                        .field("deadLetterTargetArn", Field::string().required().describe("The dead-letter queue's ARN"))
                        .field("maxReceiveCount", Field::integer().required().describe("Receives before a message moves to the dead-letter queue")),
                )
                .describe("Dead-letter queue"),
            )
            .field("redriveAllowPolicy", Field::any().describe("Which queues may use this one as their dead-letter queue (JSON object)"))
            .field("tags", common::tags_field())
            .field("arn", Field::string().computed().describe("The queue's ARN"))
            .field("queueUrl", Field::string().computed().describe("The queue's URL"))
    }

    async fn validate(&self, _ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        let spec = req.spec();
        let mut out = Vec::new();
        let fifo = spec
            .get("fifoQueue")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if let Some(n) = spec.get("queueName").and_then(Value::as_str) {
            let base = n.strip_suffix(".fifo").unwrap_or(n);
            if n.len() > MAX_NAME
                || base.is_empty()
                || !base
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                out.push(
                    Diagnostic::error(
                        "aws.sqs.invalid-name",
                        format!("`queueName` \"{n}\" must be 1 to 80 letters, digits, `-` or `_`"),
                    )
                    .at("queueName"),
                );
            }
            if fifo != n.ends_with(".fifo") {
                out.push(
                    Diagnostic::error(
                        "aws.sqs.fifo-name",
                        "a FIFO queue's name ends in `.fifo`, and only a FIFO queue's does",
                    )
                    .at("queueName"),
                );
            }
        }
        for (field, lo, hi) in [
            ("delaySeconds", 0, 900),
            ("maximumMessageSize", 1024, 1_048_576),
            ("messageRetentionPeriod", 60, 1_209_600),
            ("receiveMessageWaitTimeSeconds", 0, 20),
            ("visibilityTimeout", 0, 43_200),
            ("kmsDataKeyReusePeriodSeconds", 60, 86_400),
        ] {
            if let Some(v) = spec.get(field).and_then(Value::as_i64)
                && !(lo..=hi).contains(&v)
            {
                out.push(
                    Diagnostic::error(
                        "aws.out-of-range",
                        format!("`{field}` is {v}; it must be between {lo} and {hi}"),
                    )
                    .at(field),
                );
            }
        }
        if !fifo {
            for f in [
                "contentBasedDeduplication",
                "deduplicationScope",
                "fifoThroughputLimit",
            ] {
                if spec.get(f).is_some() {
                    out.push(
                        Diagnostic::error(
                            "aws.sqs.fifo-only",
                            format!("`{f}` applies to FIFO queues only (`fifoQueue: true`)"),
                        )
                        .at(f),
                    );
                }
            }
        }
        Ok(out)
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let spec = req.spec();
        let name = queue_name(ctx, &spec, &req.name)?;
        let url = match url_of(&c, &name).await? {
            Some(url) => {
                let tags = tags_of(&c, &url).await?;
                common::adopt_or_conflict(ctx, &req.name, &tags, "queue", &name, "queueName")?;
                converge(ctx, &c, &url, &spec, None, &req.name).await?;
                url
            }
            None => {
                let tags = common::all_tags(ctx, &spec, &req.name)?;
                c.sqs
                    .create_queue()
                    .queue_name(&name)
                    .set_attributes(Some(attributes(&spec)?))
                    .set_tags(Some(tags.into_iter().collect()))
                    .send()
                    .await
                    .map_err(|e| sdk(format!("creating queue {name}"), e))?
                    .queue_url
                    .ok_or_else(|| {
                        PluginError::internal(format!("creating queue {name}: no URL returned"))
                    })?
            }
        };
        let attrs = attributes_of(&c, &url).await?;
        Ok(Applied::new(url.clone(), state(&url, &attrs)))
    }

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let url = req.current.external_id.clone();
        converge(
            ctx,
            &c,
            &url,
            &req.spec(),
            Some(&req.current.spec()),
            &req.name,
        )
        .await?;
        let attrs = attributes_of(&c, &url).await?;
        Ok(Applied::new(url.clone(), state(&url, &attrs)))
    }

    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        let c = self.clients.get(ctx).await?;
        let url = if current.external_id.is_empty() {
            let name = queue_name(ctx, &current.spec(), &current.name)?;
            match url_of(&c, &name).await? {
                Some(u) => u,
                None => return Ok(()),
            }
        } else {
            current.external_id.clone()
        };
        match c.sqs.delete_queue().queue_url(&url).send().await {
            Ok(_) => Ok(()),
            Err(e) => {
                let e = sdk(format!("deleting queue {url}"), e);
                if e.class == ErrorClass::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            }
        }
    }

    fn supports_read(&self) -> bool {
        true
    }

    async fn read(&self, ctx: &Context, current: &ResourceState) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let spec = current.spec();
        let name = queue_name(ctx, &spec, &current.name)?;
        let Some(url) = url_of(&c, &name).await? else {
            return Ok(None);
        };
        let tags = tags_of(&c, &url).await?;
        if current.external_id.is_empty()
            && common::owner(ctx, &current.name, &tags) != common::Owner::Ours
        {
            // Someone else's queue of that name: ours was never created.
            return Ok(None);
        }
        let attrs = match attributes_of(&c, &url).await {
            Ok(a) => a,
            Err(e) if e.class == ErrorClass::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(Some(ReadState {
            spec: spec_of(&name, &attrs, &tags, &spec),
            state: state(&url, &attrs),
            external_id: Some(url),
        }))
    }

    fn supports_import(&self) -> bool {
        true
    }

    /// By the queue's URL, name or ARN; the external id is its URL, as create reports it.
    /// Read reports every attribute, so the spec holds them all.
    async fn import(&self, ctx: &Context, req: &ImportRequest) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let id = common::import_id(req, "the queue's URL, name or ARN")?;
        let name = name_of_import_id(&c, id).await?;
        let Some(url) = url_of(&c, &name).await? else {
            return Ok(None);
        };
        // Read finds the queue by the name in the spec.
        let hint = Value::map().with("queueName", name);
        self.read(ctx, &common::import_state(req, &url, hint)).await
    }
}

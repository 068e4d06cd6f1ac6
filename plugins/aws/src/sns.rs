//! `aws/sns/topic` (CloudFormation `AWS::SNS::Topic`).
//!
//! CreateTopic is idempotent by name (it answers with the existing topic's ARN), so it
//! cannot tell a retry from someone else's topic: create first looks the ARN the name
//! would have up (GetTopicAttributes) and adopts only a topic with our ownership tags.
//!
//! Not supported yet: `deliveryStatusLogging`, `subscription` (subscriptions come through
//! links), `archivePolicy`, `dataProtectionPolicy`, `fifoThroughputScope`.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_sns::types::Tag;
use trellis_plugin_sdk::prelude::*;

use crate::common::{self, NameStyle};
use crate::config::{ClientCache, Clients};
use crate::error::sdk;

pub struct Topic {
    pub clients: Arc<ClientCache>,
}

const MAX_NAME: usize = 256;

#[derive(Clone, Copy)]
enum Kind {
    Bool,
    Text,
}

/// Spec field, topic attribute, kind, AWS's default (what removing the field restores).
const ATTRIBUTES: &[(&str, &str, Kind, &str)] = &[
    ("displayName", "DisplayName", Kind::Text, ""),
    ("kmsMasterKeyId", "KmsMasterKeyId", Kind::Text, ""),
    ("signatureVersion", "SignatureVersion", Kind::Text, "1"),
    ("tracingConfig", "TracingConfig", Kind::Text, "PassThrough"),
    (
        "contentBasedDeduplication",
        "ContentBasedDeduplication",
        Kind::Bool,
        "false",
    ),
];

/// Attributes moto 5.2 stores but never reports (AWS reports them once set): when the
/// answer lacks one, the applied value stands rather than reading as drift.
const UNREPORTED_BY_MOTO: &[&str] = &["SignatureVersion", "TracingConfig"];

fn topic_name(ctx: &Context, spec: &Spec<'_>, name: &str) -> Result<String> {
    if let Some(n) = spec.opt_str("topicName")? {
        return Ok(n.to_owned());
    }
    if spec.opt_bool("fifoTopic")?.unwrap_or(false) {
        let base = common::derived_name(ctx.instance_id(), name, MAX_NAME - 5, NameStyle::Standard);
        Ok(format!("{base}.fifo"))
    } else {
        Ok(common::derived_name(
            ctx.instance_id(),
            name,
            MAX_NAME,
            NameStyle::Standard,
        ))
    }
}

async fn arn_of(c: &Clients, name: &str) -> Result<String> {
    Ok(format!(
        "arn:{}:sns:{}:{}:{name}",
        c.partition(),
        c.region,
        c.account().await?
    ))
}

/// The ARN to act on: the recorded one, else the one the name has.
async fn arn_for(ctx: &Context, c: &Clients, current: &ResourceState) -> Result<String> {
    if current.external_id.is_empty() {
        let name = topic_name(ctx, &current.spec(), &current.name)?;
        arn_of(c, &name).await
    } else {
        Ok(current.external_id.clone())
    }
}

/// The attributes a spec sets, as SNS takes them.
fn attributes(spec: &Spec<'_>) -> Result<HashMap<String, String>> {
    let mut out = HashMap::new();
    if spec.opt_bool("fifoTopic")?.unwrap_or(false) {
        out.insert("FifoTopic".to_owned(), "true".to_owned());
    }
    for (field, attr, kind, _) in ATTRIBUTES {
        if spec.get(field).is_none() {
            continue;
        }
        let text = match kind {
            Kind::Bool => spec.get_bool(field)?.to_string(),
            Kind::Text => spec.get_str(field)?.to_owned(),
        };
        out.insert((*attr).to_owned(), text);
    }
    Ok(out)
}

/// The topic's attributes; None when there is no topic at `arn`.
async fn attributes_of(c: &Clients, arn: &str) -> Result<Option<HashMap<String, String>>> {
    match c.sns.get_topic_attributes().topic_arn(arn).send().await {
        Ok(out) => Ok(Some(out.attributes.unwrap_or_default())),
        Err(e) => {
            let e = sdk(format!("reading topic {arn}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

async fn tags_of(c: &Clients, arn: &str) -> Result<Vec<(String, String)>> {
    let out = c
        .sns
        .list_tags_for_resource()
        .resource_arn(arn)
        .send()
        .await
        .map_err(|e| sdk(format!("reading the tags of topic {arn}"), e))?;
    let mut tags: Vec<(String, String)> = out
        .tags
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.value))
        .collect();
    tags.sort();
    Ok(tags)
}

fn sns_tags(tags: Vec<(String, String)>) -> Result<Vec<Tag>> {
    tags.into_iter()
        .map(|(k, v)| {
            Tag::builder()
                .key(k)
                .value(v)
                .build()
                .map_err(|e| PluginError::internal(format!("building a tag: {e}")))
        })
        .collect()
}

fn is_true(v: Option<&String>) -> bool {
    v.is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The spec as SNS reports it.
fn spec_of(
    arn: &str,
    attrs: &HashMap<String, String>,
    tags: &[(String, String)],
    applied: &Spec<'_>,
) -> Value {
    let name = arn.rsplit(':').next().unwrap_or(arn);
    let mut spec = Value::map().with("topicName", name);
    let fifo = is_true(attrs.get("FifoTopic"));
    if fifo || applied.get("fifoTopic").is_some() {
        spec.insert("fifoTopic", fifo);
    }
    for (field, attr, kind, _) in ATTRIBUTES {
        let Some(text) = attrs.get(*attr) else {
            if UNREPORTED_BY_MOTO.contains(attr)
                && let Some(v) = applied.get(field)
            {
                spec.insert(*field, v.clone());
            }
            continue;
        };
        match kind {
            Kind::Bool if fifo || applied.get(field).is_some() => {
                spec.insert(*field, text.eq_ignore_ascii_case("true"));
            }
            Kind::Bool => {}
            // An empty text is the attribute unset.
            Kind::Text if text.is_empty() && applied.get(field).is_none() => {}
            Kind::Text => {
                spec.insert(*field, text.as_str());
            }
        }
    }
    common::put(&mut spec, "tags", common::tags_value(tags, applied));
    spec
}

fn state(arn: &str) -> Value {
    Value::map().with("arn", arn).with("topicArn", arn)
}

/// Sets the attributes that differ from `have` (those the spec dropped go back to AWS's
/// defaults) and the tags.
async fn converge(
    ctx: &Context,
    c: &Clients,
    arn: &str,
    have: &HashMap<String, String>,
    spec: &Spec<'_>,
    before: Option<&Spec<'_>>,
    name: &str,
) -> Result<()> {
    let mut want = attributes(spec)?;
    want.remove("FifoTopic");
    if let Some(before) = before {
        for (field, attr, _, default) in ATTRIBUTES {
            if spec.get(field).is_none() && before.get(field).is_some() {
                want.insert((*attr).to_owned(), (*default).to_owned());
            }
        }
    }
    let mut changes: Vec<(String, String)> = want
        .into_iter()
        .filter(|(attr, v)| match have.get(attr) {
            Some(h) => !h.eq_ignore_ascii_case(v),
            None => !v.is_empty(),
        })
        .collect();
    changes.sort();
    for (attr, value) in changes {
        c.sns
            .set_topic_attributes()
            .topic_arn(arn)
            .attribute_name(&attr)
            .attribute_value(value)
            .send()
            .await
            .map_err(|e| sdk(format!("setting {attr} of topic {arn}"), e))?;
    }
    let want = common::all_tags(ctx, spec, name)?;
    let have = tags_of(c, arn).await?;
    let (set, remove) = common::tag_diff(&have, &want);
    if !set.is_empty() {
        c.sns
            .tag_resource()
            .resource_arn(arn)
            .set_tags(Some(sns_tags(set)?))
            .send()
            .await
            .map_err(|e| sdk(format!("tagging topic {arn}"), e))?;
    }
    if !remove.is_empty() {
        c.sns
            .untag_resource()
            .resource_arn(arn)
            .set_tag_keys(Some(remove))
            .send()
            .await
            .map_err(|e| sdk(format!("untagging topic {arn}"), e))?;
    }
    Ok(())
}

fn bad_name(n: &str) -> bool {
    let base = n.strip_suffix(".fifo").unwrap_or(n);
    n.len() > MAX_NAME
        || base.is_empty()
        || !base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[async_trait]
impl Resource for Topic {
    fn type_name(&self) -> &str {
        "aws/sns/topic"
    }

    fn description(&self) -> &str {
        "An SNS topic (standard or FIFO). Importable by its ARN or name."
    }

    fn schema(&self) -> Schema {
        Schema::object()
            .describe("An SNS topic; fields as CloudFormation's AWS::SNS::Topic in lowerCamelCase")
            .field("topicName", Field::string().must_recreate().describe("Up to 256 letters, digits, `-` and `_` (FIFO: ending in `.fifo`). Derived from the instance and resource name when not set."))
            .field("fifoTopic", Field::boolean().must_recreate().describe("A FIFO topic"))
            .field("contentBasedDeduplication", Field::boolean().describe("FIFO: deduplicate by a hash of the message"))
            .field("displayName", Field::string().describe("The display name (SMS sender name), up to 100 characters"))
            .field("kmsMasterKeyId", Field::string().describe("KMS key for server-side encryption (id, alias or ARN)"))
            .field("signatureVersion", Field::string().allowed(["1", "2"]).describe("Hash of message signatures: `1` (SHA1, AWS's default) or `2` (SHA256)"))
            .field("tracingConfig", Field::string().allowed(["PassThrough", "Active"]).describe("X-Ray tracing: `PassThrough` (AWS's default) or `Active`"))
            .field("tags", common::tags_field())
            .field("arn", Field::string().computed().describe("The topic's ARN"))
            .field("topicArn", Field::string().computed().describe("The topic's ARN (CloudFormation's Ref)"))
    }

    async fn validate(&self, _ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        let spec = req.spec();
        let mut out = Vec::new();
        let fifo = spec.get("fifoTopic").and_then(Value::as_bool);
        if let Some(n) = spec.get("topicName").and_then(Value::as_str) {
            if bad_name(n) {
                out.push(
                    Diagnostic::error(
                        "aws.sns.invalid-name",
                        format!("`topicName` \"{n}\" must be 1 to 256 letters, digits, `-` or `_`"),
                    )
                    .at("topicName"),
                );
            }
            // Unknown `fifoTopic` (known after deploy): nothing to compare with yet.
            if !spec.is_unknown("fifoTopic") && fifo.unwrap_or(false) != n.ends_with(".fifo") {
                out.push(
                    Diagnostic::error(
                        "aws.sns.fifo-name",
                        "a FIFO topic's name ends in `.fifo`, and only a FIFO topic's does",
                    )
                    .at("topicName"),
                );
            }
        }
        if !spec.is_unknown("fifoTopic")
            && !fifo.unwrap_or(false)
            && spec.get("contentBasedDeduplication").is_some()
        {
            out.push(
                Diagnostic::error(
                    "aws.sns.fifo-only",
                    "`contentBasedDeduplication` applies to FIFO topics only (`fifoTopic: true`)",
                )
                .at("contentBasedDeduplication"),
            );
        }
        if let Some(d) = spec.get("displayName").and_then(Value::as_str)
            && d.chars().count() > 100
        {
            out.push(
                Diagnostic::error(
                    "aws.sns.display-name-too-long",
                    "`displayName` must be at most 100 characters",
                )
                .at("displayName"),
            );
        }
        Ok(out)
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let spec = req.spec();
        let name = topic_name(ctx, &spec, &req.name)?;
        let arn = arn_of(&c, &name).await?;
        match attributes_of(&c, &arn).await? {
            Some(have) => {
                let tags = tags_of(&c, &arn).await?;
                common::adopt_or_conflict(ctx, &req.name, &tags, "topic", &name, "topicName")?;
                converge(ctx, &c, &arn, &have, &spec, None, &req.name).await?;
                Ok(Applied::new(arn.clone(), state(&arn)))
            }
            None => {
                let tags = common::all_tags(ctx, &spec, &req.name)?;
                let created = c
                    .sns
                    .create_topic()
                    .name(&name)
                    .set_attributes(Some(attributes(&spec)?))
                    .set_tags(Some(sns_tags(tags)?))
                    .send()
                    .await
                    .map_err(|e| sdk(format!("creating topic {name}"), e))?
                    .topic_arn
                    .ok_or_else(|| {
                        PluginError::internal(format!("creating topic {name}: no ARN returned"))
                    })?;
                Ok(Applied::new(created.clone(), state(&created)))
            }
        }
    }

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let arn = arn_for(ctx, &c, &req.current).await?;
        let have = attributes_of(&c, &arn)
            .await?
            .ok_or_else(|| PluginError::not_found(format!("topic {arn} no longer exists")))?;
        converge(
            ctx,
            &c,
            &arn,
            &have,
            &req.spec(),
            Some(&req.current.spec()),
            &req.name,
        )
        .await?;
        Ok(Applied::new(arn.clone(), state(&arn)))
    }

    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        let c = self.clients.get(ctx).await?;
        let arn = arn_for(ctx, &c, current).await?;
        if current.external_id.is_empty() {
            // Never recorded: delete only a topic of that name that is ours.
            if attributes_of(&c, &arn).await?.is_none() {
                return Ok(());
            }
            let tags = tags_of(&c, &arn).await?;
            if common::owner(ctx, &current.name, &tags) != common::Owner::Ours {
                return Ok(());
            }
        }
        match c.sns.delete_topic().topic_arn(&arn).send().await {
            Ok(_) => Ok(()),
            Err(e) => {
                let e = sdk(format!("deleting topic {arn}"), e);
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
        let arn = arn_for(ctx, &c, current).await?;
        let Some(attrs) = attributes_of(&c, &arn).await? else {
            return Ok(None);
        };
        let tags = match tags_of(&c, &arn).await {
            Ok(t) => t,
            Err(e) if e.class == ErrorClass::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if current.external_id.is_empty()
            && common::owner(ctx, &current.name, &tags) != common::Owner::Ours
        {
            // Someone else's topic of that name: ours was never created.
            return Ok(None);
        }
        Ok(Some(ReadState {
            spec: spec_of(&arn, &attrs, &tags, &current.spec()),
            state: state(&arn),
            external_id: Some(arn),
        }))
    }

    fn supports_import(&self) -> bool {
        true
    }

    /// By the topic's ARN or name; the external id is its ARN, as create reports it.
    async fn import(&self, ctx: &Context, req: &ImportRequest) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let id = common::import_id(req, "the topic's ARN or name")?;
        let arn = match common::import_arn(&c, id, "sns").await? {
            Some(arn) if arn.resource.contains(':') => {
                return Err(PluginError::bad_input(format!(
                    "`{id}` is a subscription's ARN; give the topic's"
                )));
            }
            Some(_) => id.to_owned(),
            None => arn_of(&c, id).await?,
        };
        self.read(ctx, &common::import_state(req, &arn, Value::map()))
            .await
    }
}

//! `aws/lambda/eventSourceMapping` (CloudFormation `AWS::Lambda::EventSourceMapping`): a
//! queue or stream that invokes a function.
//!
//! Lambda allows one mapping per function and source, so a create first looks for that
//! pair (ListEventSourceMappings) and adopts only a mapping with its ownership tags.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_lambda::types::{EventSourcePosition, FunctionResponseType};
use trellis_plugin_sdk::prelude::*;

use crate::common;
use crate::config::{ClientCache, Clients};
use crate::error::sdk;
use crate::lambda::send;

pub struct EventSourceMapping {
    pub clients: Arc<ClientCache>,
}

/// How long a mapping may stay Creating, Enabling, Disabling or Updating.
const SETTLE_WAIT: Duration = Duration::from_secs(300);

/// What Lambda says about a mapping (its Get, Create, Update and List answers alike).
#[derive(Clone, Debug, Default)]
struct Mapping {
    uuid: String,
    arn: Option<String>,
    state: Option<String>,
    function_arn: Option<String>,
    source_arn: Option<String>,
    batch_size: Option<i32>,
    window: Option<i32>,
    starting_position: Option<String>,
    response_types: Vec<String>,
}

macro_rules! mapping_from {
    ($t:ty) => {
        impl From<$t> for Mapping {
            fn from(m: $t) -> Mapping {
                Mapping {
                    uuid: m.uuid.unwrap_or_default(),
                    arn: m.event_source_mapping_arn,
                    state: m.state,
                    function_arn: m.function_arn,
                    source_arn: m.event_source_arn,
                    batch_size: m.batch_size,
                    window: m.maximum_batching_window_in_seconds,
                    starting_position: m.starting_position.map(|p| p.as_str().to_owned()),
                    response_types: m
                        .function_response_types
                        .unwrap_or_default()
                        .iter()
                        .map(|t| t.as_str().to_owned())
                        .collect(),
                }
            }
        }
    };
}

mapping_from!(aws_sdk_lambda::types::EventSourceMappingConfiguration);
mapping_from!(aws_sdk_lambda::operation::get_event_source_mapping::GetEventSourceMappingOutput);
mapping_from!(
    aws_sdk_lambda::operation::create_event_source_mapping::CreateEventSourceMappingOutput
);

impl Mapping {
    fn enabled(&self) -> bool {
        matches!(self.state.as_deref(), Some("Enabled" | "Enabling"))
    }

    /// Creating, Enabling, Disabling, Updating: Lambda refuses changes until it settles.
    fn settling(&self) -> bool {
        matches!(
            self.state.as_deref(),
            Some("Creating" | "Enabling" | "Disabling" | "Updating")
        )
    }
}

/// The service an event source ARN belongs to (`sqs`, `kinesis`, `dynamodb`, `kafka`, ...).
fn source_service(arn: &str) -> Option<&str> {
    arn.split(':').nth(2).filter(|s| !s.is_empty())
}

/// Lambda's batch size when none is set: 10 for SQS, 100 for streams and the rest.
fn default_batch(source: &str) -> i32 {
    if source_service(source) == Some("sqs") {
        10
    } else {
        100
    }
}

/// The settings a spec asks for, unset ones at Lambda's defaults.
struct Desired {
    batch_size: i32,
    enabled: bool,
    window: i32,
    response_types: Vec<String>,
}

impl Desired {
    fn of(spec: &Spec<'_>, source: &str) -> Result<Desired> {
        let int = |key: &str, default: i32| -> Result<i32> {
            match spec.opt_i64(key)? {
                Some(n) => i32::try_from(n).map_err(|_| {
                    PluginError::bad_input(format!("`{key}` {n} is out of range"))
                        .at(spec.path_of(key))
                }),
                None => Ok(default),
            }
        };
        Ok(Desired {
            batch_size: int("batchSize", default_batch(source))?,
            enabled: spec.opt_bool("enabled")?.unwrap_or(true),
            window: int("maximumBatchingWindowInSeconds", 0)?,
            response_types: spec
                .opt_str_list("functionResponseTypes")?
                .unwrap_or_default()
                .into_iter()
                .map(str::to_owned)
                .collect(),
        })
    }

    fn differs(&self, m: &Mapping, source: &str) -> bool {
        m.batch_size.unwrap_or(default_batch(source)) != self.batch_size
            || m.enabled() != self.enabled
            || m.window.unwrap_or(0) != self.window
            || m.response_types != self.response_types
    }
}

fn state(m: &Mapping) -> Value {
    let mut s = Value::map().with("uuid", m.uuid.as_str());
    common::put(&mut s, "arn", m.arn.as_deref());
    s
}

fn describe(function: &str, source: &str) -> String {
    format!("event source mapping {source} → {function}")
}

async fn get_mapping(c: &Clients, uuid: &str) -> Result<Option<Mapping>> {
    match c.lambda.get_event_source_mapping().uuid(uuid).send().await {
        Ok(out) => Ok(Some(out.into())),
        Err(e) => {
            let e = sdk(format!("reading event source mapping {uuid}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

/// The mapping of `function` and `source`, if there is one (not one being deleted).
async fn find_mapping(c: &Clients, function: &str, source: &str) -> Result<Option<Mapping>> {
    let mut marker = None;
    loop {
        let page = c
            .lambda
            .list_event_source_mappings()
            .function_name(function)
            .event_source_arn(source)
            .set_marker(marker)
            .send()
            .await
            .map_err(|e| sdk(format!("listing the {}", describe(function, source)), e))?;
        if let Some(m) = page
            .event_source_mappings
            .unwrap_or_default()
            .into_iter()
            .map(Mapping::from)
            .find(|m| m.state.as_deref() != Some("Deleting"))
        {
            return Ok(Some(m));
        }
        match page.next_marker {
            Some(m) if !m.is_empty() => marker = Some(m),
            _ => return Ok(None),
        }
    }
}

async fn tags_of(c: &Clients, m: &Mapping) -> Result<Vec<(String, String)>> {
    let Some(arn) = &m.arn else {
        return Ok(Vec::new());
    };
    let out = c
        .lambda
        .list_tags()
        .resource(arn)
        .send()
        .await
        .map_err(|e| {
            sdk(
                format!("reading the tags of event source mapping {}", m.uuid),
                e,
            )
        })?;
    let mut tags: Vec<(String, String)> = out.tags.unwrap_or_default().into_iter().collect();
    tags.sort();
    Ok(tags)
}

/// The mapping once it is no longer Creating, Enabling, Disabling or Updating.
async fn settled(ctx: &Context, c: &Clients, uuid: &str) -> Result<Mapping> {
    let start = Instant::now();
    let mut delay = Duration::from_millis(500);
    loop {
        let m = get_mapping(c, uuid).await?.ok_or_else(|| {
            PluginError::not_found(format!("event source mapping {uuid} no longer exists"))
        })?;
        if !m.settling() {
            return Ok(m);
        }
        if start.elapsed() > SETTLE_WAIT {
            return Err(PluginError::transient(format!(
                "event source mapping {uuid} is still {} after {} s",
                m.state.as_deref().unwrap_or("changing"),
                SETTLE_WAIT.as_secs()
            )));
        }
        ctx.progress(
            format!(
                "waiting for event source mapping {uuid} ({})",
                m.state.as_deref().unwrap_or("changing")
            ),
            None,
        );
        ctx.sleep(delay).await?;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// Brings mapping `m` to `spec`: settings, then tags.
async fn converge(
    ctx: &Context,
    c: &Clients,
    m: &Mapping,
    spec: &Spec<'_>,
    resource: &str,
) -> Result<Mapping> {
    let source = spec.get_str("eventSourceArn")?;
    let want = Desired::of(spec, source)?;
    let m = settled(ctx, c, &m.uuid).await?;
    if want.differs(&m, source) {
        let call = c
            .lambda
            .update_event_source_mapping()
            .uuid(&m.uuid)
            .batch_size(want.batch_size)
            .enabled(want.enabled)
            .maximum_batching_window_in_seconds(want.window)
            .set_function_response_types(Some(
                want.response_types
                    .iter()
                    .map(|t| FunctionResponseType::from(t.as_str()))
                    .collect(),
            ));
        send(
            ctx,
            &format!("updating event source mapping {}", m.uuid),
            || call.clone().send(),
        )
        .await?;
    }
    if let Some(arn) = &m.arn {
        let want = common::all_tags(ctx, spec, resource)?;
        let (set, remove) = common::tag_diff(&tags_of(c, &m).await?, &want);
        if !set.is_empty() {
            c.lambda
                .tag_resource()
                .resource(arn)
                .set_tags(Some(set.into_iter().collect()))
                .send()
                .await
                .map_err(|e| sdk(format!("tagging event source mapping {}", m.uuid), e))?;
        }
        if !remove.is_empty() {
            c.lambda
                .untag_resource()
                .resource(arn)
                .set_tag_keys(Some(remove))
                .send()
                .await
                .map_err(|e| sdk(format!("untagging event source mapping {}", m.uuid), e))?;
        }
    }
    settled(ctx, c, &m.uuid).await
}

/// The mapping of a resource the engine knows: by id, or (never recorded) by its function
/// and source, then only when it is ours.
async fn find_current(
    ctx: &Context,
    c: &Clients,
    current: &ResourceState,
) -> Result<Option<Mapping>> {
    if !current.external_id.is_empty() {
        return get_mapping(c, &current.external_id).await;
    }
    let spec = current.spec();
    let (Some(function), Some(source)) = (
        spec.opt_str("functionName")?,
        spec.opt_str("eventSourceArn")?,
    ) else {
        return Ok(None);
    };
    let Some(m) = find_mapping(c, function, source).await? else {
        return Ok(None);
    };
    if common::owner(ctx, &current.name, &tags_of(c, &m).await?) != common::Owner::Ours {
        return Ok(None);
    }
    Ok(Some(m))
}

/// The spec as Lambda reports it.
fn spec_of(m: &Mapping, tags: &[(String, String)], applied: &Spec<'_>) -> Value {
    let mut spec = Value::map();
    // Lambda answers with the function's ARN: the name the blueprint wrote reads back as is.
    let function = match (
        applied.opt_str("functionName").ok().flatten(),
        &m.function_arn,
    ) {
        (Some(a), Some(arn))
            if arn == a
                || arn.ends_with(&format!(":function:{a}"))
                || arn.ends_with(&format!(":{a}")) =>
        {
            Some(a.to_owned())
        }
        (_, arn) => arn.clone(),
    };
    common::put(&mut spec, "functionName", function);
    common::put(&mut spec, "eventSourceArn", m.source_arn.as_deref());
    common::put(&mut spec, "batchSize", m.batch_size.map(i64::from));
    spec.insert("enabled", m.enabled());
    common::put(
        &mut spec,
        "maximumBatchingWindowInSeconds",
        m.window.map(i64::from),
    );
    common::put(
        &mut spec,
        "startingPosition",
        m.starting_position.as_deref(),
    );
    if !m.response_types.is_empty() || applied.get("functionResponseTypes").is_some() {
        spec.insert(
            "functionResponseTypes",
            Value::from(m.response_types.clone()),
        );
    }
    common::put(&mut spec, "tags", common::tags_value(tags, applied));
    spec
}

#[async_trait]
impl Resource for EventSourceMapping {
    fn type_name(&self) -> &str {
        "aws/lambda/eventSourceMapping"
    }

    fn description(&self) -> &str {
        "A queue or stream that invokes a Lambda function with batches of its records. Importable by its UUID or ARN."
    }

    fn schema(&self) -> Schema {
        Schema::object()
            .describe("An event source mapping; fields as CloudFormation's AWS::Lambda::EventSourceMapping in lowerCamelCase")
            .field("functionName", Field::string().required().must_recreate().describe("The function: its name or ARN"))
            .field("eventSourceArn", Field::string().required().must_recreate().describe("The ARN of the queue, stream or table stream"))
            .field("batchSize", Field::integer().describe("Records per invocation, 1 to 10000 (default 10 for SQS, 100 for streams)"))
            .field("enabled", Field::boolean().describe("Whether the mapping polls (default true)"))
            .field("maximumBatchingWindowInSeconds", Field::integer().describe("Seconds to gather records before invoking, 0 (the default) to 300"))
            .field("startingPosition", Field::string().must_recreate().allowed(["TRIM_HORIZON", "LATEST", "AT_TIMESTAMP"]).describe("Streams only (Kinesis, DynamoDB): where reading starts"))
            .field("functionResponseTypes", Field::array(Schema::string().allowed(["ReportBatchItemFailures"])).describe("`[ReportBatchItemFailures]` lets the function report the records of a batch that failed"))
            .field("tags", common::tags_field())
            .field("uuid", Field::string().computed().describe("The mapping's id"))
            .field("arn", Field::string().computed().describe("The mapping's ARN"))
    }

    async fn validate(&self, _ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        let spec = req.spec();
        let mut out = Vec::new();
        let source = spec.get("eventSourceArn").and_then(Value::as_str);
        if let Some(s) = source
            && (!s.starts_with("arn:") || source_service(s).is_none())
        {
            out.push(
                Diagnostic::error(
                    "aws.lambda.event-source-arn",
                    format!("`eventSourceArn` \"{s}\" is not an ARN"),
                )
                .at("eventSourceArn"),
            );
        }
        let service = source.and_then(source_service);
        let position = spec.get("startingPosition");
        match service {
            Some("sqs") if position.is_some() => out.push(
                Diagnostic::error(
                    "aws.lambda.starting-position",
                    "`startingPosition` applies to streams, not to SQS queues",
                )
                .at("startingPosition"),
            ),
            Some("kinesis" | "dynamodb") if position.is_none() => out.push(
                Diagnostic::error(
                    "aws.lambda.starting-position",
                    "a stream's mapping needs `startingPosition` (TRIM_HORIZON, LATEST or AT_TIMESTAMP)",
                )
                .at("startingPosition"),
            ),
            _ => {}
        }
        for (field, lo, hi) in [
            ("batchSize", 1, 10_000),
            ("maximumBatchingWindowInSeconds", 0, 300),
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
        Ok(out)
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let spec = req.spec();
        let function = spec.get_str("functionName")?;
        let source = spec.get_str("eventSourceArn")?;
        if let Some(m) = find_mapping(&c, function, source).await? {
            common::adopt_or_conflict(
                ctx,
                &req.name,
                &tags_of(&c, &m).await?,
                "event source mapping",
                &format!("{source} → {function}"),
                "eventSourceArn",
            )?;
            let m = converge(ctx, &c, &m, &spec, &req.name).await?;
            return Ok(Applied::new(m.uuid.clone(), state(&m)));
        }
        let want = Desired::of(&spec, source)?;
        let tags: HashMap<String, String> = common::all_tags(ctx, &spec, &req.name)?
            .into_iter()
            .collect();
        let mut call = c
            .lambda
            .create_event_source_mapping()
            .function_name(function)
            .event_source_arn(source)
            .batch_size(want.batch_size)
            .enabled(want.enabled)
            .set_tags(Some(tags));
        if spec.get("maximumBatchingWindowInSeconds").is_some() {
            call = call.maximum_batching_window_in_seconds(want.window);
        }
        if !want.response_types.is_empty() {
            call = call.set_function_response_types(Some(
                want.response_types
                    .iter()
                    .map(|t| FunctionResponseType::from(t.as_str()))
                    .collect(),
            ));
        }
        if let Some(p) = spec.opt_str("startingPosition")? {
            call = call.starting_position(EventSourcePosition::from(p));
        }
        let created: Mapping = send(
            ctx,
            &format!("creating the {}", describe(function, source)),
            || call.clone().send(),
        )
        .await?
        .into();
        let m = settled(ctx, &c, &created.uuid)
            .await
            .map_err(|e| e.with_partial(created.uuid.clone(), state(&created)))?;
        Ok(Applied::new(m.uuid.clone(), state(&m)))
    }

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let m = find_current(ctx, &c, &req.current).await?.ok_or_else(|| {
            PluginError::not_found(format!(
                "event source mapping {} no longer exists",
                req.current.external_id
            ))
        })?;
        let m = converge(ctx, &c, &m, &req.spec(), &req.name).await?;
        Ok(Applied::new(m.uuid.clone(), state(&m)))
    }

    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        let c = self.clients.get(ctx).await?;
        let Some(m) = find_current(ctx, &c, current).await? else {
            return Ok(());
        };
        let deleted = send(
            ctx,
            &format!("deleting event source mapping {}", m.uuid),
            || c.lambda.delete_event_source_mapping().uuid(&m.uuid).send(),
        )
        .await;
        match deleted {
            Ok(_) => Ok(()),
            Err(e) if e.class == ErrorClass::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn supports_read(&self) -> bool {
        true
    }

    async fn read(&self, ctx: &Context, current: &ResourceState) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let Some(m) = find_current(ctx, &c, current).await? else {
            return Ok(None);
        };
        if m.state.as_deref() == Some("Deleting") {
            return Ok(None);
        }
        let tags = tags_of(&c, &m).await?;
        Ok(Some(ReadState {
            spec: spec_of(&m, &tags, &current.spec()),
            state: state(&m),
            external_id: Some(m.uuid.clone()),
        }))
    }

    fn supports_import(&self) -> bool {
        true
    }

    /// By the mapping's UUID or ARN (`arn:aws:lambda:<region>:<account>:event-source-mapping:
    /// <uuid>`); the external id is its UUID. `functionName` is the function's ARN, as Lambda
    /// reports it.
    async fn import(&self, ctx: &Context, req: &ImportRequest) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let id = common::import_id(req, "the mapping's UUID or ARN")?;
        let uuid = match common::import_arn(&c, id, "lambda").await? {
            Some(arn) => arn
                .resource
                .strip_prefix("event-source-mapping:")
                .filter(|u| !u.is_empty())
                .ok_or_else(|| {
                    PluginError::bad_input(format!(
                        "`{id}` is not an event source mapping's ARN (`arn:aws:lambda:<region>:<account>:event-source-mapping:<uuid>`)"
                    ))
                })?,
            None => id,
        };
        self.read(ctx, &common::import_state(req, uuid, Value::map()))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_defaults_by_source() {
        assert_eq!(default_batch("arn:aws:sqs:us-east-1:1:q"), 10);
        assert_eq!(default_batch("arn:aws:kinesis:us-east-1:1:stream/s"), 100);
        assert_eq!(
            source_service("arn:aws:dynamodb:r:1:table/t/stream/x"),
            Some("dynamodb")
        );
        assert_eq!(source_service("nope"), None);
    }

    #[test]
    fn function_names_read_back_as_written() {
        let m = Mapping {
            function_arn: Some("arn:aws:lambda:us-east-1:1:function:f".to_owned()),
            state: Some("Enabled".to_owned()),
            ..Mapping::default()
        };
        let applied = Value::map().with("functionName", "f");
        let spec = spec_of(&m, &[], &Spec::new(&applied));
        assert_eq!(spec.get("functionName"), Some(&Value::from("f")));
        let applied = Value::map().with("functionName", "g");
        let spec = spec_of(&m, &[], &Spec::new(&applied));
        assert_eq!(
            spec.get("functionName"),
            Some(&Value::from("arn:aws:lambda:us-east-1:1:function:f"))
        );
        assert_eq!(spec.get("enabled"), Some(&Value::Bool(true)));
    }
}

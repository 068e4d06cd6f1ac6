//! Links between AWS resource types (A's `linkSelector` selects B by label).
//!
//! - `aws/lambda/function` → a table, secret, queue, topic, bucket or parameter: one inline
//!   policy on the function's role, least privilege for that resource (`trellis-link-<B>`),
//!   and with `aws.lambda.function.populateEnvVars: true` one environment variable naming it.
//! - `aws/sqs/queue` → function: an event source mapping (the queue triggers the function)
//!   and the receive permissions it needs on the function's role.
//! - `aws/dynamodb/table` → function: the same for the table's stream (read permissions on
//!   the stream).
//! - `aws/sns/topic` → queue or function: a subscription, plus the queue policy statement or
//!   the invoke permission it needs.
//! - `aws/apigatewayv2/api` → function: an integration, a route and the invoke permission.
//! - `aws/events/rule` → function: a target and the invoke permission.
//! - `aws/s3/bucket` → function: a bucket notification and the invoke permission.
//!
//! Every phase is idempotent (a retried call finds what an earlier attempt made) and
//! LINK_DESTROY undoes exactly what the link made, recorded in its link data.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::json;
use trellis_plugin_sdk::prelude::*;
use trellis_plugin_sdk::proto::LinkUpdateType;

use aws_sdk_lambda::types::{EventSourcePosition, FunctionResponseType};

use crate::config::{ClientCache, Clients};
use crate::error::sdk;

const FUNCTION: &str = "aws/lambda/function";
pub const POPULATE_ENV_VARS: &str = "aws.lambda.function.populateEnvVars";
pub const ENV_VAR_NAME: &str = "aws.lambda.function.envVarName";
pub const ROUTE: &str = "aws.apigatewayv2.route";
pub const BUCKET_EVENTS: &str = "aws.s3.bucket.events";
pub const BATCH_SIZE: &str = "aws.sqs.queue.batchSize";
pub const PARTIAL_FAILURES: &str = "aws.sqs.queue.reportBatchItemFailures";
pub const STREAM_BATCH_SIZE: &str = "aws.dynamodb.table.batchSize";
pub const STREAM_PARTIAL_FAILURES: &str = "aws.dynamodb.table.reportBatchItemFailures";
pub const STREAM_STARTING_POSITION: &str = "aws.dynamodb.table.startingPosition";
pub const RULE_INPUT: &str = "aws.events.rule.input";

/// Serialises read-modify-write updates of one AWS object (a function's environment, a
/// queue's policy, a bucket's notifications) made by several links at once.
#[derive(Default)]
pub struct Locks {
    by_key: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Locks {
    async fn lock(&self, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let m = {
            let mut map = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(key.to_owned()).or_default().clone()
        };
        m.lock_owned().await
    }
}

/// What every link holds.
#[derive(Clone)]
pub struct Shared {
    pub clients: Arc<ClientCache>,
    pub locks: Arc<Locks>,
}

/// Every link type of the provider.
pub fn all(shared: &Shared) -> Vec<Box<dyn Link>> {
    let mut out: Vec<Box<dyn Link>> = Vec::new();
    for access in ACCESS {
        out.push(Box::new(FunctionAccess {
            shared: shared.clone(),
            access,
        }));
    }
    for source in [Poll::Queue, Poll::TableStream] {
        out.push(Box::new(Triggers {
            shared: shared.clone(),
            source,
        }));
    }
    out.push(Box::new(TopicToQueue {
        shared: shared.clone(),
    }));
    for source in INVOKERS {
        out.push(Box::new(Invokes {
            shared: shared.clone(),
            source,
        }));
    }
    out
}

fn is_destroy(link: &LinkRequest) -> bool {
    link.update_type == LinkUpdateType::Destroy
}

/// A computed or spec field of a linked resource.
fn field<'a>(r: &'a ResourceState, key: &str) -> Option<&'a str> {
    r.state
        .get(key)
        .and_then(Value::as_str)
        .or_else(|| r.spec.get(key).and_then(Value::as_str))
        .filter(|s| !s.is_empty())
}

fn need<'a>(r: &'a ResourceState, key: &str) -> Result<&'a str> {
    field(r, key).ok_or_else(|| {
        PluginError::internal(format!(
            "{} `{}` has no `{key}` in its state; deploy it again",
            r.resource_type, r.name
        ))
    })
}

/// `ordersTable` → `ORDERS_TABLE`; `save-order.v1` → `SAVE_ORDER_V1`.
pub fn env_name(resource_name: &str) -> String {
    let mut out = String::new();
    let mut prev_lower = false;
    for c in resource_name.chars() {
        if c.is_ascii_uppercase() && prev_lower {
            out.push('_');
        }
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_uppercase());
        } else if !out.ends_with('_') {
            out.push('_');
        }
        prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
    }
    let out = out.trim_matches('_').to_owned();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        format!("R_{out}")
    } else {
        out
    }
}

/// The role name of an IAM role ARN (`arn:aws:iam::1:role/path/name` → `name`).
fn role_name(arn: &str) -> Option<&str> {
    arn.strip_prefix("arn:")
        .and_then(|_| arn.split_once(":role/"))
        .and_then(|(_, rest)| rest.rsplit('/').next())
        .filter(|s| !s.is_empty())
}

/// The inline policy name a link uses on a function's role.
fn policy_name(prefix: &str, other: &str) -> String {
    let mut n: String = format!("trellis-{prefix}-{other}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "+=,.@_-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    n.truncate(128);
    n
}

async fn put_role_policy(
    c: &Clients,
    role: &str,
    name: &str,
    statements: serde_json::Value,
) -> Result<()> {
    let doc = json!({"Version": "2012-10-17", "Statement": statements});
    c.iam
        .put_role_policy()
        .role_name(role)
        .policy_name(name)
        .policy_document(doc.to_string())
        .send()
        .await
        .map_err(|e| sdk(format!("putting policy {name} on role {role}"), e))?;
    Ok(())
}

async fn delete_role_policy(c: &Clients, role: &str, name: &str) -> Result<()> {
    match c
        .iam
        .delete_role_policy()
        .role_name(role)
        .policy_name(name)
        .send()
        .await
    {
        Ok(_) => Ok(()),
        Err(e) => {
            let e = sdk(format!("deleting policy {name} from role {role}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(())
            } else {
                Err(e)
            }
        }
    }
}

/// Lets `principal` invoke `function` from `source_arn` (statement `sid`), idempotently.
async fn add_permission(
    c: &Clients,
    function: &str,
    sid: &str,
    principal: &str,
    source_arn: &str,
) -> Result<()> {
    let _ = remove_permission(c, function, sid).await;
    c.lambda
        .add_permission()
        .function_name(function)
        .statement_id(sid)
        .action("lambda:InvokeFunction")
        .principal(principal)
        .source_arn(source_arn)
        .send()
        .await
        .map_err(|e| sdk(format!("letting {principal} invoke {function}"), e))?;
    Ok(())
}

async fn remove_permission(c: &Clients, function: &str, sid: &str) -> Result<()> {
    match c
        .lambda
        .remove_permission()
        .function_name(function)
        .statement_id(sid)
        .send()
        .await
    {
        Ok(_) => Ok(()),
        Err(e) => {
            let e = sdk(format!("removing permission {sid} from {function}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(())
            } else {
                Err(e)
            }
        }
    }
}

/// A statement id for a link's permission: unique per link, stable across attempts.
fn statement_id(prefix: &str, link: &LinkRequest) -> String {
    let mut s: String = format!(
        "trellis-{prefix}-{}-{}",
        link.resource_a.name, link.resource_b.name
    )
    .chars()
    .map(|c| {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            c
        } else {
            '-'
        }
    })
    .collect();
    s.truncate(100);
    s
}

// ---- function → resource: access and environment variables ------------------------------

/// What a function may do with one resource type, and what its variable holds.
pub struct Access {
    pub b_type: &'static str,
    actions: &'static [&'static str],
    /// ARN patterns beyond the resource's own ARN (`{arn}/index/*`).
    extra_resources: &'static [&'static str],
    /// The state or spec field the environment variable holds.
    env_value: &'static str,
    description: &'static str,
}

const ACCESS: &[Access] = &[
    Access {
        b_type: "aws/dynamodb/table",
        actions: &[
            "dynamodb:GetItem",
            "dynamodb:BatchGetItem",
            "dynamodb:Query",
            "dynamodb:Scan",
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
            "dynamodb:DeleteItem",
            "dynamodb:BatchWriteItem",
            "dynamodb:ConditionCheckItem",
            "dynamodb:DescribeTable",
        ],
        extra_resources: &["{arn}/index/*"],
        env_value: "tableName",
        description: "Items of the table and its indexes: read and write (no table management).",
    },
    Access {
        b_type: "aws/secretsmanager/secret",
        actions: &[
            "secretsmanager:GetSecretValue",
            "secretsmanager:DescribeSecret",
        ],
        extra_resources: &[],
        env_value: "arn",
        description: "Read the secret's value.",
    },
    Access {
        b_type: "aws/sqs/queue",
        actions: &[
            "sqs:SendMessage",
            "sqs:GetQueueAttributes",
            "sqs:GetQueueUrl",
        ],
        extra_resources: &[],
        env_value: "queueUrl",
        description: "Send messages to the queue.",
    },
    Access {
        b_type: "aws/sns/topic",
        actions: &["sns:Publish"],
        extra_resources: &[],
        env_value: "arn",
        description: "Publish to the topic.",
    },
    Access {
        b_type: "aws/s3/bucket",
        actions: &[
            "s3:GetObject",
            "s3:PutObject",
            "s3:DeleteObject",
            "s3:ListBucket",
        ],
        extra_resources: &["{arn}/*"],
        env_value: "bucketName",
        description: "Objects of the bucket: list, read, write, delete.",
    },
    Access {
        b_type: "aws/ssm/parameter",
        actions: &["ssm:GetParameter", "ssm:GetParameters"],
        extra_resources: &[],
        env_value: "name",
        description: "Read the parameter.",
    },
];

/// The value a function's variable gets for `b` (the spec's name, else from the ARN).
fn env_value(access: &Access, b: &ResourceState) -> Result<String> {
    if let Some(v) = field(b, access.env_value) {
        return Ok(v.to_owned());
    }
    let arn = need(b, "arn")?;
    // Names not set in the blueprint were derived by the provider: read them off the ARN.
    let from_arn = match access.b_type {
        "aws/dynamodb/table" => arn.split_once(":table/").map(|(_, n)| n.to_owned()),
        "aws/s3/bucket" => arn.rsplit(':').next().map(str::to_owned),
        "aws/ssm/parameter" => arn.split_once(":parameter").map(|(_, n)| n.to_owned()),
        _ => None,
    };
    from_arn.ok_or_else(|| {
        PluginError::internal(format!(
            "{} `{}` has no `{}`",
            b.resource_type, b.name, access.env_value
        ))
    })
}

struct FunctionAccess {
    shared: Shared,
    access: &'static Access,
}

impl FunctionAccess {
    fn var_name(&self, link: &LinkRequest) -> Option<String> {
        let populate = link
            .annotations_a
            .get(POPULATE_ENV_VARS)
            .and_then(Value::as_bool)
            .unwrap_or(false)
            || link
                .annotations_a
                .get(POPULATE_ENV_VARS)
                .and_then(Value::as_str)
                == Some("true");
        populate.then(|| {
            link.annotations_b
                .get(ENV_VAR_NAME)
                .and_then(Value::as_str)
                .map_or_else(|| env_name(&link.resource_b.name), str::to_owned)
        })
    }
}

/// Sets (`Some`) or removes (`None`) one variable of a function's environment, waiting for
/// the update to finish; the function's own fields are untouched.
async fn set_env_var(
    shared: &Shared,
    c: &Clients,
    function: &str,
    name: &str,
    value: Option<&str>,
) -> Result<()> {
    let _guard = shared.locks.lock(&format!("env:{function}")).await;
    let cfg = c
        .lambda
        .get_function_configuration()
        .function_name(function)
        .send()
        .await
        .map_err(|e| sdk(format!("reading function {function}"), e))?;
    let mut vars: HashMap<String, String> = cfg
        .environment
        .and_then(|e| e.variables)
        .unwrap_or_default();
    let changed = match value {
        Some(v) => vars.insert(name.to_owned(), v.to_owned()).as_deref() != Some(v),
        None => vars.remove(name).is_some(),
    };
    if !changed {
        return Ok(());
    }
    c.lambda
        .update_function_configuration()
        .function_name(function)
        .environment(
            aws_sdk_lambda::types::Environment::builder()
                .set_variables(Some(vars))
                .build(),
        )
        .send()
        .await
        .map_err(|e| sdk(format!("setting variable {name} of function {function}"), e))?;
    Ok(())
}

#[async_trait]
impl Link for FunctionAccess {
    fn resource_type_a(&self) -> &str {
        FUNCTION
    }

    fn resource_type_b(&self) -> &str {
        self.access.b_type
    }

    fn description(&self) -> &str {
        self.access.description
    }

    fn annotations(&self) -> Vec<Annotation> {
        vec![
            Annotation::new(POPULATE_ENV_VARS, FUNCTION, SchemaType::Boolean)
                .default(false)
                .describe("Give the function one environment variable per linked resource, naming it"),
            Annotation::new(ENV_VAR_NAME, self.access.b_type, SchemaType::String).describe(
                "The variable's name in linked functions (default: the resource's name in UPPER_SNAKE_CASE)",
            ),
        ]
    }

    async fn stage(&self, _ctx: &Context, link: &LinkRequest) -> Result<StagedLink> {
        let mut staged = StagedLink::default();
        if let Some(var) = self.var_name(link) {
            staged.owned_paths_a.push(
                AttrPath::root()
                    .field("environment")
                    .field("variables")
                    .field(var),
            );
        }
        Ok(staged)
    }

    async fn update_resource_a(&self, ctx: &Context, link: &LinkRequest) -> Result<Value> {
        let c = self.shared.clients.get(ctx).await?;
        let a = &link.resource_a;
        let function = need(a, "arn")?;
        let role = need(a, "roleArn").map(|r| role_name(r).unwrap_or(r).to_owned())?;
        let policy = policy_name("link", &link.resource_b.name);
        let old_var = link
            .link_data
            .get("envVar")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if is_destroy(link) {
            delete_role_policy(&c, &role, &policy).await?;
            if let Some(old) = &old_var {
                set_env_var(&self.shared, &c, function, old, None).await?;
            }
            return Ok(Value::map()
                .with("envVar", Value::Null)
                .with("policy", Value::Null));
        }
        let b_arn = need(&link.resource_b, "arn")?;
        let mut resources = vec![json!(b_arn)];
        for extra in self.access.extra_resources {
            resources.push(json!(extra.replace("{arn}", b_arn)));
        }
        put_role_policy(
            &c,
            &role,
            &policy,
            json!([{"Effect": "Allow", "Action": self.access.actions, "Resource": resources}]),
        )
        .await?;
        let var = self.var_name(link);
        if let Some(old) = old_var.as_deref().filter(|o| Some(*o) != var.as_deref()) {
            set_env_var(&self.shared, &c, function, old, None).await?;
        }
        if let Some(var) = &var {
            let value = env_value(self.access, &link.resource_b)?;
            set_env_var(&self.shared, &c, function, var, Some(&value)).await?;
        }
        Ok(Value::map()
            .with("policy", policy.as_str())
            .with("envVar", var.map_or(Value::Null, Value::from)))
    }
}

// ---- queue or table stream → function: event source mapping ------------------------------

/// The sources Lambda polls for a function.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Poll {
    Queue,
    TableStream,
}

impl Poll {
    fn a_type(self) -> &'static str {
        match self {
            Poll::Queue => "aws/sqs/queue",
            Poll::TableStream => "aws/dynamodb/table",
        }
    }

    fn batch_key(self) -> &'static str {
        match self {
            Poll::Queue => BATCH_SIZE,
            Poll::TableStream => STREAM_BATCH_SIZE,
        }
    }

    fn partial_key(self) -> &'static str {
        match self {
            Poll::Queue => PARTIAL_FAILURES,
            Poll::TableStream => STREAM_PARTIAL_FAILURES,
        }
    }

    /// The ARN Lambda reads from: the queue's, or the table's stream.
    fn source_arn(self, a: &ResourceState) -> Result<&str> {
        match self {
            Poll::Queue => need(a, "arn"),
            Poll::TableStream => field(a, "streamArn").ok_or_else(|| {
                PluginError::bad_input(format!(
                    "table `{}` has no stream to trigger functions: set its `streamSpecification`",
                    a.name
                ))
            }),
        }
    }

    /// What the function's role may do to read the source.
    fn statements(self, a: &ResourceState, source: &str) -> Result<serde_json::Value> {
        Ok(match self {
            Poll::Queue => json!([{"Effect": "Allow",
                "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes", "sqs:ChangeMessageVisibility"],
                "Resource": [source]}]),
            Poll::TableStream => json!([
                {"Effect": "Allow",
                 "Action": ["dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator"],
                 "Resource": [source]},
                {"Effect": "Allow",
                 "Action": ["dynamodb:ListStreams"],
                 "Resource": [format!("{}/stream/*", need(a, "arn")?)]}]),
        })
    }
}

/// An annotation that is `true` (a boolean, or the text `true`).
fn annotation_flag(annotations: &Value, key: &str) -> bool {
    annotations
        .get(key)
        .is_some_and(|v| v.as_bool() == Some(true) || v.as_str() == Some("true"))
}

struct Triggers {
    shared: Shared,
    source: Poll,
}

async fn find_mapping(c: &Clients, function: &str, source: &str) -> Result<Option<String>> {
    let out = c
        .lambda
        .list_event_source_mappings()
        .function_name(function)
        .event_source_arn(source)
        .send()
        .await
        .map_err(|e| sdk(format!("listing event source mappings of {function}"), e))?;
    Ok(out
        .event_source_mappings
        .unwrap_or_default()
        .into_iter()
        .find_map(|m| m.uuid))
}

fn mapping_state(link: &LinkRequest, uuid: &str, function: &str, source: &str) -> ResourceState {
    ResourceState {
        resource_type: "aws/lambda/eventSourceMapping".to_owned(),
        name: format!("{}->{}", link.resource_a.name, link.resource_b.name),
        external_id: uuid.to_owned(),
        spec: Value::map()
            .with("functionName", function)
            .with("eventSourceArn", source),
        state: Value::map().with("uuid", uuid),
    }
}

#[async_trait]
impl Link for Triggers {
    fn resource_type_a(&self) -> &str {
        self.source.a_type()
    }

    fn resource_type_b(&self) -> &str {
        FUNCTION
    }

    fn description(&self) -> &str {
        match self.source {
            Poll::Queue => {
                "The queue triggers the function: an event source mapping, and receive permissions on the function's role."
            }
            Poll::TableStream => {
                "The table's stream triggers the function: an event source mapping, and stream read permissions on the function's role. The table needs a `streamSpecification`."
            }
        }
    }

    fn annotations(&self) -> Vec<Annotation> {
        let a = self.source.a_type();
        match self.source {
            Poll::Queue => vec![
                Annotation::new(BATCH_SIZE, a, SchemaType::Integer)
                    .describe("Messages per invocation (1 to 10000; default 10)"),
                Annotation::new(PARTIAL_FAILURES, a, SchemaType::Boolean)
                    .describe("The function reports the failed messages of a batch (`ReportBatchItemFailures`), so only those are retried"),
            ],
            Poll::TableStream => vec![
                Annotation::new(STREAM_BATCH_SIZE, a, SchemaType::Integer)
                    .describe("Records per invocation (1 to 10000; default 100)"),
                Annotation::new(STREAM_PARTIAL_FAILURES, a, SchemaType::Boolean)
                    .describe("The function reports the failed records of a batch (`ReportBatchItemFailures`), so only those are retried"),
                Annotation::new(STREAM_STARTING_POSITION, a, SchemaType::String)
                    .default("LATEST")
                    .describe("Where a new mapping starts reading: `LATEST` or `TRIM_HORIZON` (the oldest record kept)"),
            ],
        }
    }

    async fn stage(&self, _ctx: &Context, link: &LinkRequest) -> Result<StagedLink> {
        let mut staged = StagedLink::default();
        if self.source == Poll::TableStream
            && let Some(p) = link.annotations_a.get(STREAM_STARTING_POSITION)
            && !matches!(p.as_str(), Some("LATEST" | "TRIM_HORIZON"))
        {
            staged.diagnostics.push(
                Diagnostic::error(
                    "aws.dynamodb.invalid-starting-position",
                    format!(
                        "`{STREAM_STARTING_POSITION}` is {p:?}; it is `LATEST` or `TRIM_HORIZON`"
                    ),
                )
                .hint("`TRIM_HORIZON` reads the stream from its oldest record"),
            );
        }
        Ok(staged)
    }

    async fn update_intermediaries(
        &self,
        ctx: &Context,
        link: &LinkRequest,
    ) -> Result<IntermediariesUpdate> {
        let c = self.shared.clients.get(ctx).await?;
        let function = need(&link.resource_b, "arn")?;
        let role = role_name(need(&link.resource_b, "roleArn")?)
            .unwrap_or_default()
            .to_owned();
        let policy = policy_name("trigger", &link.resource_a.name);
        if is_destroy(link) {
            // A stream turned off has no ARN left: its mapping went with it.
            if let Ok(source) = self.source.source_arn(&link.resource_a)
                && let Some(uuid) = find_mapping(&c, function, source).await?
            {
                match c
                    .lambda
                    .delete_event_source_mapping()
                    .uuid(&uuid)
                    .send()
                    .await
                {
                    Ok(_) => {}
                    Err(e) => {
                        let e = sdk(format!("deleting event source mapping {uuid}"), e);
                        if e.class != ErrorClass::NotFound {
                            return Err(e);
                        }
                    }
                }
            }
            delete_role_policy(&c, &role, &policy).await?;
            return Ok(IntermediariesUpdate {
                link_data: Value::map().with("mapping", Value::Null),
                intermediaries: Vec::new(),
            });
        }
        let source = self.source.source_arn(&link.resource_a)?;
        put_role_policy(
            &c,
            &role,
            &policy,
            self.source.statements(&link.resource_a, source)?,
        )
        .await?;
        let batch = link
            .annotations_a
            .get(self.source.batch_key())
            .and_then(Value::as_i64);
        let batch = batch.map(|b| i32::try_from(b).unwrap_or(i32::MAX));
        let response_types = if annotation_flag(&link.annotations_a, self.source.partial_key()) {
            vec![FunctionResponseType::ReportBatchItemFailures]
        } else {
            Vec::new()
        };
        let uuid = match find_mapping(&c, function, source).await? {
            Some(uuid) => {
                c.lambda
                    .update_event_source_mapping()
                    .uuid(&uuid)
                    .set_batch_size(batch)
                    .set_function_response_types(Some(response_types))
                    .send()
                    .await
                    .map_err(|e| sdk(format!("updating event source mapping {uuid}"), e))?;
                uuid
            }
            None => {
                let start = match self.source {
                    Poll::Queue => None,
                    Poll::TableStream => Some(EventSourcePosition::from(
                        link.annotations_a
                            .get(STREAM_STARTING_POSITION)
                            .and_then(Value::as_str)
                            .unwrap_or("LATEST"),
                    )),
                };
                c.lambda
                    .create_event_source_mapping()
                    .function_name(function)
                    .event_source_arn(source)
                    .set_batch_size(batch)
                    .set_starting_position(start)
                    .set_function_response_types(
                        (!response_types.is_empty()).then_some(response_types),
                    )
                    .send()
                    .await
                    .map_err(|e| sdk(format!("mapping {source} to {function}"), e))?
                    .uuid
                    .ok_or_else(|| {
                        PluginError::internal("CreateEventSourceMapping returned no UUID")
                    })?
            }
        };
        Ok(IntermediariesUpdate {
            link_data: Value::map()
                .with("mapping", uuid.as_str())
                .with("policy", policy.as_str()),
            intermediaries: vec![mapping_state(link, &uuid, function, source)],
        })
    }

    async fn read_intermediaries(
        &self,
        ctx: &Context,
        link: &LinkRequest,
    ) -> Result<Vec<ResourceState>> {
        let c = self.shared.clients.get(ctx).await?;
        let Ok(source) = self.source.source_arn(&link.resource_a) else {
            return Ok(Vec::new());
        };
        let function = need(&link.resource_b, "arn")?;
        Ok(find_mapping(&c, function, source)
            .await?
            .map(|uuid| mapping_state(link, &uuid, function, source))
            .into_iter()
            .collect())
    }
}

// ---- topic → queue: subscription and queue policy -----------------------------------------

struct TopicToQueue {
    shared: Shared,
}

async fn find_subscription(c: &Clients, topic: &str, endpoint: &str) -> Result<Option<String>> {
    let mut token = None;
    loop {
        let out = c
            .sns
            .list_subscriptions_by_topic()
            .topic_arn(topic)
            .set_next_token(token)
            .send()
            .await
            .map_err(|e| sdk(format!("listing subscriptions of {topic}"), e))?;
        if let Some(s) = out
            .subscriptions
            .unwrap_or_default()
            .into_iter()
            .find(|s| s.endpoint.as_deref() == Some(endpoint))
        {
            return Ok(s.subscription_arn);
        }
        token = out.next_token;
        if token.is_none() {
            return Ok(None);
        }
    }
}

async fn subscribe(c: &Clients, topic: &str, protocol: &str, endpoint: &str) -> Result<String> {
    if let Some(arn) = find_subscription(c, topic, endpoint).await? {
        return Ok(arn);
    }
    c.sns
        .subscribe()
        .topic_arn(topic)
        .protocol(protocol)
        .endpoint(endpoint)
        .return_subscription_arn(true)
        .send()
        .await
        .map_err(|e| sdk(format!("subscribing {endpoint} to {topic}"), e))?
        .subscription_arn
        .ok_or_else(|| PluginError::internal("Subscribe returned no subscription ARN"))
}

async fn unsubscribe(c: &Clients, topic: &str, endpoint: &str) -> Result<()> {
    if let Some(arn) = find_subscription(c, topic, endpoint).await? {
        match c.sns.unsubscribe().subscription_arn(&arn).send().await {
            Ok(_) => {}
            Err(e) => {
                let e = sdk(format!("unsubscribing {arn}"), e);
                if e.class != ErrorClass::NotFound {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Adds (`Some`) or removes (`None`) the statement `sid` of a queue's policy.
async fn set_queue_statement(
    shared: &Shared,
    c: &Clients,
    queue_url: &str,
    sid: &str,
    statement: Option<serde_json::Value>,
) -> Result<()> {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let _guard = shared
        .locks
        .lock(&format!("queue-policy:{queue_url}"))
        .await;
    let attrs = c
        .sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(A::Policy)
        .send()
        .await
        .map_err(|e| sdk(format!("reading the policy of {queue_url}"), e))?
        .attributes
        .unwrap_or_default();
    let mut policy: serde_json::Value = attrs
        .get(&A::Policy)
        .and_then(|p| serde_json::from_str(p).ok())
        .unwrap_or_else(|| json!({"Version": "2012-10-17", "Statement": []}));
    let mut statements: Vec<serde_json::Value> = match policy.get("Statement") {
        Some(serde_json::Value::Array(a)) => a.clone(),
        Some(one @ serde_json::Value::Object(_)) => vec![one.clone()],
        _ => Vec::new(),
    };
    let before = statements.len();
    statements.retain(|s| s.get("Sid").and_then(|v| v.as_str()) != Some(sid));
    let removed = statements.len() != before;
    let add = statement.is_some();
    if let Some(s) = statement {
        statements.push(s);
    }
    if !add && !removed {
        return Ok(());
    }
    policy["Statement"] = serde_json::Value::Array(statements.clone());
    let text = if statements.is_empty() {
        String::new()
    } else {
        policy.to_string()
    };
    c.sqs
        .set_queue_attributes()
        .queue_url(queue_url)
        .attributes(A::Policy, text)
        .send()
        .await
        .map_err(|e| sdk(format!("setting the policy of {queue_url}"), e))?;
    Ok(())
}

#[async_trait]
impl Link for TopicToQueue {
    fn resource_type_a(&self) -> &str {
        "aws/sns/topic"
    }

    fn resource_type_b(&self) -> &str {
        "aws/sqs/queue"
    }

    fn description(&self) -> &str {
        "The queue subscribes to the topic: a subscription, and a statement in the queue's policy letting the topic send to it."
    }

    async fn update_intermediaries(
        &self,
        ctx: &Context,
        link: &LinkRequest,
    ) -> Result<IntermediariesUpdate> {
        let c = self.shared.clients.get(ctx).await?;
        let topic = need(&link.resource_a, "arn")?;
        let queue = need(&link.resource_b, "arn")?;
        let url = need(&link.resource_b, "queueUrl")?;
        let sid = statement_id("topic", link);
        if is_destroy(link) {
            unsubscribe(&c, topic, queue).await?;
            set_queue_statement(&self.shared, &c, url, &sid, None).await?;
            return Ok(IntermediariesUpdate {
                link_data: Value::map().with("subscription", Value::Null),
                intermediaries: Vec::new(),
            });
        }
        let statement = json!({
            "Sid": sid,
            "Effect": "Allow",
            "Principal": {"Service": "sns.amazonaws.com"},
            "Action": "sqs:SendMessage",
            "Resource": queue,
            "Condition": {"ArnEquals": {"aws:SourceArn": topic}}
        });
        set_queue_statement(&self.shared, &c, url, &sid, Some(statement)).await?;
        let sub = subscribe(&c, topic, "sqs", queue).await?;
        Ok(IntermediariesUpdate {
            link_data: Value::map().with("subscription", sub.as_str()),
            intermediaries: vec![subscription_state(link, &sub, "sqs", queue)],
        })
    }

    async fn read_intermediaries(
        &self,
        ctx: &Context,
        link: &LinkRequest,
    ) -> Result<Vec<ResourceState>> {
        let c = self.shared.clients.get(ctx).await?;
        let topic = need(&link.resource_a, "arn")?;
        let queue = need(&link.resource_b, "arn")?;
        Ok(find_subscription(&c, topic, queue)
            .await?
            .map(|s| subscription_state(link, &s, "sqs", queue))
            .into_iter()
            .collect())
    }
}

fn subscription_state(
    link: &LinkRequest,
    arn: &str,
    protocol: &str,
    endpoint: &str,
) -> ResourceState {
    ResourceState {
        resource_type: "aws/sns/subscription".to_owned(),
        name: format!("{}->{}", link.resource_a.name, link.resource_b.name),
        external_id: arn.to_owned(),
        spec: Value::map()
            .with("protocol", protocol)
            .with("endpoint", endpoint),
        state: Value::map().with("arn", arn),
    }
}

// ---- topic, api, rule, bucket → function: the source invokes the function -------------------

/// A resource type that invokes a function it links to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Invoker {
    Topic,
    Api,
    Rule,
    Bucket,
}

const INVOKERS: [Invoker; 4] = [Invoker::Topic, Invoker::Api, Invoker::Rule, Invoker::Bucket];

impl Invoker {
    fn a_type(self) -> &'static str {
        match self {
            Invoker::Topic => "aws/sns/topic",
            Invoker::Api => "aws/apigatewayv2/api",
            Invoker::Rule => "aws/events/rule",
            Invoker::Bucket => "aws/s3/bucket",
        }
    }

    fn principal(self) -> &'static str {
        match self {
            Invoker::Topic => "sns.amazonaws.com",
            Invoker::Api => "apigateway.amazonaws.com",
            Invoker::Rule => "events.amazonaws.com",
            Invoker::Bucket => "s3.amazonaws.com",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Invoker::Topic => {
                "The function subscribes to the topic: a subscription and the invoke permission for SNS."
            }
            Invoker::Api => {
                "The API routes to the function: an integration (AWS_PROXY, payload 2.0), a route from the function's `aws.apigatewayv2.route` annotation (default `ANY /<function resource name>`), and the invoke permission for API Gateway."
            }
            Invoker::Rule => {
                "The rule targets the function: a target, and the invoke permission for EventBridge."
            }
            Invoker::Bucket => {
                "The bucket notifies the function: a notification for the `aws.s3.bucket.events` annotation's events (default `s3:ObjectCreated:*`), and the invoke permission for S3."
            }
        }
    }
}

struct Invokes {
    shared: Shared,
    source: Invoker,
}

/// `GET /orders` (method and path) or `$default`.
pub fn valid_route(route: &str) -> bool {
    if route == "$default" {
        return true;
    }
    let Some((method, path)) = route.split_once(' ') else {
        return false;
    };
    [
        "ANY", "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS",
    ]
    .contains(&method)
        && path.starts_with('/')
}

fn route_of(link: &LinkRequest) -> String {
    link.annotations_b
        .get(ROUTE)
        .and_then(Value::as_str)
        .map_or_else(|| format!("ANY /{}", link.resource_b.name), str::to_owned)
}

/// `arn:aws:events:r:a:rule/[bus/]name` → (bus, name).
fn rule_parts(arn: &str) -> Option<(String, String)> {
    let rest = arn.split_once(":rule/")?.1;
    Some(match rest.split_once('/') {
        Some((bus, name)) => (bus.to_owned(), name.to_owned()),
        None => ("default".to_owned(), rest.to_owned()),
    })
}

impl Invokes {
    async fn api(
        &self,
        c: &Clients,
        link: &LinkRequest,
        function: &str,
    ) -> Result<(Value, Vec<ResourceState>)> {
        let api = need(&link.resource_a, "apiId")?;
        let route_key = route_of(link);
        let routes = c
            .apigw
            .get_routes()
            .api_id(api)
            .send()
            .await
            .map_err(|e| sdk(format!("listing routes of API {api}"), e))?
            .items
            .unwrap_or_default();
        let old_route = link.link_data.get("routeId").and_then(Value::as_str);
        let old_integration = link.link_data.get("integrationId").and_then(Value::as_str);
        if is_destroy(link) {
            if let Some(id) = old_route {
                ignore_missing(
                    c.apigw
                        .delete_route()
                        .api_id(api)
                        .route_id(id)
                        .send()
                        .await
                        .map_err(|e| sdk("deleting a route", e)),
                )?;
            }
            if let Some(id) = old_integration {
                ignore_missing(
                    c.apigw
                        .delete_integration()
                        .api_id(api)
                        .integration_id(id)
                        .send()
                        .await
                        .map_err(|e| sdk("deleting an integration", e)),
                )?;
            }
            return Ok((
                Value::map()
                    .with("routeId", Value::Null)
                    .with("integrationId", Value::Null),
                Vec::new(),
            ));
        }
        // The integration this link made (recorded), else one for this function.
        let integrations = c
            .apigw
            .get_integrations()
            .api_id(api)
            .send()
            .await
            .map_err(|e| sdk(format!("listing integrations of API {api}"), e))?
            .items
            .unwrap_or_default();
        let existing = integrations
            .iter()
            .find(|i| old_integration.is_some() && i.integration_id.as_deref() == old_integration)
            .or_else(|| {
                integrations
                    .iter()
                    .find(|i| i.integration_uri.as_deref() == Some(function))
            });
        let integration = match existing.and_then(|i| i.integration_id.clone()) {
            Some(id) => id,
            None => c
                .apigw
                .create_integration()
                .api_id(api)
                .integration_type(aws_sdk_apigatewayv2::types::IntegrationType::AwsProxy)
                .integration_uri(function)
                .payload_format_version("2.0")
                .send()
                .await
                .map_err(|e| sdk(format!("integrating {function} with API {api}"), e))?
                .integration_id
                .ok_or_else(|| PluginError::internal("CreateIntegration returned no id"))?,
        };
        let target = format!("integrations/{integration}");
        let existing_route = routes
            .iter()
            .find(|r| r.route_key.as_deref() == Some(route_key.as_str()));
        let route = match existing_route.and_then(|r| r.route_id.clone()) {
            Some(id) => {
                if existing_route.and_then(|r| r.target.as_deref()) != Some(target.as_str()) {
                    c.apigw
                        .update_route()
                        .api_id(api)
                        .route_id(&id)
                        .target(&target)
                        .send()
                        .await
                        .map_err(|e| sdk(format!("pointing route {route_key} at {function}"), e))?;
                }
                id
            }
            None => c
                .apigw
                .create_route()
                .api_id(api)
                .route_key(&route_key)
                .target(&target)
                .send()
                .await
                .map_err(|e| sdk(format!("adding route {route_key} to API {api}"), e))?
                .route_id
                .ok_or_else(|| PluginError::internal("CreateRoute returned no id"))?,
        };
        // The route key changed: the old route goes.
        if let Some(old) = old_route.filter(|o| *o != route) {
            ignore_missing(
                c.apigw
                    .delete_route()
                    .api_id(api)
                    .route_id(old)
                    .send()
                    .await
                    .map_err(|e| sdk("deleting a route", e)),
            )?;
        }
        let data = Value::map()
            .with("routeId", route.as_str())
            .with("routeKey", route_key.as_str())
            .with("integrationId", integration.as_str());
        let name = format!("{}->{}", link.resource_a.name, link.resource_b.name);
        Ok((
            data,
            vec![
                ResourceState {
                    resource_type: "aws/apigatewayv2/integration".to_owned(),
                    name: name.clone(),
                    external_id: integration.clone(),
                    spec: Value::map().with("integrationUri", function),
                    state: Value::map().with("integrationId", integration.as_str()),
                },
                ResourceState {
                    resource_type: "aws/apigatewayv2/route".to_owned(),
                    name,
                    external_id: route.clone(),
                    spec: Value::map().with("routeKey", route_key.as_str()),
                    state: Value::map().with("routeId", route.as_str()),
                },
            ],
        ))
    }

    async fn rule(
        &self,
        c: &Clients,
        link: &LinkRequest,
        function: &str,
    ) -> Result<(Value, Vec<ResourceState>)> {
        let arn = need(&link.resource_a, "arn")?;
        let (bus, rule) = rule_parts(arn)
            .ok_or_else(|| PluginError::internal(format!("`{arn}` is not a rule ARN")))?;
        let id = statement_id("target", link);
        let id: String = id.chars().take(64).collect();
        if is_destroy(link) {
            ignore_missing(
                c.events
                    .remove_targets()
                    .rule(&rule)
                    .event_bus_name(&bus)
                    .ids(&id)
                    .send()
                    .await
                    .map_err(|e| sdk(format!("removing target {id} of rule {rule}"), e)),
            )?;
            return Ok((Value::map().with("targetId", Value::Null), Vec::new()));
        }
        let input = link
            .annotations_a
            .get(RULE_INPUT)
            .and_then(Value::as_str)
            .map(str::to_owned);
        let target = aws_sdk_eventbridge::types::Target::builder()
            .id(&id)
            .arn(function)
            .set_input(input)
            .build()
            .map_err(|e| PluginError::internal(format!("building target: {e}")))?;
        let out = c
            .events
            .put_targets()
            .rule(&rule)
            .event_bus_name(&bus)
            .targets(target)
            .send()
            .await
            .map_err(|e| sdk(format!("targeting {function} from rule {rule}"), e))?;
        if out.failed_entry_count > 0 {
            let why = out
                .failed_entries
                .unwrap_or_default()
                .into_iter()
                .filter_map(|f| f.error_message)
                .collect::<Vec<_>>()
                .join("; ");
            return Err(PluginError::transient(format!(
                "rule {rule} refused target {id}: {why}"
            )));
        }
        Ok((Value::map().with("targetId", id.as_str()), Vec::new()))
    }

    async fn bucket(
        &self,
        c: &Clients,
        link: &LinkRequest,
        function: &str,
    ) -> Result<(Value, Vec<ResourceState>)> {
        use aws_sdk_s3::types::{Event, LambdaFunctionConfiguration, NotificationConfiguration};
        let arn = need(&link.resource_a, "arn")?;
        let bucket = arn.rsplit(':').next().unwrap_or(arn).to_owned();
        let id = statement_id("notify", link);
        let _guard = self
            .shared
            .locks
            .lock(&format!("notifications:{bucket}"))
            .await;
        let current =
            c.s3.get_bucket_notification_configuration()
                .bucket(&bucket)
                .send()
                .await
                .map_err(|e| sdk(format!("reading the notifications of bucket {bucket}"), e))?;
        let mut lambdas: Vec<LambdaFunctionConfiguration> = current
            .lambda_function_configurations
            .unwrap_or_default()
            .into_iter()
            .filter(|l| l.id.as_deref() != Some(id.as_str()))
            .collect();
        let events: Vec<String> = link
            .annotations_a
            .get(BUCKET_EVENTS)
            .and_then(Value::as_str)
            .unwrap_or("s3:ObjectCreated:*")
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        if !is_destroy(link) {
            let mut b = LambdaFunctionConfiguration::builder()
                .id(&id)
                .lambda_function_arn(function);
            for e in &events {
                b = b.events(Event::from(e.as_str()));
            }
            lambdas.push(
                b.build()
                    .map_err(|e| PluginError::internal(format!("building a notification: {e}")))?,
            );
        }
        let config = NotificationConfiguration::builder()
            .set_topic_configurations(current.topic_configurations)
            .set_queue_configurations(current.queue_configurations)
            .set_lambda_function_configurations(Some(lambdas))
            .set_event_bridge_configuration(current.event_bridge_configuration)
            .build();
        c.s3.put_bucket_notification_configuration()
            .bucket(&bucket)
            .notification_configuration(config)
            .send()
            .await
            .map_err(|e| sdk(format!("setting the notifications of bucket {bucket}"), e))?;
        Ok((
            Value::map().with(
                "notificationId",
                if is_destroy(link) {
                    Value::Null
                } else {
                    Value::from(id.as_str())
                },
            ),
            Vec::new(),
        ))
    }
}

fn ignore_missing<T>(r: Result<T>) -> Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.class == ErrorClass::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[async_trait]
impl Link for Invokes {
    fn resource_type_a(&self) -> &str {
        self.source.a_type()
    }

    fn resource_type_b(&self) -> &str {
        FUNCTION
    }

    fn description(&self) -> &str {
        self.source.description()
    }

    fn annotations(&self) -> Vec<Annotation> {
        match self.source {
            Invoker::Api => vec![Annotation::new(ROUTE, FUNCTION, SchemaType::String).describe(
                "The route to the function: `METHOD /path` (`GET /orders/{id}`) or `$default`; default `ANY /<function resource name>`",
            )],
            Invoker::Bucket => vec![Annotation::new(BUCKET_EVENTS, "aws/s3/bucket", SchemaType::String)
                .default("s3:ObjectCreated:*")
                .describe("Comma-separated S3 event types that invoke linked functions")],
            Invoker::Rule => vec![Annotation::new(RULE_INPUT, "aws/events/rule", SchemaType::String)
                .describe("A JSON text the target receives as its event, instead of the matched event")],
            Invoker::Topic => Vec::new(),
        }
    }

    async fn stage(&self, _ctx: &Context, link: &LinkRequest) -> Result<StagedLink> {
        let mut staged = StagedLink::default();
        if self.source == Invoker::Rule
            && let Some(input) = link.annotations_a.get(RULE_INPUT)
            && input
                .as_str()
                .is_none_or(|t| serde_json::from_str::<serde_json::Value>(t).is_err())
        {
            staged.diagnostics.push(
                Diagnostic::error(
                    "aws.events.invalid-input",
                    format!("`{RULE_INPUT}` is not a JSON text"),
                )
                .hint(r#"a JSON value written as text, like {"task": "cleanup"}"#),
            );
        }
        if self.source == Invoker::Api {
            let route = route_of(link);
            if !valid_route(&route) {
                staged.diagnostics.push(
                    Diagnostic::error(
                        "aws.apigatewayv2.invalid-route",
                        format!(
                            "`{ROUTE}` is \"{route}\"; a route is `METHOD /path` or `$default`"
                        ),
                    )
                    .hint("for example `GET /orders/{id}`"),
                );
            }
        }
        Ok(staged)
    }

    async fn update_intermediaries(
        &self,
        ctx: &Context,
        link: &LinkRequest,
    ) -> Result<IntermediariesUpdate> {
        let c = self.shared.clients.get(ctx).await?;
        let function = need(&link.resource_b, "arn")?;
        let sid = statement_id(
            match self.source {
                Invoker::Topic => "sns",
                Invoker::Api => "api",
                Invoker::Rule => "events",
                Invoker::Bucket => "s3",
            },
            link,
        );
        let (mut data, intermediaries) = match self.source {
            Invoker::Topic => {
                let topic = need(&link.resource_a, "arn")?;
                if is_destroy(link) {
                    unsubscribe(&c, topic, function).await?;
                    (Value::map().with("subscription", Value::Null), Vec::new())
                } else {
                    let sub = subscribe(&c, topic, "lambda", function).await?;
                    (
                        Value::map().with("subscription", sub.as_str()),
                        vec![subscription_state(link, &sub, "lambda", function)],
                    )
                }
            }
            Invoker::Api => self.api(&c, link, function).await?,
            Invoker::Rule => self.rule(&c, link, function).await?,
            Invoker::Bucket => self.bucket(&c, link, function).await?,
        };
        if is_destroy(link) {
            remove_permission(&c, function, &sid).await?;
            data.insert("permission", Value::Null);
        } else {
            let source_arn = match self.source {
                // Any stage, any route of this API.
                Invoker::Api => format!("{}/*", need(&link.resource_a, "executionArn")?),
                _ => need(&link.resource_a, "arn")?.to_owned(),
            };
            add_permission(&c, function, &sid, self.source.principal(), &source_arn).await?;
            data.insert("permission", sid.as_str());
        }
        Ok(IntermediariesUpdate {
            link_data: data,
            intermediaries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names() {
        assert_eq!(env_name("ordersTable"), "ORDERS_TABLE");
        assert_eq!(env_name("save-order.v1"), "SAVE_ORDER_V1");
        assert_eq!(env_name("buckets[0]"), "BUCKETS_0");
        assert_eq!(env_name("9lives"), "R_9LIVES");
    }

    #[test]
    fn arns() {
        assert_eq!(
            role_name("arn:aws:iam::123456789012:role/service/fn-role"),
            Some("fn-role")
        );
        assert_eq!(role_name("arn:aws:iam::123456789012:role/r"), Some("r"));
        assert_eq!(role_name("nope"), None);
        assert_eq!(
            rule_parts("arn:aws:events:us-east-1:1:rule/nightly"),
            Some(("default".to_owned(), "nightly".to_owned()))
        );
        assert_eq!(
            rule_parts("arn:aws:events:us-east-1:1:rule/bus/nightly"),
            Some(("bus".to_owned(), "nightly".to_owned()))
        );
    }

    #[test]
    fn poll_sources_read_what_their_link_needs() {
        let table = |state: Value| ResourceState {
            resource_type: "aws/dynamodb/table".to_owned(),
            name: "orders".to_owned(),
            external_id: "orders".to_owned(),
            spec: Value::map(),
            state,
        };
        let arn = "arn:aws:dynamodb:us-east-1:1:table/orders";
        let stream = "arn:aws:dynamodb:us-east-1:1:table/orders/stream/2026-01-01T00:00:00.000";
        let with_stream = table(Value::map().with("arn", arn).with("streamArn", stream));
        assert_eq!(
            Poll::TableStream.source_arn(&with_stream).ok(),
            Some(stream)
        );
        let without = table(Value::map().with("arn", arn));
        let e = Poll::TableStream
            .source_arn(&without)
            .expect_err("no stream");
        assert_eq!(e.class, ErrorClass::BadInput, "{e:?}");
        let statements = Poll::TableStream
            .statements(&with_stream, stream)
            .expect("statements");
        assert_eq!(statements[0]["Resource"], json!([stream]));
        assert_eq!(statements[0]["Action"][1], "dynamodb:GetRecords");
        assert_eq!(
            statements[1]["Resource"],
            json!([format!("{arn}/stream/*")])
        );
        assert!(annotation_flag(
            &Value::map().with(PARTIAL_FAILURES, true),
            PARTIAL_FAILURES
        ));
        assert!(annotation_flag(
            &Value::map().with(PARTIAL_FAILURES, "true"),
            PARTIAL_FAILURES
        ));
        assert!(!annotation_flag(
            &Value::map().with(PARTIAL_FAILURES, false),
            PARTIAL_FAILURES
        ));
        assert!(!annotation_flag(&Value::map(), PARTIAL_FAILURES));
    }

    #[test]
    fn routes() {
        assert!(valid_route("GET /orders/{id}"));
        assert!(valid_route("$default"));
        assert!(!valid_route("FETCH /x"));
        assert!(!valid_route("GET orders"));
    }
}

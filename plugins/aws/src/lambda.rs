//! `aws/lambda/function` (CloudFormation `AWS::Lambda::Function`, with the specification's
//! own fields: `codeUri`, `tracing`, `environment.variables`).
//!
//! The code comes from `codeUri` through [`crate::code::load`]. Without `role`, the function
//! owns an execution role (named after it, trusting `lambda.amazonaws.com`, with the
//! AWSLambdaBasicExecutionRole managed policy) that carries the function's ownership tags,
//! is recorded in the state (`ownedRole`) and is deleted with the function. Links add their
//! inline policies to the role in `roleArn`, whichever it is.
//!
//! Environment variables the blueprint never set (a link's, say) are kept on update; the
//! ones it set and then dropped are removed. Their values are never logged.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_lambda::types::{
    Architecture, Environment, FunctionCode, FunctionConfiguration, LastUpdateStatus, PackageType,
    Runtime, TracingConfig, TracingMode,
};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::Blob;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use trellis_plugin_sdk::prelude::*;

use crate::code::{self, Code, Package};
use crate::common::{self, NameStyle, Owner};
use crate::config::{ClientCache, Clients};
use crate::error::sdk;
use crate::iam;

pub struct Function {
    pub clients: Arc<ClientCache>,
}

const MAX_NAME: usize = 64;
const MAX_ROLE_NAME: usize = 64;
/// How long Lambda may refuse a fresh role (IAM propagation takes seconds, rarely a minute).
const ROLE_WAIT: Duration = Duration::from_secs(120);
/// How long a function may stay Pending or InProgress (VPC functions take minutes).
const READY_WAIT: Duration = Duration::from_secs(600);
const DEFAULT_TIMEOUT: i32 = 3;
const DEFAULT_MEMORY: i32 = 128;
const DEFAULT_TRACING: &str = "PassThrough";
const DEFAULT_ARCHITECTURE: &str = "x86_64";

/// The managed policy an owned execution role gets: writing logs to CloudWatch.
pub fn basic_execution_policy_arn(partition: &str) -> String {
    format!("arn:{partition}:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole")
}

/// The name of the execution role a function owns: `<function name>-role`, cut to fit.
pub fn owned_role_name(function: &str) -> String {
    let base: String = function.chars().take(MAX_ROLE_NAME - 5).collect();
    format!("{base}-role")
}

/// The trust policy of an owned execution role.
pub fn lambda_trust_policy() -> serde_json::Value {
    serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": {"Service": "lambda.amazonaws.com"},
            "Action": "sts:AssumeRole"
        }]
    })
}

/// Why Lambda refused a call for a reason that passes, and how long it may take.
fn passing(code: Option<&str>, message: &str) -> Option<(&'static str, Duration)> {
    match code? {
        "InvalidParameterValueException"
            if message.contains("cannot be assumed by Lambda")
                || message.contains("execution role does not have permissions") =>
        {
            Some((
                "the role is not usable by Lambda yet (IAM changes take a few seconds to spread)",
                ROLE_WAIT,
            ))
        }
        "ResourceConflictException" if message.contains("cannot be performed at this time") => {
            Some((
                "an earlier change of the function is still in progress",
                READY_WAIT,
            ))
        }
        "ResourceInUseException" => Some((
            "the event source mapping is still changing state",
            READY_WAIT,
        )),
        _ => None,
    }
}

/// Sends `call` again, with progress, while Lambda refuses it for a passing reason (a role
/// too new, an update still running), up to that reason's time limit.
pub(crate) async fn send<T, E, F, Fut>(ctx: &Context, what: &str, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, SdkError<E, HttpResponse>>>,
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let start = Instant::now();
    let mut delay = Duration::from_secs(1);
    loop {
        let err = match call().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let why = match passing(err.code(), err.message().unwrap_or("")) {
            Some((why, limit)) if start.elapsed() < limit => why,
            _ => return Err(sdk(what, err)),
        };
        ctx.progress(
            format!("{what}: {why}; trying again in {} s", delay.as_secs()),
            None,
        );
        ctx.sleep(delay).await?;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

/// The function's configuration once no creation or update is running: Pending and
/// InProgress are waited out (with progress), Failed is an error.
async fn wait_ready(ctx: &Context, c: &Clients, name: &str) -> Result<FunctionConfiguration> {
    let start = Instant::now();
    let mut delay = Duration::from_millis(500);
    loop {
        let cfg = get_function(c, name)
            .await?
            .and_then(|f| f.configuration)
            .ok_or_else(|| PluginError::not_found(format!("function {name} does not exist")))?;
        let state = cfg.state.as_ref().map(|s| s.as_str().to_owned());
        let update = cfg.last_update_status.clone();
        if state.as_deref() == Some("Failed") {
            return Err(PluginError::bad_input(format!(
                "function {name} failed to become ready: {}",
                cfg.state_reason.as_deref().unwrap_or("no reason given")
            )));
        }
        if update == Some(LastUpdateStatus::Failed) {
            return Err(PluginError::bad_input(format!(
                "the update of function {name} failed: {}",
                cfg.last_update_status_reason
                    .as_deref()
                    .unwrap_or("no reason given")
            )));
        }
        let pending = state.as_deref() == Some("Pending");
        if !pending && update != Some(LastUpdateStatus::InProgress) {
            return Ok(cfg);
        }
        if start.elapsed() > READY_WAIT {
            return Err(PluginError::transient(format!(
                "function {name} is still {} after {} s",
                if pending { "Pending" } else { "being updated" },
                READY_WAIT.as_secs()
            )));
        }
        ctx.progress(
            if pending {
                format!("waiting for function {name} to become Active")
            } else {
                format!("waiting for the update of function {name} to finish")
            },
            None,
        );
        ctx.sleep(delay).await?;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

async fn get_function(
    c: &Clients,
    name: &str,
) -> Result<Option<aws_sdk_lambda::operation::get_function::GetFunctionOutput>> {
    match c.lambda.get_function().function_name(name).send().await {
        Ok(out) => Ok(Some(out)),
        Err(e) => {
            let e = sdk(format!("reading function {name}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

fn sorted_tags(tags: Option<&HashMap<String, String>>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = tags
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.sort();
    out
}

fn function_name(ctx: &Context, spec: &Spec<'_>, resource: &str) -> Result<String> {
    common::physical_name(
        ctx,
        spec,
        "functionName",
        resource,
        MAX_NAME,
        NameStyle::Standard,
    )
}

/// An environment variable's value as text (the blueprint may write numbers and booleans).
fn env_text(v: &Value) -> Option<String> {
    match v.revealed() {
        Value::String(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        Value::Float(f) => Some(f.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `architectures`: `arm64` or `[arm64]`.
fn architecture_of(v: &Value) -> Option<&str> {
    match v.revealed() {
        Value::String(s) => Some(s),
        Value::List(items) if items.len() == 1 => items[0].as_str(),
        _ => None,
    }
}

/// The configuration a spec asks for, unset fields at Lambda's defaults.
struct Settings {
    handler: Option<String>,
    runtime: Option<String>,
    timeout: i32,
    memory: i32,
    description: String,
    tracing: String,
    layers: Vec<String>,
    architecture: String,
    /// The blueprint's variables (values may be secrets: never logged).
    env: HashMap<String, String>,
}

impl Settings {
    fn of(spec: &Spec<'_>) -> Result<Settings> {
        let int = |key: &str, default: i32| -> Result<i32> {
            match spec.opt_i64(key)? {
                Some(n) => i32::try_from(n).map_err(|_| {
                    PluginError::bad_input(format!("`{key}` {n} is out of range"))
                        .at(spec.path_of(key))
                }),
                None => Ok(default),
            }
        };
        let architecture = match spec.get("architectures") {
            Some(v) => architecture_of(v)
                .ok_or_else(|| {
                    PluginError::bad_input(
                        "`architectures` must be `x86_64` or `arm64` (or a list of one)",
                    )
                    .at(spec.path_of("architectures"))
                })?
                .to_owned(),
            None => DEFAULT_ARCHITECTURE.to_owned(),
        };
        Ok(Settings {
            handler: spec.opt_str("handler")?.map(str::to_owned),
            runtime: spec.opt_str("runtime")?.map(str::to_owned),
            timeout: int("timeout", DEFAULT_TIMEOUT)?,
            memory: int("memorySize", DEFAULT_MEMORY)?,
            description: spec.opt_str("description")?.unwrap_or("").to_owned(),
            tracing: spec
                .opt_str("tracing")?
                .unwrap_or(DEFAULT_TRACING)
                .to_owned(),
            layers: spec
                .opt_str_list("layers")?
                .unwrap_or_default()
                .into_iter()
                .map(str::to_owned)
                .collect(),
            architecture,
            env: env_vars(spec)?,
        })
    }
}

/// `environment.variables` as text.
fn env_vars(spec: &Spec<'_>) -> Result<HashMap<String, String>> {
    let Some(env) = spec.opt_object("environment")? else {
        return Ok(HashMap::new());
    };
    let Some(vars) = env.opt_map("variables")? else {
        return Ok(HashMap::new());
    };
    let mut out = HashMap::new();
    for (k, v) in vars {
        let text = env_text(v).ok_or_else(|| {
            PluginError::bad_input(format!(
                "environment variable `{k}` must be a string, number or boolean"
            ))
            .at(env.path_of("variables").join(k))
        })?;
        out.insert(k.clone(), text);
    }
    Ok(out)
}

/// The variables to set: those in Lambda now, less those the blueprint dropped, plus the
/// blueprint's. Variables the blueprint never had (a link's) stay.
fn merged_env(
    current: &HashMap<String, String>,
    before: Option<&Spec<'_>>,
    want: &HashMap<String, String>,
) -> HashMap<String, String> {
    let mut out = current.clone();
    if let Some(before) = before
        && let Ok(Some(env)) = before.opt_object("environment")
        && let Ok(Some(vars)) = env.opt_map("variables")
    {
        for k in vars.keys() {
            if !want.contains_key(k) {
                out.remove(k);
            }
        }
    }
    out.extend(want.iter().map(|(k, v)| (k.clone(), v.clone())));
    out
}

fn current_env(cfg: &FunctionConfiguration) -> HashMap<String, String> {
    cfg.environment
        .as_ref()
        .and_then(|e| e.variables.clone())
        .unwrap_or_default()
}

fn layer_arns(cfg: &FunctionConfiguration) -> Vec<String> {
    cfg.layers
        .iter()
        .flatten()
        .filter_map(|l| l.arn.clone())
        .collect()
}

fn architecture_now(cfg: &FunctionConfiguration) -> &str {
    cfg.architectures
        .as_ref()
        .and_then(|a| a.first())
        .map_or(DEFAULT_ARCHITECTURE, Architecture::as_str)
}

fn tracing_now(cfg: &FunctionConfiguration) -> &str {
    cfg.tracing_config
        .as_ref()
        .and_then(|t| t.mode.as_ref())
        .map_or(DEFAULT_TRACING, TracingMode::as_str)
}

/// Whether the configuration in Lambda differs from the one wanted.
fn config_differs(
    cfg: &FunctionConfiguration,
    s: &Settings,
    env: &HashMap<String, String>,
    role: &str,
) -> bool {
    cfg.handler != s.handler
        || cfg.runtime.as_ref().map(Runtime::as_str) != s.runtime.as_deref()
        || cfg.timeout.unwrap_or(DEFAULT_TIMEOUT) != s.timeout
        || cfg.memory_size.unwrap_or(DEFAULT_MEMORY) != s.memory
        || cfg.description.as_deref().unwrap_or("") != s.description
        || tracing_now(cfg) != s.tracing
        || layer_arns(cfg) != s.layers
        || &current_env(cfg) != env
        || cfg.role.as_deref() != Some(role)
}

fn function_code(code: &Code) -> Result<FunctionCode> {
    Ok(match &code.package {
        Package::Zip(bytes) => FunctionCode::builder()
            .zip_file(Blob::new(bytes.clone()))
            .build(),
        Package::S3(at) => FunctionCode::builder()
            .s3_bucket(&at.bucket)
            .s3_key(&at.key)
            .set_s3_object_version(at.version.clone())
            .build(),
        Package::Deployed(sha) => {
            return Err(PluginError::bad_input(format!(
                "`codeUri` {} names code a function already has: there is nothing to upload; give the code's source (a directory, a .zip file or s3://bucket/key)",
                code::deployed_uri(sha)
            ))
            .at("codeUri"));
        }
    })
}

async fn load_code(ctx: &Context, spec: &Spec<'_>) -> Result<Code> {
    let uri = spec.get_str("codeUri")?;
    code::load(ctx, uri)
        .await
        .map_err(|e| e.at(spec.path_of("codeUri")))
}

/// The sha256 Lambda will report for `code` (a package in S3 is read to know it).
async fn code_sha(c: &Clients, code: &Code) -> Result<String> {
    match (&code.sha256, &code.package) {
        (Some(s), _) => Ok(s.clone()),
        (None, Package::Zip(bytes)) => Ok(code::sha256_base64(bytes)),
        (None, Package::S3(at)) => code::s3_sha256(&c.s3, at)
            .await
            .map_err(|e| e.at("codeUri")),
        (None, Package::Deployed(sha)) => Ok(sha.clone()),
    }
}

/// The role the function runs as: `role` when set, else its own (made sure of here).
async fn role_for(
    ctx: &Context,
    c: &Clients,
    spec: &Spec<'_>,
    function: &str,
    resource: &str,
) -> Result<(String, Option<String>)> {
    if let Some(r) = spec.opt_str("role")? {
        return Ok((r.to_owned(), None));
    }
    let name = owned_role_name(function);
    let description = format!("Execution role of Lambda function {function}");
    let role = iam::ensure_role(
        ctx,
        c,
        &iam::RoleRequest {
            name: &name,
            trust_policy: &lambda_trust_policy(),
            owner: resource,
            description: Some(&description),
            field: "role",
        },
    )
    .await?;
    iam::attach_managed_policy(c, &name, &basic_execution_policy_arn(c.partition())).await?;
    Ok((role.arn, Some(name)))
}

/// Deletes execution role `role` (and its policies) when it carries `resource`'s ownership
/// tags; a role that is gone, or not ours, is left alone.
async fn delete_owned_role(ctx: &Context, c: &Clients, role: &str, resource: &str) -> Result<()> {
    let Some(found) = iam::get_role(c, role).await? else {
        return Ok(());
    };
    let tags: Vec<(String, String)> = found
        .tags
        .iter()
        .flatten()
        .map(|t| (t.key.clone(), t.value.clone()))
        .collect();
    if common::owner(ctx, resource, &tags) != Owner::Ours {
        tracing::info!("IAM role {role} is not this function's own role: left in place");
        return Ok(());
    }
    iam::delete_role(c, role).await
}

fn state(cfg: &FunctionConfiguration, owned_role: Option<&str>) -> Value {
    let mut s = Value::map();
    common::put(&mut s, "arn", cfg.function_arn.as_deref());
    common::put(&mut s, "roleArn", cfg.role.as_deref());
    common::put(&mut s, "codeSha256", cfg.code_sha256.as_deref());
    common::put(&mut s, "ownedRole", owned_role);
    s
}

/// Brings an existing function to `spec`: role, configuration, code (only when its sha256
/// differs from Lambda's), reserved concurrency, tags; then drops an owned role it no
/// longer uses. `before`/`before_state` are the applied spec and state (None on adoption).
#[allow(clippy::too_many_arguments)]
async fn converge(
    ctx: &Context,
    c: &Clients,
    name: &str,
    resource: &str,
    spec: &Spec<'_>,
    before: Option<&Spec<'_>>,
    before_state: Option<&Spec<'_>>,
    code: &Code,
) -> Result<Applied> {
    let s = Settings::of(spec)?;
    let cfg = wait_ready(ctx, c, name).await?;
    let (role, owned) = role_for(ctx, c, spec, name, resource).await?;
    let env = merged_env(&current_env(&cfg), before, &s.env);
    if config_differs(&cfg, &s, &env, &role) {
        ctx.progress(
            format!("updating the configuration of function {name}"),
            None,
        );
        let call = c
            .lambda
            .update_function_configuration()
            .function_name(name)
            .set_handler(s.handler.clone())
            .set_runtime(s.runtime.as_deref().map(Runtime::from))
            .timeout(s.timeout)
            .memory_size(s.memory)
            .description(&s.description)
            .tracing_config(
                TracingConfig::builder()
                    .mode(TracingMode::from(s.tracing.as_str()))
                    .build(),
            )
            .set_layers(Some(s.layers.clone()))
            .environment(Environment::builder().set_variables(Some(env)).build())
            .role(&role);
        send(
            ctx,
            &format!("updating the configuration of function {name}"),
            || call.clone().send(),
        )
        .await?;
        wait_ready(ctx, c, name).await?;
    }
    let sha = code_sha(c, code).await?;
    if cfg.code_sha256.as_deref() != Some(sha.as_str()) || architecture_now(&cfg) != s.architecture
    {
        if let Package::Deployed(sha) = &code.package {
            // Nothing to upload: the code pinned is not there, or must go up again.
            let why = match cfg.code_sha256.as_deref() {
                Some(now) if now != sha => format!("its code is now CodeSha256 {now}"),
                _ => "changing `architectures` uploads the code again".to_owned(),
            };
            return Err(PluginError::bad_input(format!(
                "`codeUri` {} keeps the code function {name} has, but {why}: give the code's source (a directory, a .zip file or s3://bucket/key)",
                code::deployed_uri(sha)
            ))
            .at("codeUri"));
        }
        ctx.progress(format!("updating the code of function {name}"), None);
        let f = function_code(code)?;
        let call = c
            .lambda
            .update_function_code()
            .function_name(name)
            .set_zip_file(f.zip_file)
            .set_s3_bucket(f.s3_bucket)
            .set_s3_key(f.s3_key)
            .set_s3_object_version(f.s3_object_version)
            .architectures(Architecture::from(s.architecture.as_str()));
        send(
            ctx,
            &format!("updating the code of function {name}"),
            || call.clone().send(),
        )
        .await
        .map_err(|e| e.at("codeUri"))?;
        wait_ready(ctx, c, name).await?;
    }
    let found = get_function(c, name)
        .await?
        .ok_or_else(|| PluginError::not_found(format!("function {name} no longer exists")))?;
    let reserved = found
        .concurrency
        .as_ref()
        .and_then(|x| x.reserved_concurrent_executions);
    set_concurrency(c, name, spec, reserved).await?;
    let arn = found
        .configuration
        .as_ref()
        .and_then(|x| x.function_arn.clone())
        .unwrap_or_else(|| name.to_owned());
    let want = common::all_tags(ctx, spec, resource)?;
    let (set, remove) = common::tag_diff(&sorted_tags(found.tags.as_ref()), &want);
    if !set.is_empty() {
        c.lambda
            .tag_resource()
            .resource(&arn)
            .set_tags(Some(set.into_iter().collect()))
            .send()
            .await
            .map_err(|e| sdk(format!("tagging function {name}"), e))?;
    }
    if !remove.is_empty() {
        c.lambda
            .untag_resource()
            .resource(&arn)
            .set_tag_keys(Some(remove))
            .send()
            .await
            .map_err(|e| sdk(format!("untagging function {name}"), e))?;
    }
    if owned.is_none() {
        // `role` is set now: the role the function owned before goes.
        let old = match before_state {
            Some(st) => st.opt_str("ownedRole").ok().flatten().map(str::to_owned),
            None => Some(owned_role_name(name)),
        };
        if let Some(old) = old {
            delete_owned_role(ctx, c, &old, resource).await?;
        }
    }
    let cfg = wait_ready(ctx, c, name).await?;
    Ok(Applied::new(name, state(&cfg, owned.as_deref())))
}

/// Sets or removes the reserved concurrency when it differs from `current`.
async fn set_concurrency(
    c: &Clients,
    name: &str,
    spec: &Spec<'_>,
    current: Option<i32>,
) -> Result<()> {
    let want = match spec.opt_i64("reservedConcurrentExecutions")? {
        Some(n) => Some(i32::try_from(n).map_err(|_| {
            PluginError::bad_input(format!(
                "`reservedConcurrentExecutions` {n} is out of range"
            ))
            .at("reservedConcurrentExecutions")
        })?),
        None => None,
    };
    if want == current {
        return Ok(());
    }
    match want {
        Some(n) => {
            c.lambda
                .put_function_concurrency()
                .function_name(name)
                .reserved_concurrent_executions(n)
                .send()
                .await
                .map_err(|e| {
                    sdk(format!("reserving concurrency for function {name}"), e)
                        .at("reservedConcurrentExecutions")
                })?;
        }
        None => {
            c.lambda
                .delete_function_concurrency()
                .function_name(name)
                .send()
                .await
                .map_err(|e| sdk(format!("removing the reserved concurrency of {name}"), e))?;
        }
    }
    Ok(())
}

/// A value Lambda reports (text), shaped as the blueprint wrote it: `5432` stays a number
/// when it was one, and a secret stays marked.
fn env_value_like(found: &str, applied: Option<&Value>) -> Value {
    let Some(applied) = applied else {
        // Not the blueprint's: it could be anything, so it is not shown.
        return Value::sensitive(found);
    };
    let v = match applied.revealed() {
        Value::Int(n) if found.parse::<i64>().ok() == Some(*n) => Value::Int(*n),
        Value::Float(f) if found.parse::<f64>().ok() == Some(*f) => Value::Float(*f),
        Value::Bool(b) if found.parse::<bool>().ok() == Some(*b) => Value::Bool(*b),
        _ => Value::from(found),
    };
    if applied.is_sensitive() {
        Value::sensitive(v)
    } else {
        v
    }
}

/// The spec as Lambda reports it.
fn spec_of(
    out: &aws_sdk_lambda::operation::get_function::GetFunctionOutput,
    cfg: &FunctionConfiguration,
    applied: &Spec<'_>,
    applied_sha: Option<&str>,
) -> Value {
    let mut spec = Value::map();
    common::put(&mut spec, "functionName", cfg.function_name.as_deref());
    if let Some(uri) = applied.get("codeUri") {
        // The code is compared by its sha256: the same as applied reads back as the same URI.
        match (applied_sha, cfg.code_sha256.as_deref()) {
            (Some(was), Some(now)) if was != now => {
                spec.insert(
                    "codeUri",
                    format!("(code changed outside Trellis: CodeSha256 {now})"),
                );
            }
            _ => {
                spec.insert("codeUri", uri.clone());
            }
        }
    }
    common::put(&mut spec, "handler", cfg.handler.as_deref());
    common::put(
        &mut spec,
        "runtime",
        cfg.runtime.as_ref().map(Runtime::as_str),
    );
    common::put(&mut spec, "timeout", cfg.timeout.map(i64::from));
    common::put(&mut spec, "memorySize", cfg.memory_size.map(i64::from));
    spec.insert("tracing", tracing_now(cfg));
    let arch = architecture_now(cfg);
    match applied.get("architectures").map(Value::revealed) {
        Some(Value::String(_)) => {
            spec.insert("architectures", arch);
        }
        _ => {
            spec.insert("architectures", Value::from(vec![arch]));
        }
    }
    let vars = current_env(cfg);
    let applied_vars = applied
        .get("environment")
        .and_then(|e| e.get("variables"))
        .and_then(Value::as_map);
    if !vars.is_empty() || applied_vars.is_some() {
        let mut keys: Vec<&String> = vars.keys().collect();
        keys.sort_by_key(|k| {
            (
                applied_vars
                    .and_then(|a| a.get_index_of(k.as_str()))
                    .unwrap_or(usize::MAX),
                k.as_str(),
            )
        });
        let mut map = Value::map();
        for k in keys {
            let was = applied_vars.and_then(|a| a.get(k.as_str()));
            map.insert(k.as_str(), env_value_like(&vars[k], was));
        }
        spec.insert("environment", Value::map().with("variables", map));
    }
    match cfg.description.as_deref().filter(|d| !d.is_empty()) {
        Some(d) => {
            spec.insert("description", d);
        }
        None if applied.get("description").is_some() => {
            spec.insert("description", "");
        }
        None => {}
    }
    if applied.get("role").is_some() {
        common::put(&mut spec, "role", cfg.role.as_deref());
    }
    let layers = layer_arns(cfg);
    if !layers.is_empty() || applied.get("layers").is_some() {
        spec.insert("layers", Value::from(layers));
    }
    common::put(
        &mut spec,
        "reservedConcurrentExecutions",
        out.concurrency
            .as_ref()
            .and_then(|x| x.reserved_concurrent_executions)
            .map(i64::from),
    );
    common::put(
        &mut spec,
        "tags",
        common::tags_value(&sorted_tags(out.tags.as_ref()), applied),
    );
    spec
}

fn valid_function_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= MAX_NAME
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn valid_role_arn(a: &str) -> bool {
    a.starts_with("arn:") && a.contains(":iam::") && a.contains(":role/")
}

fn valid_env_key(k: &str) -> bool {
    k.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Keys Lambda sets itself and refuses in a function's environment.
const RESERVED_ENV: &[&str] = &[
    "_HANDLER",
    "_X_AMZN_TRACE_ID",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_EXECUTION_ENV",
    "AWS_LAMBDA_FUNCTION_NAME",
    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
    "AWS_LAMBDA_FUNCTION_VERSION",
    "AWS_LAMBDA_INITIALIZATION_TYPE",
    "AWS_LAMBDA_LOG_GROUP_NAME",
    "AWS_LAMBDA_LOG_STREAM_NAME",
    "AWS_ACCESS_KEY",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_LAMBDA_RUNTIME_API",
    "LAMBDA_TASK_ROOT",
    "LAMBDA_RUNTIME_DIR",
];

#[async_trait]
impl Resource for Function {
    fn type_name(&self) -> &str {
        "aws/lambda/function"
    }

    fn description(&self) -> &str {
        "A Lambda function from a zip package (a directory, a .zip file or an S3 object). Importable by its name or ARN (zip packages only); its code imports as `deployed://<CodeSha256>`."
    }

    fn schema(&self) -> Schema {
        let int = |d: &str| Field::integer().describe(d.to_owned());
        Schema::object()
            .describe("A Lambda function; fields as CloudFormation's AWS::Lambda::Function in lowerCamelCase, with `codeUri`, `tracing` and `environment.variables` as the specification writes them")
            .field("functionName", Field::string().must_recreate().describe("Up to 64 letters, digits, `-` and `_`. Derived from the instance and resource name when not set."))
            .field("codeUri", Field::string().required().local_asset().describe("The code: `s3://bucket/key` (with `?versionId=...` for one version), or a `.zip` file or a directory (packed into a zip) relative to the blueprint, whose content the client sends with the plan. `deployed://<CodeSha256>` (what import reports) keeps the code the function has; an update fails if that code changed, or to change `architectures`."))
            .field("handler", Field::string().describe("The function's entry point, like `save_order.handler`"))
            .field("runtime", Field::string().describe("The runtime, like `python3.12` or `nodejs20.x`"))
            .field("tracing", Field::string().allowed(["Active", "PassThrough"]).describe("X-Ray tracing: Active or PassThrough (the default)"))
            .field("architectures", Field::any().describe("The instruction set: `x86_64` (the default) or `arm64`, or a list of one"))
            .field("timeout", int("Seconds the function may run, 1 to 900 (default 3)"))
            .field("memorySize", int("Memory in MB, 128 (the default) to 10240"))
            .field(
                "environment",
                Field::object(Schema::object().field(
                    "variables",
                    Field::map(Schema::any()).describe("Variable → value (text, numbers and booleans); values may be secrets"),
                ))
                .describe("The function's environment"),
            )
            .field("description", Field::string().describe("Up to 256 characters"))
            .field("role", Field::string().describe("ARN of the execution role. Without it the function gets a role of its own (with AWSLambdaBasicExecutionRole), deleted with it."))
            .field("layers", Field::array(Schema::string()).describe("ARNs of layer versions"))
            .field("reservedConcurrentExecutions", int("Concurrent executions reserved for the function (none when not set)"))
            .field("tags", common::tags_field())
            .field("arn", Field::string().computed().describe("The function's ARN"))
            .field("roleArn", Field::string().computed().describe("The ARN of the role the function runs as"))
            .field("codeSha256", Field::string().computed().describe("The sha256 (base64) of the code deployed"))
            .field("ownedRole", Field::string().computed().describe("The name of the execution role the function owns, when `role` is not set"))
    }

    async fn validate(&self, _ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        let spec = req.spec();
        let mut out = Vec::new();
        if let Some(n) = spec.get("functionName").and_then(Value::as_str)
            && !valid_function_name(n)
        {
            out.push(
                Diagnostic::error(
                    "aws.lambda.invalid-name",
                    format!("`functionName` \"{n}\" must be 1 to 64 letters, digits, `-` or `_`"),
                )
                .at("functionName"),
            );
        }
        if let Some(u) = spec.get("codeUri").and_then(Value::as_str)
            && let Some(rest) = u.strip_prefix("s3://")
            && code::parse_s3(rest).is_none()
        {
            out.push(
                Diagnostic::error(
                    "aws.lambda.code-uri",
                    format!("`codeUri` \"{u}\" is not an S3 object: write s3://bucket/key"),
                )
                .at("codeUri"),
            );
        }
        // Every package this type deploys is a zip, which needs a handler and a runtime.
        for field in ["handler", "runtime"] {
            if spec.get(field).is_none() {
                out.push(
                    Diagnostic::error(
                        format!("aws.lambda.{field}-required"),
                        format!("`{field}` is required for a zip package"),
                    )
                    .at(field),
                );
            }
        }
        if let Some(r) = spec.get("runtime").and_then(Value::as_str)
            && !Runtime::values().contains(&r)
        {
            out.push(
                Diagnostic::warning(
                    "aws.lambda.unknown-runtime",
                    format!("runtime \"{r}\" is not one this provider knows; Lambda may refuse it"),
                )
                .at("runtime")
                .hint("runtimes look like `python3.12`, `nodejs20.x`, `java21`, `provided.al2023`"),
            );
        }
        for (field, lo, hi) in [
            ("timeout", 1, 900),
            ("memorySize", 128, 10_240),
            ("reservedConcurrentExecutions", 0, i64::from(i32::MAX)),
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
        if let Some(v) = spec.get("architectures").filter(|v| !v.is_unknown())
            && !architecture_of(v).is_some_and(|a| a == "x86_64" || a == "arm64")
        {
            out.push(
                Diagnostic::error(
                    "aws.lambda.architectures",
                    "`architectures` must be `x86_64` or `arm64` (or a list of one of them)",
                )
                .at("architectures"),
            );
        }
        if let Some(r) = spec.get("role").and_then(Value::as_str)
            && !valid_role_arn(r)
        {
            out.push(
                Diagnostic::error(
                    "aws.lambda.role-arn",
                    format!("`role` \"{r}\" is not an IAM role ARN (`arn:aws:iam::<account>:role/<name>`)"),
                )
                .at("role"),
            );
        }
        if let Some(vars) = spec
            .get("environment")
            .and_then(|e| e.get("variables"))
            .and_then(Value::as_map)
        {
            let at = spec.path_of("environment").join("variables");
            for (k, v) in vars {
                if !valid_env_key(k) || RESERVED_ENV.contains(&k.as_str()) {
                    out.push(
                        Diagnostic::error(
                            "aws.lambda.environment-key",
                            format!("environment variable name `{k}` is not allowed: letters, digits and `_`, starting with a letter, and not one Lambda sets itself"),
                        )
                        .at(at.join(k)),
                    );
                }
                if !v.is_unknown() && env_text(v).is_none() {
                    out.push(
                        Diagnostic::error(
                            "aws.lambda.environment-value",
                            format!(
                                "environment variable `{k}` must be a string, number or boolean"
                            ),
                        )
                        .at(at.join(k)),
                    );
                }
            }
        }
        Ok(out)
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let spec = req.spec();
        let name = function_name(ctx, &spec, &req.name)?;
        let s = Settings::of(&spec)?;
        let code = load_code(ctx, &spec).await?;
        if let Some(found) = get_function(&c, &name).await? {
            common::adopt_or_conflict(
                ctx,
                &req.name,
                &sorted_tags(found.tags.as_ref()),
                "Lambda function",
                &name,
                "functionName",
            )?;
            return converge(ctx, &c, &name, &req.name, &spec, None, None, &code).await;
        }
        // Before anything is made (an owned role): `deployed://` has nothing to upload.
        let package = function_code(&code)?;
        let (role, owned) = role_for(ctx, &c, &spec, &name, &req.name).await?;
        // A failure from here on records the owned role, so it is not orphaned.
        let mut recorded = Value::map().with("roleArn", role.as_str());
        common::put(&mut recorded, "ownedRole", owned.as_deref());
        let tags: HashMap<String, String> = common::all_tags(ctx, &spec, &req.name)?
            .into_iter()
            .collect();
        let mut call = c
            .lambda
            .create_function()
            .function_name(&name)
            .role(&role)
            .code(package)
            .set_handler(s.handler.clone())
            .set_runtime(s.runtime.as_deref().map(Runtime::from))
            .timeout(s.timeout)
            .memory_size(s.memory)
            .set_description(Some(s.description.clone()).filter(|d| !d.is_empty()))
            .tracing_config(
                TracingConfig::builder()
                    .mode(TracingMode::from(s.tracing.as_str()))
                    .build(),
            )
            .architectures(Architecture::from(s.architecture.as_str()))
            .set_layers(Some(s.layers.clone()).filter(|l| !l.is_empty()))
            .set_tags(Some(tags));
        if !s.env.is_empty() {
            call = call.environment(Environment::builder().set_variables(Some(s.env)).build());
        }
        send(ctx, &format!("creating function {name}"), || {
            call.clone().send()
        })
        .await
        .map_err(|e| e.with_partial_state(recorded.clone()))?;
        // The function exists: a failure from here on records it.
        let finish = async {
            let cfg = wait_ready(ctx, &c, &name).await?;
            set_concurrency(&c, &name, &spec, None).await?;
            Ok::<_, PluginError>(cfg)
        };
        let cfg = finish
            .await
            .map_err(|e| e.with_partial(name.clone(), recorded.clone()))?;
        Ok(Applied::new(name, state(&cfg, owned.as_deref())))
    }

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let spec = req.spec();
        let name = if req.current.external_id.is_empty() {
            function_name(ctx, &spec, &req.name)?
        } else {
            req.current.external_id.clone()
        };
        let code = load_code(ctx, &spec).await?;
        let before = req.current.spec();
        let before_state = req.current.state();
        converge(
            ctx,
            &c,
            &name,
            &req.name,
            &spec,
            Some(&before),
            Some(&before_state),
            &code,
        )
        .await
    }

    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        let c = self.clients.get(ctx).await?;
        let spec = current.spec();
        let recorded = !current.external_id.is_empty();
        let name = if recorded {
            current.external_id.clone()
        } else {
            function_name(ctx, &spec, &current.name)?
        };
        let ours = if recorded {
            true
        } else {
            // Never recorded: only a function with our ownership tags is ours to delete.
            match get_function(&c, &name).await? {
                Some(found) => {
                    common::owner(ctx, &current.name, &sorted_tags(found.tags.as_ref()))
                        == Owner::Ours
                }
                None => true,
            }
        };
        if ours {
            let deleted = send(ctx, &format!("deleting function {name}"), || {
                c.lambda.delete_function().function_name(&name).send()
            })
            .await;
            match deleted {
                Ok(_) => {}
                Err(e) if e.class == ErrorClass::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        let owned = match current.state().opt_str("ownedRole").ok().flatten() {
            Some(r) => Some(r.to_owned()),
            // A create cut short records no state: the role it may have made has this name.
            None if spec.get("role").is_none() && current.state.get("roleArn").is_none() => {
                Some(owned_role_name(&name))
            }
            None => None,
        };
        if let Some(role) = owned {
            delete_owned_role(ctx, &c, &role, &current.name).await?;
        }
        Ok(())
    }

    fn supports_read(&self) -> bool {
        true
    }

    async fn read(&self, ctx: &Context, current: &ResourceState) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let spec = current.spec();
        let st = current.state();
        let name = if current.external_id.is_empty() {
            function_name(ctx, &spec, &current.name)?
        } else {
            current.external_id.clone()
        };
        let Some(found) = get_function(&c, &name).await? else {
            return Ok(None);
        };
        if current.external_id.is_empty()
            && common::owner(ctx, &current.name, &sorted_tags(found.tags.as_ref())) != Owner::Ours
        {
            // Someone else's function of that name: ours was never created.
            return Ok(None);
        }
        let Some(cfg) = found.configuration.as_ref() else {
            return Ok(None);
        };
        let owned = match st.opt_str("ownedRole").ok().flatten() {
            Some(r) => Some(r.to_owned()),
            None if spec.get("role").is_none() => cfg
                .role
                .as_deref()
                .and_then(iam::role_name_of_arn)
                .filter(|r| *r == owned_role_name(&name))
                .map(str::to_owned),
            None => None,
        };
        let applied_sha = st.opt_str("codeSha256").ok().flatten();
        Ok(Some(ReadState {
            spec: spec_of(&found, cfg, &spec, applied_sha),
            state: state(cfg, owned.as_deref()),
            external_id: Some(name),
        }))
    }

    fn supports_import(&self) -> bool {
        true
    }

    /// By the function's name or ARN (not a version's or alias's); the external id is its
    /// name. Lambda keeps no trace of where the code came from, so `codeUri` is
    /// `deployed://<CodeSha256>`: the code it has, kept as is (see [`crate::code`]). `role` is
    /// the role it runs as (an imported function owns none), and its environment variables'
    /// values are marked sensitive, as any may be a secret.
    async fn import(&self, ctx: &Context, req: &ImportRequest) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let id = common::import_id(req, "the function's name or ARN")?;
        let name = match common::import_arn(&c, id, "lambda").await? {
            Some(arn) => match arn.resource.strip_prefix("function:") {
                Some(n) if !n.is_empty() && !n.contains(':') => n,
                Some(_) => {
                    return Err(PluginError::bad_input(format!(
                        "`{id}` names a version or alias; give the function's name or unqualified ARN"
                    )));
                }
                None => {
                    return Err(PluginError::bad_input(format!(
                        "`{id}` is not a function's ARN (`arn:aws:lambda:<region>:<account>:function:<name>`)"
                    )));
                }
            },
            None if id.contains(':') => {
                return Err(PluginError::bad_input(format!(
                    "`{id}`: give the function's name or its ARN"
                )));
            }
            None => id,
        };
        let Some(found) = get_function(&c, name).await? else {
            return Ok(None);
        };
        let Some(cfg) = found.configuration.as_ref() else {
            return Ok(None);
        };
        if cfg.package_type == Some(PackageType::Image) {
            return Err(PluginError::bad_input(format!(
                "function {name} runs a container image; {} deploys zip packages only",
                req.resource_type
            )));
        }
        let sha = cfg.code_sha256.as_deref().unwrap_or_default();
        // Read reports `codeUri` and `role` only when the applied spec has them.
        let mut hint = Value::map().with("codeUri", code::deployed_uri(sha));
        common::put(&mut hint, "role", cfg.role.as_deref());
        Ok(Some(ReadState {
            spec: spec_of(&found, cfg, &Spec::new(&hint), Some(sha)),
            state: state(cfg, None),
            external_id: Some(cfg.function_name.clone().unwrap_or_else(|| name.to_owned())),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_role_names_fit() {
        assert_eq!(owned_role_name("saveOrder"), "saveOrder-role");
        let long = owned_role_name(&"f".repeat(64));
        assert_eq!(long.len(), 64);
        assert!(long.ends_with("-role"));
    }

    #[test]
    fn passing_refusals() {
        assert!(
            passing(
                Some("InvalidParameterValueException"),
                "The role defined for the function cannot be assumed by Lambda."
            )
            .is_some()
        );
        assert!(passing(
            Some("ResourceConflictException"),
            "The operation cannot be performed at this time. An update is in progress for resource: arn:aws:lambda:us-east-1:1:function:f"
        )
        .is_some());
        assert!(
            passing(
                Some("ResourceConflictException"),
                "Function already exist: f"
            )
            .is_none()
        );
        assert!(
            passing(
                Some("InvalidParameterValueException"),
                "Unzipped size must be smaller"
            )
            .is_none()
        );
        assert!(passing(None, "").is_none());
    }

    #[test]
    fn variables_the_blueprint_never_set_stay() {
        let current: HashMap<String, String> = [("A", "1"), ("LINKED", "x"), ("DROPPED", "2")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let before = Value::map().with(
            "environment",
            Value::map().with(
                "variables",
                Value::map().with("A", "1").with("DROPPED", "2"),
            ),
        );
        let want: HashMap<String, String> = [("A".to_owned(), "3".to_owned())].into();
        let got = merged_env(&current, Some(&Spec::new(&before)), &want);
        let mut got: Vec<(String, String)> = got.into_iter().collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                ("A".to_owned(), "3".to_owned()),
                ("LINKED".to_owned(), "x".to_owned())
            ]
        );
    }

    #[test]
    fn variables_read_back_in_the_blueprint_s_shape() {
        assert_eq!(
            env_value_like("5432", Some(&Value::Int(5432))),
            Value::Int(5432)
        );
        assert_eq!(
            env_value_like("5433", Some(&Value::Int(5432))),
            Value::from("5433")
        );
        assert_eq!(
            env_value_like("pw", Some(&Value::sensitive("old"))),
            Value::sensitive("pw")
        );
        assert!(env_value_like("x", None).is_sensitive());
    }
}

//! Client commands (plan, deploy, destroy, instances, instance, events, drift, reconcile,
//! cancel) that talk to a running engine over the engine API
//! (proto/trellis/engine/v1/engine.proto).
//!
//! Everything printed is produced by pure functions from the API's messages (`*_json`,
//! `*_text`), so the output shapes documented in docs/cli.md are unit-tested without a server.
//! Results go to stdout; progress and errors go to stderr.

use std::collections::{HashMap, HashSet};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Subcommand, ValueEnum};
use serde_json::{Map, Value as Json, json};
use tonic::Code;
use tonic::codegen::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint, Uri};
use trellis_proto::engine::v1 as pb;
use trellis_proto::engine::v1::engine_client::EngineClient;
use trellis_proto::plugin::v1 as pv;
use trellis_proto::plugin::v1::value::Kind;

use crate::cli::OutputFormat;
use crate::plugins::values::{self, JsonMarks};

/// The engine a client talks to when neither `--engine` nor `TRELLIS_ENGINE` says otherwise.
pub const DEFAULT_ENGINE: &str = "http://127.0.0.1:8325";

/// Responses (an instance with large specs) may exceed tonic's 4 MiB default.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The engine sends a heartbeat every few seconds; a watch that hears nothing for this long is
/// on a dead connection (a half-open TCP connection never errors by itself).
const WATCH_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Reconnection attempts after a watch stream breaks: with the backoff below, about 30 s, long
/// enough for an engine restart.
const WATCH_RETRIES: u32 = 8;

mod assets;
mod backup;
mod connect;
mod imported;
pub(crate) mod render;
mod wait;
mod watch;

pub use backup::BackupArgs;
use connect::*;
pub use connect::{Api, BearerToken, connect, connect_with_token};
use imported::{imported_json, imported_yaml};
use render::*;
use watch::*;

// ---- commands ---------------------------------------------------------------------------------

/// The client commands, flattened into `trellis`'s own subcommands.
#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Plan the changes that bring an instance to a blueprint, without changing anything.
    ///
    /// Sends FILE to the engine (`--engine`), with the files it includes and the local files
    /// the engine asks for (a function's `codeUri`, relative to FILE; docs/assets.md), which
    /// plans against the instance NAME (recorded with its first change set) and records a
    /// change set. Prints the change set: one block per resource to
    /// create (+), update (~), recreate (-/+, with the reason) or delete (-), the field
    /// changes (`(known after deploy)` for values known only after deploy, `(sensitive)` for
    /// secrets), a summary, and the command that deploys it: `trellis deploy --change-set ID`.
    ///
    /// --format json prints {"changeSet": {...}} (docs/cli.md).
    ///
    /// With --request-id (or TRELLIS_REQUEST_ID), a retried command gets back the change set
    /// the first attempt recorded instead of planning again.
    ///
    /// Exit codes: 0 planned; 1 the blueprint is invalid (the engine's diagnostics are
    /// printed); 2 usage error, unreadable file, the engine cannot be reached, or the request
    /// id was used for another request.
    Plan(PlanArgs),
    /// Deploy a blueprint (plan, then execute) or a change set planned before, and watch the
    /// operation to its end.
    ///
    /// `trellis deploy FILE --instance NAME` plans like `trellis plan`, prints the plan and
    /// executes it; `trellis deploy --change-set ID` executes a plan made earlier (refused when
    /// the instance changed since). Progress goes to stderr: one live status line on a
    /// terminal, one line per event otherwise. If the connection drops, the watch resumes
    /// where it stopped. Ctrl-C stops watching, not the operation (`trellis cancel` does).
    ///
    /// With --request-id (or TRELLIS_REQUEST_ID), a retried command attaches to the operation
    /// the first attempt started instead of deploying twice (or executes the change set it
    /// planned, if it got no further).
    ///
    /// --format json prints {"operation": {...}, "changeSet": {...}, "events": N} when the
    /// operation ends (docs/cli.md).
    ///
    /// Exit codes: 0 succeeded; 1 the operation failed, was cancelled or interrupted, the
    /// blueprint is invalid, the change set is stale, or another operation holds the instance;
    /// 2 usage error or the engine cannot be reached.
    Deploy(DeployArgs),
    /// Destroy every resource of an instance, in reverse dependency order, and watch the
    /// operation to its end.
    ///
    /// Progress and --request-id as for `trellis deploy`. --format json prints
    /// {"operation": {...}, "events": N} (docs/cli.md).
    ///
    /// Exit codes: 0 destroyed; 1 the operation failed, was cancelled or interrupted, or
    /// another operation holds the instance; 2 usage error, unknown instance, or the engine
    /// cannot be reached.
    Destroy(DestroyArgs),
    /// List the engine's instances: name, status, version and id.
    ///
    /// --format json prints {"instances": [{"name", "id", "status", "version"}]}.
    ///
    /// Exit codes: 0 listed; 2 the engine cannot be reached.
    Instances(InstancesArgs),
    /// Show an instance: its status, resources (name, type, status) and exports.
    ///
    /// --format json prints the whole state: {"name", "id", "status", "version",
    /// "resources": {NAME: {"type", "status", "spec", "state", ...}}, "links", "exports"}
    /// (docs/cli.md).
    ///
    /// Exit codes: 0 shown; 2 unknown instance, or the engine cannot be reached.
    Instance(InstanceArgs),
    /// Print the events of an instance, oldest first; with --follow, keep printing new ones.
    ///
    /// Each line shows the sequence number, the time, the kind and the resource. --after SEQ
    /// starts after that sequence number, so a script that remembers the last number it saw
    /// resumes without missing or repeating anything. --format json prints JSON Lines:
    /// {"seq", "kind", "at", "operationId", "payload"} per event.
    ///
    /// Exit codes: 0 done; 2 unknown instance, or the engine cannot be reached.
    Events(EventsArgs),
    /// Read every resource of an instance through its provider and compare with state.
    ///
    /// Prints each drifted resource (changed, missing, or unresolved after a crash) with its
    /// field differences (state → found), and the resources that could not be read.
    /// --format json prints {"instance", "drifted", "resources": [...], "errors": [...]}.
    ///
    /// Exit codes: 0 no drift; 3 drift found; 1 no drift found but some resources could not
    /// be read; 2 unknown instance, or the engine cannot be reached.
    Drift(DriftArgs),
    /// Resolve drift or an interrupted operation, and watch the operation to its end.
    ///
    /// --mode accept records what exists as the new state; --mode reapply applies the recorded
    /// spec again, recreating what is missing. --resource limits it to some resources
    /// (default: every drifted or unresolved one). Progress, --request-id and --format json
    /// as for `trellis destroy`.
    ///
    /// Exit codes: as for `trellis destroy`.
    Reconcile(ReconcileArgs),
    /// Adopt an existing resource into an instance, and print how the blueprint declares it.
    ///
    /// The provider of --type reads the resource by --id (the forms each type accepts are in
    /// `trellis plugins describe`'s type descriptions and docs/import.md; a `local/file` id is
    /// its path), and the instance (created if new) records it under NAME as the provider
    /// found it. Nothing is changed outside the engine. Prints, as YAML on stdout, the
    /// `resources:` entry the blueprint should carry: with exactly that spec the next plan
    /// shows no change for NAME. Until the blueprint declares NAME, a deploy of it plans to
    /// delete the resource, as it would any resource the blueprint no longer has.
    ///
    /// Secrets the provider reports print as `(sensitive)` unless --reveal-secrets (admin role
    /// on an engine with authentication); declare them with secret variables. --env gives the
    /// provider settings for an instance that records none yet. --format json prints
    /// {"operation": {...}, "resource": {"name", "type", "externalId", "spec", "state"},
    /// "events": N}.
    ///
    /// Exit codes: 0 imported; 1 refused or failed (a type that cannot be imported, a bad
    /// name, no such resource, another operation holds the instance); 2 the instance has the
    /// name or the resource already, usage error, or the engine cannot be reached.
    Import(ImportArgs),
    /// Ask a running operation to stop at its next safe point, and print it.
    ///
    /// No provider call is abandoned half-way: the operation ends CANCELLED shortly after.
    /// --format json prints {"operation": {...}}.
    ///
    /// Exit codes: 0 requested; 1 the engine refused (e.g. the operation already ended);
    /// 2 unknown operation, or the engine cannot be reached.
    Cancel(CancelArgs),
    /// Copy the engine's whole state to FILE while the engine runs (needs an admin token for
    /// every instance on an engine with authentication).
    ///
    /// The engine takes a consistent copy (SQLite's online backup: deploys go on meanwhile) and
    /// sends it; FILE is written owner-only, checked against the engine's SHA-256, and appears
    /// only when whole. To restore, stop the engine and put FILE in its data directory as
    /// `state.db` (docs/state.md). --format json prints {"backup": {"file", "bytes",
    /// "sha256"}}.
    ///
    /// Exit codes: 0 written; 1 the copy did not arrive whole (FILE untouched); 2 FILE cannot
    /// be written, the token may not take backups, or the engine cannot be reached.
    Backup(BackupArgs),
}

/// Where the engine is and how to print; shared by every client command.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// The engine's address: `http://host:port`, `https://host:port`, `host:port` or
    /// `unix:/path/to/socket`.
    #[arg(long, value_name = "ADDR", env = "TRELLIS_ENGINE", default_value = DEFAULT_ENGINE)]
    pub engine: String,
    /// A PEM file of CA certificates to trust for an `https://` engine, besides the system's
    /// (for a self-signed certificate or a private CA).
    #[arg(long, value_name = "FILE", env = "TRELLIS_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// A file holding the token for an engine with authentication (docs/auth.md); without it
    /// the token comes from TRELLIS_TOKEN. There is no flag taking the token itself.
    #[arg(long, value_name = "FILE", env = "TRELLIS_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Output format: human text, or one JSON document on stdout (shapes in docs/cli.md).
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
}

/// The idempotency key of a mutation.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RequestIdArgs {
    /// Idempotency key: a retry with the same id returns what the first attempt recorded (its
    /// change set, its operation) instead of planning or starting again. Default: a new random
    /// id.
    #[arg(long, value_name = "ID", env = "TRELLIS_REQUEST_ID")]
    pub request_id: Option<String>,
}

impl RequestIdArgs {
    /// The id given, if any (an empty environment variable counts as none).
    fn given(&self) -> Option<&str> {
        self.request_id.as_deref().filter(|s| !s.is_empty())
    }

    fn resolve(&self) -> String {
        self.given()
            .map_or_else(|| trellis_ids::new_id("req"), str::to_owned)
    }
}

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The blueprint file (YAML, or JSON for .json/.jsonc).
    #[arg(value_name = "FILE")]
    pub file: String,
    /// The instance to plan for; recorded with its first change set.
    #[arg(long, value_name = "NAME")]
    pub instance: String,
    /// A variable value, parsed to the variable's declared type.
    #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_var)]
    pub vars: Vec<(String, String)>,
    #[command(flatten)]
    pub inputs: crate::cli::inputs::InputArgs,
    #[command(flatten)]
    pub request: RequestIdArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(clap::Args, Debug)]
pub struct DeployArgs {
    /// The blueprint file to plan and deploy.
    #[arg(
        value_name = "FILE",
        required_unless_present = "change_set",
        conflicts_with = "change_set",
        requires = "instance"
    )]
    pub file: Option<String>,
    /// The instance to deploy to; recorded with its first change set.
    #[arg(long, value_name = "NAME", conflicts_with = "change_set")]
    pub instance: Option<String>,
    /// A variable value, parsed to the variable's declared type.
    #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_var, conflicts_with = "change_set")]
    pub vars: Vec<(String, String)>,
    /// `--env` and `--var-file` (not with --change-set: its plan already has its inputs).
    #[command(flatten)]
    pub inputs: crate::cli::inputs::InputArgs,
    /// Execute this change set (from `trellis plan`) instead of planning FILE.
    #[arg(long, value_name = "ID")]
    pub change_set: Option<String>,
    /// On failure, return the instance to its state before this deploy.
    #[arg(long)]
    pub rollback_on_failure: bool,
    /// When another operation holds the instance, wait for it (and for the requests that
    /// waited before this one, in order) instead of failing; `--wait=DURATION` (`90s`, `10m`,
    /// `1h`) gives up after that long, bare `--wait` waits as long as it takes.
    #[arg(long, value_name = "DURATION", num_args = 0..=1, require_equals = true,
          default_missing_value = wait::FOREVER, value_parser = wait::parse)]
    pub wait: Option<wait::WaitFor>,
    #[command(flatten)]
    pub request: RequestIdArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(clap::Args, Debug)]
pub struct DestroyArgs {
    /// The instance to destroy.
    #[arg(long, value_name = "NAME")]
    pub instance: String,
    /// When another operation holds the instance, wait for it (and for the requests that
    /// waited before this one, in order) instead of failing; `--wait=DURATION` (`90s`, `10m`,
    /// `1h`) gives up after that long, bare `--wait` waits as long as it takes.
    #[arg(long, value_name = "DURATION", num_args = 0..=1, require_equals = true,
          default_missing_value = wait::FOREVER, value_parser = wait::parse)]
    pub wait: Option<wait::WaitFor>,
    #[command(flatten)]
    pub request: RequestIdArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(clap::Args, Debug)]
pub struct InstancesArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(clap::Args, Debug)]
pub struct InstanceArgs {
    /// The instance's name.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Print secrets (exports, specs and states derived from a secret) in clear instead of
    /// `(sensitive)`. On an engine with authentication this needs the admin role.
    #[arg(long)]
    pub reveal_secrets: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(clap::Args, Debug)]
pub struct EventsArgs {
    /// The instance whose events to print.
    #[arg(long, value_name = "NAME")]
    pub instance: String,
    /// Keep the stream open and print new events as they happen (until Ctrl-C).
    #[arg(long)]
    pub follow: bool,
    /// Only events after this sequence number (the last one seen, to resume).
    #[arg(long, value_name = "SEQ", default_value_t = 0)]
    pub after: u64,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(clap::Args, Debug)]
pub struct DriftArgs {
    /// The instance to check.
    #[arg(long, value_name = "NAME")]
    pub instance: String,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReconcileModeArg {
    /// Record what exists as the new state.
    Accept,
    /// Apply the recorded spec again.
    Reapply,
}

impl ReconcileModeArg {
    fn to_pb(self) -> pb::ReconcileMode {
        match self {
            Self::Accept => pb::ReconcileMode::AcceptExternal,
            Self::Reapply => pb::ReconcileMode::Reapply,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct ReconcileArgs {
    /// The instance to reconcile.
    #[arg(long, value_name = "NAME")]
    pub instance: String,
    /// Accept what exists, or re-apply the recorded spec.
    #[arg(long, value_enum)]
    pub mode: ReconcileModeArg,
    /// Only this resource (repeatable; default: every drifted or unresolved one).
    #[arg(long = "resource", value_name = "NAME")]
    pub resources: Vec<String>,
    #[command(flatten)]
    pub request: RequestIdArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// The resource's name in the instance and the blueprint.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The instance to record it in (created if it does not exist).
    #[arg(long, value_name = "INSTANCE")]
    pub instance: String,
    /// The resource type, e.g. `local/file` or `aws/s3/bucket`; its provider must declare it
    /// importable.
    #[arg(long = "type", value_name = "TYPE")]
    pub resource_type: String,
    /// The resource's id, in a form its type accepts: a path, a name, a URL, an ARN.
    #[arg(long, value_name = "EXTERNAL_ID")]
    pub id: String,
    /// An environment file whose provider settings the read uses (and the new instance
    /// records), as for `trellis plan --env`.
    #[arg(long = "env", value_name = "FILE")]
    pub env: Option<PathBuf>,
    /// Print secret values the provider reports in clear instead of `(sensitive)`. On an
    /// engine with authentication this needs the admin role.
    #[arg(long)]
    pub reveal_secrets: bool,
    #[command(flatten)]
    pub request: RequestIdArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

#[derive(clap::Args, Debug)]
pub struct CancelArgs {
    /// The operation to cancel (printed by deploy, destroy and reconcile).
    #[arg(value_name = "OPERATION_ID")]
    pub operation_id: String,
    #[command(flatten)]
    pub request: RequestIdArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

fn parse_var(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected NAME=VALUE, got `{s}`")),
    }
}

impl ClientCommand {
    fn engine_args(&self) -> &EngineArgs {
        match self {
            Self::Plan(a) => &a.engine,
            Self::Deploy(a) => &a.engine,
            Self::Destroy(a) => &a.engine,
            Self::Instances(a) => &a.engine,
            Self::Instance(a) => &a.engine,
            Self::Events(a) => &a.engine,
            Self::Drift(a) => &a.engine,
            Self::Reconcile(a) => &a.engine,
            Self::Import(a) => &a.engine,
            Self::Cancel(a) => &a.engine,
            Self::Backup(a) => &a.engine,
        }
    }
}

/// Runs a client command to its exit code (0 ok, 1 failed, 2 could not run, 3 drift).
pub fn run(command: ClientCommand) -> ExitCode {
    let format = command.engine_args().format;
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(dispatch(command)) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            report_failure(&failure, format);
            ExitCode::from(failure.exit)
        }
    }
}

async fn dispatch(command: ClientCommand) -> Result<u8, Failure> {
    let engine = command.engine_args().engine.clone();
    let engine = if engine.is_empty() {
        DEFAULT_ENGINE.to_owned()
    } else {
        engine
    };
    // Read local inputs before connecting: a typo in a path is reported as such, not hidden
    // behind a connection error.
    let source = match &command {
        ClientCommand::Plan(a) => Some(blueprint_source(&a.file)?),
        ClientCommand::Deploy(DeployArgs {
            file: Some(file), ..
        }) => Some(blueprint_source(file)?),
        _ => None,
    };
    let ca_cert = command.engine_args().ca_cert.clone();
    let token = BearerToken::from_args(command.engine_args().token_file.as_deref())?;
    let mut client = Client {
        api: connect_with(&engine, ca_cert.as_deref(), token).await?,
        engine,
    };
    match command {
        ClientCommand::Plan(a) => plan(&mut client, &a, source.unwrap_or_default()).await,
        ClientCommand::Deploy(a) => deploy(&mut client, &a, source).await,
        ClientCommand::Destroy(a) => destroy(&mut client, &a).await,
        ClientCommand::Instances(a) => instances(&mut client, &a).await,
        ClientCommand::Instance(a) => instance(&mut client, &a).await,
        ClientCommand::Events(a) => events(&mut client, &a).await,
        ClientCommand::Drift(a) => drift(&mut client, &a).await,
        ClientCommand::Reconcile(a) => reconcile(&mut client, &a).await,
        ClientCommand::Import(a) => import(&mut client, &a).await,
        ClientCommand::Cancel(a) => cancel(&mut client, &a).await,
        ClientCommand::Backup(a) => backup::backup(&mut client, &a).await,
    }
}

// ---- command implementations ------------------------------------------------------------------

async fn plan(
    client: &mut Client,
    args: &PlanArgs,
    source: pb::BlueprintSource,
) -> Result<u8, Failure> {
    let request_id = args.request.resolve();
    let sent = sent_files(&source);
    let inputs = crate::cli::inputs::resolve(&args.inputs, &args.vars).map_err(Failure::usage)?;
    let cs = create_change_set(client, &request_id, &args.instance, source, &inputs).await?;
    match args.engine.format {
        OutputFormat::Json => emit_json(&json!({ "changeSet": change_set_json(&cs) }))?,
        OutputFormat::Text if is_invalid(&cs) => emit(&invalid_plan_text(&cs, &sent))?,
        OutputFormat::Text => emit(&plan_text(&cs, true))?,
    }
    Ok(plan_exit_code(&cs))
}

/// `message` with the `x-request-id` header set to its request id, so the engine's log lines
/// for the call carry the id a CI log shows.
fn traced<T>(request_id: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Ok(value) = request_id.parse() {
        request
            .metadata_mut()
            .insert(crate::serve::REQUEST_ID_HEADER, value);
    }
    request
}

/// Plans `source`. When the engine answers that the blueprint names local assets the request
/// lacks (a function's code directory), they are read here and the plan is asked again: each
/// round sends what the last one found missing (a child blueprint's assets show only once
/// its parent's are there), never the same path twice.
async fn create_change_set(
    client: &mut Client,
    request_id: &str,
    instance: &str,
    mut source: pb::BlueprintSource,
    inputs: &crate::cli::inputs::Resolved,
) -> Result<pb::ChangeSet, Failure> {
    let mut used = 0usize;
    // A round per level of included blueprints, at most.
    for _ in 0..=crate::engine::children::MAX_DEPTH + 1 {
        let request = pb::CreateChangeSetRequest {
            request_id: request_id.to_owned(),
            instance: instance.to_owned(),
            source: Some(source.clone()),
            variables: inputs.variables.clone(),
            environment: inputs.environment_pb(),
        };
        let cs = match client
            .api
            .create_change_set(traced(request_id, request))
            .await
        {
            Ok(r) => r.into_inner(),
            Err(s) => return Err(client.fail(s)),
        };
        let Some(pb::blueprint_source::Source::Inline(inline)) = source.source.as_mut() else {
            return Ok(cs);
        };
        let wanted: Vec<&String> = cs
            .missing_assets
            .iter()
            .filter(|p| !inline.assets.iter().any(|a| &a.path == *p))
            .collect();
        if wanted.is_empty() {
            return Ok(cs);
        }
        for path in wanted {
            inline.assets.push(assets::read(path, &mut used)?);
        }
    }
    Err(Failure::new(
        1,
        "INVALID_ARGUMENT",
        "the engine kept asking for more local assets; stopped",
    ))
}

async fn deploy(
    client: &mut Client,
    args: &DeployArgs,
    source: Option<pb::BlueprintSource>,
) -> Result<u8, Failure> {
    let format = args.engine.format;
    if args.change_set.is_some() && !args.inputs.is_empty() {
        return Err(Failure::usage(
            "--env and --var-file cannot be used with --change-set: the change set was planned with its inputs",
        ));
    }
    let request_id = args.request.resolve();
    let mut planned = None;
    let operation = match (&args.change_set, source, &args.instance) {
        (Some(change_set_id), _, _) => {
            let waiting = Waiting::new(args.wait, None);
            execute(
                client,
                &request_id,
                change_set_id,
                args.rollback_on_failure,
                &waiting,
            )
            .await?
        }
        (None, Some(source), Some(instance)) => {
            // A retry of `deploy FILE` must not plan and deploy a second time: when the first
            // attempt got as far as executing, follow that operation.
            let earlier = match args.request.given() {
                Some(id) => find_operation_by_request(client, instance, id).await?,
                None => None,
            };
            if let Some(op) = earlier {
                eprintln!(
                    "request {} already started operation {}; following it",
                    op.request_id, op.id
                );
                planned = get_change_set(client, &op.change_set_id).await;
                op
            } else {
                // The same id: a retry that had got as far as planning gets that plan back.
                let sent = sent_files(&source);
                let inputs = crate::cli::inputs::resolve(&args.inputs, &args.vars)
                    .map_err(Failure::usage)?;
                let waiting = Waiting::new(args.wait, Some(instance.clone()));
                let mut plan_id = request_id.clone();
                let mut round = 0;
                loop {
                    let cs = create_change_set(client, &plan_id, instance, source.clone(), &inputs)
                        .await?;
                    if format == OutputFormat::Text {
                        if is_invalid(&cs) {
                            emit(&invalid_plan_text(&cs, &sent))?;
                        } else {
                            emit(&plan_text(&cs, false))?;
                        }
                    }
                    if plan_exit_code(&cs) != 0 {
                        if format == OutputFormat::Json {
                            let doc = json!({
                                "operation": null,
                                "changeSet": change_set_json(&cs),
                                "events": 0,
                            });
                            emit_json(&doc)?;
                        }
                        return Ok(1);
                    }
                    match execute(
                        client,
                        &request_id,
                        &cs.id,
                        args.rollback_on_failure,
                        &waiting,
                    )
                    .await
                    {
                        Ok(op) => {
                            planned = Some(cs);
                            break op;
                        }
                        // What this deploy waited behind changed the instance: its plan is
                        // stale, and the file is planned again against the state now (a new
                        // plan request id: the first one names the stale change set).
                        Err(f)
                            if args.wait.is_some()
                                && f.code == "FAILED_PRECONDITION"
                                && round < MAX_REPLANS =>
                        {
                            round += 1;
                            plan_id = format!("{request_id}.replan{round}");
                            eprintln!(
                                "the instance changed while this deploy waited (change set {} \
                                 can no longer run): planning {FILE} again",
                                cs.id,
                                FILE = args.file.as_deref().unwrap_or("the blueprint")
                            );
                        }
                        Err(f) => return Err(f),
                    }
                }
            }
        }
        // clap requires FILE and --instance together unless --change-set is given.
        _ => {
            return Err(Failure::usage(
                "give FILE --instance NAME, or --change-set ID",
            ));
        }
    };
    // With `--change-set` the change set is not fetched: for a large plan that costs the
    // engine more than the first resources, and the engine's `operation.started` event says
    // how many resources change (events name their types).
    let cs = planned;
    let total = cs.as_ref().map(changed_resources);
    let watch = Watched {
        total,
        plan: cs.as_ref(),
        plan_in_output: args.change_set.is_none(),
    };
    follow_operation(client, operation, watch, format).await
}

/// Plans a `deploy FILE --wait` makes again when what it waited behind made its plan stale;
/// each stale plan means another operation finished first.
const MAX_REPLANS: u32 = 10;

/// A command's `--wait`: how long, counted from the command's start.
struct Waiting {
    wait: Option<wait::WaitFor>,
    since: Instant,
    instance: Option<String>,
}

impl Waiting {
    fn new(wait: Option<wait::WaitFor>, instance: Option<String>) -> Waiting {
        Waiting {
            wait,
            since: Instant::now(),
            instance,
        }
    }

    /// What the request carries; `Err` when a deadline is used up already.
    fn request(&self) -> Result<Option<pb::Wait>, Failure> {
        match self.wait {
            None => Ok(None),
            Some(w) => wait::remaining(w, self.since).map(Some).ok_or_else(|| {
                Failure::new(
                    1,
                    "ABORTED",
                    format!(
                        "the instance stayed busy: --wait's time ran out (waited {}s)",
                        self.since.elapsed().as_secs()
                    ),
                )
            }),
        }
    }
}

/// Sends `call` (a request that may wait for its turn); while it waits, says where it stands.
async fn waiting_call<T>(
    client: &Client,
    waiting: &Waiting,
    change_set_id: Option<&str>,
    request_id: &str,
    call: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<T, tonic::Status> {
    if waiting.wait.is_none() {
        return call.await;
    }
    let announce = wait::announce(
        client.api.clone(),
        waiting.instance.clone(),
        change_set_id.map(str::to_owned),
        request_id.to_owned(),
    );
    tokio::pin!(call);
    tokio::select! {
        r = &mut call => r,
        () = announce => call.await,
    }
}

async fn execute(
    client: &mut Client,
    request_id: &str,
    change_set_id: &str,
    rollback_on_failure: bool,
    waiting: &Waiting,
) -> Result<pb::Operation, Failure> {
    let request = pb::ExecuteChangeSetRequest {
        request_id: request_id.to_owned(),
        change_set_id: change_set_id.to_owned(),
        rollback_on_failure,
        wait: waiting.request()?,
    };
    let mut api = client.api.clone();
    let call = api.execute_change_set(traced(request_id, request));
    match waiting_call(client, waiting, Some(change_set_id), request_id, call).await {
        Ok(r) => Ok(r.into_inner()),
        Err(s) => Err(client.fail(s)),
    }
}

async fn get_change_set(client: &mut Client, id: &str) -> Option<pb::ChangeSet> {
    if id.is_empty() {
        return None;
    }
    let request = pb::GetChangeSetRequest {
        change_set_id: id.to_owned(),
    };
    client
        .api
        .get_change_set(request)
        .await
        .ok()
        .map(|r| r.into_inner())
}

/// The instance's operation started with `request_id`, if any (none when the instance does
/// not exist yet).
async fn find_operation_by_request(
    client: &mut Client,
    instance: &str,
    request_id: &str,
) -> Result<Option<pb::Operation>, Failure> {
    let request = pb::ListOperationsRequest {
        instance: instance.to_owned(),
    };
    match client.api.list_operations(request).await {
        Ok(r) => Ok(r
            .into_inner()
            .operations
            .into_iter()
            .find(|op| op.request_id == request_id)),
        Err(s) if s.code() == Code::NotFound => Ok(None),
        Err(s) => Err(client.fail(s)),
    }
}

/// Resources the change set touches: what the progress line counts to.
fn changed_resources(cs: &pb::ChangeSet) -> usize {
    cs.resources
        .iter()
        .filter(|r| r.action() != pb::ChangeAction::NoChange)
        .count()
}

async fn destroy(client: &mut Client, args: &DestroyArgs) -> Result<u8, Failure> {
    // The engine announces how many resources go in the operation's first event, which sizes
    // the progress line (reading the whole instance for it would cost as much as a plan).
    let request_id = args.request.resolve();
    let waiting = Waiting::new(args.wait, Some(args.instance.clone()));
    let request = pb::DestroyRequest {
        request_id: request_id.clone(),
        instance: args.instance.clone(),
        wait: waiting.request()?,
    };
    let mut api = client.api.clone();
    let call = api.destroy(traced(&request_id, request));
    let op = match waiting_call(client, &waiting, None, &request_id, call).await {
        Ok(r) => r.into_inner(),
        Err(s) => return Err(client.fail(s)),
    };
    follow_operation(client, op, Watched::default(), args.engine.format).await
}

async fn reconcile(client: &mut Client, args: &ReconcileArgs) -> Result<u8, Failure> {
    let request_id = args.request.resolve();
    let request = pb::ReconcileRequest {
        request_id: request_id.clone(),
        instance: args.instance.clone(),
        mode: args.mode.to_pb() as i32,
        resources: args.resources.clone(),
    };
    let op = match client.api.reconcile(traced(&request_id, request)).await {
        Ok(r) => r.into_inner(),
        Err(s) => return Err(client.fail(s)),
    };
    let sizing = (!args.resources.is_empty()).then_some(args.resources.len());
    follow_operation(client, op, Watched::sized(sizing), args.engine.format).await
}

async fn import(client: &mut Client, args: &ImportArgs) -> Result<u8, Failure> {
    let format = args.engine.format;
    let inputs = crate::cli::inputs::InputArgs {
        env: args.env.clone(),
        var_files: Vec::new(),
    };
    let inputs = crate::cli::inputs::resolve(&inputs, &[]).map_err(Failure::usage)?;
    let request_id = args.request.resolve();
    let request = pb::ImportResourceRequest {
        request_id: request_id.clone(),
        instance: args.instance.clone(),
        name: args.name.clone(),
        resource_type: args.resource_type.clone(),
        external_id: args.id.clone(),
        environment: inputs.environment_pb(),
    };
    let op = match client
        .api
        .import_resource(traced(&request_id, request))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => return Err(client.fail(s)),
    };
    let started = Instant::now();
    let (done, events) = watch_to_end(client, op, Watched::sized(Some(1)), format).await?;
    if done.status() != pb::OperationStatus::Succeeded {
        match format {
            OutputFormat::Json => {
                emit_json(&json!({ "operation": operation_json(&done), "events": events }))?
            }
            OutputFormat::Text => emit(&operation_text(&done, started.elapsed()))?,
        }
        return Ok(operation_exit_code(&done));
    }
    let inst = fetch_instance(client, &args.instance, args.reveal_secrets).await?;
    let Some(resource) = inst.resources.iter().find(|r| r.name == args.name) else {
        return Err(Failure::new(
            1,
            "NOT_FOUND",
            format!(
                "the import succeeded, but instance `{}` no longer has `{}` (another operation removed it)",
                args.instance, args.name
            ),
        ));
    };
    match format {
        OutputFormat::Json => emit_json(&json!({
            "operation": operation_json(&done),
            "resource": imported_json(resource),
            "events": events,
        }))?,
        OutputFormat::Text => emit(&imported_yaml(&inst.name, resource))?,
    }
    Ok(0)
}

async fn cancel(client: &mut Client, args: &CancelArgs) -> Result<u8, Failure> {
    let request_id = args.request.resolve();
    let request = pb::CancelOperationRequest {
        request_id: request_id.clone(),
        operation_id: args.operation_id.clone(),
    };
    let op = match client
        .api
        .cancel_operation(traced(&request_id, request))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => return Err(client.fail(s)),
    };
    match args.engine.format {
        OutputFormat::Json => emit_json(&json!({ "operation": operation_json(&op) }))?,
        OutputFormat::Text => emit(&cancel_text(&op))?,
    }
    Ok(0)
}

async fn instances(client: &mut Client, args: &InstancesArgs) -> Result<u8, Failure> {
    let list = match client.api.list_instances(pb::ListInstancesRequest {}).await {
        Ok(r) => r.into_inner(),
        Err(s) => return Err(client.fail(s)),
    };
    match args.engine.format {
        OutputFormat::Json => emit_json(&instances_json(&list))?,
        OutputFormat::Text => emit(&instances_text(&list))?,
    }
    Ok(0)
}

/// An instance as the engine shows it; with `reveal`, its secrets in clear (admin role).
async fn fetch_instance(
    client: &mut Client,
    name: &str,
    reveal: bool,
) -> Result<pb::Instance, Failure> {
    let request = pb::GetInstanceRequest {
        instance: name.to_owned(),
        reveal_secrets: reveal,
    };
    let mut inst = match client.api.get_instance(request).await {
        Ok(r) => r.into_inner(),
        Err(s) => return Err(client.fail(s)),
    };
    if reveal {
        reveal_instance(&mut inst);
    }
    Ok(inst)
}

async fn instance(client: &mut Client, args: &InstanceArgs) -> Result<u8, Failure> {
    let inst = fetch_instance(client, &args.name, args.reveal_secrets).await?;
    match args.engine.format {
        OutputFormat::Json => emit_json(&instance_json(&inst))?,
        OutputFormat::Text => emit(&instance_text(&inst))?,
    }
    Ok(0)
}

async fn drift(client: &mut Client, args: &DriftArgs) -> Result<u8, Failure> {
    let request = pb::CheckDriftRequest {
        instance: args.instance.clone(),
    };
    let report = match client.api.check_drift(request).await {
        Ok(r) => r.into_inner(),
        Err(s) => return Err(client.fail(s)),
    };
    match args.engine.format {
        OutputFormat::Json => emit_json(&drift_json(&report))?,
        OutputFormat::Text => emit(&drift_text(&report))?,
    }
    Ok(drift_exit_code(&report))
}

async fn events(client: &mut Client, args: &EventsArgs) -> Result<u8, Failure> {
    let target = WatchTarget::Instance {
        name: args.instance.clone(),
        follow: args.follow,
    };
    let mut sink = EventPrinter::new(args.engine.format);
    watch(client, &target, args.after, &mut sink).await?;
    Ok(0)
}

/// What a followed operation's display and result know besides the operation.
#[derive(Default)]
struct Watched<'a> {
    /// Resources the operation touches, if known.
    total: Option<usize>,
    /// The change set it executes, if known.
    plan: Option<&'a pb::ChangeSet>,
    /// Print the change set in the JSON result (`deploy FILE`).
    plan_in_output: bool,
}

impl Watched<'_> {
    fn sized(total: Option<usize>) -> Self {
        Self {
            total,
            ..Self::default()
        }
    }
}

/// Watches `op` to its end, then prints the result.
async fn follow_operation(
    client: &mut Client,
    op: pb::Operation,
    watched: Watched<'_>,
    format: OutputFormat,
) -> Result<u8, Failure> {
    let started = Instant::now();
    let plan = watched.plan.filter(|_| watched.plan_in_output);
    let (done, events) = watch_to_end(client, op, watched, format).await?;
    match format {
        OutputFormat::Json => {
            let mut doc = Map::new();
            doc.insert("operation".into(), operation_json(&done));
            if let Some(cs) = plan {
                doc.insert("changeSet".into(), change_set_json(cs));
            }
            doc.insert("events".into(), json!(events));
            emit_json(&Json::Object(doc))?;
        }
        OutputFormat::Text => emit(&operation_text(&done, started.elapsed()))?,
    }
    Ok(operation_exit_code(&done))
}

/// Watches `op` to its end, showing its progress on stderr; the operation as it ended and
/// how many events it had.
async fn watch_to_end(
    client: &mut Client,
    op: pb::Operation,
    watched: Watched<'_>,
    format: OutputFormat,
) -> Result<(pb::Operation, usize), Failure> {
    if format == OutputFormat::Text {
        eprintln!(
            "{} of {}: operation {} (stop it with `trellis cancel {}`)",
            capitalized(kind_word(&op)),
            op.instance,
            op.id,
            op.id
        );
    }
    let mut progress = Progress::new(kind_word(&op), &op.instance, watched.total);
    if let Some(cs) = watched.plan {
        progress.names.learn_types(cs);
    }
    let mut display = LiveDisplay::new(progress);
    let target = WatchTarget::Operation(op.id.clone());
    let result = watch(client, &target, 0, &mut display).await;
    display.clear();
    let last = result?;
    let request = pb::GetOperationRequest {
        operation_id: op.id.clone(),
    };
    let done = match (client.api.get_operation(request).await, last) {
        (Ok(r), _) => r.into_inner(),
        // The engine may stop right after the operation ends (a drain waits for exactly
        // that): its last event says how it ended.
        (Err(s), Some(last)) if retryable(s.code()) => ended_as(&op, &last),
        (Err(s), _) => return Err(client.fail(s)),
    };
    Ok((done, display.progress.events))
}

// ---- failures and exit codes ------------------------------------------------------------------

/// Why a command stopped, with its exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The process exit code: 1 failed, 2 could not run, 130 interrupted.
    pub exit: u8,
    /// For `--format json`: a gRPC code name (`NOT_FOUND`), `UNREACHABLE`, `USAGE`,
    /// `INTERRUPTED` or `OUTPUT`.
    pub code: String,
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

impl Failure {
    fn new(exit: u8, code: &str, message: impl Into<String>) -> Self {
        Self {
            exit,
            code: code.to_owned(),
            message: message.into(),
        }
    }

    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(2, "USAGE", message)
    }

    /// The documented "cannot reach" message (exit 2).
    pub fn unreachable(engine: &str, detail: &str) -> Self {
        Self::new(
            2,
            "UNREACHABLE",
            format!("cannot reach the engine at {engine}: {detail} (is `trellis serve` running?)"),
        )
    }

    fn output(e: std::io::Error) -> Self {
        // A closed pipe (`trellis events | head`) is the reader's choice, not worth a message.
        let message = if e.kind() == std::io::ErrorKind::BrokenPipe {
            String::new()
        } else {
            format!("cannot write the output: {e}")
        };
        Self::new(2, "OUTPUT", message)
    }
}

/// `NotFound` → `NOT_FOUND`.
fn code_name(code: Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// The message and exit code for an error the engine (or the connection to it) returned.
pub fn status_failure(status: &tonic::Status, engine: &str) -> Failure {
    let msg = status.message().trim();
    let code = status.code();
    let with_default = |default: &str| {
        if msg.is_empty() {
            default.to_owned()
        } else {
            msg.to_owned()
        }
    };
    // tonic reports a connection that broke before any answer (say, plain HTTP/2 to an engine
    // serving TLS) as UNKNOWN with the transport error as its source: that is unreachable too.
    if code == Code::Unknown
        && let Some(source) = std::error::Error::source(status)
    {
        let detail = error_chain(source);
        let hint = if engine.starts_with("https://") {
            ""
        } else {
            " (if the engine serves TLS, use an https:// address)"
        };
        return Failure::new(
            2,
            "UNREACHABLE",
            format!("cannot reach the engine at {engine}: {msg}: {detail}{hint}"),
        );
    }
    let (exit, message) = match code {
        Code::Unavailable => return Failure::unreachable(engine, &with_default("unavailable")),
        Code::NotFound => (2, with_default("not found")),
        // A request id used for another request, or (import) a name the instance has.
        Code::AlreadyExists if !msg.contains("request id") && !msg.is_empty() => {
            (2, msg.to_owned())
        }
        Code::AlreadyExists => (
            2,
            format!(
                "{} (a request id names one request: retry the same request with it, or use a \
                 new --request-id)",
                with_default("the request id was already used for another request")
            ),
        ),
        Code::PermissionDenied | Code::Unauthenticated => (2, with_default("permission denied")),
        Code::FailedPrecondition => (1, with_default("the engine refused the request")),
        Code::Aborted => (
            1,
            format!(
                "{} (another operation holds the instance: wait for it (--wait), or stop it with \
                 `trellis cancel`)",
                with_default("aborted")
            ),
        ),
        // A bad request (an invalid blueprint is an answer: `invalid_plan_text`).
        Code::InvalidArgument => (1, with_default("invalid request")),
        _ => (1, format!("the engine answered {}: {msg}", code_name(code))),
    };
    Failure::new(exit, &code_name(code), message)
}

/// 0 when the operation succeeded, 1 when it failed, was cancelled or interrupted.
pub fn operation_exit_code(op: &pb::Operation) -> u8 {
    u8::from(op.status() != pb::OperationStatus::Succeeded)
}

/// 1 when the blueprint is invalid or the plan has error diagnostics.
pub fn plan_exit_code(cs: &pb::ChangeSet) -> u8 {
    u8::from(
        is_invalid(cs)
            || cs
                .diagnostics
                .iter()
                .any(|d| d.severity() == pb::Severity::Error),
    )
}

/// 3 when drift was found, 1 when none was but some resources could not be read, else 0.
pub fn drift_exit_code(report: &pb::DriftReport) -> u8 {
    if report.drifted {
        3
    } else if !report.errors.is_empty() {
        1
    } else {
        0
    }
}

/// Errors go to stderr; with `--format json`, stdout also gets
/// `{"error": {"code", "message"}}` so it always holds one JSON document.
fn report_failure(failure: &Failure, format: OutputFormat) {
    if failure.message.is_empty() {
        return;
    }
    if failure.message.contains('\n') {
        eprintln!("{}", failure.message.trim_end());
    } else {
        eprintln!("error: {}", failure.message);
    }
    if format == OutputFormat::Json && failure.code != "OUTPUT" {
        let doc = json!({ "error": { "code": failure.code, "message": failure.message } });
        let _ = emit_json(&doc);
    }
}

fn emit(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(Failure::output)
}

fn emit_json(doc: &Json) -> Result<(), Failure> {
    emit(&format!("{doc}\n"))
}

#[cfg(test)]
mod tests;

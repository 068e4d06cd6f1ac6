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

// ---- commands ---------------------------------------------------------------------------------

/// The client commands, flattened into `trellis`'s own subcommands.
#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Plan the changes that bring an instance to a blueprint, without changing anything.
    ///
    /// Sends FILE to the engine (`--engine`), which plans against the instance NAME (recorded
    /// with its first change set) and records a change set. Prints the change set: one block per resource to
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
    /// Ask a running operation to stop at its next safe point, and print it.
    ///
    /// No provider call is abandoned half-way: the operation ends CANCELLED shortly after.
    /// --format json prints {"operation": {...}}.
    ///
    /// Exit codes: 0 requested; 1 the engine refused (e.g. the operation already ended);
    /// 2 unknown operation, or the engine cannot be reached.
    Cancel(CancelArgs),
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
            .map_or_else(|| crate::state::new_id("req"), str::to_owned)
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
    /// Execute this change set (from `trellis plan`) instead of planning FILE.
    #[arg(long, value_name = "ID")]
    pub change_set: Option<String>,
    /// On failure, return the instance to its state before this deploy.
    #[arg(long)]
    pub rollback_on_failure: bool,
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
    /// `(sensitive)`. Once the engine has authentication this will need its own permission.
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
            Self::Cancel(a) => &a.engine,
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
    let mut client = Client {
        api: connect_with(&engine, ca_cert.as_deref()).await?,
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
        ClientCommand::Cancel(a) => cancel(&mut client, &a).await,
    }
}

// ---- connection -------------------------------------------------------------------------------

/// Where the engine listens, from `--engine`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineAddr {
    /// An `http://` URI.
    Http(String),
    /// An `https://` URI: TLS, trusting the system's roots and `--ca-cert`.
    Https(String),
    /// A Unix socket path.
    Unix(PathBuf),
}

/// Parses `http://host:port`, `host:port` (plain HTTP/2), `https://host:port` (TLS) or
/// `unix:/path`.
pub fn parse_engine_addr(addr: &str) -> Result<EngineAddr, String> {
    let addr = addr.trim();
    if let Some(path) = addr.strip_prefix("unix:") {
        // `unix:///run/x.sock` (URI style) and `unix:/run/x.sock` mean the same path.
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() {
            return Err(format!("`{addr}`: the socket path is missing (unix:/path)"));
        }
        return Ok(EngineAddr::Unix(PathBuf::from(path)));
    }
    let (uri, tls) = match addr.split_once("://") {
        Some(("http", _)) => (addr.to_owned(), false),
        Some(("https", _)) => (addr.to_owned(), true),
        Some((scheme, _)) => {
            return Err(format!(
                "`{addr}`: unsupported scheme `{scheme}` (use http://host:port, \
                 https://host:port, host:port or unix:/path)"
            ));
        }
        None if addr.is_empty() => return Err("the engine address is empty".to_owned()),
        None => (format!("http://{addr}"), false),
    };
    match uri.parse::<Uri>() {
        Ok(u) if u.host().is_some_and(|h| !h.is_empty()) => Ok(if tls {
            EngineAddr::Https(uri)
        } else {
            EngineAddr::Http(uri)
        }),
        Ok(_) => Err(format!("`{addr}`: the host is missing")),
        Err(e) => Err(format!("`{addr}` is not a valid address: {e}")),
    }
}

/// Connects to the engine at `addr` (any form [`parse_engine_addr`] accepts). The connection
/// is made now, so an engine that is not there is reported here with the documented message.
pub async fn connect(addr: &str) -> Result<EngineClient<Channel>, Failure> {
    connect_with(addr, None).await
}

/// [`connect`], also trusting the CA certificates in `ca_cert` (PEM) for an `https://`
/// engine. `ca_cert` is not used for the other kinds of address.
pub async fn connect_with(
    addr: &str,
    ca_cert: Option<&std::path::Path>,
) -> Result<EngineClient<Channel>, Failure> {
    let target = parse_engine_addr(addr).map_err(|m| Failure::usage(format!("--engine {m}")))?;
    let connected = match target {
        EngineAddr::Http(uri) => {
            let endpoint = Endpoint::from_shared(uri)
                .map_err(|e| Failure::usage(format!("--engine `{addr}`: {e}")))?;
            endpoint.connect_timeout(CONNECT_TIMEOUT).connect().await
        }
        EngineAddr::Https(uri) => {
            let extra = match ca_cert {
                Some(path) => crate::engine::remote::read_certificates(path)
                    .map_err(|e| Failure::usage(format!("--ca-cert {e}")))?,
                None => Vec::new(),
            };
            let roots = crate::engine::remote::trust_roots(&extra)
                .map_err(|e| Failure::usage(format!("--engine `{addr}`: {e}; pass --ca-cert")))?;
            let tls = ClientTlsConfig::new()
                .trust_anchors(roots.roots)
                .timeout(CONNECT_TIMEOUT);
            let endpoint = Endpoint::from_shared(uri)
                .and_then(|e| e.tls_config(tls))
                .map_err(|e| Failure::usage(format!("--engine `{addr}`: {e}")))?;
            endpoint.connect_timeout(CONNECT_TIMEOUT).connect().await
        }
        EngineAddr::Unix(path) => {
            // The authority is never used for routing over a socket; any valid one will do.
            Endpoint::from_static("http://trellis-engine.invalid")
                .connect_timeout(CONNECT_TIMEOUT)
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                }))
                .await
        }
    };
    let channel = connected.map_err(|e| {
        let detail = error_chain(&e);
        // "transport error" says nothing the caller does not know; its cause does.
        let detail = detail.strip_prefix("transport error: ").unwrap_or(&detail);
        if detail.contains("certificate") {
            // The engine is there; its certificate is not trusted (or not for this name).
            return Failure::new(
                2,
                "UNREACHABLE",
                format!(
                    "cannot reach the engine at {addr}: {detail} (for a self-signed or private \
                     CA certificate, pass --ca-cert FILE or set TRELLIS_CA_CERT)"
                ),
            );
        }
        Failure::unreachable(addr, detail)
    })?;
    Ok(EngineClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// An error and its causes, `a: b: c` (tonic's transport errors say little at the top).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        // Some layers repeat their cause's text in their own.
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

/// The connected API and the address it was reached at (for error messages).
struct Client {
    api: EngineClient<Channel>,
    engine: String,
}

impl Client {
    fn fail(&self, status: tonic::Status) -> Failure {
        status_failure(&status, &self.engine)
    }
}

/// The blueprint as sent to the engine: the file as given, and the files it includes.
fn blueprint_source(path: &str) -> Result<pb::BlueprintSource, Failure> {
    let content = crate::cli::read_limited(path, crate::document::DEFAULT_MAX_INPUT_BYTES)
        .map_err(|e| Failure::usage(format!("cannot read {path}: {e}")))?;
    let children = include_files(path, &content)?;
    Ok(pb::BlueprintSource {
        source: Some(pb::blueprint_source::Source::Inline(pb::InlineBlueprint {
            file_name: path.to_owned(),
            content,
            children,
        })),
    })
}

/// Local files the blueprint includes (and what they include), to send along with it: every
/// include whose `path` is written literally and relative, keyed by its path on this machine
/// as the blueprint's own name gives it (`sub/app.yaml` includes `./a.yaml` as `sub/a.yaml`),
/// which is how the engine looks them up. Paths with `${..}` or absolute ones
/// are resolved by the engine on its host; a file that cannot be read is left for the engine
/// to report where the include is written.
fn include_files(path: &str, content: &[u8]) -> Result<Vec<pb::SourceFile>, Failure> {
    let mut out: Vec<pb::SourceFile> = Vec::new();
    let root_dir = path
        .rfind('/')
        .map_or(String::new(), |i| path[..i].to_owned());
    let mut queue = vec![(root_dir, path.to_owned(), content.to_vec(), 0usize)];
    while let Some((dir, name, bytes, depth)) = queue.pop() {
        if depth > crate::engine::children::MAX_DEPTH {
            continue;
        }
        for literal in literal_includes(&name, bytes) {
            let key = crate::engine::children::normalize(&if dir.is_empty() {
                literal
            } else {
                format!("{dir}/{literal}")
            });
            if key == path || out.iter().any(|f| f.path == key) {
                continue;
            }
            let Ok(child) = std::fs::read(&key) else {
                continue;
            };
            let child_dir = key
                .rfind('/')
                .map_or(String::new(), |i| key[..i].to_owned());
            queue.push((child_dir, key.clone(), child.clone(), depth + 1));
            out.push(pb::SourceFile {
                path: key,
                content: child,
            });
        }
    }
    Ok(out)
}

/// The include paths of a document that are plain relative text (no `${..}`, no scheme).
fn literal_includes(name: &str, bytes: Vec<u8>) -> Vec<String> {
    use crate::subst::Part;
    let mut sources = crate::source::SourceMap::new();
    let mut diags = crate::diag::Diagnostics::default();
    let Some(file) = crate::document::load_bytes(&mut sources, name, bytes, usize::MAX, &mut diags)
    else {
        return Vec::new();
    };
    let format = crate::document::Format::from_path(name);
    let Some(root) = crate::document::parse(&sources, file, format, &mut diags) else {
        return Vec::new();
    };
    let bp = crate::blueprint::load(&root, sources.get(file), file, &mut diags);
    bp.include
        .iter()
        .filter_map(|inc| match inc.path.as_ref()?.parts.as_slice() {
            [Part::Lit(text)] if !text.starts_with('/') && !text.contains("://") => {
                Some(text.clone())
            }
            _ => None,
        })
        .collect()
}

fn variables(vars: &[(String, String)]) -> Vec<pb::Variable> {
    vars.iter()
        .map(|(name, value)| pb::Variable {
            name: name.clone(),
            value: value.clone(),
        })
        .collect()
}

// ---- command implementations ------------------------------------------------------------------

async fn plan(
    client: &mut Client,
    args: &PlanArgs,
    source: pb::BlueprintSource,
) -> Result<u8, Failure> {
    let request_id = args.request.resolve();
    let sent = sent_files(&source);
    let cs = create_change_set(client, &request_id, &args.instance, source, &args.vars).await?;
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
        request.metadata_mut().insert("x-request-id", value);
    }
    request
}

async fn create_change_set(
    client: &mut Client,
    request_id: &str,
    instance: &str,
    source: pb::BlueprintSource,
    vars: &[(String, String)],
) -> Result<pb::ChangeSet, Failure> {
    let request = pb::CreateChangeSetRequest {
        request_id: request_id.to_owned(),
        instance: instance.to_owned(),
        source: Some(source),
        variables: variables(vars),
    };
    match client
        .api
        .create_change_set(traced(request_id, request))
        .await
    {
        Ok(r) => Ok(r.into_inner()),
        Err(s) => Err(client.fail(s)),
    }
}

async fn deploy(
    client: &mut Client,
    args: &DeployArgs,
    source: Option<pb::BlueprintSource>,
) -> Result<u8, Failure> {
    let format = args.engine.format;
    let request_id = args.request.resolve();
    let mut planned = None;
    let operation = match (&args.change_set, source, &args.instance) {
        (Some(change_set_id), _, _) => {
            execute(client, &request_id, change_set_id, args.rollback_on_failure).await?
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
                let cs =
                    create_change_set(client, &request_id, instance, source, &args.vars).await?;
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
                let op = execute(client, &request_id, &cs.id, args.rollback_on_failure).await?;
                planned = Some(cs);
                op
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

async fn execute(
    client: &mut Client,
    request_id: &str,
    change_set_id: &str,
    rollback_on_failure: bool,
) -> Result<pb::Operation, Failure> {
    let request = pb::ExecuteChangeSetRequest {
        request_id: request_id.to_owned(),
        change_set_id: change_set_id.to_owned(),
        rollback_on_failure,
    };
    match client
        .api
        .execute_change_set(traced(request_id, request))
        .await
    {
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
    let request = pb::DestroyRequest {
        request_id: args.request.resolve(),
        instance: args.instance.clone(),
    };
    let op = match client
        .api
        .destroy(traced(&request.request_id.clone(), request))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => return Err(client.fail(s)),
    };
    follow_operation(client, op, Watched::default(), args.engine.format).await
}

async fn reconcile(client: &mut Client, args: &ReconcileArgs) -> Result<u8, Failure> {
    let request = pb::ReconcileRequest {
        request_id: args.request.resolve(),
        instance: args.instance.clone(),
        mode: args.mode.to_pb() as i32,
        resources: args.resources.clone(),
    };
    let op = match client
        .api
        .reconcile(traced(&request.request_id.clone(), request))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => return Err(client.fail(s)),
    };
    let sizing = (!args.resources.is_empty()).then_some(args.resources.len());
    follow_operation(client, op, Watched::sized(sizing), args.engine.format).await
}

async fn cancel(client: &mut Client, args: &CancelArgs) -> Result<u8, Failure> {
    let request = pb::CancelOperationRequest {
        request_id: args.request.resolve(),
        operation_id: args.operation_id.clone(),
    };
    let op = match client
        .api
        .cancel_operation(traced(&request.request_id.clone(), request))
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

async fn instance(client: &mut Client, args: &InstanceArgs) -> Result<u8, Failure> {
    let request = pb::GetInstanceRequest {
        instance: args.name.clone(),
        reveal_secrets: args.reveal_secrets,
    };
    let mut inst = match client.api.get_instance(request).await {
        Ok(r) => r.into_inner(),
        Err(s) => return Err(client.fail(s)),
    };
    if args.reveal_secrets {
        reveal_instance(&mut inst);
    }
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
    let mut sink = EventPrinter {
        format: args.engine.format,
        names: EventNames::default(),
    };
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
    match format {
        OutputFormat::Json => {
            let mut doc = Map::new();
            doc.insert("operation".into(), operation_json(&done));
            if let Some(cs) = watched.plan.filter(|_| watched.plan_in_output) {
                doc.insert("changeSet".into(), change_set_json(cs));
            }
            doc.insert("events".into(), json!(display.progress.events));
            emit_json(&Json::Object(doc))?;
        }
        OutputFormat::Text => emit(&operation_text(&done, started.elapsed()))?,
    }
    Ok(operation_exit_code(&done))
}

// ---- watching ---------------------------------------------------------------------------------

enum WatchTarget {
    Operation(String),
    Instance { name: String, follow: bool },
}

/// `op` as its terminal event (`operation.finished` or `operation.interrupted`) says it ended.
fn ended_as(op: &pb::Operation, last: &pb::Event) -> pb::Operation {
    let p = payload(last);
    let status = match (last.kind.as_str(), p.get("status").and_then(Json::as_str)) {
        ("operation.interrupted", _) => pb::OperationStatus::Interrupted,
        (_, Some("succeeded")) => pb::OperationStatus::Succeeded,
        (_, Some("cancelled")) => pb::OperationStatus::Cancelled,
        (_, Some("interrupted")) => pb::OperationStatus::Interrupted,
        _ => pb::OperationStatus::Failed,
    };
    pb::Operation {
        status: status as i32,
        error: p
            .get("error")
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_owned(),
        ..op.clone()
    }
}

/// What a watch does with what it receives.
trait WatchSink {
    fn event(&mut self, event: &pb::Event) -> Result<(), Failure>;
    /// Called on heartbeats and every second: time passes on the progress line.
    fn refresh(&mut self) {}
}

/// Follows a watch stream until it ends (an operation's last event, or an
/// instance's events so far unless following), reconnecting after transport errors and
/// resuming after the last sequence number seen: the engine promises nothing is missed or
/// repeated. Returns an operation's terminal event when the stream ended on it.
async fn watch(
    client: &mut Client,
    target: &WatchTarget,
    after: u64,
    sink: &mut dyn WatchSink,
) -> Result<Option<pb::Event>, Failure> {
    let mut after = after;
    let mut attempt = 0u32;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let opened = match target {
            WatchTarget::Operation(id) => {
                let request = pb::WatchOperationRequest {
                    operation_id: id.clone(),
                    after_seq: after,
                };
                client.api.watch_operation(request).await
            }
            WatchTarget::Instance { name, follow } => {
                let request = pb::WatchInstanceRequest {
                    instance: name.clone(),
                    after_seq: after,
                    follow: *follow,
                };
                client.api.watch_instance(request).await
            }
        };
        let broken = match opened {
            Ok(response) => {
                let mut stream = response.into_inner();
                let mut heard = Instant::now();
                loop {
                    let item = tokio::select! {
                        item = stream.message() => item,
                        _ = tick.tick() => {
                            if heard.elapsed() > WATCH_IDLE_TIMEOUT {
                                break tonic::Status::unavailable("no heartbeat from the engine");
                            }
                            sink.refresh();
                            continue;
                        }
                        _ = &mut ctrl_c => return interrupted(target),
                    };
                    match item {
                        Ok(Some(response)) => {
                            heard = Instant::now();
                            attempt = 0;
                            match response.item {
                                Some(pb::watch_response::Item::Event(event)) => {
                                    after = after.max(event.seq);
                                    sink.event(&event)?;
                                    if matches!(target, WatchTarget::Operation(_))
                                        && is_last_event(&event.kind)
                                    {
                                        return Ok(Some(event));
                                    }
                                }
                                Some(pb::watch_response::Item::Heartbeat(_)) | None => {
                                    sink.refresh()
                                }
                            }
                        }
                        Ok(None) => match target {
                            WatchTarget::Instance { follow: false, .. } => return Ok(None),
                            // An operation's stream ends after `operation.finished`; ending
                            // before it (the engine shutting down) means: look, then resume.
                            WatchTarget::Operation(id) => {
                                if operation_ended(client, id).await? {
                                    return Ok(None);
                                }
                                break tonic::Status::unavailable("the stream ended early");
                            }
                            WatchTarget::Instance { follow: true, .. } => {
                                break tonic::Status::unavailable("the stream ended");
                            }
                        },
                        Err(status) => break status,
                    }
                }
            }
            Err(status) => status,
        };
        if !retryable(broken.code()) || attempt >= WATCH_RETRIES {
            return Err(client.fail(broken));
        }
        // Backoff 0.25 s, 0.5 s, ... capped at 8 s.
        let delay = Duration::from_millis(250 << attempt.min(5));
        attempt += 1;
        sink.refresh();
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = &mut ctrl_c => return interrupted(target),
        }
    }
}

/// Ctrl-C: the normal end of `events --follow`; for an operation, a note that it goes on.
fn interrupted(target: &WatchTarget) -> Result<Option<pb::Event>, Failure> {
    match target {
        WatchTarget::Operation(id) => Err(Failure::new(
            130,
            "INTERRUPTED",
            format!(
                "stopped watching; operation {id} goes on in the engine (`trellis cancel {id}` \
                 stops it)"
            ),
        )),
        WatchTarget::Instance { .. } => Ok(None),
    }
}

async fn operation_ended(client: &mut Client, id: &str) -> Result<bool, Failure> {
    let request = pb::GetOperationRequest {
        operation_id: id.to_owned(),
    };
    match client.api.get_operation(request).await {
        Ok(r) => Ok(is_terminal(r.into_inner().status())),
        // Unreachable right now: the watch retry decides.
        Err(s) if retryable(s.code()) => Ok(false),
        Err(s) => Err(client.fail(s)),
    }
}

/// The event after which an operation's stream ends.
fn is_last_event(kind: &str) -> bool {
    matches!(kind, "operation.finished" | "operation.interrupted")
}

/// Errors a watch recovers from by reconnecting (the connection, not the request, failed).
fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::Unknown
            | Code::Internal
            | Code::Cancelled
            | Code::DeadlineExceeded
    )
}

fn is_terminal(status: pb::OperationStatus) -> bool {
    use pb::OperationStatus as S;
    matches!(
        status,
        S::Succeeded | S::Failed | S::Cancelled | S::Interrupted
    )
}

/// `trellis events`: every event to stdout.
struct EventPrinter {
    format: OutputFormat,
    names: EventNames,
}

impl WatchSink for EventPrinter {
    fn event(&mut self, event: &pb::Event) -> Result<(), Failure> {
        self.names.learn(event);
        let line = match self.format {
            OutputFormat::Json => event_json(event).to_string(),
            OutputFormat::Text => format!(
                "{:>6}  {}  {}",
                event.seq,
                rfc3339(event.at_unix_ms, false),
                event_line(event, &self.names.types)
            ),
        };
        // Lines go out as they come: `--follow` is read live, through pipes too.
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(Failure::output)
    }
}

/// Resource types seen in a change set or in earlier events: not every event repeats them.
#[derive(Default)]
struct EventNames {
    types: HashMap<String, String>,
}

impl EventNames {
    fn learn(&mut self, event: &pb::Event) {
        let payload = payload(event);
        if let (Some(name), Some(ty)) = (resource_of(&payload), str_field(&payload, "type")) {
            self.types.insert(name.to_owned(), ty.to_owned());
        }
    }

    fn learn_types(&mut self, cs: &pb::ChangeSet) {
        for r in &cs.resources {
            self.types.insert(r.name.clone(), r.resource_type.clone());
        }
    }
}

/// Where a resource event leaves its resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Started,
    Done,
    Failed,
}

/// Classifies `resource.*` event kinds by their verb (docs/engine-api.md lists them), so new
/// kinds count without a list to keep in sync with the engine: `*_requested` starts a resource;
/// `created`, `accepted`, `forgotten`... finish it.
fn resource_phase(kind: &str) -> Option<Phase> {
    let verb = kind.strip_prefix("resource.")?;
    if verb.contains("fail") {
        Some(Phase::Failed)
    } else if verb.ends_with("_requested") || verb.ends_with("ing") || verb == "started" {
        Some(Phase::Started)
    } else if verb.ends_with("ed") || verb.ends_with("en") {
        Some(Phase::Done)
    } else {
        None
    }
}

/// The state of an operation as its events tell it: what the progress line shows.
struct Progress {
    verb: &'static str,
    instance: String,
    total: Option<usize>,
    active: HashSet<String>,
    done: HashSet<String>,
    failed: HashSet<String>,
    events: usize,
    names: EventNames,
}

impl Progress {
    fn new(kind: &str, instance: &str, total: Option<usize>) -> Self {
        let verb = match kind {
            "destroy" => "destroying",
            "reconcile" => "reconciling",
            _ => "deploying",
        };
        Self {
            verb,
            instance: instance.to_owned(),
            total,
            active: HashSet::new(),
            done: HashSet::new(),
            failed: HashSet::new(),
            events: 0,
            names: EventNames::default(),
        }
    }

    /// Takes an event into account; returns its line and whether it finished a resource.
    fn observe(&mut self, event: &pb::Event) -> (String, bool) {
        self.events += 1;
        self.names.learn(event);
        let payload = payload(event);
        // The engine may announce how many resources the operation touches.
        if event.kind == "operation.started"
            && let Some(n) = payload.get("total").and_then(Json::as_u64)
        {
            self.total = Some(n as usize);
        }
        let mut finished = false;
        if let (Some(phase), Some(name)) = (resource_phase(&event.kind), resource_of(&payload)) {
            let name = name.to_owned();
            match phase {
                Phase::Started => {
                    self.done.remove(&name);
                    self.failed.remove(&name);
                    self.active.insert(name);
                }
                Phase::Done => {
                    self.active.remove(&name);
                    self.done.insert(name);
                    finished = true;
                }
                Phase::Failed => {
                    self.active.remove(&name);
                    self.failed.insert(name);
                    finished = true;
                }
            }
        }
        (event_line(event, &self.names.types), finished)
    }

    /// `deploying app: 12/40 resources done, 3 in progress [00:04]`.
    fn status_line(&self, elapsed: Duration) -> String {
        let done = match self.total {
            Some(total) => format!("{}/{total}", self.done.len()),
            None => self.done.len().to_string(),
        };
        let noun = if self.total.unwrap_or(self.done.len()) == 1 {
            "resource"
        } else {
            "resources"
        };
        let mut line = format!(
            "{} {}: {done} {noun} done, {} in progress",
            self.verb,
            self.instance,
            self.active.len()
        );
        if !self.failed.is_empty() {
            line.push_str(&format!(", {} failed", self.failed.len()));
        }
        line.push_str(&format!(" [{}]", clock(elapsed)));
        line
    }
}

/// Progress on stderr: a live status line on a terminal, one line per event otherwise.
struct LiveDisplay {
    progress: Progress,
    tty: bool,
    started: Instant,
    shown: bool,
    width: usize,
}

impl LiveDisplay {
    fn new(progress: Progress) -> Self {
        let tty =
            std::io::stderr().is_terminal() && std::env::var("TERM").map_or(true, |t| t != "dumb");
        let width = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(80usize);
        Self {
            progress,
            tty,
            started: Instant::now(),
            shown: false,
            width,
        }
    }

    fn draw(&mut self, err: &mut impl Write) {
        // A line longer than the terminal wraps, and `\r` would then redraw only its tail.
        let line: String = self
            .progress
            .status_line(self.started.elapsed())
            .chars()
            .take(self.width.saturating_sub(1).max(1))
            .collect();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
        self.shown = true;
    }

    fn clear(&mut self) {
        if self.tty && self.shown {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.shown = false;
        }
    }
}

impl WatchSink for LiveDisplay {
    fn event(&mut self, event: &pb::Event) -> Result<(), Failure> {
        let (line, finished) = self.progress.observe(event);
        let mut err = std::io::stderr().lock();
        if self.tty {
            if finished {
                let _ = writeln!(err, "\r\x1b[2K{line}");
            }
            self.draw(&mut err);
        } else {
            let _ = writeln!(err, "{line}");
        }
        Ok(())
    }

    fn refresh(&mut self) {
        if self.tty {
            self.draw(&mut std::io::stderr().lock());
        }
    }
}

// ---- rendering: names -------------------------------------------------------------------------

/// Drops a proto enum value's prefix: `short("INSTANCE_STATUS_DEPLOYED", "INSTANCE_STATUS")` is
/// `DEPLOYED`.
pub fn short<'a>(name: &'a str, prefix: &str) -> &'a str {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('_'))
        .filter(|rest| !rest.is_empty())
        .unwrap_or(name)
}

fn kind_word(op: &pb::Operation) -> &'static str {
    match op.kind() {
        pb::OperationKind::Destroy => "destroy",
        pb::OperationKind::Reconcile => "reconcile",
        _ => "deploy",
    }
}

fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    chars.next().map_or_else(String::new, |c| {
        c.to_uppercase().chain(chars).collect::<String>()
    })
}

/// Optional text: `null` in JSON when empty.
fn opt_str(s: &str) -> Json {
    if s.is_empty() {
        Json::Null
    } else {
        Json::String(s.to_owned())
    }
}

/// A value as JSON, with the markers `trellis eval --format json` uses: a value known only
/// after deploy is `{"unknown": true}`, a secret `{"sensitive": true}`.
fn value_json(v: Option<&pv::Value>) -> Json {
    use pv::value::Kind;
    let Some(v) = v else { return Json::Null };
    if v.sensitive {
        return json!({ "sensitive": true });
    }
    match &v.kind {
        Some(Kind::Unknown(_)) => json!({ "unknown": true }),
        Some(Kind::List(l)) => Json::Array(l.items.iter().map(|i| value_json(Some(i))).collect()),
        Some(Kind::Map(m)) => Json::Object(
            m.entries
                .iter()
                .map(|e| (e.key.clone(), value_json(e.value.as_ref())))
                .collect(),
        ),
        _ => values::to_json(
            v,
            JsonMarks {
                mask_sensitive: true,
            },
        ),
    }
}

/// Asked for with `--reveal-secrets`: secrets the engine sent with their values print as
/// those values (a masked one, without a value, stays masked).
fn reveal_instance(inst: &mut pb::Instance) {
    fn reveal(v: &mut pv::Value) {
        use pv::value::Kind;
        if v.kind.is_some() {
            v.sensitive = false;
        }
        match &mut v.kind {
            Some(Kind::List(l)) => l.items.iter_mut().for_each(reveal),
            Some(Kind::Map(m)) => m
                .entries
                .iter_mut()
                .filter_map(|e| e.value.as_mut())
                .for_each(reveal),
            _ => {}
        }
    }
    for r in &mut inst.resources {
        r.spec.iter_mut().chain(r.state.iter_mut()).for_each(reveal);
    }
    for l in &mut inst.links {
        l.data.iter_mut().for_each(reveal);
    }
    for e in &mut inst.exports {
        e.value.iter_mut().for_each(reveal);
    }
}

// ---- rendering: JSON --------------------------------------------------------------------------

/// `trellis instance --format json`.
pub fn instance_json(inst: &pb::Instance) -> Json {
    let resources: Map<String, Json> = inst
        .resources
        .iter()
        .map(|r| {
            let v = json!({
                "type": r.resource_type,
                "status": short(r.status().as_str_name(), "RESOURCE_STATUS"),
                "spec": value_json(r.spec.as_ref()),
                "state": value_json(r.state.as_ref()),
                "externalId": opt_str(&r.external_id),
                "dependsOn": r.depends_on,
                "failureReason": opt_str(&r.failure_reason),
            });
            (r.name.clone(), v)
        })
        .collect();
    let links: Vec<Json> = inst
        .links
        .iter()
        .map(|l| {
            json!({
                "resourceA": l.resource_a,
                "resourceB": l.resource_b,
                "linkType": l.link_type,
                "status": short(l.status().as_str_name(), "RESOURCE_STATUS"),
                "data": value_json(l.data.as_ref()),
            })
        })
        .collect();
    let children: Vec<Json> = inst
        .children
        .iter()
        .map(|c| json!({ "name": c.name, "instanceId": c.instance_id }))
        .collect();
    let exports: Map<String, Json> = inst
        .exports
        .iter()
        .map(|e| (e.name.clone(), value_json(e.value.as_ref())))
        .collect();
    json!({
        "name": inst.name,
        "id": inst.id,
        "status": short(inst.status().as_str_name(), "INSTANCE_STATUS"),
        "version": inst.version,
        "resources": resources,
        "links": links,
        "children": children,
        "exports": exports,
    })
}

/// `trellis instances --format json`.
pub fn instances_json(list: &pb::ListInstancesResponse) -> Json {
    let items: Vec<Json> = list
        .instances
        .iter()
        .map(|i| {
            json!({
                "name": i.name,
                "id": i.id,
                "status": short(i.status().as_str_name(), "INSTANCE_STATUS"),
                "version": i.version,
            })
        })
        .collect();
    json!({ "instances": items })
}

fn field_json(f: &pb::FieldChange) -> Json {
    let mut o = Map::new();
    o.insert("path".into(), json!(f.path));
    if let Some(v) = &f.previous {
        o.insert("previous".into(), value_json(Some(v)));
    }
    if let Some(v) = &f.new {
        o.insert("new".into(), value_json(Some(v)));
    }
    o.insert("mustRecreate".into(), json!(f.must_recreate));
    Json::Object(o)
}

fn action_name(action: pb::ChangeAction) -> &'static str {
    short(action.as_str_name(), "CHANGE_ACTION")
}

/// A diagnostic in the shape `trellis validate --format json` uses.
fn diagnostic_json(d: &pb::Diagnostic) -> Json {
    let mut v = json!({
        "severity": severity_word(d),
        "code": d.code,
        "message": d.message,
        "file": d.file,
        "line": d.line,
        "column": d.column,
        "end_line": d.end_line,
        "end_column": d.end_column,
    });
    if !d.hint.is_empty()
        && let Some(o) = v.as_object_mut()
    {
        o.insert("hint".into(), json!(d.hint));
    }
    v
}

fn severity_word(d: &pb::Diagnostic) -> &'static str {
    match d.severity() {
        pb::Severity::Error => "error",
        pb::Severity::Warning => "warning",
        pb::Severity::Info | pb::Severity::Unspecified => "info",
    }
}

fn resources_json(resources: &[pb::ResourceChange]) -> Vec<Json> {
    resources
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "type": r.resource_type,
                "action": action_name(r.action()),
                "fields": r.fields.iter().map(field_json).collect::<Vec<_>>(),
                "reason": opt_str(&r.reason),
                "dependsOn": r.depends_on,
            })
        })
        .collect()
}

fn links_json(links: &[pb::LinkChange]) -> Vec<Json> {
    links
        .iter()
        .map(|l| {
            json!({
                "resourceA": l.resource_a,
                "resourceB": l.resource_b,
                "linkType": l.link_type,
                "action": action_name(l.action()),
            })
        })
        .collect()
}

fn exports_json(exports: &[pb::ExportChange]) -> Vec<Json> {
    exports
        .iter()
        .map(|e| {
            let mut o = Map::new();
            o.insert("name".into(), json!(e.name));
            o.insert("action".into(), json!(action_name(e.action())));
            if let Some(v) = &e.previous {
                o.insert("previous".into(), value_json(Some(v)));
            }
            if let Some(v) = &e.new {
                o.insert("new".into(), value_json(Some(v)));
            }
            Json::Object(o)
        })
        .collect()
}

/// One entry of `children` in the `changeSet` object (nested for the child's own children).
fn child_json(c: &pb::ChildChange) -> Json {
    json!({
        "name": c.name,
        "instance": c.instance,
        "action": action_name(c.action()),
        "plannedVersion": c.planned_version,
        "summary": c.summary,
        "resources": resources_json(&c.resources),
        "links": links_json(&c.links),
        "exports": exports_json(&c.exports),
        "children": c.children.iter().map(child_json).collect::<Vec<_>>(),
        "unknownVariables": c.unknown_variables,
        "deferred": opt_str(&c.deferred),
        "diagnostics": c.diagnostics.iter().map(diagnostic_json).collect::<Vec<_>>(),
    })
}

/// The `changeSet` object of `trellis plan/deploy --format json`.
pub fn change_set_json(cs: &pb::ChangeSet) -> Json {
    json!({
        "id": cs.id,
        "instance": cs.instance,
        "status": short(cs.status().as_str_name(), "CHANGE_SET_STATUS"),
        "plannedVersion": cs.planned_version,
        "digest": cs.digest,
        "summary": cs.summary,
        "resources": resources_json(&cs.resources),
        "links": links_json(&cs.links),
        "exports": exports_json(&cs.exports),
        "diagnostics": cs.diagnostics.iter().map(diagnostic_json).collect::<Vec<_>>(),
        "children": cs.children.iter().map(child_json).collect::<Vec<_>>(),
    })
}

/// The `operation` object of `trellis deploy/destroy/reconcile/cancel --format json`.
pub fn operation_json(op: &pb::Operation) -> Json {
    json!({
        "id": op.id,
        "instance": op.instance,
        "kind": short(op.kind().as_str_name(), "OPERATION_KIND"),
        "status": short(op.status().as_str_name(), "OPERATION_STATUS"),
        "error": opt_str(&op.error),
        "changeSetId": opt_str(&op.change_set_id),
    })
}

/// One line of `trellis events --format json`.
pub fn event_json(event: &pb::Event) -> Json {
    json!({
        "seq": event.seq,
        "kind": event.kind,
        "at": if event.at_unix_ms == 0 { Json::Null } else { json!(rfc3339(event.at_unix_ms, true)) },
        "operationId": opt_str(&event.operation_id),
        "payload": payload(event),
    })
}

/// The event's payload as JSON (`{}` when empty; kept as a string if it is not JSON).
fn payload(event: &pb::Event) -> Json {
    if event.payload_json.trim().is_empty() {
        return json!({});
    }
    serde_json::from_str(&event.payload_json)
        .unwrap_or_else(|_| Json::String(event.payload_json.clone()))
}

fn str_field<'a>(payload: &'a Json, key: &str) -> Option<&'a str> {
    payload
        .get(key)
        .and_then(Json::as_str)
        .filter(|s| !s.is_empty())
}

fn resource_of(payload: &Json) -> Option<&str> {
    str_field(payload, "resource").or_else(|| str_field(payload, "name"))
}

/// `trellis drift --format json`.
pub fn drift_json(report: &pb::DriftReport) -> Json {
    let resources: Vec<Json> = report
        .resources
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "type": r.resource_type,
                "kind": short(r.kind().as_str_name(), "DRIFT_KIND"),
                "fields": r.fields.iter().map(field_json).collect::<Vec<_>>(),
                "detail": opt_str(&r.detail),
            })
        })
        .collect();
    json!({
        "instance": report.instance,
        "drifted": report.drifted,
        "resources": resources,
        "errors": report.errors,
    })
}

// ---- rendering: text --------------------------------------------------------------------------

const UNKNOWN_TEXT: &str = crate::eval::render::UNKNOWN_TEXT;
const SENSITIVE_TEXT: &str = crate::eval::render::SENSITIVE_TEXT;

/// A value on one line: JSON-like, with `(known after deploy)` and `(sensitive)` in place.
pub fn value_text(v: &pv::Value) -> String {
    let mut out = String::new();
    write_value(v, &mut out);
    out
}

fn write_value(v: &pv::Value, out: &mut String) {
    if v.sensitive {
        out.push_str(SENSITIVE_TEXT);
        return;
    }
    match &v.kind {
        None | Some(Kind::Null(_)) => out.push_str("null"),
        Some(Kind::Bool(b)) => out.push_str(if *b { "true" } else { "false" }),
        Some(Kind::Int(i)) => out.push_str(&i.to_string()),
        Some(Kind::Float(f)) => out.push_str(&Json::from(*f).to_string()),
        Some(Kind::String(s)) => out.push_str(&Json::String(s.clone()).to_string()),
        Some(Kind::Unknown(_)) => out.push_str(UNKNOWN_TEXT),
        Some(Kind::List(l)) => {
            out.push('[');
            for (i, item) in l.items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Some(Kind::Map(m)) => {
            out.push('{');
            for (i, e) in m.entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&Json::String(e.key.clone()).to_string());
                out.push_str(": ");
                match &e.value {
                    Some(v) => write_value(v, out),
                    None => out.push_str("null"),
                }
            }
            out.push('}');
        }
    }
}

/// `path: old → new`; `forcing` marks the fields that force a recreate (only meaningful when
/// the resource is recreated: the engine flags immutable fields on creates too).
fn field_text(f: &pb::FieldChange, forcing: bool) -> String {
    let mut line = format!("{}: ", f.path);
    match (&f.previous, &f.new) {
        (Some(old), Some(new)) => {
            line.push_str(&format!("{} → {}", value_text(old), value_text(new)));
        }
        (None, Some(new)) => line.push_str(&value_text(new)),
        (Some(old), None) => line.push_str(&format!("{} → (removed)", value_text(old))),
        (None, None) => line.push_str("(removed)"),
    }
    if forcing && f.must_recreate {
        line.push_str("  (forces recreate)");
    }
    line
}

fn action_sign(action: pb::ChangeAction) -> &'static str {
    match action {
        pb::ChangeAction::Create => "+",
        pb::ChangeAction::Update => "~",
        pb::ChangeAction::Recreate => "-/+",
        pb::ChangeAction::Delete => "-",
        pb::ChangeAction::NoChange | pb::ChangeAction::Unspecified => " ",
    }
}

/// The engine found the blueprint invalid: nothing was planned, `diagnostics` say why.
pub fn is_invalid(cs: &pb::ChangeSet) -> bool {
    cs.status() == pb::ChangeSetStatus::Invalid
}

/// The documents a request sends (to show diagnostics with their source lines); none for a
/// path on the engine host.
fn sent_files(source: &pb::BlueprintSource) -> Vec<(String, Vec<u8>)> {
    match &source.source {
        Some(pb::blueprint_source::Source::Inline(b)) => {
            std::iter::once((b.file_name.clone(), b.content.clone()))
                .chain(
                    b.children
                        .iter()
                        .map(|c| (c.path.clone(), c.content.clone())),
                )
                .collect()
        }
        _ => Vec::new(),
    }
}

/// An invalid blueprint, as `trellis validate` shows one: every diagnostic (with its source
/// line when it is in a document this command sent), then a summary line.
pub fn invalid_plan_text(cs: &pb::ChangeSet, sent: &[(String, Vec<u8>)]) -> String {
    let mut sources = crate::source::SourceMap::new();
    let files: Vec<(&str, crate::source::FileId)> = sent
        .iter()
        .map(|(name, bytes)| {
            let text = String::from_utf8_lossy(bytes).into_owned();
            (name.as_str(), sources.add(name.clone(), text))
        })
        .collect();
    let mut out = String::new();
    for d in &cs.diagnostics {
        let located = files
            .iter()
            .find(|(name, _)| *name == d.file)
            .and_then(|(_, id)| located_diagnostic(d, *id, &sources));
        match located {
            Some(diag) => out.push_str(&crate::diag::render_text(&diag, &sources)),
            None => out.push_str(&diagnostic_text(d)),
        }
        out.push('\n');
    }
    let errors = cs
        .diagnostics
        .iter()
        .filter(|d| d.severity() == pb::Severity::Error)
        .count();
    let warnings = cs.diagnostics.len() - errors;
    out.push_str(&format!(
        "error: the blueprint is invalid: {errors} error{}, {warnings} warning{}; nothing was \
         planned\n",
        plural(errors),
        plural(warnings)
    ));
    out
}

/// `d` as a diagnostic spanning its lines and columns in `file`, to render with its source
/// line; `None` when its code or location does not fit.
fn located_diagnostic(
    d: &pb::Diagnostic,
    file: crate::source::FileId,
    sources: &crate::source::SourceMap,
) -> Option<crate::diag::Diagnostic> {
    use crate::diag::Severity;
    let code = crate::diag::lookup(&d.code)?;
    let text = &sources.get(file).text;
    let start = text_offset(text, d.line, d.column)?;
    let end = text_offset(text, d.end_line, d.end_column)
        .filter(|&e| e >= start)
        .unwrap_or(start);
    Some(crate::diag::Diagnostic {
        severity: match d.severity() {
            pb::Severity::Error => Severity::Error,
            pb::Severity::Warning => Severity::Warning,
            pb::Severity::Info | pb::Severity::Unspecified => Severity::Info,
        },
        code,
        message: d.message.clone(),
        span: crate::source::Span::new(file, start, end),
        hint: (!d.hint.is_empty()).then(|| d.hint.clone()),
    })
}

/// The byte offset of 1-based `line` and `column` (in characters) in `text`, the column
/// capped at the line's end.
fn text_offset(text: &str, line: u32, column: u32) -> Option<usize> {
    if line == 0 || column == 0 {
        return None;
    }
    let mut start = 0;
    for _ in 1..line {
        start += text[start..].find('\n')? + 1;
    }
    let line_text = text[start..].split('\n').next().unwrap_or("");
    let within = line_text
        .char_indices()
        .nth(column as usize - 1)
        .map_or(line_text.len(), |(i, _)| i);
    Some(start + within)
}

fn diagnostic_text(d: &pb::Diagnostic) -> String {
    let mut text = if d.code.is_empty() {
        format!("{}: {}\n", severity_word(d), d.message)
    } else {
        format!("{}[{}]: {}\n", severity_word(d), d.code, d.message)
    };
    if d.line > 0 {
        text.push_str(&format!("  --> {}:{}:{}\n", d.file, d.line, d.column));
    } else if !d.file.is_empty() {
        text.push_str(&format!("  --> {}\n", d.file));
    }
    if !d.hint.is_empty() {
        text.push_str(&format!("  = hint: {}\n", d.hint));
    }
    text
}

/// Resource blocks (those that change), then link and export changes, as `trellis plan`
/// shows them; returns the resource counts (create, update, recreate, delete, unchanged).
fn changes_text(
    resources: &[pb::ResourceChange],
    links: &[pb::LinkChange],
    exports: &[pb::ExportChange],
    out: &mut String,
) -> [usize; 5] {
    use pb::ChangeAction as A;
    let mut counts = [0usize; 5]; // create, update, recreate, delete, unchanged
    for r in resources {
        let action = r.action();
        let slot = match action {
            A::Create => 0,
            A::Update => 1,
            A::Recreate => 2,
            A::Delete => 3,
            A::NoChange | A::Unspecified => 4,
        };
        counts[slot] += 1;
        if slot == 4 {
            continue;
        }
        out.push_str(&format!(
            "\n{:>3} {}  ({})",
            action_sign(action),
            r.name,
            r.resource_type
        ));
        if action == A::Recreate && !r.reason.is_empty() {
            out.push_str(&format!("  must be recreated: {}", r.reason));
        }
        out.push('\n');
        for f in &r.fields {
            let line = field_text(f, action == A::Recreate);
            out.push_str(&format!("      {line}\n"));
        }
    }
    let links: Vec<_> = links
        .iter()
        .filter(|l| !matches!(l.action(), A::NoChange | A::Unspecified))
        .collect();
    if !links.is_empty() {
        out.push_str("\nLinks:\n");
        for l in links {
            out.push_str(&format!(
                "{:>3} {} -> {}  ({})\n",
                action_sign(l.action()),
                l.resource_a,
                l.resource_b,
                l.link_type
            ));
        }
    }
    let exports: Vec<_> = exports
        .iter()
        .filter(|e| !matches!(e.action(), A::NoChange | A::Unspecified))
        .collect();
    if !exports.is_empty() {
        out.push_str("\nExports:\n");
        for e in exports {
            let f = pb::FieldChange {
                path: e.name.clone(),
                previous: e.previous.clone(),
                new: e.new.clone(),
                must_recreate: false,
            };
            out.push_str(&format!(
                "{:>3} {}\n",
                action_sign(e.action()),
                field_text(&f, false)
            ));
        }
    }
    counts
}

/// Children that change, each with its own changes indented under it; unchanged children are
/// only counted. Returns the counts (create, update, delete, unchanged).
fn children_text(children: &[pb::ChildChange], out: &mut String) -> [usize; 4] {
    use pb::ChangeAction as A;
    let mut counts = [0usize; 4];
    for c in children {
        let action = c.action();
        let slot = match action {
            A::Create => 0,
            A::Update | A::Recreate => 1,
            A::Delete => 2,
            A::NoChange | A::Unspecified => 3,
        };
        counts[slot] += 1;
        if slot == 3 {
            continue;
        }
        out.push_str(&format!(
            "\n{:>3} {}  (instance {})",
            action_sign(action),
            c.name,
            c.instance
        ));
        if !c.deferred.is_empty() {
            out.push_str(&format!("  changes known at deploy: {}", c.deferred));
        } else if !c.unknown_variables.is_empty() {
            out.push_str(&format!(
                "  known after deploy: {}",
                c.unknown_variables
                    .iter()
                    .map(|v| format!("variables.{v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        out.push('\n');
        let mut body = String::new();
        changes_text(&c.resources, &c.links, &c.exports, &mut body);
        if c.children.iter().any(|n| n.action() != A::NoChange) {
            body.push_str("\nChildren:\n");
            children_text(&c.children, &mut body);
        }
        for d in &c.diagnostics {
            body.push('\n');
            body.push_str(&diagnostic_text(d));
        }
        if c.deferred.is_empty() && !c.summary.is_empty() {
            body.push_str(&format!("\n{}\n", c.summary));
        }
        for line in body.split_inclusive('\n') {
            if line != "\n" {
                out.push_str("    ");
            }
            out.push_str(line);
        }
    }
    counts
}

/// The human change set: one block per resource that changes, exports, children, diagnostics,
/// the summary and (with `hint`) the command that deploys it.
pub fn plan_text(cs: &pb::ChangeSet, hint: bool) -> String {
    let mut out = format!(
        "Change set {} for instance {} (planned against version {})\n",
        cs.id, cs.instance, cs.planned_version
    );
    let counts = changes_text(&cs.resources, &cs.links, &cs.exports, &mut out);
    let mut children = [0usize; 4];
    if cs
        .children
        .iter()
        .any(|c| c.action() != pb::ChangeAction::NoChange)
    {
        out.push_str("\nChildren:\n");
    }
    if !cs.children.is_empty() {
        children = children_text(&cs.children, &mut out);
    }
    if !cs.diagnostics.is_empty() {
        out.push('\n');
        for d in &cs.diagnostics {
            out.push_str(&diagnostic_text(d));
        }
    }
    let [create, update, recreate, delete, unchanged] = counts;
    let [c_create, c_update, c_delete, c_unchanged] = children;
    let child_summary = if cs.children.is_empty() {
        String::new()
    } else {
        format!(
            "; children: {c_create} to create, {c_update} to update, {c_delete} to delete, \
             {c_unchanged} unchanged"
        )
    };
    if create + update + recreate + delete + c_create + c_update + c_delete == 0 {
        out.push_str(&format!(
            "\nNo changes: {unchanged} resource{} unchanged",
            plural(unchanged)
        ));
        if !cs.children.is_empty() {
            out.push_str(&format!(
                ", {c_unchanged} child{} unchanged",
                if c_unchanged == 1 { "" } else { "ren" }
            ));
        }
        out.push_str(".\n");
    } else {
        out.push_str(&format!(
            "\nPlan: {create} to create, {update} to update, {recreate} to recreate, {delete} to \
             delete, {unchanged} unchanged{child_summary}.\n"
        ));
    }
    if hint && plan_exit_code(cs) == 0 {
        out.push_str(&format!(
            "To deploy it: trellis deploy --change-set {}\n",
            cs.id
        ));
    }
    out
}

/// Left-aligned columns separated by two spaces.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            s.push_str(cell);
            s.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
        }
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(&mut header.iter().copied());
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// `trellis instances`.
pub fn instances_text(list: &pb::ListInstancesResponse) -> String {
    if list.instances.is_empty() {
        return "No instances.\n".to_owned();
    }
    let rows: Vec<Vec<String>> = list
        .instances
        .iter()
        .map(|i| {
            vec![
                i.name.clone(),
                short(i.status().as_str_name(), "INSTANCE_STATUS").to_owned(),
                i.version.to_string(),
                i.id.clone(),
            ]
        })
        .collect();
    table(&["NAME", "STATUS", "VERSION", "ID"], &rows)
}

/// `trellis instance NAME`: status, resources, failures, exports.
pub fn instance_text(inst: &pb::Instance) -> String {
    let mut out = format!(
        "Instance {} ({})\nStatus:  {}\nVersion: {}\n",
        inst.name,
        inst.id,
        short(inst.status().as_str_name(), "INSTANCE_STATUS"),
        inst.version
    );
    if inst.resources.is_empty() {
        out.push_str("\nNo resources.\n");
    } else {
        let rows: Vec<Vec<String>> = inst
            .resources
            .iter()
            .map(|r| {
                vec![
                    r.name.clone(),
                    r.resource_type.clone(),
                    short(r.status().as_str_name(), "RESOURCE_STATUS").to_owned(),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table(&["RESOURCE", "TYPE", "STATUS"], &rows));
        for r in inst
            .resources
            .iter()
            .filter(|r| !r.failure_reason.is_empty())
        {
            out.push_str(&format!("  {}: {}\n", r.name, r.failure_reason));
        }
    }
    if !inst.exports.is_empty() {
        out.push_str("\nExports:\n");
        for e in &inst.exports {
            let value = e
                .value
                .as_ref()
                .map_or_else(|| "null".to_owned(), value_text);
            out.push_str(&format!("  {} = {}\n", e.name, value));
        }
    }
    out
}

/// `trellis drift`.
pub fn drift_text(report: &pb::DriftReport) -> String {
    let mut out = if report.drifted {
        let n = report.resources.len();
        format!(
            "Drift in instance {}: {n} resource{} drifted (values: state → found)\n",
            report.instance,
            plural(n)
        )
    } else {
        format!("No drift in instance {}.\n", report.instance)
    };
    for r in &report.resources {
        let (sign, word) = match r.kind() {
            pb::DriftKind::Changed => ("~", "changed"),
            pb::DriftKind::Missing => ("-", "missing"),
            pb::DriftKind::Unresolved => ("?", "unresolved"),
            pb::DriftKind::Unspecified => (" ", "drifted"),
        };
        out.push_str(&format!(
            "\n{sign} {}  ({})  {word}",
            r.name, r.resource_type
        ));
        if !r.detail.is_empty() {
            out.push_str(&format!(": {}", r.detail));
        }
        out.push('\n');
        for f in &r.fields {
            out.push_str(&format!("    {}\n", field_text(f, false)));
        }
    }
    if !report.errors.is_empty() {
        out.push_str("\nCould not read:\n");
        for e in &report.errors {
            out.push_str(&format!("  {e}\n"));
        }
    }
    if report.drifted {
        out.push_str(&format!(
            "\nTo resolve: trellis reconcile --instance {} --mode accept|reapply\n",
            report.instance
        ));
    }
    out
}

/// One event as a line: `resource.created  config  (local/file)`, with the status or reason
/// when the payload has one.
pub fn event_line(event: &pb::Event, types: &HashMap<String, String>) -> String {
    let payload = payload(event);
    let mut line = event.kind.clone();
    if let Some(resource) = resource_of(&payload) {
        line.push_str("  ");
        line.push_str(resource);
        let ty = str_field(&payload, "type").or_else(|| types.get(resource).map(String::as_str));
        if let Some(ty) = ty {
            line.push_str(&format!("  ({ty})"));
        }
    }
    if let (Some(a), Some(b)) = (
        str_field(&payload, "resourceA"),
        str_field(&payload, "resourceB"),
    ) {
        line.push_str(&format!("  {a} -> {b}"));
        if let Some(ty) = str_field(&payload, "linkType") {
            line.push_str(&format!("  ({ty})"));
        }
    }
    if let Some(status) = str_field(&payload, "status") {
        line.push_str("  ");
        line.push_str(&status.to_uppercase());
    }
    if let Some(reason) = str_field(&payload, "reason").or_else(|| str_field(&payload, "error")) {
        line.push_str(": ");
        line.push_str(reason);
    }
    line
}

/// `trellis cancel`: what the engine answered.
pub fn cancel_text(op: &pb::Operation) -> String {
    let what = format!("operation {} ({} of {})", op.id, kind_word(op), op.instance);
    let status = short(op.status().as_str_name(), "OPERATION_STATUS");
    if is_terminal(op.status()) {
        format!("Nothing to cancel: {what} already ended {status}.\n")
    } else {
        format!("Cancellation requested: {what} is {status}; it stops at its next safe point.\n")
    }
}

/// `trellis deploy/destroy/reconcile`: the final status.
pub fn operation_text(op: &pb::Operation, watched: Duration) -> String {
    let took = if op.created_at_unix_ms > 0 && op.finished_at_unix_ms >= op.created_at_unix_ms {
        Duration::from_millis((op.finished_at_unix_ms - op.created_at_unix_ms) as u64)
    } else {
        watched
    };
    let status = short(op.status().as_str_name(), "OPERATION_STATUS");
    let what = format!("{} of {}", capitalized(kind_word(op)), op.instance);
    let mut out = match op.status() {
        pb::OperationStatus::Succeeded => {
            format!(
                "{what} succeeded in {} (operation {}).\n",
                clock(took),
                op.id
            )
        }
        _ => format!(
            "{what} {status} after {} (operation {}).\n",
            clock(took),
            op.id
        ),
    };
    if !op.error.is_empty() {
        out.push_str(&format!("error: {}\n", op.error));
    }
    if op.status() == pb::OperationStatus::Interrupted {
        out.push_str(&format!(
            "The engine stopped while it ran: check `trellis drift --instance {}`, then \
             `trellis reconcile`.\n",
            op.instance
        ));
    }
    out
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `mm:ss`, or `h:mm:ss` past an hour.
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{:02}:{:02}", s / 60, s % 60)
    }
}

/// Unix milliseconds as RFC 3339 UTC (`2024-05-01T12:00:00.123Z`).
fn rfc3339(unix_ms: i64, millis: bool) -> String {
    let secs = unix_ms.div_euclid(1000);
    let ms = unix_ms.rem_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (rem / 3600, rem / 60 % 60, rem % 60);
    if millis {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{ms:03}Z")
    } else {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
    }
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
                "{} (another operation holds the instance: wait for it, or stop it with \
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
mod tests {
    use super::*;

    fn v(kind: Kind) -> pv::Value {
        pv::Value {
            kind: Some(kind),
            sensitive: false,
        }
    }

    fn s(text: &str) -> pv::Value {
        v(Kind::String(text.to_owned()))
    }

    fn unknown() -> pv::Value {
        v(Kind::Unknown(pv::Unknown {}))
    }

    fn secret() -> pv::Value {
        // The engine never sends a secret in clear: the marker and a masked value.
        pv::Value {
            kind: Some(Kind::String("****".into())),
            sensitive: true,
        }
    }

    fn map(entries: &[(&str, pv::Value)]) -> pv::Value {
        v(Kind::Map(pv::MapValue {
            entries: entries
                .iter()
                .map(|(k, val)| pv::MapEntry {
                    key: (*k).to_owned(),
                    value: Some(val.clone()),
                })
                .collect(),
        }))
    }

    fn field(path: &str, previous: Option<pv::Value>, new: Option<pv::Value>) -> pb::FieldChange {
        pb::FieldChange {
            path: path.into(),
            previous,
            new,
            must_recreate: false,
        }
    }

    fn change(name: &str, ty: &str, action: pb::ChangeAction) -> pb::ResourceChange {
        pb::ResourceChange {
            name: name.into(),
            resource_type: ty.into(),
            action: action as i32,
            ..Default::default()
        }
    }

    fn sample_change_set() -> pb::ChangeSet {
        use pb::ChangeAction as A;
        let mut config = change("config", "local/file", A::Create);
        config.fields = vec![
            // Immutable, but this is a create: no "(forces recreate)".
            pb::FieldChange {
                must_recreate: true,
                ..field("spec.path", None, Some(s("/tmp/app.conf")))
            },
            field("spec.id", None, Some(unknown())),
            field("spec.token", None, Some(secret())),
        ];
        let mut web = change("web", "aws/lambda/function", A::Update);
        web.fields = vec![field(
            "spec.memory",
            Some(v(Kind::Int(128))),
            Some(v(Kind::Int(256))),
        )];
        web.depends_on = vec!["config".into()];
        let mut db = change("db", "aws/rds/instance", A::Recreate);
        db.reason = "spec.engine cannot change in place".into();
        db.fields = vec![pb::FieldChange {
            must_recreate: true,
            ..field("spec.engine", Some(s("postgres")), Some(s("mysql")))
        }];
        pb::ChangeSet {
            id: "cs_1".into(),
            instance: "app".into(),
            instance_id: "inst_1".into(),
            status: pb::ChangeSetStatus::Planned as i32,
            planned_version: 3,
            digest: "sha256:abc".into(),
            resources: vec![
                config,
                web,
                db,
                change("old", "local/file", A::Delete),
                change("same", "local/dir", A::NoChange),
            ],
            exports: vec![pb::ExportChange {
                name: "url".into(),
                action: A::Create as i32,
                previous: None,
                new: Some(unknown()),
            }],
            diagnostics: vec![pb::Diagnostic {
                code: "T0301".into(),
                severity: pb::Severity::Warning as i32,
                message: "unused variable `x`".into(),
                file: "app.yaml".into(),
                line: 3,
                column: 5,
                end_line: 3,
                end_column: 6,
                hint: String::new(),
            }],
            summary: "1 to create, 1 to update, 1 to recreate, 1 to delete".into(),
            created_at_unix_ms: 0,
            links: vec![pb::LinkChange {
                resource_a: "env".into(),
                resource_b: "config".into(),
                link_type: "local/envFile::local/file".into(),
                action: A::Create as i32,
            }],
            children: vec![],
        }
    }

    #[test]
    fn engine_addresses() {
        let http = |s: &str| Ok(EngineAddr::Http(s.to_owned()));
        assert_eq!(
            parse_engine_addr("http://127.0.0.1:8325"),
            http("http://127.0.0.1:8325")
        );
        assert_eq!(parse_engine_addr("engine:8325"), http("http://engine:8325"));
        assert_eq!(parse_engine_addr(" [::1]:8325 "), http("http://[::1]:8325"));
        assert_eq!(
            parse_engine_addr("unix:/run/trellis.sock"),
            Ok(EngineAddr::Unix("/run/trellis.sock".into()))
        );
        assert_eq!(
            parse_engine_addr("unix:///run/trellis.sock"),
            Ok(EngineAddr::Unix("/run/trellis.sock".into()))
        );
        assert_eq!(
            parse_engine_addr("https://engine:8325"),
            Ok(EngineAddr::Https("https://engine:8325".into()))
        );
        assert!(parse_engine_addr("https://").is_err());
        assert!(
            parse_engine_addr("grpc://engine:1")
                .unwrap_err()
                .contains("scheme")
        );
        assert!(parse_engine_addr("unix:").is_err());
        assert!(parse_engine_addr("").is_err());
        assert!(parse_engine_addr("http://").is_err());
    }

    #[test]
    fn enum_prefixes_are_dropped() {
        let deployed = pb::InstanceStatus::Deployed.as_str_name();
        assert_eq!(short(deployed, "INSTANCE_STATUS"), "DEPLOYED");
        let failed = pb::ResourceStatus::CreateFailed.as_str_name();
        assert_eq!(short(failed, "RESOURCE_STATUS"), "CREATE_FAILED");
        let no_change = pb::ChangeAction::NoChange.as_str_name();
        assert_eq!(short(no_change, "CHANGE_ACTION"), "NO_CHANGE");
        // A name without the prefix is kept whole.
        assert_eq!(short("OTHER", "INSTANCE_STATUS"), "OTHER");
    }

    #[test]
    fn instance_json_shape() {
        let inst = pb::Instance {
            id: "inst_1".into(),
            name: "app".into(),
            status: pb::InstanceStatus::Deployed as i32,
            version: 7,
            last_seq: 40,
            resources: vec![pb::Resource {
                name: "config".into(),
                resource_type: "local/file".into(),
                status: pb::ResourceStatus::Created as i32,
                spec: Some(map(&[("path", s("/tmp/x")), ("token", secret())])),
                state: Some(map(&[("id", unknown())])),
                external_id: "/tmp/x".into(),
                failure_reason: String::new(),
                depends_on: vec!["dir".into()],
                updated_at_unix_ms: 0,
            }],
            links: vec![pb::Link {
                resource_a: "config".into(),
                resource_b: "dir".into(),
                link_type: "local/file::local/dir".into(),
                status: pb::ResourceStatus::Created as i32,
                data: None,
            }],
            children: vec![],
            exports: vec![pb::Export {
                name: "path".into(),
                r#type: "string".into(),
                value: Some(s("/tmp/x")),
            }],
            created_at_unix_ms: 0,
            updated_at_unix_ms: 0,
        };
        assert_eq!(
            instance_json(&inst),
            json!({
                "name": "app",
                "id": "inst_1",
                "status": "DEPLOYED",
                "version": 7,
                "resources": {
                    "config": {
                        "type": "local/file",
                        "status": "CREATED",
                        "spec": {"path": "/tmp/x", "token": {"sensitive": true}},
                        "state": {"id": {"unknown": true}},
                        "externalId": "/tmp/x",
                        "dependsOn": ["dir"],
                        "failureReason": null,
                    }
                },
                "links": [{
                    "resourceA": "config",
                    "resourceB": "dir",
                    "linkType": "local/file::local/dir",
                    "status": "CREATED",
                    "data": null,
                }],
                "children": [],
                "exports": {"path": "/tmp/x"},
            })
        );
        let text = instance_text(&inst);
        assert!(text.contains("Status:  DEPLOYED"), "{text}");
        assert!(text.contains("config    local/file  CREATED"), "{text}");
        assert!(text.contains("  path = \"/tmp/x\""), "{text}");
    }

    #[test]
    fn instances_json_and_text() {
        let list = pb::ListInstancesResponse {
            instances: vec![pb::Instance {
                id: "inst_1".into(),
                name: "app".into(),
                status: pb::InstanceStatus::UpdateFailed as i32,
                version: 2,
                ..Default::default()
            }],
        };
        assert_eq!(
            instances_json(&list),
            json!({"instances": [{"name": "app", "id": "inst_1", "status": "UPDATE_FAILED", "version": 2}]})
        );
        assert_eq!(
            instances_text(&list),
            "NAME  STATUS         VERSION  ID\napp   UPDATE_FAILED  2        inst_1\n"
        );
        assert_eq!(
            instances_text(&pb::ListInstancesResponse::default()),
            "No instances.\n"
        );
    }

    #[test]
    fn change_set_json_shape() {
        let doc = change_set_json(&sample_change_set());
        assert_eq!(doc["id"], "cs_1");
        assert_eq!(doc["status"], "PLANNED");
        assert_eq!(doc["plannedVersion"], 3);
        let actions: Vec<&str> = doc["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["action"].as_str().unwrap())
            .collect();
        assert_eq!(
            actions,
            ["CREATE", "UPDATE", "RECREATE", "DELETE", "NO_CHANGE"]
        );
        // A new field has no `previous`; values keep their markers.
        assert_eq!(
            doc["resources"][0]["fields"],
            json!([
                {"path": "spec.path", "new": "/tmp/app.conf", "mustRecreate": true},
                {"path": "spec.id", "new": {"unknown": true}, "mustRecreate": false},
                {"path": "spec.token", "new": {"sensitive": true}, "mustRecreate": false},
            ])
        );
        assert_eq!(doc["resources"][0]["reason"], Json::Null);
        assert_eq!(doc["resources"][1]["dependsOn"], json!(["config"]));
        assert_eq!(
            doc["resources"][2]["reason"],
            "spec.engine cannot change in place"
        );
        assert_eq!(doc["resources"][2]["fields"][0]["mustRecreate"], true);
        assert_eq!(
            doc["exports"],
            json!([{"name": "url", "action": "CREATE", "new": {"unknown": true}}])
        );
        assert_eq!(
            doc["links"],
            json!([{"resourceA": "env", "resourceB": "config",
                    "linkType": "local/envFile::local/file", "action": "CREATE"}])
        );
        assert_eq!(doc["diagnostics"][0]["severity"], "warning");
        assert_eq!(doc["diagnostics"][0]["code"], "T0301");
        assert_eq!(doc["diagnostics"][0]["end_column"], 6);
    }

    #[test]
    fn plan_text_shows_changes_and_hides_secrets() {
        let text = plan_text(&sample_change_set(), true);
        let expected = "\
Change set cs_1 for instance app (planned against version 3)

  + config  (local/file)
      spec.path: \"/tmp/app.conf\"
      spec.id: (known after deploy)
      spec.token: (sensitive)

  ~ web  (aws/lambda/function)
      spec.memory: 128 → 256

-/+ db  (aws/rds/instance)  must be recreated: spec.engine cannot change in place
      spec.engine: \"postgres\" → \"mysql\"  (forces recreate)

  - old  (local/file)

Links:
  + env -> config  (local/envFile::local/file)

Exports:
  + url: (known after deploy)

warning[T0301]: unused variable `x`
  --> app.yaml:3:5

Plan: 1 to create, 1 to update, 1 to recreate, 1 to delete, 1 unchanged.
To deploy it: trellis deploy --change-set cs_1
";
        assert_eq!(text, expected);
        assert!(!text.contains("****"));
        assert!(!plan_text(&sample_change_set(), false).contains("trellis deploy"));
    }

    #[test]
    fn plan_without_changes() {
        let cs = pb::ChangeSet {
            id: "cs_2".into(),
            instance: "app".into(),
            resources: vec![change("same", "local/dir", pb::ChangeAction::NoChange)],
            ..Default::default()
        };
        let text = plan_text(&cs, true);
        assert!(
            text.contains("\nNo changes: 1 resource unchanged.\n"),
            "{text}"
        );
        assert!(!text.contains("same"), "{text}");
    }

    #[test]
    fn values_as_text() {
        let nested = map(&[
            (
                "a",
                v(Kind::List(pv::ListValue {
                    items: vec![v(Kind::Bool(true)), unknown()],
                })),
            ),
            ("b", secret()),
            ("c", v(Kind::Float(1.5))),
            ("d", v(Kind::Null(0))),
        ]);
        assert_eq!(
            value_text(&nested),
            "{\"a\": [true, (known after deploy)], \"b\": (sensitive), \"c\": 1.5, \"d\": null}"
        );
        assert_eq!(value_text(&s("line\nbreak")), "\"line\\nbreak\"");
    }

    #[test]
    fn drift_json_and_text() {
        let report = pb::DriftReport {
            instance: "app".into(),
            drifted: true,
            resources: vec![
                pb::ResourceDrift {
                    name: "web".into(),
                    resource_type: "aws/lambda/function".into(),
                    kind: pb::DriftKind::Changed as i32,
                    fields: vec![field(
                        "spec.memory",
                        Some(v(Kind::Int(128))),
                        Some(v(Kind::Int(512))),
                    )],
                    detail: String::new(),
                },
                pb::ResourceDrift {
                    name: "db".into(),
                    resource_type: "aws/rds/instance".into(),
                    kind: pb::DriftKind::Missing as i32,
                    fields: vec![],
                    detail: "not found".into(),
                },
            ],
            errors: vec!["cache: provider unavailable".into()],
        };
        assert_eq!(
            drift_json(&report),
            json!({
                "instance": "app",
                "drifted": true,
                "resources": [
                    {"name": "web", "type": "aws/lambda/function", "kind": "CHANGED",
                     "fields": [{"path": "spec.memory", "previous": 128, "new": 512, "mustRecreate": false}],
                     "detail": null},
                    {"name": "db", "type": "aws/rds/instance", "kind": "MISSING", "fields": [],
                     "detail": "not found"},
                ],
                "errors": ["cache: provider unavailable"],
            })
        );
        let text = drift_text(&report);
        assert!(
            text.contains("~ web  (aws/lambda/function)  changed\n    spec.memory: 128 → 512\n"),
            "{text}"
        );
        assert!(
            text.contains("- db  (aws/rds/instance)  missing: not found\n"),
            "{text}"
        );
        assert!(
            text.contains("Could not read:\n  cache: provider unavailable\n"),
            "{text}"
        );
        assert_eq!(drift_exit_code(&report), 3);
        let clean = pb::DriftReport {
            instance: "app".into(),
            ..Default::default()
        };
        assert_eq!(drift_exit_code(&clean), 0);
        assert_eq!(drift_text(&clean), "No drift in instance app.\n");
        let unread = pb::DriftReport {
            errors: vec!["x".into()],
            ..clean
        };
        assert_eq!(drift_exit_code(&unread), 1);
    }

    #[test]
    fn exit_codes() {
        use pb::OperationStatus as S;
        let op = |status: S| pb::Operation {
            status: status as i32,
            ..Default::default()
        };
        assert_eq!(operation_exit_code(&op(S::Succeeded)), 0);
        for s in [S::Failed, S::Cancelled, S::Interrupted] {
            assert_eq!(operation_exit_code(&op(s)), 1);
        }
        assert_eq!(plan_exit_code(&sample_change_set()), 0);
        let mut bad = sample_change_set();
        bad.diagnostics[0].severity = pb::Severity::Error as i32;
        assert_eq!(plan_exit_code(&bad), 1);
        assert!(!plan_text(&bad, true).contains("To deploy it"));
    }

    #[test]
    fn status_mapping() {
        let engine = "http://127.0.0.1:8325";
        let f = status_failure(&tonic::Status::not_found("instance x not found"), engine);
        assert_eq!(
            (f.exit, f.code.as_str(), f.message.as_str()),
            (2, "NOT_FOUND", "instance x not found")
        );
        let f = status_failure(
            &tonic::Status::failed_precondition("change set cs_1 is stale: plan again"),
            engine,
        );
        assert_eq!(
            (f.exit, f.message.as_str()),
            (1, "change set cs_1 is stale: plan again")
        );
        let f = status_failure(&tonic::Status::aborted("instance app is busy"), engine);
        assert_eq!(f.exit, 1);
        assert!(
            f.message
                .starts_with("instance app is busy (another operation")
        );
        let diags = "error[T0301]: unknown variable\n  --> app.yaml:3:5";
        let f = status_failure(&tonic::Status::invalid_argument(diags), engine);
        assert_eq!((f.exit, f.message.as_str()), (1, diags));
        let f = status_failure(&tonic::Status::already_exists("request id reused"), engine);
        assert_eq!((f.exit, f.code.as_str()), (2, "ALREADY_EXISTS"));
        assert!(f.message.contains("--request-id"));
        let f = status_failure(&tonic::Status::unavailable("connection refused"), engine);
        assert_eq!(f.exit, 2);
        assert_eq!(
            f.message,
            "cannot reach the engine at http://127.0.0.1:8325: connection refused (is `trellis serve` running?)"
        );
        let f = status_failure(&tonic::Status::internal("boom"), engine);
        assert_eq!(
            (f.exit, f.message.as_str()),
            (1, "the engine answered INTERNAL: boom")
        );
        assert_eq!(code_name(Code::DeadlineExceeded), "DEADLINE_EXCEEDED");
    }

    fn event(seq: u64, kind: &str, payload: Json) -> pb::Event {
        pb::Event {
            instance_id: "inst_1".into(),
            seq,
            kind: kind.into(),
            payload_json: payload.to_string(),
            at_unix_ms: 1_700_000_000_123,
            operation_id: "op_1".into(),
        }
    }

    #[test]
    fn an_operation_ends_as_its_terminal_event_says_when_the_engine_is_gone() {
        let op = pb::Operation {
            id: "op_1".into(),
            status: pb::OperationStatus::Running as i32,
            ..Default::default()
        };
        let ok = event(9, "operation.finished", json!({"status": "succeeded"}));
        assert_eq!(ended_as(&op, &ok).status(), pb::OperationStatus::Succeeded);
        let failed = event(
            9,
            "operation.finished",
            json!({"status": "failed", "error": "boom"}),
        );
        let done = ended_as(&op, &failed);
        assert_eq!(done.status(), pb::OperationStatus::Failed);
        assert_eq!(done.error, "boom");
        assert_eq!(done.id, "op_1");
        let cut = event(9, "operation.interrupted", json!({}));
        assert_eq!(
            ended_as(&op, &cut).status(),
            pb::OperationStatus::Interrupted
        );
    }

    #[test]
    fn events_as_json_and_lines() {
        let e = event(
            12,
            "resource.created",
            json!({"resource": "config", "externalId": "/x"}),
        );
        assert_eq!(
            event_json(&e),
            json!({
                "seq": 12,
                "kind": "resource.created",
                "at": "2023-11-14T22:13:20.123Z",
                "operationId": "op_1",
                "payload": {"resource": "config", "externalId": "/x"},
            })
        );
        let types = HashMap::from([("config".to_owned(), "local/file".to_owned())]);
        assert_eq!(
            event_line(&e, &types),
            "resource.created  config  (local/file)"
        );
        let failed = event(
            13,
            "resource.failed",
            json!({"resource": "web", "reason": "timeout"}),
        );
        assert_eq!(event_line(&failed, &types), "resource.failed  web: timeout");
        let linked = event(
            15,
            "link.created",
            json!({"resourceA": "env", "resourceB": "config", "linkType": "local/envFile::local/file"}),
        );
        assert_eq!(
            event_line(&linked, &types),
            "link.created  env -> config  (local/envFile::local/file)"
        );
        let finished = event(14, "operation.finished", json!({"status": "succeeded"}));
        assert_eq!(
            event_line(&finished, &types),
            "operation.finished  SUCCEEDED"
        );
        let raw = pb::Event {
            payload_json: "not json".into(),
            operation_id: String::new(),
            at_unix_ms: 0,
            ..e
        };
        assert_eq!(event_json(&raw)["payload"], "not json");
        assert_eq!(event_json(&raw)["operationId"], Json::Null);
        assert_eq!(event_json(&raw)["at"], Json::Null);
    }

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0, false), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000, false), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_709_251_199_999, true), "2024-02-29T23:59:59.999Z");
        assert_eq!(clock(Duration::from_secs(4)), "00:04");
        assert_eq!(clock(Duration::from_secs(3725)), "1:02:05");
    }

    #[test]
    fn progress_counts_resources_from_events() {
        let mut p = Progress::new("deploy", "app", Some(3));
        let r = |seq, kind: &str, name: &str| {
            event(seq, kind, json!({"resource": name, "type": "local/file"}))
        };
        assert!(!p.observe(&r(1, "resource.create_requested", "a")).1);
        p.observe(&r(2, "resource.create_requested", "b"));
        let (line, finished) = p.observe(&r(3, "resource.created", "a"));
        assert!(finished);
        assert_eq!(line, "resource.created  a  (local/file)");
        p.observe(&r(4, "resource.failed", "b"));
        p.observe(&r(5, "resource.update_requested", "c"));
        assert_eq!(
            p.status_line(Duration::from_secs(4)),
            "deploying app: 1/3 resources done, 1 in progress, 1 failed [00:04]"
        );
        assert_eq!(p.events, 5);
        let mut q = Progress::new("destroy", "app", None);
        q.observe(&r(1, "resource.destroyed", "a"));
        assert_eq!(
            q.status_line(Duration::ZERO),
            "destroying app: 1 resource done, 0 in progress [00:00]"
        );
        q.observe(&r(2, "resource.forgotten", "b"));
        q.observe(&r(3, "rollback.started", "b"));
        assert_eq!(
            q.status_line(Duration::ZERO),
            "destroying app: 2 resources done, 0 in progress [00:00]"
        );
    }

    #[test]
    fn operation_result_text() {
        let op = pb::Operation {
            id: "op_1".into(),
            instance: "app".into(),
            kind: pb::OperationKind::Deploy as i32,
            status: pb::OperationStatus::Failed as i32,
            error: "web: timeout".into(),
            created_at_unix_ms: 1_000,
            finished_at_unix_ms: 13_000,
            change_set_id: "cs_1".into(),
            ..Default::default()
        };
        assert_eq!(
            operation_text(&op, Duration::ZERO),
            "Deploy of app FAILED after 00:12 (operation op_1).\nerror: web: timeout\n"
        );
        assert_eq!(
            cancel_text(&op),
            "Nothing to cancel: operation op_1 (deploy of app) already ended FAILED.\n"
        );
        assert_eq!(
            operation_json(&op),
            json!({"id": "op_1", "instance": "app", "kind": "DEPLOY", "status": "FAILED",
                   "error": "web: timeout", "changeSetId": "cs_1"})
        );
    }

    // ---- against a fake engine ----------------------------------------------------------------

    use pb::engine_server::{Engine, EngineServer};
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use tonic::{Request, Response, Status};

    type Stream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::WatchResponse, Status>> + Send>>;

    /// Serves the events of operation `op_1` (seq 5 to 9), breaking the first stream after two
    /// events, and records the `after_seq` of every watch.
    #[derive(Default)]
    struct FakeEngine {
        watches: Arc<Mutex<Vec<u64>>>,
    }

    fn unimplemented<T>() -> Result<Response<T>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    #[tonic::async_trait]
    impl Engine for FakeEngine {
        type ValidateStream =
            Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::Diagnostic, Status>> + Send>>;
        type WatchOperationStream = Stream;
        type WatchInstanceStream = Stream;

        async fn validate(
            &self,
            _: Request<pb::ValidateRequest>,
        ) -> Result<Response<Self::ValidateStream>, Status> {
            unimplemented()
        }
        async fn create_change_set(
            &self,
            _: Request<pb::CreateChangeSetRequest>,
        ) -> Result<Response<pb::ChangeSet>, Status> {
            unimplemented()
        }
        async fn get_change_set(
            &self,
            _: Request<pb::GetChangeSetRequest>,
        ) -> Result<Response<pb::ChangeSet>, Status> {
            unimplemented()
        }
        async fn list_change_sets(
            &self,
            _: Request<pb::ListChangeSetsRequest>,
        ) -> Result<Response<pb::ListChangeSetsResponse>, Status> {
            unimplemented()
        }
        async fn execute_change_set(
            &self,
            _: Request<pb::ExecuteChangeSetRequest>,
        ) -> Result<Response<pb::Operation>, Status> {
            unimplemented()
        }
        async fn destroy(
            &self,
            _: Request<pb::DestroyRequest>,
        ) -> Result<Response<pb::Operation>, Status> {
            unimplemented()
        }
        async fn get_instance(
            &self,
            _: Request<pb::GetInstanceRequest>,
        ) -> Result<Response<pb::Instance>, Status> {
            Err(Status::not_found("instance x not found"))
        }
        async fn list_instances(
            &self,
            _: Request<pb::ListInstancesRequest>,
        ) -> Result<Response<pb::ListInstancesResponse>, Status> {
            Ok(Response::new(pb::ListInstancesResponse::default()))
        }
        async fn get_exports(
            &self,
            _: Request<pb::GetExportsRequest>,
        ) -> Result<Response<pb::GetExportsResponse>, Status> {
            unimplemented()
        }
        async fn get_operation(
            &self,
            _: Request<pb::GetOperationRequest>,
        ) -> Result<Response<pb::Operation>, Status> {
            unimplemented()
        }
        async fn list_operations(
            &self,
            _: Request<pb::ListOperationsRequest>,
        ) -> Result<Response<pb::ListOperationsResponse>, Status> {
            unimplemented()
        }
        async fn watch_operation(
            &self,
            request: Request<pb::WatchOperationRequest>,
        ) -> Result<Response<Stream>, Status> {
            let after = request.into_inner().after_seq;
            let first = {
                let mut watches = self.watches.lock().unwrap();
                watches.push(after);
                watches.len() == 1
            };
            let item = |e: pb::Event| {
                Ok(pb::WatchResponse {
                    item: Some(pb::watch_response::Item::Event(e)),
                })
            };
            let kinds = [
                (5, "operation.started"),
                (6, "resource.create_requested"),
                (7, "resource.created"),
                (8, "link.created"),
                (9, "operation.finished"),
            ];
            let mut items: Vec<Result<pb::WatchResponse, Status>> = vec![Ok(pb::WatchResponse {
                item: Some(pb::watch_response::Item::Heartbeat(pb::Heartbeat {
                    last_seq: 9,
                })),
            })];
            items.extend(
                kinds
                    .iter()
                    .filter(|(seq, _)| *seq > after)
                    .map(|(seq, kind)| item(event(*seq, kind, json!({"resource": "a"})))),
            );
            if first {
                items.truncate(3);
                items.push(Err(Status::unavailable("connection reset")));
            }
            Ok(Response::new(Box::pin(tokio_stream::iter(items))))
        }
        async fn watch_instance(
            &self,
            _: Request<pb::WatchInstanceRequest>,
        ) -> Result<Response<Stream>, Status> {
            unimplemented()
        }
        async fn cancel_operation(
            &self,
            _: Request<pb::CancelOperationRequest>,
        ) -> Result<Response<pb::Operation>, Status> {
            unimplemented()
        }
        async fn check_drift(
            &self,
            _: Request<pb::CheckDriftRequest>,
        ) -> Result<Response<pb::DriftReport>, Status> {
            unimplemented()
        }
        async fn reconcile(
            &self,
            _: Request<pb::ReconcileRequest>,
        ) -> Result<Response<pb::Operation>, Status> {
            unimplemented()
        }
    }

    #[derive(Default)]
    struct Collect(Vec<u64>);

    impl WatchSink for Collect {
        fn event(&mut self, event: &pb::Event) -> Result<(), Failure> {
            self.0.push(event.seq);
            Ok(())
        }
    }

    #[tokio::test]
    async fn watch_resumes_after_a_broken_stream() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let fake = FakeEngine::default();
        let watches = fake.watches.clone();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(EngineServer::new(fake))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let mut client = Client {
            api: connect(&addr).await.unwrap(),
            engine: addr,
        };
        let mut seen = Collect::default();
        let target = WatchTarget::Operation("op_1".into());
        watch(&mut client, &target, 0, &mut seen).await.unwrap();
        // Nothing missed, nothing repeated, stopped at `operation.finished`.
        assert_eq!(seen.0, [5, 6, 7, 8, 9]);
        assert_eq!(*watches.lock().unwrap(), [0, 6]);

        let err = client
            .api
            .get_instance(pb::GetInstanceRequest {
                instance: "x".into(),
                reveal_secrets: false,
            })
            .await
            .unwrap_err();
        assert_eq!(client.fail(err).message, "instance x not found");
    }

    #[tokio::test]
    async fn connects_over_a_unix_socket() {
        let dir = std::env::temp_dir().join(format!("trellis-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("engine.sock");
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(EngineServer::new(FakeEngine::default()))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let mut api = connect(&format!("unix:{}", path.display())).await.unwrap();
        let list = api
            .list_instances(pb::ListInstancesRequest {})
            .await
            .unwrap();
        assert!(list.into_inner().instances.is_empty());
        let _ = std::fs::remove_dir_all(&dir);

        let missing = connect(&format!("unix:{}", dir.join("none.sock").display()))
            .await
            .unwrap_err();
        assert_eq!(missing.exit, 2);
        assert!(
            missing.message.contains("(is `trellis serve` running?)"),
            "{}",
            missing.message
        );
    }

    #[test]
    fn invalid_plan_shows_diagnostics_like_validate() {
        let cs = pb::ChangeSet {
            instance: "app".into(),
            status: pb::ChangeSetStatus::Invalid as i32,
            diagnostics: vec![
                pb::Diagnostic {
                    code: "T0501".into(),
                    severity: pb::Severity::Error as i32,
                    message: "unknown variable `x`".into(),
                    file: "app.yaml".into(),
                    line: 2,
                    column: 14,
                    end_line: 2,
                    end_column: 15,
                    ..Default::default()
                },
                pb::Diagnostic {
                    code: "T0501".into(),
                    severity: pb::Severity::Error as i32,
                    message: "unknown variable `y`".into(),
                    file: "on-the-engine-host.yaml".into(),
                    line: 1,
                    column: 1,
                    hint: "declare it".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(plan_exit_code(&cs), 1);
        let sent = vec![(
            "app.yaml".to_owned(),
            b"version: 2023-04-20\nvalue: \"\xc3\xa9${x}\"\n".to_vec(),
        )];
        let text = invalid_plan_text(&cs, &sent);
        let expected = "\
error[T0501]: unknown variable `x`
 --> app.yaml:2:14
  |
2 | value: \"\u{e9}${x}\"
  |              ^

error[T0501]: unknown variable `y`
  --> on-the-engine-host.yaml:1:1
  = hint: declare it

error: the blueprint is invalid: 2 errors, 0 warnings; nothing was planned
";
        assert_eq!(text, expected);
        assert_eq!(text_offset("ab\ncd", 2, 2), Some(4));
        assert_eq!(
            text_offset("ab\ncd", 2, 9),
            Some(5),
            "capped at the line's end"
        );
        assert_eq!(text_offset("ab", 3, 1), None);
    }
}

//! The engine: plans change sets, executes them, destroys and reconciles instances, and keeps
//! what happened in the state store. The gRPC handlers (`crate::serve::api`) only decode, call
//! an [`Engine`] method and encode.
//!
//! Invariants:
//! - Every mutation of an instance runs under the instance's lease, as an Operation recorded
//!   (with its `request_id`) before any work starts; a retry of the same request returns it.
//! - A provider create is preceded by a durable intent (`exec`), so a crash never orphans.
//! - Plans are tied to the instance version they read and to a digest of their exact inputs;
//!   execution re-evaluates exactly those inputs.

pub mod assets;
pub mod body;
mod change_sets;
pub mod check;
mod child_runs;
pub mod children;
pub mod diff;
pub mod drift;
pub mod exec;
mod idempotency;
mod import;
pub mod links;
pub mod metrics;
pub mod names;
mod operations;
mod paths;
pub mod plan;
pub mod prepare;
mod progress;
mod provider_plan;
pub mod provision;
mod recovery;
pub mod remote;
pub mod settings;
pub mod state_values;
pub mod tls;
mod waiting;

use child_runs::*;
use idempotency::*;
pub use import::ImportRequest;
pub use operations::Finish;
pub use waiting::{Queued, Wait};
// The crates below the engine, under the names their modules had when they were one crate.
use trellis_host as plugins;
#[cfg(test)]
use trellis_lang::test_dir;
use trellis_lang::{
    blueprint, datasource, diag, document, eval, inject, plugin_checks, redact, source, subst,
    transform, validate,
};
use trellis_state as state;

use std::collections::HashMap;

use dashmap::DashMap;
use indexmap::IndexMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value as Json, json};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use crate::check::PluginContext;
use crate::plugins::PluginHost;
use crate::state::{
    Change, ChangeSet, ChangeSetStatus, Conflict, InstanceState, InstanceStatus, InterruptScope,
    Lease, NewChangeSet, NewEvent, NewOperation, Operation, OperationKind, OperationStatus,
    RequestKey, ResourceStatus, StateError, StateStore,
};
use exec::{Outcome, RunContext};
use plan::Plan;
use prepare::{Inputs, Prepared};
use provision::{Observed, Provisioner};

/// The plan this engine made last, kept for its execution: rebuilding a large plan from the
/// recorded change set costs more than the deployment's first layer.
struct LastPlanned {
    change_set_id: String,
    inputs: Inputs,
    plan: Plan,
    prepared: Prepared,
}

/// Settings of an engine (from `trellis serve`'s configuration).
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Who takes leases and accepts operations. Stable across restarts of the same engine (one
    /// per data directory), so a restart recognises the operations its previous run left.
    pub owner: String,
    pub max_parallel: usize,
    pub lease_ttl: Duration,
    pub max_input_size: usize,
    /// Bounds on what evaluating one request's blueprint may build (value sizes, resources
    /// after `each`, total bytes).
    pub eval_limits: crate::eval::limits::Limits,
    /// Roots under which requests may name blueprint files on the engine host.
    pub allowed_roots: Vec<PathBuf>,
    /// Where `https://` includes may be fetched from (allow-listed hosts, size limit, trust).
    pub remote_includes: remote::RemoteIncludes,
    /// The working directory `cwd()` returns in blueprints.
    pub cwd: PathBuf,
    /// Provider configuration and property injectors from the engine's config file.
    pub settings: settings::EngineSettings,
    /// Where the content of local assets is kept (`<data dir>/assets`).
    pub assets: assets::Store,
}

/// An engine call's failure, mapped to a gRPC status by the API layer.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineError {
    NotFound(String),
    /// Bad input; for an invalid blueprint the message holds the rendered diagnostics.
    InvalidArgument(String),
    /// An invalid blueprint: `message` holds the rendered diagnostics (what `Display` shows),
    /// `diagnostics` each one in the JSON shape of `trellis validate --format json`.
    InvalidBlueprint {
        message: String,
        diagnostics: Vec<Json>,
        /// Local assets the blueprint names that the request did not carry.
        missing_assets: Vec<String>,
    },
    /// Stale or executed change set, or an instance in the wrong state.
    FailedPrecondition(String),
    /// Another operation holds the instance.
    Aborted(String),
    /// The request id was used for another request.
    AlreadyExists(String),
    PermissionDenied(String),
    /// The engine is shutting down.
    Unavailable(String),
    Internal(String),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let m = match self {
            EngineError::NotFound(m)
            | EngineError::InvalidArgument(m)
            | EngineError::InvalidBlueprint { message: m, .. }
            | EngineError::FailedPrecondition(m)
            | EngineError::Aborted(m)
            | EngineError::AlreadyExists(m)
            | EngineError::PermissionDenied(m)
            | EngineError::Unavailable(m)
            | EngineError::Internal(m) => m,
        };
        f.write_str(m)
    }
}

impl From<StateError> for EngineError {
    fn from(e: StateError) -> Self {
        match &e {
            StateError::NotFound { .. } => EngineError::NotFound(e.to_string()),
            StateError::Conflict(Conflict::LeaseHeld { .. }) => EngineError::Aborted(format!(
                "another operation is running on the instance ({e})"
            )),
            StateError::Stale { .. } | StateError::AlreadyExecuted { .. } => {
                EngineError::FailedPrecondition(e.to_string())
            }
            StateError::RequestIdReused { .. } => EngineError::AlreadyExists(e.to_string()),
            StateError::EventsPruned { .. } | StateError::Unsupported(_) => {
                EngineError::FailedPrecondition(e.to_string())
            }
            _ => EngineError::Internal(e.to_string()),
        }
    }
}

pub type Result<T> = std::result::Result<T, EngineError>;

/// A request's documents: names and contents, the root first.
type Documents = Vec<(String, Vec<u8>)>;

/// Where a blueprint comes from in a request.
#[derive(Clone, Debug)]
pub enum Source {
    Inline {
        file_name: String,
        content: Vec<u8>,
        children: Vec<(String, Vec<u8>)>,
        /// The local assets the request carried (kept already, [`Engine::keep_assets`]):
        /// path → digest.
        assets: IndexMap<String, String>,
    },
    Path(PathBuf),
}

/// A planned change set as the API shows it.
#[derive(Clone, Debug)]
pub struct ChangeSetView {
    pub change_set: ChangeSet,
    pub instance_name: String,
    pub plan: Plan,
    pub diagnostics: Vec<Json>,
}

struct Running {
    stop: CancellationToken,
    cancel_requested: Arc<AtomicBool>,
}

pub struct Engine {
    store: Arc<dyn StateStore>,
    host: Arc<PluginHost>,
    provisioner: Arc<dyn Provisioner>,
    config: EngineConfig,
    running: DashMap<String, Running>,
    /// Operations whose end the store refused to record (a full disk): how they ended, shown
    /// by reads until a retry records it (see [`Engine::record_end`]).
    unrecorded: DashMap<String, Operation>,
    /// Wakes drain when an operation ends.
    finished: tokio::sync::Notify,
    /// The evaluated blueprint of the change set this engine planned last, so executing it
    /// right after (what `trellis deploy FILE` does) skips reading and evaluating the inputs
    /// again. One entry: a large blueprint's evaluation is big.
    last_planned: Mutex<Option<LastPlanned>>,
    draining: AtomicBool,
    /// Requests waiting for their turn on a busy instance (`--wait`), per instance.
    queues: waiting::Queues,
    /// One lock per request id being started: a concurrent retry of a request waits until the
    /// first has recorded its operation, then gets that operation instead of a lease refusal.
    starting: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    rt: Handle,
    /// Stops the engine's background tasks (the cancel-request listener) when it is dropped.
    _background: tokio_util::sync::DropGuard,
}

fn now_nanos() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

impl Engine {
    pub fn new(
        store: Arc<dyn StateStore>,
        host: Arc<PluginHost>,
        provisioner: Arc<dyn Provisioner>,
        config: EngineConfig,
        rt: Handle,
    ) -> Arc<Engine> {
        let background = CancellationToken::new();
        let mut cancels = store.cancel_requests();
        let engine = Arc::new(Engine {
            store,
            host,
            provisioner,
            config,
            running: DashMap::new(),
            unrecorded: DashMap::new(),
            finished: tokio::sync::Notify::new(),
            last_planned: Mutex::new(None),
            draining: AtomicBool::new(false),
            queues: waiting::Queues::default(),
            starting: Mutex::new(HashMap::new()),
            rt,
            _background: background.clone().drop_guard(),
        });
        // Cancel requests made through any engine sharing the store (another replica) stop the
        // operation here if it runs here.
        let this = Arc::downgrade(&engine);
        engine.rt.spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                let id = tokio::select! {
                    _ = background.cancelled() => return,
                    r = cancels.recv() => match r {
                        Ok(id) => id,
                        Err(RecvError::Lagged(missed)) => {
                            // The heartbeat's check still finds those.
                            tracing::warn!(missed, "cancel requests arrived faster than handled");
                            continue;
                        }
                        Err(RecvError::Closed) => return,
                    },
                };
                let Some(engine) = this.upgrade() else { return };
                engine.stop_running(&id);
            }
        });
        engine
    }

    pub fn store(&self) -> &Arc<dyn StateStore> {
        &self.store
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    fn accepting(&self) -> Result<()> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(EngineError::Unavailable(
                "the engine is shutting down and accepts no new operations".into(),
            ));
        }
        Ok(())
    }

    // ---- inputs ---------------------------------------------------------------------------

    /// Keeps the content of a request's local assets (checked and hashed by
    /// [`assets::receive`]) and returns them by path, for [`Source::Inline`].
    pub async fn keep_assets(
        &self,
        received: Vec<assets::Received>,
    ) -> Result<IndexMap<String, String>> {
        let store = self.config.assets.clone();
        for a in &received {
            // Any replica may execute the plan: it finds the content in the shared state.
            store.share(a).await.map_err(|e| {
                EngineError::Internal(format!("keeping the asset `{}`: {e}", a.path))
            })?;
        }
        tokio::task::spawn_blocking(move || {
            let mut out = IndexMap::new();
            for a in &received {
                store.put(a).map_err(|e| {
                    EngineError::Internal(format!("keeping the asset `{}`: {e}", a.path))
                })?;
                out.insert(a.path.clone(), a.digest.clone());
            }
            Ok(out)
        })
        .await
        .map_err(|e| EngineError::Internal(format!("engine task failed: {e}")))?
    }

    /// The documents of a request, and its local assets. A path must lie under an allowed
    /// root.
    fn read_source(&self, source: Source) -> Result<(Documents, IndexMap<String, String>)> {
        match source {
            Source::Inline {
                file_name,
                content,
                children,
                assets,
            } => {
                if file_name.is_empty() {
                    return Err(EngineError::InvalidArgument(
                        "the inline blueprint needs a file name (it chooses YAML or JSON)".into(),
                    ));
                }
                let mut files = vec![(file_name, content)];
                files.extend(children);
                Ok((files, assets))
            }
            Source::Path(path) => {
                let (resolved, content) = paths::read_source(
                    &path,
                    &self.config.cwd,
                    &self.config.allowed_roots,
                    self.config.max_input_size,
                )?;
                Ok((
                    vec![(resolved.display().to_string(), content)],
                    IndexMap::new(),
                ))
            }
        }
    }

    /// Runs `f` on a blocking thread with plugin access (validation and provider functions
    /// block on the engine's runtime), in the request's span, its plugin calls carrying the
    /// request's id ([`serving_request`]).
    async fn with_plugins<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Engine, &PluginContext<'_>) -> T + Send + 'static,
    ) -> Result<T> {
        let this = self.clone();
        let span = tracing::Span::current();
        let request_id = REQUEST_ID.try_with(Clone::clone).ok();
        tokio::task::spawn_blocking(move || {
            let _entered = span.enter();
            let mut plugins = PluginContext::load(&this.host, this.rt.clone());
            plugins.request_id = request_id;
            f(&this, &plugins)
        })
        .await
        .map_err(|e| EngineError::Internal(format!("engine task failed: {e}")))
    }

    // ---- validate -------------------------------------------------------------------------

    /// Validates with the plugins; diagnostics in the documented JSON shape.
    pub async fn validate(
        self: &Arc<Self>,
        source: Source,
        variables: Vec<(String, String)>,
        environment: settings::Environment,
    ) -> Result<Vec<Json>> {
        let (files, _) = self.read_source(source)?;
        let max = self.config.max_input_size;
        self.with_plugins(move |engine, plugins| {
            let (plugins, _held) = engine.request_plugins(&environment, plugins)?;
            let scopes = settings::injector_scopes(&engine.config.settings, &environment);
            let additions = check::Additions {
                injectors: &scopes,
                secret_variables: &environment.secret_variables,
            };
            let mut sources = crate::source::SourceMap::new();
            let mut diags = crate::diag::Diagnostics::default();
            let (name, bytes) = files.into_iter().next().unwrap_or_default();
            crate::check::validate_source(
                &mut sources,
                &name,
                bytes,
                &variables,
                additions,
                max,
                &plugins,
                &|_| None,
                &mut diags,
            );
            Ok(diags
                .items
                .iter()
                .map(|d| crate::diag::render_json_value(d, &sources))
                .collect())
        })
        .await?
    }

    /// The plugin context of a request with `environment`: the engine's provider config with
    /// the environment's merged over it, checked against the providers' config schemas and by
    /// each provider the environment configures (ValidateConfig).
    /// The secrets of the merged settings are held (cut out of provider messages and plugin
    /// logs) for as long as the returned guard lives.
    fn request_plugins<'a>(
        &self,
        environment: &settings::Environment,
        plugins: &PluginContext<'a>,
    ) -> Result<(PluginContext<'a>, crate::redact::Held)> {
        let (merged, held) = plugins.rt.block_on(self.checked_settings(environment))?;
        Ok((plugins.with_configs(merged.configs()), held))
    }

    /// The engine's settings with a request's `environment` merged over them, checked as
    /// [`Engine::request_plugins`] says; its secrets held while the guard lives.
    pub(crate) async fn checked_settings(
        &self,
        environment: &settings::Environment,
    ) -> Result<(settings::Merged, crate::redact::Held)> {
        let invalid = EngineError::InvalidArgument;
        let merged = settings::merge(&self.config.settings, environment).map_err(invalid)?;
        let what = if environment.name.is_empty() {
            "the request's environment".to_owned()
        } else {
            format!("environment `{}`", environment.name)
        };
        settings::check_injectors(&what, &environment.injectors).map_err(invalid)?;
        let held = crate::redact::hold(merged.secret_texts());
        let empty = serde_json::Map::new();
        let entries: Vec<_> = environment
            .providers
            .iter()
            .map(|(ns, given)| {
                let whole = merged.providers.get(ns).unwrap_or(&empty);
                (ns.as_str(), given, whole)
            })
            .collect();
        settings::check_providers(&self.host, &what, &entries)
            .await
            .map_err(invalid)?;
        Ok((merged, held))
    }

    /// The provider config of a run for an instance whose deployments recorded `recorded` (its
    /// environment): the engine's settings with it merged over them. A record the engine's
    /// settings now refuse (a key since pinned) counts for nothing: the engine's settings hold.
    pub(crate) fn recorded_settings(&self, recorded: &Json) -> settings::Merged {
        let env = recorded.get("environment").unwrap_or(&Json::Null);
        let env = settings::Environment::from_json(env).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the instance's recorded environment is unreadable; using the engine's provider settings");
            settings::Environment::default()
        });
        let (merged, dropped) = settings::merge_recorded(&self.config.settings, &env);
        if !dropped.is_empty() {
            tracing::warn!(keys = ?dropped, "the engine pins keys the instance's recorded environment set; the engine's values apply");
        }
        merged
    }

    // ---- reads ----------------------------------------------------------------------------

    pub async fn get_instance(&self, name: &str) -> Result<InstanceState> {
        let inst = self.instance_named(name).await?;
        Ok(self.store.load_state(&inst.id).await?)
    }

    pub async fn list_instances(&self) -> Result<Vec<crate::state::Instance>> {
        Ok(self.store.list_instances().await?)
    }

    /// A consistent copy of the whole state (every instance), for `trellis backup`.
    pub async fn backup(&self) -> Result<crate::state::StateBackup> {
        Ok(self.store.backup().await?)
    }

    /// The operation as recorded, or as it ended when the store has not accepted its end yet.
    pub async fn get_operation(&self, id: &str) -> Result<Operation> {
        if let Some(ended) = self.unrecorded.get(id) {
            return Ok(ended.clone());
        }
        Ok(self.store.get_operation(id).await?)
    }

    pub async fn list_operations(&self, instance: &str) -> Result<Vec<Operation>> {
        let inst = self.instance_named(instance).await?;
        Ok(self.store.list_operations(&inst.id).await?)
    }

    pub async fn instance_name(&self, instance_id: &str) -> Result<String> {
        Ok(self.store.get_instance(instance_id).await?.name)
    }

    pub async fn instance_id(&self, name: &str) -> Result<String> {
        Ok(self.instance_named(name).await?.id)
    }

    // ---- drift ----------------------------------------------------------------------------

    /// Reads every resource through its provider and compares it with state (fields links
    /// own are not drift: see [`drift`]).
    pub async fn check_drift(&self, instance: &str) -> Result<DriftReport> {
        let state = self.get_instance(instance).await?;
        let checker = drift::Checker::load(self.provisioner.as_ref(), &state).await;
        let mut report = DriftReport {
            instance: instance.to_owned(),
            resources: Vec::new(),
            errors: Vec::new(),
        };
        let instance_id = state.instance.id.as_str();
        let recorded = self.recorded_settings(&state.instance.environment);
        let _secrets = crate::redact::hold(recorded.secret_texts());
        let configs = recorded.configs();
        let configs = &configs;
        let reads = state.resources.iter().map(|r| async move {
            let observed = match r.status {
                ResourceStatus::CreateRequested
                | ResourceStatus::UpdateRequested
                | ResourceStatus::DestroyRequested => None,
                _ => Some(
                    self.provisioner
                        .read(&exec::target_of(instance_id, configs, r))
                        .await,
                ),
            };
            (r, observed)
        });
        // Collected first: a lazy iterator of futures inside the stream trips the Send check
        // of the API's async handler (a higher-ranked lifetime).
        let reads: Vec<_> = reads.collect();
        // At most --max-parallel reads at once, as for an operation's provider calls.
        use futures_util::StreamExt;
        let results: Vec<_> = futures_util::stream::iter(reads)
            .buffered(self.config.max_parallel.max(1))
            .collect()
            .await;
        for (r, observed) in results {
            match observed {
                None => report.resources.push(ResourceDrift {
                    name: r.name.clone(),
                    resource_type: r.resource_type.clone(),
                    kind: DriftKind::Unresolved,
                    fields: vec![],
                    detail: format!(
                        "a provider call was in flight when the engine stopped ({}); reconcile to settle it",
                        r.status
                    ),
                }),
                Some(Err(f)) => report.errors.push(format!("{}: {}", r.name, f.message)),
                Some(Ok(Observed::Missing)) => {
                    if matches!(r.status, ResourceStatus::CreateFailed) {
                        continue;
                    }
                    report.resources.push(ResourceDrift {
                        name: r.name.clone(),
                        resource_type: r.resource_type.clone(),
                        kind: DriftKind::Missing,
                        fields: vec![],
                        detail: "the resource no longer exists".into(),
                    })
                }
                Some(Ok(Observed::Exists { spec, .. })) => {
                    let fields = checker.fields(r, &spec);
                    if !fields.is_empty() {
                        report.resources.push(ResourceDrift {
                            name: r.name.clone(),
                            resource_type: r.resource_type.clone(),
                            kind: DriftKind::Changed,
                            fields,
                            detail: String::new(),
                        });
                    }
                }
            }
        }
        Ok(report)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriftKind {
    Changed,
    Missing,
    Unresolved,
}

#[derive(Clone, Debug)]
pub struct ResourceDrift {
    pub name: String,
    pub resource_type: String,
    pub kind: DriftKind,
    pub fields: Vec<diff::FieldChange>,
    pub detail: String,
}

#[derive(Clone, Debug)]
pub struct DriftReport {
    pub instance: String,
    pub resources: Vec<ResourceDrift>,
    pub errors: Vec<String>,
}

impl DriftReport {
    pub fn drifted(&self) -> bool {
        !self.resources.is_empty()
    }
}

tokio::task_local! {
    /// The engine API request being served, set by the server around each request.
    static REQUEST_ID: String;
}

/// Runs `fut`, the work of engine API request `request_id`: the plugin calls it makes while
/// validating and planning carry the id (`CallContext.request_id`); an operation's calls carry
/// the id of the request that started it.
pub async fn serving_request<F: std::future::Future>(request_id: String, fut: F) -> F::Output {
    REQUEST_ID.scope(request_id, fut).await
}

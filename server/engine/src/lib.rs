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

pub mod check;
pub mod children;
pub mod diff;
pub mod drift;
pub mod exec;
pub mod links;
pub mod names;
mod paths;
pub mod plan;
pub mod prepare;
pub mod provision;
pub mod remote;
pub mod state_values;

// The crates below the engine, under the names their modules had when they were one crate.
use trellis_host as plugins;
#[cfg(test)]
use trellis_lang::test_dir;
use trellis_lang::{
    blueprint, datasource, diag, document, eval, plugin_checks, redact, source, subst, transform,
    validate,
};
use trellis_state as state;

use std::collections::HashMap;

use dashmap::DashMap;
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
    RequestKey, Resource, ResourceStatus, StateError, StateStore,
};
use exec::{Outcome, RunContext};
use plan::Plan;
use prepare::{Inputs, Prepared};
use provision::{Observed, Provisioner};

/// What [`Engine::start_operation`] records.
struct OperationStart<'a> {
    kind: OperationKind,
    request_id: &'a str,
    request_digest: &'a str,
    change_set_id: Option<String>,
    instance_status: InstanceStatus,
    /// How many resources the operation changes, when known.
    total: Option<usize>,
}

/// What [`Engine::start_operation`] did.
enum Started {
    /// Recorded and marked running: the caller runs it.
    New(Operation),
    /// The request id already names this operation: nothing was started.
    Existing(Operation),
}

/// A request id's turn-taking lock (see [`Engine::once`]); its map entry goes with the last
/// holder.
struct Starting<'a> {
    map: &'a Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    request_id: String,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        // Clones are made under the map's lock: two (the map's and ours) means nobody else
        // holds or waits for this id.
        if Arc::strong_count(&self.lock) == 2 {
            map.remove(&self.request_id);
        }
    }
}

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
            StateError::EventsPruned { .. } => EngineError::FailedPrecondition(e.to_string()),
            _ => EngineError::Internal(e.to_string()),
        }
    }
}

pub type Result<T> = std::result::Result<T, EngineError>;

/// Where a blueprint comes from in a request.
#[derive(Clone, Debug)]
pub enum Source {
    Inline {
        file_name: String,
        content: Vec<u8>,
        children: Vec<(String, Vec<u8>)>,
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
    /// One lock per request id being started: a concurrent retry of a request waits until the
    /// first has recorded its operation, then gets that operation instead of a lease refusal.
    starting: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    rt: Handle,
}

fn now_nanos() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// What identifies a CreateChangeSet request for its retries: the request as received (a
/// path, not the file's content; the variables in their order), not the plan's time.
fn plan_request_digest(instance: &str, source: &Source, variables: &[(String, String)]) -> String {
    let mut parts: Vec<&[u8]> = vec![b"plan", instance.as_bytes()];
    let count;
    let path;
    match source {
        Source::Inline {
            file_name,
            content,
            children,
        } => {
            count = children.len().to_le_bytes();
            parts.extend([b"inline".as_slice(), file_name.as_bytes(), content, &count]);
            for (name, body) in children {
                parts.extend([name.as_bytes(), body.as_slice()]);
            }
        }
        Source::Path(p) => {
            path = p.to_string_lossy();
            parts.extend([b"path".as_slice(), path.as_bytes()]);
        }
    }
    for (k, v) in variables {
        parts.extend([k.as_bytes(), v.as_bytes()]);
    }
    digest(&parts)
}

/// sha256 over `parts`, each framed by its length so no two lists collide.
fn digest<T: AsRef<[u8]>>(parts: &[T]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for p in parts {
        let p = p.as_ref();
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl Engine {
    pub fn new(
        store: Arc<dyn StateStore>,
        host: Arc<PluginHost>,
        provisioner: Arc<dyn Provisioner>,
        config: EngineConfig,
        rt: Handle,
    ) -> Arc<Engine> {
        Arc::new(Engine {
            store,
            host,
            provisioner,
            config,
            running: DashMap::new(),
            unrecorded: DashMap::new(),
            finished: tokio::sync::Notify::new(),
            last_planned: Mutex::new(None),
            draining: AtomicBool::new(false),
            starting: Mutex::new(HashMap::new()),
            rt,
        })
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

    /// The documents of a request. A path must lie under an allowed root.
    fn read_source(&self, source: Source) -> Result<Vec<(String, Vec<u8>)>> {
        match source {
            Source::Inline {
                file_name,
                content,
                children,
            } => {
                if file_name.is_empty() {
                    return Err(EngineError::InvalidArgument(
                        "the inline blueprint needs a file name (it chooses YAML or JSON)".into(),
                    ));
                }
                let mut files = vec![(file_name, content)];
                files.extend(children);
                Ok(files)
            }
            Source::Path(path) => {
                let (resolved, content) = paths::read_source(
                    &path,
                    &self.config.cwd,
                    &self.config.allowed_roots,
                    self.config.max_input_size,
                )?;
                Ok(vec![(resolved.display().to_string(), content)])
            }
        }
    }

    /// Runs `f` on a blocking thread with plugin access (validation and provider functions
    /// block on the engine's runtime).
    async fn with_plugins<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Engine, &PluginContext<'_>) -> T + Send + 'static,
    ) -> Result<T> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let plugins = PluginContext::load(&this.host, this.rt.clone());
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
    ) -> Result<Vec<Json>> {
        let files = self.read_source(source)?;
        let max = self.config.max_input_size;
        self.with_plugins(move |_, plugins| {
            let mut sources = crate::source::SourceMap::new();
            let mut diags = crate::diag::Diagnostics::default();
            let (name, bytes) = files.into_iter().next().unwrap_or_default();
            crate::check::validate_source(
                &mut sources,
                &name,
                bytes,
                &variables,
                max,
                plugins,
                &mut diags,
            );
            diags
                .items
                .iter()
                .map(|d| crate::diag::render_json_value(d, &sources))
                .collect()
        })
        .await
    }

    // ---- change sets ----------------------------------------------------------------------

    async fn instance_named(&self, name: &str) -> Result<crate::state::Instance> {
        self.store
            .find_instance(name)
            .await?
            .ok_or_else(|| EngineError::NotFound(format!("instance `{name}` not found")))
    }

    /// Plans `source` against `instance`. With a `request_id`, a retry of the same request
    /// (same instance, documents and variables) returns the change set the first one recorded
    /// and plans nothing; the id with another request is `AlreadyExists`. Without one, every
    /// call records a new change set.
    pub async fn create_change_set(
        self: &Arc<Self>,
        request_id: &str,
        instance: &str,
        source: Source,
        variables: Vec<(String, String)>,
    ) -> Result<ChangeSetView> {
        if let Some(why) = names::instance_name_problem(instance) {
            return Err(EngineError::InvalidArgument(why));
        }
        if request_id.is_empty() {
            return self
                .create_change_set_in(instance, source, variables, Vec::new(), None, None)
                .await;
        }
        let key = RequestKey {
            id: request_id.to_owned(),
            digest: plan_request_digest(instance, &source, &variables),
        };
        // Identical requests arriving together take turns: the second finds the first's
        // change set instead of planning again. Keyed apart from operations' ids.
        let ticket = self.starting(&format!("plan\u{0}{request_id}"));
        let _one_at_a_time = ticket.lock.lock().await;
        if let Some(cs) = self.store.find_change_set(&key).await? {
            let inst = self.store.get_instance(&cs.instance_id).await?;
            return Ok(view(cs, inst.name));
        }
        self.create_change_set_in(instance, source, variables, Vec::new(), None, Some(key))
            .await
    }

    /// [`Engine::create_change_set`] for a child blueprint included by `include_chain`, on its
    /// parent's clock (`now`).
    async fn create_change_set_in(
        self: &Arc<Self>,
        instance: &str,
        source: Source,
        variables: Vec<(String, String)>,
        include_chain: Vec<String>,
        now: Option<i128>,
        request: Option<RequestKey>,
    ) -> Result<ChangeSetView> {
        if instance.is_empty() {
            return Err(EngineError::InvalidArgument(
                "an instance name is required".into(),
            ));
        }
        let files = self.read_source(source)?;
        let mut inputs = Inputs {
            files,
            variables,
            now_unix_nanos: now.unwrap_or_else(now_nanos),
            include_chain,
        };
        // A new instance is planned from empty state and recorded only with its first change
        // set: a blueprint that fails to plan leaves no instance behind.
        let existing = self.store.find_instance(instance).await?;
        let current = match &existing {
            Some(i) => self.store.load_state(&i.id).await?,
            None => empty_state(instance),
        };
        // The version of the very snapshot the plan reads: execution requires it unchanged.
        let planned_version = current.instance.version;
        let max = self.config.request_limits();
        let cwd = self.config.cwd.display().to_string();
        let planned_inputs = inputs.clone();
        let name = instance.to_owned();
        let planned = self
            .with_plugins(move |engine, plugins| {
                let failed = |error: PlanFailure| Planned {
                    error: Some(error),
                    ..Planned::default()
                };
                let mut prepared = prepare::prepare(&planned_inputs, max, plugins, &cwd);
                if prepared.diags.has_errors() {
                    return failed(PlanFailure::invalid("", &prepared));
                }
                prepared.read_links(&current);
                // The children are planned first, each against its own instance: the exports
                // they will have, where known, feed the parent's resources and the children
                // after them.
                let children = match engine.plan_children(
                    &name,
                    &mut prepared,
                    &planned_inputs,
                    &current,
                    plugins,
                ) {
                    Ok(c) => c,
                    Err(e) => return failed(e),
                };
                let mut plan = plan::plan(&mut prepared, &current, &plugins.manifests, plugins);
                if prepared.diags.has_errors() {
                    return failed(PlanFailure::invalid("", &prepared));
                }
                plan.children = children.children;
                Planned {
                    datasources: prepared.datasources_json(),
                    diagnostics: prepared.diagnostics_json(),
                    plan,
                    error: None,
                    prepared: Some(prepared),
                    files: children.files,
                }
            })
            .await?;
        if let Some(failure) = planned.error {
            return Err(failure.into());
        }
        let Planned {
            plan,
            diagnostics,
            datasources,
            prepared,
            files,
            ..
        } = planned;
        // Included documents read from this host are part of what was planned: the digest
        // covers them and execution reads them from the change set.
        inputs.files.extend(files);
        let inst = match existing {
            Some(i) => i,
            None => match self.store.create_instance(instance).await {
                Ok(i) => i,
                // Created meanwhile by a concurrent plan (at version 0 still, or this plan
                // is stale at execution, as it should be).
                Err(StateError::Conflict(Conflict::NameTaken { .. })) => {
                    self.instance_named(instance).await?
                }
                Err(e) => return Err(e.into()),
            },
        };
        let body = json!({
            "inputs": inputs.to_json(),
            "plan": plan.to_json(),
            "links": links::to_json(&plan.links),
            "children": plan.children_json(),
            // What the plan's data sources returned: execution uses exactly these.
            "datasources": datasources,
            "summary": plan.summary(),
            "diagnostics": diagnostics,
        });
        let cs = self
            .store
            .create_change_set(NewChangeSet {
                instance_id: inst.id.clone(),
                planned_version,
                digest: inputs.digest(),
                body,
                request,
            })
            .await?;
        if let Some(prepared) = prepared {
            *self.last_planned.lock().unwrap_or_else(|e| e.into_inner()) = Some(LastPlanned {
                change_set_id: cs.id.clone(),
                inputs,
                plan: plan.clone(),
                prepared,
            });
        }
        Ok(ChangeSetView {
            change_set: cs,
            instance_name: inst.name,
            plan,
            diagnostics,
        })
    }

    /// Plans every include of `prepared` against its own instance (`<parent>/<name>`), in
    /// dependency order, and the children `current` has that the blueprint no longer includes
    /// (deleted). Records the exports the plan knows of each child in `prepared` and evaluates
    /// the parent's resources again with them.
    fn plan_children(
        &self,
        parent: &str,
        prepared: &mut Prepared,
        inputs: &Inputs,
        current: &InstanceState,
        plugins: &PluginContext<'_>,
    ) -> std::result::Result<PlannedChildren, PlanFailure> {
        let mut out = PlannedChildren::default();
        if prepared.blueprint.include.is_empty() && current.children.is_empty() {
            return Ok(out);
        }
        let parent_file = inputs
            .files
            .first()
            .map(|f| f.0.clone())
            .unwrap_or_default();
        let mut chain = inputs.include_chain.clone();
        chain.push(children::normalize(&parent_file));
        // The request's documents and those read while planning, for the children's includes.
        let mut files = inputs.files.clone();
        for i in prepared.include_order() {
            let name = prepared.blueprint.include[i].name.value.clone();
            let instance = format!("{parent}/{name}");
            let state = self.child_state(&instance)?;
            let at = plan::include_at_plan(prepared, i, plugins)?;
            let Some(path) = at.path else {
                out.children.push(deferred_child(
                    &name,
                    &state,
                    at.unknown,
                    "its path is known only after deploy".into(),
                ));
                continue;
            };
            if chain.len() > children::MAX_DEPTH {
                return Err(format!(
                    "include `{name}`: includes nest deeper than {} levels ({})",
                    children::MAX_DEPTH,
                    chain.join(" -> ")
                )
                .into());
            }
            let (file, content) = children::resolve(
                &parent_file,
                &path,
                &files,
                &self.config.allowed_roots,
                self.config.max_input_size,
                // On a blocking thread: wait for the fetch on the runtime.
                &|url| self.rt.block_on(self.config.remote_includes.fetch(url)),
            )
            .map_err(|e| format!("include `{name}`: {e}"))?;
            // Read from this host or fetched: kept under the name execution looks it up by,
            // so execution deploys the very document planned.
            let file = if files.iter().any(|(n, _)| *n == file) {
                file
            } else if remote::is_remote(&file) {
                files.push((file.clone(), content.clone()));
                out.files.push((file.clone(), content.clone()));
                file
            } else {
                let key = include_key(&parent_file, &path);
                files.push((key.clone(), content.clone()));
                out.files.push((key.clone(), content.clone()));
                key
            };
            let key = children::normalize(&file);
            if chain.contains(&key) {
                return Err(format!(
                    "include `{name}`: an include cycle: {} -> {key}",
                    chain.join(" -> ")
                )
                .into());
            }
            let declared = plan::child_variables(&file, &content, self.config.max_input_size)
                .unwrap_or_default();
            if let Some(d) =
                plan::undeclared_child_variable(&prepared.blueprint.include[i], &file, &declared)
            {
                prepared.diags.push(d);
                return Err(PlanFailure::invalid("", prepared));
            }
            let child = ChildInputs {
                name: &name,
                instance: &instance,
                file,
                content,
                declared,
                variables: at.variables,
                unknown: at.unknown,
                chain: chain.clone(),
                now: inputs.now_unix_nanos,
            };
            let found = out.files.len();
            let planned = self.plan_child(child, &files, &state, plugins, &mut out.files)?;
            files.extend(out.files[found..].iter().cloned());
            if planned.deferred.is_empty() {
                prepared.set_child_exports(
                    &name,
                    planned.known_exports(),
                    planned.secret_exports(),
                );
            }
            out.children.push(planned);
        }
        for c in &current.children {
            if prepared
                .blueprint
                .include
                .iter()
                .any(|i| i.name.value == c.name)
            {
                continue;
            }
            let state = self
                .rt
                .block_on(self.store.load_state(&c.child_instance_id))
                .map_err(|e| format!("child `{}`: {e}", c.name))?;
            out.children.push(self.plan_deleted_child(&c.name, &state)?);
        }
        if !prepared.blueprint.include.is_empty() {
            // The parent's resources read the children's exports known now.
            for idx in prepared.order.clone() {
                let found = prepared.reevaluate(idx, plugins);
                prepared.diags.extend(found);
            }
        }
        Ok(out)
    }

    /// Plans one child against its instance's state; its own children first.
    fn plan_child(
        &self,
        child: ChildInputs<'_>,
        files: &[(String, Vec<u8>)],
        state: &InstanceState,
        plugins: &PluginContext<'_>,
        read: &mut Vec<(String, Vec<u8>)>,
    ) -> std::result::Result<plan::ChildPlan, PlanFailure> {
        let ChildInputs {
            name,
            instance,
            file,
            content,
            mut variables,
            unknown,
            declared,
            chain,
            now,
        } = child;
        let max = self.config.request_limits();
        variables.extend(plan::placeholder_variables(&declared, &unknown));
        let key = children::normalize(&file);
        let mut child_files = vec![(file, content)];
        child_files.extend(
            files
                .iter()
                .filter(|(n, _)| children::normalize(n) != key)
                .cloned(),
        );
        let inputs = Inputs {
            files: child_files,
            variables,
            now_unix_nanos: now,
            include_chain: chain,
        };
        let cwd = self.config.cwd.display().to_string();
        let mut prepared = prepare::prepare(&inputs, max, plugins, &cwd);
        // With stand-ins for unknown variables, a child may not evaluate (a data source
        // filter, a function): its changes are then worked out at deploy.
        let unknown_note = || {
            format!(
                "{} known only after deploy",
                unknown
                    .iter()
                    .map(|u| format!("`{u}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
                    + if unknown.len() == 1 { " is" } else { " are" }
            )
        };
        if prepared.diags.has_errors() {
            if !unknown.is_empty() {
                return Ok(deferred_child(name, state, unknown.clone(), unknown_note()));
            }
            return Err(PlanFailure::invalid(
                &format!("child `{instance}`: "),
                &prepared,
            ));
        }
        plan::forget_variables(&mut prepared, &unknown, plugins);
        prepared.read_links(state);
        let nested = self.plan_children(instance, &mut prepared, &inputs, state, plugins)?;
        read.extend(nested.files);
        let mut planned = plan::plan(&mut prepared, state, &plugins.manifests, plugins);
        if prepared.diags.has_errors() {
            if !unknown.is_empty() {
                return Ok(deferred_child(name, state, unknown.clone(), unknown_note()));
            }
            return Err(PlanFailure::invalid(
                &format!("child `{instance}`: "),
                &prepared,
            ));
        }
        planned.children = nested.children;
        let exports = plan::planned_exports(&mut prepared, &planned, state, plugins);
        Ok(plan::ChildPlan {
            name: name.to_owned(),
            instance: instance.to_owned(),
            action: plan::child_action(plan::deployed(state), &planned, &exports),
            planned_version: state.instance.version,
            plan: planned,
            exports,
            unknown_variables: unknown,
            deferred: String::new(),
            diagnostics: prepared.diagnostics_json(),
        })
    }

    /// The plan of a child no longer included, and of its own children.
    fn plan_deleted_child(
        &self,
        name: &str,
        state: &InstanceState,
    ) -> std::result::Result<plan::ChildPlan, String> {
        let mut nested = Vec::new();
        for c in state.children.iter().rev() {
            let s = self
                .rt
                .block_on(self.store.load_state(&c.child_instance_id))
                .map_err(|e| format!("child `{}`: {e}", c.name))?;
            nested.push(self.plan_deleted_child(&c.name, &s)?);
        }
        Ok(plan::deleted_child(name, state, nested))
    }

    /// A child instance's state; an empty new instance when there is none yet.
    fn child_state(&self, instance: &str) -> std::result::Result<InstanceState, String> {
        let found = self
            .rt
            .block_on(self.store.find_instance(instance))
            .map_err(|e| format!("child `{instance}`: {e}"))?;
        match found {
            Some(i) => self
                .rt
                .block_on(self.store.load_state(&i.id))
                .map_err(|e| format!("child `{instance}`: {e}")),
            None => Ok(empty_state(instance)),
        }
    }

    pub async fn get_change_set(&self, id: &str) -> Result<ChangeSetView> {
        let cs = self.store.get_change_set(id).await?;
        let inst = self.store.get_instance(&cs.instance_id).await?;
        Ok(view(cs, inst.name))
    }

    pub async fn list_change_sets(&self, instance: &str) -> Result<Vec<ChangeSetView>> {
        let inst = self.instance_named(instance).await?;
        Ok(self
            .store
            .list_change_sets(&inst.id)
            .await?
            .into_iter()
            .map(|cs| view(cs, inst.name.clone()))
            .collect())
    }

    // ---- operations -------------------------------------------------------------------------

    /// Starts a mutation at most once per request id: a retry of the same request (same
    /// digest) gets the operation recorded first, whatever its status now, and starts nothing;
    /// the same id with another request is `AlreadyExists`. `start` runs for a new id only.
    async fn once(
        &self,
        request_id: &str,
        request_digest: &str,
        start: impl std::future::Future<Output = Result<Operation>>,
    ) -> Result<Operation> {
        if request_id.is_empty() {
            return Err(EngineError::InvalidArgument(
                "request_id is required (a fresh unique id per request; reuse it to retry)".into(),
            ));
        }
        // Identical requests arriving together in this engine take turns: the second finds
        // the first's operation instead of being refused by the lease the first holds.
        let ticket = self.starting(request_id);
        let _one_at_a_time = ticket.lock.lock().await;
        if let Some(op) = self.retried(request_id, request_digest).await? {
            return Ok(op);
        }
        match start.await {
            // Refused before recording anything (the instance is held, the change set taken):
            // perhaps by this very request, started at once through another engine on the same
            // store. Then its operation is the answer.
            Err(e @ (EngineError::Aborted(_) | EngineError::FailedPrecondition(_))) => {
                match self.retried(request_id, request_digest).await {
                    Ok(Some(op)) => Ok(op),
                    Err(reused @ EngineError::AlreadyExists(_)) => Err(reused),
                    _ => Err(e),
                }
            }
            other => other,
        }
    }

    /// The turn-taking lock of `request_id` (see [`Engine::once`]).
    fn starting(&self, request_id: &str) -> Starting<'_> {
        let mut map = self.starting.lock().unwrap_or_else(|e| e.into_inner());
        let lock = map.entry(request_id.to_owned()).or_default().clone();
        Starting {
            map: &self.starting,
            request_id: request_id.to_owned(),
            lock,
        }
    }

    /// The existing operation for a retried request, or `None` for a new request id.
    async fn retried(&self, request_id: &str, request_digest: &str) -> Result<Option<Operation>> {
        match self.store.find_operation(request_id).await? {
            Some(op) if op.request_digest == request_digest => Ok(Some(op)),
            Some(_) => Err(EngineError::AlreadyExists(format!(
                "request id `{request_id}` was already used for a different request"
            ))),
            None => Ok(None),
        }
    }

    async fn lease(&self, instance_id: &str) -> Result<Lease> {
        Ok(self
            .store
            .acquire_lease(instance_id, &self.config.owner, self.config.lease_ttl)
            .await?)
    }

    /// How many resources a change set creates, updates, recreates or deletes: from the plan
    /// this engine holds, else from the recorded body; `None` if neither can be read.
    async fn planned_changes(&self, change_set_id: &str) -> Option<usize> {
        let count = |plan: &Plan| {
            plan.resources
                .iter()
                .filter(|r| r.action != plan::Action::NoChange)
                .count()
        };
        {
            let slot = self.last_planned.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(p) = slot.as_ref().filter(|p| p.change_set_id == change_set_id) {
                return Some(count(&p.plan));
            }
        }
        let cs = self.store.get_change_set(change_set_id).await.ok()?;
        Plan::from_body(&cs.body).map(|p| count(&p))
    }

    /// Records the operation and marks it running, under `lease`.
    async fn start_operation(&self, lease: &Lease, start: OperationStart<'_>) -> Result<Started> {
        let OperationStart {
            kind,
            request_id,
            request_digest,
            change_set_id,
            instance_status,
            total,
        } = start;
        let accepted = self
            .store
            .create_operation(NewOperation {
                instance_id: lease.instance_id.clone(),
                kind,
                request_id: request_id.to_owned(),
                request_digest: request_digest.to_owned(),
                change_set_id: change_set_id.clone(),
                owner: self.config.owner.clone(),
            })
            .await?;
        let op = accepted.operation;
        if !accepted.created {
            // The same request, recorded meanwhile (through another engine): never run twice,
            // and the lease taken for it goes back.
            let _ = self.store.release_lease(lease).await;
            return Ok(Started::Existing(op));
        }
        self.store
            .commit(
                lease,
                vec![
                    Change::OperationStatus {
                        id: op.id.clone(),
                        status: OperationStatus::Running,
                        error: None,
                    },
                    Change::InstanceStatus(instance_status),
                ],
                vec![NewEvent::new("operation.started", {
                    let mut payload = json!({ "operation": op.id, "kind": kind.as_str(),
                            "changeSet": change_set_id, "status": instance_status.as_str() });
                    // How many resources the operation changes, so that a watcher can size
                    // its progress without fetching the whole change set.
                    if let Some(total) = total {
                        payload["total"] = total.into();
                    }
                    payload
                })],
            )
            .await?;
        Ok(Started::New(self.store.get_operation(&op.id).await?))
    }

    /// Starts executing a change set.
    pub async fn execute(
        self: &Arc<Self>,
        request_id: &str,
        change_set_id: &str,
        rollback_on_failure: bool,
    ) -> Result<Operation> {
        let request_digest = digest(&[
            "execute",
            change_set_id,
            if rollback_on_failure { "rollback" } else { "" },
        ]);
        self.once(
            request_id,
            &request_digest,
            self.start_execute(
                request_id,
                &request_digest,
                change_set_id,
                rollback_on_failure,
            ),
        )
        .await
    }

    async fn start_execute(
        self: &Arc<Self>,
        request_id: &str,
        request_digest: &str,
        change_set_id: &str,
        rollback_on_failure: bool,
    ) -> Result<Operation> {
        self.accepting()?;
        // The body (the whole plan) is read by the run, and only when this engine no longer
        // holds the plan it made.
        let cs = self.store.get_change_set_head(change_set_id).await?;
        if cs.status != ChangeSetStatus::Planned {
            return Err(EngineError::FailedPrecondition(format!(
                "change set {change_set_id} is {}; plan again",
                cs.status
            )));
        }
        let lease = self.lease(&cs.instance_id).await?;
        let before = match self.store.begin_execution(change_set_id, &lease).await {
            Ok(_) => self.store.load_state(&cs.instance_id).await?,
            Err(e) => {
                let _ = self.store.release_lease(&lease).await;
                return Err(e.into());
            }
        };
        let status = match before.instance.status {
            InstanceStatus::New | InstanceStatus::Destroyed => InstanceStatus::Deploying,
            _ if before.resources.is_empty() => InstanceStatus::Deploying,
            _ => InstanceStatus::Updating,
        };
        let total = self.planned_changes(&cs.id).await;
        let op = match self
            .start_operation(
                &lease,
                OperationStart {
                    kind: OperationKind::Deploy,
                    request_id,
                    request_digest,
                    change_set_id: Some(cs.id.clone()),
                    instance_status: status,
                    total,
                },
            )
            .await
        {
            Ok(Started::New(op)) => op,
            // Unreachable in practice: the request that recorded it took the change set first.
            Ok(Started::Existing(op)) => return Ok(op),
            Err(e) => {
                // The change set was taken for execution: mark it failed rather than leave it.
                let _ = self
                    .store
                    .commit(
                        &lease,
                        vec![Change::ChangeSetStatus {
                            id: cs.id.clone(),
                            status: ChangeSetStatus::Failed,
                        }],
                        vec![],
                    )
                    .await;
                let _ = self.store.release_lease(&lease).await;
                return Err(e);
            }
        };
        let updating = status == InstanceStatus::Updating;
        self.spawn_run(op.clone(), lease, move |engine, ctx, plugins| {
            engine.run_deploy(ctx, plugins, cs, before, rollback_on_failure, updating)
        });
        Ok(op)
    }

    /// Starts destroying an instance.
    pub async fn destroy(self: &Arc<Self>, request_id: &str, instance: &str) -> Result<Operation> {
        let request_digest = digest(&["destroy", instance]);
        self.once(
            request_id,
            &request_digest,
            self.start_destroy(request_id, &request_digest, instance),
        )
        .await
    }

    async fn start_destroy(
        self: &Arc<Self>,
        request_id: &str,
        request_digest: &str,
        instance: &str,
    ) -> Result<Operation> {
        self.accepting()?;
        let inst = self.instance_named(instance).await?;
        let lease = self.lease(&inst.id).await?;
        // Sizes a watcher's progress; not worth failing the destroy over.
        let total = self
            .store
            .count_resources(&inst.id)
            .await
            .ok()
            .and_then(|n| usize::try_from(n).ok());
        let op = match self
            .start_operation(
                &lease,
                OperationStart {
                    kind: OperationKind::Destroy,
                    request_id,
                    request_digest,
                    change_set_id: None,
                    instance_status: InstanceStatus::Destroying,
                    total,
                },
            )
            .await
        {
            Ok(Started::New(op)) => op,
            Ok(Started::Existing(op)) => return Ok(op),
            Err(e) => {
                let _ = self.store.release_lease(&lease).await;
                return Err(e);
            }
        };
        self.spawn_run(op.clone(), lease, |engine, ctx, _| engine.run_destroy(ctx));
        Ok(op)
    }

    /// Starts a reconcile: unresolved provider calls are settled, drifted resources accepted
    /// or re-applied.
    pub async fn reconcile(
        self: &Arc<Self>,
        request_id: &str,
        instance: &str,
        accept_external: bool,
        only: Vec<String>,
    ) -> Result<Operation> {
        let mode = if accept_external { "accept" } else { "reapply" };
        let request_digest = digest(&["reconcile", instance, mode, &only.join("\u{0}")]);
        self.once(
            request_id,
            &request_digest,
            self.start_reconcile(request_id, &request_digest, instance, accept_external, only),
        )
        .await
    }

    async fn start_reconcile(
        self: &Arc<Self>,
        request_id: &str,
        request_digest: &str,
        instance: &str,
        accept_external: bool,
        only: Vec<String>,
    ) -> Result<Operation> {
        self.accepting()?;
        let inst = self.instance_named(instance).await?;
        let lease = self.lease(&inst.id).await?;
        let status = inst.status;
        let op = match self
            .start_operation(
                &lease,
                OperationStart {
                    kind: OperationKind::Reconcile,
                    request_id,
                    request_digest,
                    change_set_id: None,
                    instance_status: status,
                    total: None,
                },
            )
            .await
        {
            Ok(Started::New(op)) => op,
            Ok(Started::Existing(op)) => return Ok(op),
            Err(e) => {
                let _ = self.store.release_lease(&lease).await;
                return Err(e);
            }
        };
        self.spawn_run(op.clone(), lease, move |engine, ctx, _| {
            engine.run_reconcile(ctx, accept_external, &only)
        });
        Ok(op)
    }

    /// Asks a running operation to stop at its next safe point. Idempotent, so it records no
    /// request id: asking again asks again, and the answer is the operation as it is now.
    pub async fn cancel(&self, operation_id: &str) -> Result<Operation> {
        if let Some(ended) = self.unrecorded.get(operation_id) {
            return Ok(ended.clone());
        }
        let op = self.store.get_operation(operation_id).await?;
        if let Some(r) = self.running.get(operation_id) {
            r.cancel_requested.store(true, Ordering::SeqCst);
            r.stop.cancel();
        }
        Ok(op)
    }

    /// Runs an operation on a blocking thread (see `exec`) and records how it ended.
    fn spawn_run(
        self: &Arc<Self>,
        op: Operation,
        lease: Lease,
        body: impl FnOnce(&Arc<Engine>, &Arc<RunContext>, &PluginContext<'_>) -> Finish + Send + 'static,
    ) {
        let stop = CancellationToken::new();
        let cancel_requested = Arc::new(AtomicBool::new(false));
        self.running.insert(
            op.id.clone(),
            Running {
                stop: stop.clone(),
                cancel_requested: cancel_requested.clone(),
            },
        );
        let lease = Arc::new(Mutex::new(lease));
        let heartbeat_done = CancellationToken::new();
        let ctx = Arc::new(RunContext {
            store: self.store.clone(),
            provisioner: self.provisioner.clone(),
            lease: lease.clone(),
            operation: op.clone(),
            max_parallel: self.config.max_parallel,
            stop: stop.clone(),
            rt: self.rt.clone(),
            link_locks: exec::LinkLocks::default(),
        });
        let this = self.clone();
        self.rt.spawn(async move {
            exec::spawn_heartbeat(
                this.store.clone(),
                lease.clone(),
                this.config.lease_ttl,
                heartbeat_done.clone(),
                stop.clone(),
            );
            let runner = this.clone();
            let run_ctx = ctx.clone();
            let finish = tokio::task::spawn_blocking(move || {
                let mut plugins = PluginContext::load(&runner.host, runner.rt.clone());
                plugins.ask_providers = false;
                body(&runner, &run_ctx, &plugins)
            })
            .await
            .unwrap_or_else(|e| Finish::failed(format!("the operation panicked: {e}")));
            heartbeat_done.cancel();
            // Stopped by a drain: the operation is left running for the drain to mark
            // interrupted. One that succeeded all the same is recorded as it ended.
            let drained = this.draining.load(Ordering::SeqCst)
                && stop.is_cancelled()
                && !cancel_requested.load(Ordering::SeqCst)
                && finish.error.is_some();
            if !drained {
                let cancelled = cancel_requested.load(Ordering::SeqCst);
                this.record_end(&ctx, finish, cancelled).await;
            }
            this.running.remove(&op.id);
            this.finished.notify_waiters();
        });
    }

    /// Records how an operation ended, with its lease given up. When the store refuses the
    /// write (a full disk, an I/O error), the ending is kept in memory, where reads, cancels
    /// and watches find it, and a task records it once the store accepts writes again (with
    /// backoff), or gives up when another engine took the instance over (which marks the
    /// operation interrupted). A restart marks it interrupted too.
    async fn record_end(self: &Arc<Self>, ctx: &Arc<RunContext>, f: Finish, cancelled: bool) {
        let Err(first) = self.finish(ctx, f.clone(), cancelled).await else {
            return;
        };
        let op = &ctx.operation;
        tracing::error!(operation = %op.id, instance = %op.instance_id, error = %first,
            "the state store refused to record the end of the operation; it is kept in memory and recorded once the store accepts writes");
        let note = format!(
            "its end is not recorded yet: the state store refused the write ({first}); the \
             engine retries until it can"
        );
        let now = crate::state::Timestamp::from_millis(
            i64::try_from(now_nanos() / 1_000_000).unwrap_or(i64::MAX),
        );
        self.unrecorded.insert(
            op.id.clone(),
            Operation {
                status: end_status(&f, cancelled),
                error: Some(match &f.error {
                    Some(e) => format!("{e}\n({note})"),
                    None => format!("({note})"),
                }),
                updated_at: now,
                finished_at: Some(now),
                ..op.clone()
            },
        );
        let this = self.clone();
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let id = ctx.operation.id.clone();
            let mut wait = Duration::from_millis(250);
            loop {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RECORD_RETRY_MAX);
                match this.finish(&ctx, f.clone(), cancelled).await {
                    Ok(()) => {
                        tracing::info!(operation = %id, "the end of the operation is recorded");
                        break;
                    }
                    Err(e @ StateError::Fenced { .. }) => {
                        tracing::warn!(operation = %id, error = %e, "another engine took the instance over; it records the operation as interrupted");
                        break;
                    }
                    // Only a failing store (disk, database) may heal; anything else will not,
                    // and the next start marks the operation interrupted.
                    Err(e) if !matches!(e, StateError::Io(_) | StateError::Db(_)) => {
                        tracing::error!(operation = %id, error = %e, "the end of the operation cannot be recorded; the next start marks it interrupted");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(operation = %id, error = %e, retry_in = ?wait, "the state store still refuses the end of the operation")
                    }
                }
            }
            this.unrecorded.remove(&id);
        });
    }

    /// Records the end of an operation: its status, the instance's and the change set's, the
    /// terminal `operation.finished` event and the release of its lease, in one transaction:
    /// a client that sees the operation finished can start the next one at once.
    async fn finish(
        &self,
        ctx: &RunContext,
        f: Finish,
        cancelled: bool,
    ) -> std::result::Result<(), StateError> {
        let op = &ctx.operation;
        let status = end_status(&f, cancelled);
        let mut changes = vec![];
        if let Some(s) = f.instance_status {
            changes.push(Change::InstanceStatus(s));
        }
        changes.extend(f.changes);
        if let Some(cs) = &op.change_set_id {
            changes.push(Change::ChangeSetStatus {
                id: cs.clone(),
                status: if f.error.is_none() {
                    ChangeSetStatus::Executed
                } else {
                    ChangeSetStatus::Failed
                },
            });
        }
        changes.push(Change::OperationStatus {
            id: op.id.clone(),
            status,
            error: f.error.clone(),
        });
        changes.push(Change::ReleaseLease);
        let event = NewEvent::new(
            "operation.finished",
            json!({ "status": status.as_str(), "error": f.error,
                    "instanceStatus": f.instance_status.map(|s| s.as_str()) }),
        );
        ctx.commit(changes, vec![event]).await.map(drop)
    }

    /// Inputs, plan and evaluation rebuilt from a change set's recorded body, with the data
    /// sources replayed as planned.
    fn recorded_plan(
        &self,
        ctx: &RunContext,
        change_set_id: &str,
        digest: &str,
        plugins: &PluginContext<'_>,
    ) -> std::result::Result<(Inputs, Plan, Prepared), String> {
        let cs = ctx
            .rt
            .block_on(self.store.get_change_set(change_set_id))
            .map_err(|e| format!("state store: {e}"))?;
        let inputs = cs
            .body
            .get("inputs")
            .and_then(Inputs::from_json)
            .ok_or("the change set's recorded inputs cannot be read")?;
        if inputs.digest() != digest {
            return Err("the change set's recorded inputs do not match its digest".into());
        }
        let plan = Plan::from_body(&cs.body).ok_or("the change set's plan cannot be read")?;
        let cwd = self.config.cwd.display().to_string();
        let recorded = prepare::RecordedDataSources::from_body(&cs.body, plugins);
        let prepared = prepare::prepare_with(
            &inputs,
            self.config.request_limits(),
            plugins,
            &cwd,
            Some(&recorded),
        );
        Ok((inputs, plan, prepared))
    }

    fn run_deploy(
        self: &Arc<Self>,
        ctx: &Arc<RunContext>,
        plugins: &PluginContext<'_>,
        cs: ChangeSet,
        before: InstanceState,
        rollback_on_failure: bool,
        updating: bool,
    ) -> Finish {
        let (ok_status, failed_status) = if updating {
            (InstanceStatus::Updated, InstanceStatus::UpdateFailed)
        } else {
            (InstanceStatus::Deployed, InstanceStatus::DeployFailed)
        };
        let fail = |error: String| Finish {
            error: Some(error),
            instance_status: Some(failed_status),
            changes: vec![],
        };
        let cached = {
            let mut slot = self.last_planned.lock().unwrap_or_else(|e| e.into_inner());
            match slot.take() {
                Some(p) if p.change_set_id == cs.id => Some(p),
                other => {
                    *slot = other;
                    None
                }
            }
        };
        // The evaluation from planning when this engine still has it (same inputs: the change
        // set's digest names them; same state: the instance version is the planned one).
        // Otherwise everything is rebuilt from the recorded body.
        let (inputs, plan, mut prepared) = match cached {
            Some(p) if p.inputs.digest() == cs.digest => (p.inputs, p.plan, p.prepared),
            _ => match self.recorded_plan(ctx, &cs.id, &cs.digest, plugins) {
                Ok(planned) => planned,
                Err(e) => return fail(e),
            },
        };
        // Provider failures and plugin logs are cleaned of this deploy's secrets while it runs
        // (its children's and links' calls and its rollback included): see `crate::redact`.
        let mut secrets = prepared.evaluation.secret_texts();
        secrets.extend(state_values::instance_secrets(&before));
        let _secrets = crate::redact::hold(secrets);
        if prepared.diags.has_errors() {
            return fail(format!(
                "the blueprint no longer validates with the installed plugins:\n{}",
                prepared.errors_text()
            ));
        }
        prepared.read_links(&before);
        let can_roll_back = |engine: &Engine| rollback_on_failure && !engine.drained(ctx);
        // Children first, in the order of the references between them: their exports feed
        // the parent's resources and the children after them.
        let mut undo = Vec::new();
        let deployed_children = self.deploy_children(
            ctx,
            &mut prepared,
            &inputs,
            &plan.children,
            &before,
            plugins,
            rollback_on_failure,
            &mut undo,
        );
        let child_changes = match deployed_children {
            Ok(c) => c,
            Err(e) if can_roll_back(self) => return self.roll_back(ctx, e, &[], &before, &undo),
            Err(e) => return fail(e),
        };
        if !child_changes.is_empty()
            && let Err(e) = ctx.commit_blocking(child_changes, vec![])
        {
            return fail(format!("state store: {e}"));
        }
        let (outcome, done) = exec::deploy(ctx, &mut prepared, &plan, &before, plugins);
        match outcome {
            Outcome::Succeeded => {
                // Exports read the final state of every resource.
                match self.final_exports(ctx, &mut prepared, plugins) {
                    Ok(changes) => Finish {
                        error: None,
                        instance_status: Some(ok_status),
                        changes,
                    },
                    Err(e) if can_roll_back(self) => self.roll_back(ctx, e, &done, &before, &undo),
                    Err(e) => fail(e),
                }
            }
            Outcome::Failed { error, .. } if can_roll_back(self) => {
                self.roll_back(ctx, error, &done, &before, &undo)
            }
            Outcome::Failed { error, .. } => fail(error),
        }
    }

    /// Undoes a failed deploy: the parent's resources (`done`, back to `before`), then what it
    /// did to its children, the last first. The instance ends `ROLLBACK_COMPLETE`, or
    /// `ROLLBACK_FAILED` when something could not be undone.
    fn roll_back(
        self: &Arc<Self>,
        ctx: &Arc<RunContext>,
        error: String,
        done: &[exec::Done],
        before: &InstanceState,
        undo: &[ChildUndo],
    ) -> Finish {
        let _ = ctx.commit_blocking(
            vec![Change::InstanceStatus(InstanceStatus::RollingBack)],
            vec![NewEvent::new(
                "rollback.started",
                json!({ "reason": error, "steps": done.len(), "children": undo.len() }),
            )],
        );
        // Rollback must run to the end even though the run was asked to stop.
        let resources = exec::rollback(ctx, done, before);
        // The parent's resources may read the children: they go back first.
        let children = self.roll_back_children(ctx, undo);
        let status = match resources.and(children) {
            Ok(()) => InstanceStatus::RollbackComplete,
            Err(e) => {
                tracing::error!(operation = %ctx.operation.id, error = %e, "rollback failed");
                InstanceStatus::RollbackFailed
            }
        };
        Finish {
            error: Some(error),
            instance_status: Some(status),
            changes: vec![],
        }
    }

    /// Undoes what a deploy did to its children, the last first: a child it created is
    /// destroyed, one it updated or destroyed is deployed again from its previous inputs.
    /// Each outcome is a `child.rolled_back` event of the parent. Returns the first error.
    fn roll_back_children(
        self: &Arc<Self>,
        ctx: &Arc<RunContext>,
        undo: &[ChildUndo],
    ) -> std::result::Result<(), String> {
        let mut first_error = None;
        for u in undo.iter().rev() {
            let (name, instance, result) = match u {
                ChildUndo::Destroy { name, instance } => (
                    name,
                    instance,
                    self.destroy_child_instance(ctx, name, instance, "rollback")
                        .map(|()| ("destroyed", "created by the failed operation")),
                ),
                ChildUndo::Restore {
                    name,
                    instance,
                    previous: None,
                    ..
                } => (
                    name,
                    instance,
                    self.destroy_child_instance(ctx, name, instance, "rollback")
                        .map(|()| ("destroyed", "no earlier successful deploy is recorded")),
                ),
                ChildUndo::Restore {
                    name,
                    instance,
                    instance_id,
                    previous: Some(inputs),
                } => (
                    name,
                    instance,
                    self.restore_child(ctx, name, instance, instance_id, inputs)
                        .map(|()| ("restored", "deployed again as it was before the operation")),
                ),
            };
            let payload = match &result {
                Ok((status, why)) => json!({
                    "child": name, "instance": instance, "status": status,
                    "reason": format!("{instance}: {why}"),
                }),
                Err(e) => json!({
                    "child": name, "instance": instance, "status": "failed", "error": e,
                }),
            };
            let _ = ctx.commit_blocking(vec![], vec![NewEvent::new("child.rolled_back", payload)]);
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Destroys a child's instance and forgets it in the parent (if the parent records it).
    fn destroy_child_instance(
        self: &Arc<Self>,
        ctx: &Arc<RunContext>,
        name: &str,
        instance: &str,
        why: &str,
    ) -> std::result::Result<(), String> {
        let request = format!("{}:{why}:destroy:{instance}", ctx.operation.id);
        let op = ctx
            .rt
            .block_on(async {
                let op = self.destroy(&request, instance).await?;
                self.wait_operation(&op.id).await
            })
            .map_err(|e| format!("child `{instance}`: {e}"))?;
        if op.status != OperationStatus::Succeeded {
            return Err(format!(
                "child `{instance}` {}: {}",
                op.status,
                op.error.unwrap_or_default()
            ));
        }
        self.forget_child(ctx, name)
    }

    /// Removes the parent's record of child `name`, if it has one.
    fn forget_child(&self, ctx: &RunContext, name: &str) -> std::result::Result<(), String> {
        let state = ctx
            .rt
            .block_on(self.store.load_state(&ctx.operation.instance_id))
            .map_err(|e| e.to_string())?;
        if state.children.iter().any(|c| c.name == name) {
            ctx.commit_blocking(
                vec![Change::RemoveChild {
                    name: name.to_owned(),
                }],
                vec![],
            )
            .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Deploys a child again from recorded inputs (its last successful deploy's) and records
    /// it in the parent.
    fn restore_child(
        self: &Arc<Self>,
        ctx: &Arc<RunContext>,
        name: &str,
        instance: &str,
        instance_id: &str,
        inputs: &Inputs,
    ) -> std::result::Result<(), String> {
        let what = |e: EngineError| format!("child `{instance}`: {e}");
        let mut files = inputs.files.clone();
        if files.is_empty() {
            return Err(format!(
                "child `{instance}`: its previous inputs hold no document"
            ));
        }
        let (file_name, content) = files.remove(0);
        let source = Source::Inline {
            file_name,
            content,
            children: files,
        };
        let request = format!("{}:rollback:restore:{instance}", ctx.operation.id);
        let op = ctx
            .rt
            .block_on(async {
                let cs = self
                    .create_change_set_in(
                        instance,
                        source,
                        inputs.variables.clone(),
                        inputs.include_chain.clone(),
                        Some(inputs.now_unix_nanos),
                        None,
                    )
                    .await?;
                let op = self.execute(&request, &cs.change_set.id, false).await?;
                self.wait_operation(&op.id).await
            })
            .map_err(what)?;
        if op.status != OperationStatus::Succeeded {
            return Err(format!(
                "child `{instance}` {}: {}",
                op.status,
                op.error.unwrap_or_default()
            ));
        }
        ctx.commit_blocking(
            vec![Change::PutChild {
                name: name.to_owned(),
                child_instance_id: instance_id.to_owned(),
            }],
            vec![],
        )
        .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// The inputs of a child's last successful deploy (its newest executed change set).
    fn last_deployed_inputs(&self, ctx: &RunContext, instance_id: &str) -> Option<Box<Inputs>> {
        let sets = ctx
            .rt
            .block_on(self.store.list_change_sets(instance_id))
            .ok()?;
        sets.iter()
            .rev()
            .find(|cs| cs.status == ChangeSetStatus::Executed)
            .and_then(|cs| cs.body.get("inputs"))
            .and_then(Inputs::from_json)
            .map(Box::new)
    }

    /// Plans and executes every include as an instance of its own (`<parent>/<name>`), in
    /// dependency order, records its exports for the parent's evaluation, and destroys the
    /// children the blueprint no longer includes. Returns the parent's child records to write;
    /// `undo` gets how to undo each child this did something to, in order (for a rollback;
    /// with `rollback`, a failing child also rolls itself back).
    ///
    /// A child whose instance changed since `planned` read it is refused (the parent's change
    /// set is stale), and so is a child whose exports differ from what the plan knew of them
    /// (the parent's plan relied on them).
    #[allow(clippy::too_many_arguments)]
    fn deploy_children(
        self: &Arc<Self>,
        ctx: &Arc<RunContext>,
        prepared: &mut Prepared,
        inputs: &Inputs,
        planned: &[plan::ChildPlan],
        before: &InstanceState,
        plugins: &PluginContext<'_>,
        rollback: bool,
        undo: &mut Vec<ChildUndo>,
    ) -> std::result::Result<Vec<Change>, String> {
        // Nothing is deployed when the plan is stale for any child.
        for p in planned {
            check_child_version(p, &self.child_state(&p.instance)?)?;
        }
        let parent = before.instance.name.clone();
        let parent_file = inputs
            .files
            .first()
            .map(|f| f.0.clone())
            .unwrap_or_default();
        let mut chain = inputs.include_chain.clone();
        chain.push(children::normalize(&parent_file));
        let mut changes = Vec::new();
        for i in prepared.include_order() {
            let name = prepared.blueprint.include[i].name.value.clone();
            let (path, variables) = prepared.include_inputs(i, plugins)?;
            if chain.len() > children::MAX_DEPTH {
                return Err(format!(
                    "include `{name}`: includes nest deeper than {} levels ({})",
                    children::MAX_DEPTH,
                    chain.join(" -> ")
                ));
            }
            let (file, content) = children::resolve(
                &parent_file,
                &path,
                &inputs.files,
                &self.config.allowed_roots,
                self.config.max_input_size,
                // On the operation's blocking thread: wait for the fetch on the runtime.
                &|url| ctx.rt.block_on(self.config.remote_includes.fetch(url)),
            )
            .map_err(|e| format!("include `{name}`: {e}"))?;
            let key = children::normalize(&file);
            if chain.contains(&key) {
                return Err(format!(
                    "include `{name}`: an include cycle: {} -> {key}",
                    chain.join(" -> ")
                ));
            }
            // The child sees every file of the request, so its own includes resolve too.
            let others: Vec<(String, Vec<u8>)> = inputs
                .files
                .iter()
                .filter(|(n, _)| children::normalize(n) != key)
                .cloned()
                .collect();
            let instance = format!("{parent}/{name}");
            let source = Source::Inline {
                file_name: file,
                content,
                children: others,
            };
            let child_plan = planned.iter().find(|c| c.name == name);
            let state = self.child_state(&instance)?;
            if let Some(p) = child_plan {
                check_child_version(p, &state)?;
            }
            // What a rollback would go back to: captured before the child changes.
            let previous =
                plan::deployed(&state).then(|| self.last_deployed_inputs(ctx, &state.instance.id));
            let run = ctx.rt.block_on(self.run_child(
                ctx,
                &instance,
                source,
                variables,
                chain.clone(),
                inputs.now_unix_nanos,
                rollback,
            ))?;
            match previous {
                None => undo.push(ChildUndo::Destroy {
                    name: name.clone(),
                    instance: instance.clone(),
                }),
                Some(previous) if run.changed => undo.push(ChildUndo::Restore {
                    name: name.clone(),
                    instance: instance.clone(),
                    instance_id: run.instance_id.clone(),
                    previous,
                }),
                Some(_) => {}
            }
            if let Some(p) = child_plan {
                check_child_exports(p, &run.exports)?;
            }
            prepared.set_child_exports(&name, run.exports, run.secret_exports);
            changes.push(Change::PutChild {
                name,
                child_instance_id: run.instance_id,
            });
        }
        let gone: Vec<String> = before
            .children
            .iter()
            .filter(|c| {
                !prepared
                    .blueprint
                    .include
                    .iter()
                    .any(|i| i.name.value == c.name)
            })
            .map(|c| c.name.clone())
            .collect();
        if !gone.is_empty() {
            for c in before.children.iter().filter(|c| gone.contains(&c.name)) {
                let state = ctx
                    .rt
                    .block_on(self.store.load_state(&c.child_instance_id))
                    .map_err(|e| format!("child `{}`: {e}", c.name))?;
                if let Some(p) = planned.iter().find(|p| p.name == c.name) {
                    check_child_version(p, &state)?;
                }
                undo.push(ChildUndo::Restore {
                    name: c.name.clone(),
                    instance: state.instance.name.clone(),
                    instance_id: c.child_instance_id.clone(),
                    previous: self.last_deployed_inputs(ctx, &c.child_instance_id),
                });
            }
            self.destroy_children(ctx, before, &gone)?;
        }
        Ok(changes)
    }

    /// Plans and executes one child (on its parent's clock `now`; with `rollback`, a failure
    /// rolls the child back); its exports once it is deployed.
    #[allow(clippy::too_many_arguments)]
    async fn run_child(
        self: &Arc<Self>,
        ctx: &RunContext,
        instance: &str,
        source: Source,
        variables: Vec<(String, String)>,
        chain: Vec<String>,
        now: i128,
        rollback: bool,
    ) -> std::result::Result<ChildRun, String> {
        let what = |e: EngineError| format!("child `{instance}`: {e}");
        let cs = self
            .create_change_set_in(instance, source, variables, chain, Some(now), None)
            .await
            .map_err(what)?;
        let request = format!("{}:{instance}", ctx.operation.id);
        let op = self
            .execute(&request, &cs.change_set.id, rollback)
            .await
            .map_err(what)?;
        let op = self.wait_operation(&op.id).await.map_err(what)?;
        if op.status != OperationStatus::Succeeded {
            return Err(format!(
                "child `{instance}` {}: {}",
                op.status,
                op.error.unwrap_or_default()
            ));
        }
        let state = self
            .store
            .load_state(&op.instance_id)
            .await
            .map_err(|e| e.to_string())?;
        Ok(ChildRun {
            instance_id: op.instance_id.clone(),
            changed: !cs.plan.is_empty(),
            exports: state
                .exports
                .iter()
                .map(|e| {
                    (
                        e.name.clone(),
                        crate::eval::value::Value::from_json(&state_values::unwrap(&e.value)),
                    )
                })
                .collect(),
            secret_exports: state
                .exports
                .iter()
                .filter(|e| state_values::holds_secret(&e.value))
                .map(|e| e.name.clone())
                .collect(),
        })
    }

    /// Destroys the named children's instances (and forgets them in the parent), the last
    /// deployed first: children were recorded in dependency order, so a child that reads
    /// another goes before it.
    fn destroy_children(
        self: &Arc<Self>,
        ctx: &Arc<RunContext>,
        state: &InstanceState,
        names: &[String],
    ) -> std::result::Result<(), String> {
        for c in state
            .children
            .iter()
            .rev()
            .filter(|c| names.contains(&c.name))
        {
            let child = ctx
                .rt
                .block_on(self.store.get_instance(&c.child_instance_id))
                .map_err(|e| e.to_string())?;
            let request = format!("{}:destroy:{}", ctx.operation.id, child.name);
            let result = ctx.rt.block_on(async {
                let op = self.destroy(&request, &child.name).await?;
                self.wait_operation(&op.id).await
            });
            match result {
                Ok(op) if op.status == OperationStatus::Succeeded => {}
                Ok(op) => {
                    return Err(format!(
                        "child `{}` {}: {}",
                        child.name,
                        op.status,
                        op.error.unwrap_or_default()
                    ));
                }
                Err(e) => return Err(format!("child `{}`: {e}", child.name)),
            }
            ctx.commit_blocking(
                vec![Change::RemoveChild {
                    name: c.name.clone(),
                }],
                vec![NewEvent::new(
                    "child.destroyed",
                    json!({ "child": c.name, "instance": child.name }),
                )],
            )
            .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Waits until an operation ends.
    async fn wait_operation(&self, id: &str) -> Result<Operation> {
        loop {
            // Through the engine: a child's ending the store refused counts as its end.
            let op = self.get_operation(id).await?;
            if op.status.is_terminal() {
                return Ok(op);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn drained(&self, ctx: &RunContext) -> bool {
        self.draining.load(Ordering::SeqCst) && ctx.stop.is_cancelled()
    }

    /// The instance's exports after a deploy: every resource's recorded state is read into the
    /// evaluation, then each export is evaluated and type-checked.
    fn final_exports(
        &self,
        ctx: &RunContext,
        prepared: &mut Prepared,
        plugins: &PluginContext<'_>,
    ) -> std::result::Result<Vec<Change>, String> {
        if prepared.blueprint.exports.is_empty() {
            return Ok(vec![]);
        }
        let state = ctx
            .rt
            .block_on(ctx.store.load_state(&ctx.operation.instance_id))
            .map_err(|e| e.to_string())?;
        prepared.read_links(&state);
        for r in &state.resources {
            if let (Some(idx), Some(s)) = (prepared.find(&r.name), &r.state) {
                let slot = prepared.evaluation.resources[idx].instance;
                state_values::set_state(&mut prepared.evaluation.instances[slot], Some(s));
            }
        }
        let mut changes = Vec::new();
        let mut errors = Vec::new();
        for x in prepared.exports(plugins) {
            match x.value {
                // Derived from a secret: stored marked, so every answer masks it.
                Ok(v) => changes.push(Change::PutExport {
                    name: x.name,
                    export_type: x.ty,
                    value: if x.sensitive {
                        state_values::mark_secret(state_values::eval_to_json(&v))
                    } else {
                        state_values::eval_to_json(&v)
                    },
                }),
                Err(e) => errors.push(e),
            }
        }
        for old in &state.exports {
            if !prepared
                .blueprint
                .exports
                .iter()
                .any(|x| x.name.value == old.name)
            {
                changes.push(Change::RemoveExport {
                    name: old.name.clone(),
                });
            }
        }
        if errors.is_empty() {
            Ok(changes)
        } else {
            Err(errors.join("\n"))
        }
    }

    fn run_destroy(self: &Arc<Self>, ctx: &Arc<RunContext>) -> Finish {
        let state = match ctx
            .rt
            .block_on(ctx.store.load_state(&ctx.operation.instance_id))
        {
            Ok(s) => s,
            Err(e) => return Finish::failed(e.to_string()),
        };
        let _secrets = crate::redact::hold(state_values::instance_secrets(&state));
        let resources: Vec<&Resource> = state.resources.iter().collect();
        let (mut outcome, _) = exec::destroy_all(ctx, &resources, &state.links);
        // Children go after the resources that may depend on them.
        if matches!(outcome, Outcome::Succeeded) {
            let names: Vec<String> = state.children.iter().map(|c| c.name.clone()).collect();
            if let Err(error) = self.destroy_children(ctx, &state, &names) {
                outcome = Outcome::Failed {
                    error,
                    stopped: false,
                };
            }
        }
        match outcome {
            Outcome::Succeeded => Finish {
                error: None,
                instance_status: Some(InstanceStatus::Destroyed),
                changes: state
                    .exports
                    .iter()
                    .map(|e| Change::RemoveExport {
                        name: e.name.clone(),
                    })
                    .collect(),
            },
            Outcome::Failed { error, .. } => Finish {
                error: Some(error),
                instance_status: Some(InstanceStatus::DestroyFailed),
                changes: vec![],
            },
        }
    }

    fn run_reconcile(&self, ctx: &Arc<RunContext>, accept: bool, only: &[String]) -> Finish {
        let inst = ctx.operation.instance_id.clone();
        let state = match ctx.rt.block_on(ctx.store.load_state(&inst)) {
            Ok(s) => s,
            Err(e) => return Finish::failed(e.to_string()),
        };
        let _secrets = crate::redact::hold(state_values::instance_secrets(&state));
        let errors = exec::reconcile_all(ctx, &state, accept, only);
        let after = ctx.rt.block_on(ctx.store.load_state(&inst));
        let settled = after.as_ref().is_ok_and(|s| {
            s.resources
                .iter()
                .all(|r| matches!(r.status, ResourceStatus::Created | ResourceStatus::Updated))
        });
        let status = if !settled || !errors.is_empty() {
            InstanceStatus::DeployFailed
        } else if after.is_ok_and(|s| s.resources.is_empty()) {
            InstanceStatus::Destroyed
        } else {
            InstanceStatus::Deployed
        };
        Finish {
            error: (!errors.is_empty()).then(|| errors.join("\n")),
            instance_status: Some(status),
            changes: vec![],
        }
    }

    // ---- reads ----------------------------------------------------------------------------

    pub async fn get_instance(&self, name: &str) -> Result<InstanceState> {
        let inst = self.instance_named(name).await?;
        Ok(self.store.load_state(&inst.id).await?)
    }

    pub async fn list_instances(&self) -> Result<Vec<crate::state::Instance>> {
        Ok(self.store.list_instances().await?)
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
        let reads = state.resources.iter().map(|r| async move {
            let observed = match r.status {
                ResourceStatus::CreateRequested
                | ResourceStatus::UpdateRequested
                | ResourceStatus::DestroyRequested => None,
                _ => Some(
                    self.provisioner
                        .read(&exec::target_of(instance_id, r))
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

    // ---- start and stop ---------------------------------------------------------------------

    /// At start: operations a previous run of this engine left pending or running are marked
    /// interrupted (so are operations whose lease expired), and so are their instances.
    pub async fn recover(&self) -> Result<Vec<Operation>> {
        let mut ops = self
            .store
            .mark_interrupted(InterruptScope::Owner(self.config.owner.clone()))
            .await?;
        ops.extend(self.store.mark_interrupted(InterruptScope::Expired).await?);
        self.mark_instances_interrupted(&ops).await;
        Ok(ops)
    }

    async fn mark_instances_interrupted(&self, ops: &[Operation]) {
        let mut seen = std::collections::HashSet::new();
        for op in ops {
            if !seen.insert(op.instance_id.clone()) {
                continue;
            }
            let result = async {
                let lease = self.lease(&op.instance_id).await?;
                let r = self
                    .store
                    .commit(
                        &lease,
                        vec![Change::InstanceStatus(InstanceStatus::Interrupted)],
                        vec![NewEvent::new(
                            "instance.interrupted",
                            json!({ "operation": op.id,
                                    "hint": "check drift and reconcile (trellis drift / trellis reconcile)" }),
                        )],
                    )
                    .await;
                let _ = self.store.release_lease(&lease).await;
                r.map_err(EngineError::from)
            }
            .await;
            match result {
                Ok(_) => {
                    tracing::warn!(operation = %op.id, instance = %op.instance_id, "operation interrupted; instance marked interrupted")
                }
                Err(e) => {
                    tracing::error!(operation = %op.id, error = %e, "could not mark the instance interrupted")
                }
            }
        }
    }

    /// Graceful stop: refuse new mutations and let running operations finish for up to
    /// `timeout`; those still running then are asked to stop at a safe point (no new provider
    /// call starts) and get [`STOP_GRACE`] to reach it; what is left is marked interrupted.
    pub async fn drain(&self, timeout: Duration) {
        self.draining.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + timeout;
        if !self.wait_idle(deadline).await {
            let left = self.running.len();
            tracing::warn!(timeout = ?timeout, operations = left, "drain timeout reached: stopping running operations at a safe point");
            for r in self.running.iter() {
                r.stop.cancel();
            }
            if !self
                .wait_idle(tokio::time::Instant::now() + STOP_GRACE)
                .await
            {
                tracing::warn!(grace = ?STOP_GRACE, "operations did not reach a safe point in time");
            }
        }
        match self
            .store
            .mark_interrupted(InterruptScope::ShutDown(self.config.owner.clone()))
            .await
        {
            Ok(ops) => self.mark_instances_interrupted(&ops).await,
            Err(e) => tracing::error!(error = %e, "could not mark operations interrupted"),
        }
    }

    /// Waits until no operation runs, or `deadline`; whether none runs.
    async fn wait_idle(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            let notified = self.finished.notified();
            if self.running.is_empty() {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

/// The longest wait between two tries to record an operation's end the store refused.
const RECORD_RETRY_MAX: Duration = Duration::from_secs(10);

/// How an operation that ran its body to `f` ended.
fn end_status(f: &Finish, cancelled: bool) -> OperationStatus {
    match (&f.error, cancelled) {
        (None, _) => OperationStatus::Succeeded,
        (Some(_), true) => OperationStatus::Cancelled,
        (Some(_), false) => OperationStatus::Failed,
    }
}

/// After the drain timeout, how long operations asked to stop get to reach a safe point (the
/// provider calls in flight come back) before they are marked interrupted.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// What planning a blueprint found, handed back from the planning thread.
#[derive(Default)]
struct Planned {
    plan: Plan,
    diagnostics: Vec<Json>,
    datasources: Json,
    /// Why the blueprint cannot be planned.
    error: Option<PlanFailure>,
    prepared: Option<Prepared>,
    /// Included documents read from this host while planning.
    files: Vec<(String, Vec<u8>)>,
}

/// Why planning stopped: a message, and for an invalid blueprint (the root's or a child's)
/// its diagnostics, which the API returns as data (they may be far too many for a status).
struct PlanFailure {
    message: String,
    diagnostics: Vec<Json>,
}

impl PlanFailure {
    /// `prepared` has errors: `prefix` names the child they are in ("" for the root).
    fn invalid(prefix: &str, prepared: &Prepared) -> PlanFailure {
        PlanFailure {
            message: format!(
                "{prefix}the blueprint has errors:\n{}",
                prepared.errors_text()
            ),
            diagnostics: prepared.diagnostics_json(),
        }
    }
}

impl From<String> for PlanFailure {
    fn from(message: String) -> PlanFailure {
        PlanFailure {
            message,
            diagnostics: Vec::new(),
        }
    }
}

impl From<PlanFailure> for EngineError {
    fn from(f: PlanFailure) -> EngineError {
        if f.diagnostics.is_empty() {
            EngineError::InvalidArgument(f.message)
        } else {
            EngineError::InvalidBlueprint {
                message: f.message,
                diagnostics: f.diagnostics,
            }
        }
    }
}

/// What planning a blueprint's children found.
#[derive(Default)]
struct PlannedChildren {
    children: Vec<plan::ChildPlan>,
    /// Documents read from the engine host (not sent with the request), named as execution
    /// looks them up: added to the root's inputs, so its digest covers them and execution
    /// deploys what was planned.
    files: Vec<(String, Vec<u8>)>,
}

/// One include to plan.
struct ChildInputs<'a> {
    name: &'a str,
    instance: &'a str,
    file: String,
    content: Vec<u8>,
    /// Known values, as `--var` text.
    variables: Vec<(String, String)>,
    /// Variables known only after deploy.
    unknown: Vec<String>,
    /// The variables the child declares.
    declared: Vec<crate::blueprint::Variable>,
    chain: Vec<String>,
    now: i128,
}

/// A child whose changes are worked out only at deploy.
fn deferred_child(
    name: &str,
    state: &InstanceState,
    unknown: Vec<String>,
    why: String,
) -> plan::ChildPlan {
    plan::ChildPlan {
        name: name.to_owned(),
        instance: state.instance.name.clone(),
        action: if plan::deployed(state) {
            plan::Action::Update
        } else {
            plan::Action::Create
        },
        planned_version: state.instance.version,
        plan: Plan::default(),
        exports: Vec::new(),
        unknown_variables: unknown,
        deferred: why,
        diagnostics: Vec::new(),
    }
}

/// The name under which `children::resolve` finds the document `path` included by `parent`
/// among the request's files.
fn include_key(parent: &str, path: &str) -> String {
    let dir = parent.rfind('/').map_or("", |i| &parent[..i]);
    if path.starts_with('/') || dir.is_empty() {
        children::normalize(path)
    } else {
        children::normalize(&format!("{dir}/{path}"))
    }
}

/// The state of an instance that does not exist yet.
fn empty_state(name: &str) -> InstanceState {
    let t = crate::state::Timestamp::from_millis(0);
    InstanceState {
        instance: crate::state::Instance {
            id: String::new(),
            name: name.to_owned(),
            status: InstanceStatus::New,
            version: 0,
            last_seq: 0,
            pruned_through: 0,
            lease_epoch: 0,
            lease: None,
            created_at: t,
            updated_at: t,
        },
        resources: Vec::new(),
        links: Vec::new(),
        children: Vec::new(),
        exports: Vec::new(),
    }
}

/// A child deployed by its parent's operation.
struct ChildRun {
    instance_id: String,
    /// Its change set changed something.
    changed: bool,
    exports: indexmap::IndexMap<String, crate::eval::value::Value>,
    /// The names of the exports it stored marked sensitive.
    secret_exports: Vec<String>,
}

/// A child instance must be at the version the parent's plan read: otherwise what the plan
/// showed (and what the parent's plan relied on) may no longer hold.
fn check_child_version(
    planned: &plan::ChildPlan,
    state: &InstanceState,
) -> std::result::Result<(), String> {
    if planned.planned_version == state.instance.version {
        Ok(())
    } else {
        Err(format!(
            "child `{}` changed since the change set was planned (version {} then, {} now); \
             plan again",
            planned.instance, planned.planned_version, state.instance.version
        ))
    }
}

/// The exports a child ended with must be those its plan knew: the parent's plan (what it
/// left unchanged) relied on them.
fn check_child_exports(
    planned: &plan::ChildPlan,
    exports: &indexmap::IndexMap<String, crate::eval::value::Value>,
) -> std::result::Result<(), String> {
    for e in &planned.exports {
        let Some(diff::Shown::Value(expected)) = &e.new else {
            continue;
        };
        let actual = exports.get(&e.name).map(state_values::eval_to_json);
        if actual.as_ref() != Some(expected) && e.sensitive {
            // The error is stored and shown: a secret's values are not quoted.
            return Err(format!(
                "child `{}`: export `{}` (sensitive) is not what its plan expected after its \
                 deploy; plan again",
                planned.instance, e.name
            ));
        }
        if actual.as_ref() != Some(expected) {
            return Err(format!(
                "child `{}`: export `{}` is {} after its deploy, not {expected} as planned; plan \
                 again",
                planned.instance,
                e.name,
                actual.map_or_else(|| "missing".to_owned(), |a| a.to_string())
            ));
        }
    }
    Ok(())
}

/// How to undo what a deploy did to one child when it rolls back.
#[derive(Clone, Debug)]
enum ChildUndo {
    /// Created by the operation: destroyed.
    Destroy { name: String, instance: String },
    /// Updated (or destroyed as no longer included) by the operation: deployed again from
    /// the inputs of its last successful deploy before it (`None`: there is none, so it is
    /// destroyed).
    Restore {
        name: String,
        instance: String,
        instance_id: String,
        previous: Option<Box<Inputs>>,
    },
}

fn view(cs: ChangeSet, instance_name: String) -> ChangeSetView {
    let plan = Plan::from_body(&cs.body).unwrap_or_default();
    let diagnostics = cs
        .body
        .get("diagnostics")
        .and_then(Json::as_array)
        .cloned()
        .unwrap_or_default();
    ChangeSetView {
        change_set: cs,
        instance_name,
        plan,
        diagnostics,
    }
}

/// How an operation's body ended.
#[derive(Clone)]
pub struct Finish {
    pub error: Option<String>,
    pub instance_status: Option<InstanceStatus>,
    /// Written with the end of the operation (exports).
    pub changes: Vec<Change>,
}

impl Finish {
    fn failed(error: String) -> Finish {
        Finish {
            error: Some(error),
            instance_status: None,
            changes: vec![],
        }
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

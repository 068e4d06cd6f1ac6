//! The executor: runs a plan over the dependency graph, as many independent resources at once
//! as the parallelism limit allows, recording an intent before every provider call and the
//! outcome after it, each with its event, in one state transaction.
//!
//! The scheduling loop runs on a blocking thread and owns the evaluation: when a resource's
//! dependencies are done it evaluates the resource's spec again against their fresh state (this
//! may call provider functions, which block), then hands the provider call to an async task.
//! Tasks report back over a channel; the loop never waits on a provider itself.

use std::borrow::Cow;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use serde_json::{Value as Json, json};
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::links::PlannedLink;
use super::plan::{Action, Plan};
use super::prepare::Prepared;
use super::progress::Progress;
use super::provision::{Applied, Failure, LinkCall, LinkUpdate, Provisioner, Target};
use super::state_values;
use crate::check::PluginContext;
use crate::settings::ProviderConfigs;
use crate::state::{
    Change, Committed, InstanceState, Lease, NewEvent, Operation, Resource, StateError, StateStore,
};

/// What an operation runs with.
pub struct RunContext {
    pub store: Arc<dyn StateStore>,
    pub provisioner: Arc<dyn Provisioner>,
    pub lease: Arc<Mutex<Lease>>,
    pub operation: Operation,
    pub max_parallel: usize,
    /// Stop starting new work (cancel, drain, lost lease); calls in flight finish.
    pub stop: CancellationToken,
    pub rt: Handle,
    /// The per-resource locks of link calls (see [`LinkLocks`]).
    pub link_locks: LinkLocks,
    /// The provider config of the run, set once by the operation before any provider call
    /// (a deploy's from its change set, a destroy's from the instance's record).
    pub configs: std::sync::OnceLock<ProviderConfigs>,
    /// The resources of the run that a transformer generated, by name, with the abstract
    /// resource each came from: set by a deploy from its change set, so that every event about
    /// such a resource names both (`derivedFrom` in the payload).
    pub derivations: std::sync::OnceLock<HashMap<String, super::plan::DerivedFrom>>,
}

/// How a run ended.
#[derive(Debug)]
pub enum Outcome {
    Succeeded,
    /// The first failure, and whether the run was stopped rather than failed.
    Failed {
        error: String,
        stopped: bool,
    },
}

impl RunContext {
    /// The run's provider config (none set: the engine's defaults are not applied either, so
    /// every run sets it first).
    pub fn configs(&self) -> ProviderConfigs {
        self.configs.get().cloned().unwrap_or_default()
    }

    fn lease(&self) -> Lease {
        self.lease.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Commits changes with events tagged with this operation.
    pub async fn commit(
        &self,
        changes: Vec<Change>,
        events: Vec<NewEvent>,
    ) -> Result<Committed, StateError> {
        let derivations = self.derivations.get();
        let events = events
            .into_iter()
            .map(|mut e| {
                if let Json::Object(o) = &mut e.payload {
                    let derived = derivations
                        .zip(o.get("resource").and_then(Json::as_str))
                        .and_then(|(all, name)| all.get(name));
                    if let Some(d) = derived {
                        o.insert(
                            "derivedFrom".into(),
                            json!({ "resource": d.resource, "transform": d.transform }),
                        );
                    }
                    o.insert("operation".into(), Json::String(self.operation.id.clone()));
                }
                e
            })
            .collect();
        self.store.commit(&self.lease(), changes, events).await
    }

    pub fn commit_blocking(
        &self,
        changes: Vec<Change>,
        events: Vec<NewEvent>,
    ) -> Result<Committed, StateError> {
        self.rt.block_on(self.commit(changes, events))
    }

    /// A store failure as the operation reports it, logged for the operator (a full disk or an
    /// I/O error is theirs to fix; the operation's error alone may never reach them).
    pub(crate) fn store_error(&self, e: &StateError) -> String {
        tracing::error!(operation = %self.operation.id, instance = %self.operation.instance_id,
            error = %e, "the state store refused a write");
        format!("state store: {e}")
    }

    fn key(&self, name: &str, what: &str) -> String {
        format!("{}:{name}:{what}", self.operation.id)
    }
}

fn target(ctx: &RunContext, r: &Resource) -> Target {
    Target {
        request_id: ctx.operation.request_id.clone(),
        ..target_of(&ctx.operation.instance_id, &ctx.configs(), r)
    }
}

fn new_target(ctx: &RunContext, name: &str, ty: &str) -> Target {
    Target {
        instance_id: ctx.operation.instance_id.clone(),
        name: name.to_owned(),
        resource_type: ty.to_owned(),
        external_id: None,
        current_spec: None,
        current_state: None,
        configs: ctx.configs(),
        request_id: ctx.operation.request_id.clone(),
        progress: None,
    }
}

/// One unit of work for a provider, run on an async task.
// Moved once per resource; boxing the larger variant would buy nothing measurable.
#[allow(clippy::large_enum_variant)]
enum Job {
    /// A create, update or destroy whose intent and outcome the scheduling loop records.
    Apply(Apply),
    /// A destroy of a resource that has links: they are removed first, each through its
    /// provider, so the job records its own steps.
    Unlink { current: Resource, key: String },
    /// Reconcile settles one resource (see [`reconcile_one`]).
    Settle {
        resource: Resource,
        accept: bool,
        checker: Arc<super::drift::Checker>,
    },
}

/// What a finished job did, for rollback and for dependents.
#[derive(Clone, Debug)]
pub enum Done {
    Created {
        name: String,
        state: Json,
    },
    Updated {
        before: Resource,
        state: Json,
    },
    Deleted {
        before: Resource,
    },
    /// Reconciled (whatever that took).
    Settled {
        name: String,
    },
}

impl Done {
    /// The provider's state after a create or update.
    fn state(&self) -> Option<&Json> {
        match self {
            Done::Created { state, .. } | Done::Updated { state, .. } => Some(state),
            Done::Deleted { .. } | Done::Settled { .. } => None,
        }
    }
}

async fn run_job(ctx: Arc<RunContext>, job: Job) -> Result<Done, String> {
    match job {
        Job::Apply(a) => apply_one(&ctx, a).await,
        Job::Unlink { current, key } => {
            destroy(&ctx, &current, &key).await?;
            Ok(Done::Deleted { before: current })
        }
        Job::Settle {
            resource,
            accept,
            checker,
        } => {
            reconcile_one(&ctx, &resource, accept, &checker)
                .await
                .map_err(|e| format!("{}: {e}", resource.name))?;
            Ok(Done::Settled {
                name: resource.name,
            })
        }
    }
}

/// One provider call on its own: the same intent, call and outcome the scheduler batches.
async fn apply_one(ctx: &RunContext, a: Apply) -> Result<Done, String> {
    let fail = |e: StateError| ctx.store_error(&e);
    // The intent is durable before the provider hears of the resource: a crash after this
    // point leaves a record to reconcile, never an orphan.
    let (change, event) = intent(&a);
    ctx.commit(vec![change], vec![event]).await.map_err(fail)?;
    let result = call(ctx, &a).await;
    let (changes, event, done) = outcome(a, result);
    ctx.commit(changes, vec![event]).await.map_err(fail)?;
    done
}

/// Creates a resource from a recorded spec (rollback, reconcile) with the idempotency `key`;
/// its new state.
async fn create(ctx: &RunContext, r: &Resource, key: String) -> Result<Json, String> {
    let done = apply_one(ctx, create_job(r, key)).await?;
    Ok(done.state().cloned().unwrap_or(Json::Null))
}

/// A create of a recorded resource, as it was recorded.
fn create_job(r: &Resource, key: String) -> Apply {
    Apply::Create {
        name: r.name.clone(),
        ty: r.resource_type.clone(),
        spec: r.spec.clone(),
        depends_on: r.depends_on.clone(),
        metadata: r.metadata.clone(),
        key,
    }
}

/// Which provider call an intent announced.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    Create,
    Update,
    Destroy,
}

/// The key of the call `r`'s unfinished intent announced (no answer came), when the call about
/// to be made is that call again: the same kind and, for a create or update, the same spec
/// (`None`: the recorded one). The provider's idempotency then finds what the lost call did.
/// Any other call gets a key of its own: a provider may answer a reused key with the lost
/// call's result.
fn unfinished_key(r: &Resource, call: Call, spec: Option<&Json>) -> Option<String> {
    use crate::state::ResourceStatus as S;
    let same_call = matches!(
        (r.status, call),
        (S::CreateRequested, Call::Create)
            | (S::UpdateRequested, Call::Update)
            | (S::DestroyRequested, Call::Destroy)
    );
    let same_spec = spec.is_none_or(|s| *s == r.spec);
    r.call_key
        .clone()
        .filter(|k| same_call && same_spec && !k.is_empty())
}

/// Updates a resource back to a recorded spec (rollback, reconcile).
fn update_to(current: &Resource, recorded: &Resource, key: String) -> Apply {
    Apply::Update {
        current: current.clone(),
        spec: recorded.spec.clone(),
        depends_on: recorded.depends_on.clone(),
        metadata: recorded.metadata.clone(),
        key,
    }
}

/// Links first, then intent, provider destroy, removal.
async fn destroy(ctx: &RunContext, current: &Resource, key: &str) -> Result<(), String> {
    unlink_all(ctx, &current.name).await?;
    let job = Apply::Destroy {
        current: current.clone(),
        key: key.to_owned(),
    };
    apply_one(ctx, job).await.map(drop)
}

/// A node of the schedule: a job (built when the node becomes ready) and what it waits for.
struct Node {
    deps: Vec<usize>,
    dependents: Vec<usize>,
    waiting: usize,
}

/// Which way a schedule over resources follows their `depends_on`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    /// Dependencies first (creates, updates).
    Forward,
    /// Dependents first (destroys).
    Reverse,
    /// No order: all at once.
    Unordered,
}

/// The nodes of a schedule over `resources`, ordered by their `depends_on` among themselves.
fn nodes_for(resources: &[&Resource], order: Order) -> Vec<Node> {
    let mut nodes: Vec<Node> = resources
        .iter()
        .map(|_| Node {
            deps: Vec::new(),
            dependents: Vec::new(),
            waiting: 0,
        })
        .collect();
    if order == Order::Unordered {
        return nodes;
    }
    let index: HashMap<&str, usize> = resources
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.as_str(), i))
        .collect();
    for (i, r) in resources.iter().enumerate() {
        for d in &r.depends_on {
            match index.get(d.as_str()) {
                Some(&j) if j != i && order == Order::Forward => nodes[i].deps.push(j),
                Some(&j) if j != i => nodes[j].deps.push(i),
                _ => {}
            }
        }
    }
    nodes
}

/// Runs nodes in dependency order, up to `max_parallel` at once. `start(i)` is called on the
/// loop thread when node `i` is ready: it returns the job to run, `Ok(None)` when there is
/// nothing to do (the node is done at once), or an error that fails the node. `finish` sees
/// every finished node, before its outcome is committed (with the intents of the dependents
/// it makes ready). What it does on a failure and on `ctx.stop` is the `policy`'s; a failed
/// node's dependents never start. Returns the failure (all of them, one a line, when the
/// policy keeps going) and whether the run was stopped.
fn schedule(
    ctx: &Arc<RunContext>,
    nodes: &mut [Node],
    policy: Policy,
    mut start: impl FnMut(usize) -> Result<Option<Job>, String>,
    mut finish: impl FnMut(usize, Done),
) -> Result<(), (String, bool)> {
    for i in 0..nodes.len() {
        let deps = nodes[i].deps.clone();
        nodes[i].waiting = deps.len();
        for d in deps {
            nodes[d].dependents.push(i);
        }
    }
    let mut ready: std::collections::VecDeque<usize> = (0..nodes.len())
        .filter(|&i| nodes[i].waiting == 0)
        .collect();
    let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
    let mut in_flight = 0usize;
    let mut failure: Option<(String, bool)> = None;
    let mut errors: Vec<String> = Vec::new();
    // Nothing more may start: stopped, failed without keep-going, or the store refused a turn.
    let mut halted = false;
    let mut done = 0usize;
    let release = |nodes: &mut [Node], ready: &mut std::collections::VecDeque<usize>, i: usize| {
        for k in 0..nodes[i].dependents.len() {
            let d = nodes[i].dependents[k];
            nodes[d].waiting -= 1;
            if nodes[d].waiting == 0 {
                ready.push_back(d);
            }
        }
    };
    // Each turn records one unit of work: the outcomes of the provider calls that came back
    // and the intents of the creates and updates they made ready. One commit (and one fsync)
    // per turn rather than two keeps the store off the critical path of a deep graph; the
    // intents still precede their calls, and the outcomes their dependents' calls.
    let mut arrived: Vec<Msg> = Vec::new();
    loop {
        let mut changes: Vec<Change> = Vec::new();
        let mut events: Vec<NewEvent> = Vec::new();
        in_flight -= arrived.len();
        for m in arrived.drain(..) {
            let (i, result) = match m {
                Msg::Done(i, r) => (i, r),
                Msg::Called(i, job, r) => {
                    let (c, e, result) = outcome(job, r);
                    changes.extend(c);
                    events.push(e);
                    (i, result)
                }
            };
            match result {
                Ok(d) => {
                    done += 1;
                    finish(i, d);
                    release(nodes, &mut ready, i);
                }
                Err(e) => {
                    if failure.is_none() {
                        failure = Some((e.clone(), false));
                    }
                    errors.push(e);
                    halted |= !policy.keep_going;
                }
            }
        }
        // Start what is ready. Creates and updates record their intents in this turn's unit
        // of work, before any of their provider calls goes out.
        let mut batch: Vec<(usize, Apply)> = Vec::new();
        while !halted && in_flight + batch.len() < ctx.max_parallel && batch.len() < TURN_CALLS {
            if policy.stoppable && ctx.stop.is_cancelled() {
                let why = "the operation was stopped before it finished".to_owned();
                if failure.is_none() {
                    failure = Some((why.clone(), true));
                }
                errors.push(why);
                halted = true;
                break;
            }
            let Some(i) = ready.pop_front() else { break };
            match start(i).map(|j| j.map(Job::batchable)) {
                Ok(Some(Ok(apply))) => batch.push((i, apply)),
                Ok(Some(Err(job))) => {
                    let tx = tx.clone();
                    let ctx2 = ctx.clone();
                    in_flight += 1;
                    // In the operation's span, like the loop: its lines name the operation.
                    ctx.rt
                        .spawn(tracing::Instrument::in_current_span(async move {
                            // A task that panics still reports, or the loop would wait forever.
                            let r = AssertUnwindSafe(run_job(ctx2, job))
                                .catch_unwind()
                                .await
                                .unwrap_or_else(|_| Err(PANICKED.into()));
                            let _ = tx.send(Msg::Done(i, r));
                        }));
                }
                Ok(None) => {
                    done += 1;
                    release(nodes, &mut ready, i);
                }
                Err(e) => {
                    if failure.is_none() {
                        failure = Some((e.clone(), false));
                    }
                    errors.push(e);
                    halted |= !policy.keep_going;
                }
            }
        }
        if !events.is_empty() || !batch.is_empty() {
            for (_, job) in &batch {
                let (c, e) = intent(job);
                changes.push(c);
                events.push(e);
            }
            match ctx.commit_blocking(changes, events) {
                Ok(_) => {
                    in_flight += batch.len();
                    let (batch, groups) = destroy_groups(batch);
                    for group in groups {
                        let tx = tx.clone();
                        let ctx2 = ctx.clone();
                        ctx.rt
                            .spawn(tracing::Instrument::in_current_span(destroy_group(
                                ctx2, group, tx,
                            )));
                    }
                    for (i, job) in batch {
                        let tx = tx.clone();
                        let ctx2 = ctx.clone();
                        ctx.rt
                            .spawn(tracing::Instrument::in_current_span(async move {
                                let r = AssertUnwindSafe(call(&ctx2, &job)).catch_unwind().await;
                                // After a panic the call's outcome is unknown: its intent stays.
                                let m = match r {
                                    Ok(r) => Msg::Called(i, job, r),
                                    Err(_) => Msg::Done(i, Err(PANICKED.into())),
                                };
                                let _ = tx.send(m);
                            }));
                    }
                }
                Err(e) => {
                    // Nothing of the turn was recorded: the calls that came back happened and
                    // their intents stay (reconcile settles them); the new ones never start.
                    let e = ctx.store_error(&e);
                    if failure.is_none() {
                        failure = Some((e.clone(), false));
                    }
                    errors.push(e);
                    halted = true;
                }
            }
        }
        if in_flight == 0 {
            break;
        }
        // More is ready than the last turn started: start it now, with whatever has arrived.
        let more = !halted && !ready.is_empty() && in_flight < ctx.max_parallel;
        if !more {
            // Wait for one result, then take whatever else has arrived.
            let Some(first) = rx.blocking_recv() else {
                break;
            };
            arrived.push(first);
        }
        while let Ok(m) = rx.try_recv() {
            arrived.push(m);
        }
    }
    match failure {
        Some((_, stopped)) if errors.len() > 1 => Err((errors.join("\n"), stopped)),
        Some(f) => Err(f),
        None if done < nodes.len() => Err(("a dependency cycle blocked the plan".into(), false)),
        None => Ok(()),
    }
}

/// The destroys of a turn that can go to their provider together, one group a provider with
/// more than one, apart from the rest of the turn.
#[allow(clippy::type_complexity)]
fn destroy_groups(batch: Vec<(usize, Apply)>) -> (Vec<(usize, Apply)>, Vec<Vec<(usize, Apply)>>) {
    let mut rest = Vec::new();
    let mut groups: Vec<Vec<(usize, Apply)>> = Vec::new();
    for (i, job) in batch {
        let Apply::Destroy { current, .. } = &job else {
            rest.push((i, job));
            continue;
        };
        let ns = super::provision::namespace(&current.resource_type);
        let same = |g: &Vec<(usize, Apply)>| {
            matches!(&g[0].1, Apply::Destroy { current: c, .. }
                if super::provision::namespace(&c.resource_type) == ns)
        };
        match groups.iter_mut().find(|g| same(g)) {
            Some(g) => g.push((i, job)),
            None => groups.push(vec![(i, job)]),
        }
    }
    let (groups, single): (Vec<_>, Vec<_>) = groups.into_iter().partition(|g| g.len() > 1);
    rest.extend(single.into_iter().flatten());
    (rest, groups)
}

/// The destroys of one provider started in one turn, handed to it together
/// ([`Provisioner::destroy_many`]); each outcome goes to the loop as it comes, like a call of
/// its own.
async fn destroy_group(
    ctx: Arc<RunContext>,
    group: Vec<(usize, Apply)>,
    tx: mpsc::UnboundedSender<Msg>,
) {
    let items: Vec<(Target, String)> = group
        .iter()
        .map(|(_, job)| match job {
            Apply::Destroy { current, key } => (target(&ctx, current), key.clone()),
            _ => unreachable!("destroy_groups groups destroys only"),
        })
        .collect();
    let jobs = std::sync::Mutex::new(group.into_iter().map(Some).collect::<Vec<_>>());
    let take = |k: usize| jobs.lock().unwrap_or_else(|e| e.into_inner())[k].take();
    let done = |k: usize, r: Result<(), Failure>| {
        if let Some((i, job)) = take(k) {
            let _ = tx.send(Msg::Called(i, job, r.map(|()| None)));
        }
    };
    let run = AssertUnwindSafe(ctx.provisioner.destroy_many(&items, &done)).catch_unwind();
    // After a panic the outcomes not given are unknown: their intents stay.
    let why = match run.await {
        Ok(()) => {
            "the engine got no outcome for this destroy (a bug); the resource is left for reconcile"
        }
        Err(_) => PANICKED,
    };
    for k in 0..items.len() {
        if let Some((i, _)) = take(k) {
            let _ = tx.send(Msg::Done(i, Err(why.into())));
        }
    }
}

/// The most calls one turn starts. When more are ready (the first layer of a wide graph),
/// the first calls leave after a short commit and go out while the loop records the next
/// intents, rather than all waiting for one commit of every intent (BENCHMARKS.md, issue 13:
/// a 10,000-resource deploy 1.17 -> 1.14 x its critical path). A turn of answers arriving
/// in the usual trickle starts far fewer. It also bounds a `DestroyResources` call: a turn's
/// destroys of one provider go out together (32 to 256 measured alike, BENCHMARKS.md).
const TURN_CALLS: usize = 128;

/// What a scheduled task that panicked reports (the panic itself is in the engine's log).
const PANICKED: &str = "an engine task panicked during the provider call (a bug; the engine log has it); the resource is left for reconcile";

/// How a schedule treats a stop request and a failure.
#[derive(Clone, Copy)]
struct Policy {
    /// Stop starting work when the operation is asked to stop (cancel, drain, lost lease).
    stoppable: bool,
    /// After a failure, go on with what does not depend on it.
    keep_going: bool,
}

/// A deploy or destroy: stops at the first failure or when asked.
const DEPLOY: Policy = Policy {
    stoppable: true,
    keep_going: false,
};
/// A rollback undoes all it can, asked to stop or not.
const ROLLBACK: Policy = Policy {
    stoppable: false,
    keep_going: true,
};
/// A reconcile settles all it can, until asked to stop.
const RECONCILE: Policy = Policy {
    stoppable: true,
    keep_going: true,
};

/// A create, update or destroy: the jobs whose intents and outcomes the loop records in
/// batches. `key` is the idempotency key of the provider call.
// Moved once per resource; boxing the larger variant would buy nothing measurable.
#[allow(clippy::large_enum_variant)]
enum Apply {
    Create {
        name: String,
        ty: String,
        spec: Json,
        depends_on: Vec<String>,
        metadata: Json,
        key: String,
    },
    Update {
        current: Resource,
        spec: Json,
        depends_on: Vec<String>,
        metadata: Json,
        key: String,
    },
    Destroy {
        current: Resource,
        key: String,
    },
}

impl Job {
    /// The job as a batchable create or update, or itself.
    #[allow(clippy::result_large_err)]
    fn batchable(self) -> Result<Apply, Job> {
        match self {
            Job::Apply(a) => Ok(a),
            other => Err(other),
        }
    }
}

/// What a scheduled task reports.
#[allow(clippy::large_enum_variant)]
enum Msg {
    /// A job that recorded its own steps.
    Done(usize, Result<Done, String>),
    /// A call whose intent the loop recorded; the loop records the outcome too.
    Called(usize, Apply, Result<Option<Applied>, Failure>),
}

/// The intent of a provider call, and its event.
fn intent(job: &Apply) -> (Change, NewEvent) {
    match job {
        Apply::Create {
            name,
            ty,
            spec,
            depends_on,
            metadata,
            key,
        } => (
            Change::IntendCreate {
                name: name.clone(),
                resource_type: ty.clone(),
                spec: spec.clone(),
                depends_on: depends_on.clone(),
                metadata: metadata.clone(),
                key: key.clone(),
            },
            NewEvent::new(
                "resource.create_requested",
                json!({ "resource": name, "type": ty }),
            ),
        ),
        Apply::Update {
            current,
            spec,
            depends_on,
            metadata,
            key,
        } => (
            Change::IntendUpdate {
                name: current.name.clone(),
                spec: spec.clone(),
                depends_on: depends_on.clone(),
                metadata: metadata.clone(),
                key: key.clone(),
            },
            NewEvent::new(
                "resource.update_requested",
                json!({ "resource": current.name, "type": current.resource_type }),
            ),
        ),
        Apply::Destroy { current, key } => (
            Change::IntendDestroy {
                name: current.name.clone(),
                key: key.clone(),
            },
            NewEvent::new(
                "resource.destroy_requested",
                json!({ "resource": current.name, "type": current.resource_type }),
            ),
        ),
    }
}

/// The provider call of a job whose intent is recorded: what a create or update applied.
async fn call(ctx: &RunContext, job: &Apply) -> Result<Option<Applied>, Failure> {
    let p = &ctx.provisioner;
    match job {
        Apply::Create {
            name,
            ty,
            spec,
            key,
            ..
        } => {
            let progress = Progress::start(ctx, name, ty);
            let target = Target {
                progress: Some(progress.sink()),
                ..new_target(ctx, name, ty)
            };
            let r = p.apply(&target, state_values::to_pb(spec), key).await;
            progress.finish().await;
            r.map(Some)
        }
        Apply::Update {
            current, spec, key, ..
        } => {
            let progress = Progress::start(ctx, &current.name, &current.resource_type);
            let target = Target {
                progress: Some(progress.sink()),
                ..target(ctx, current)
            };
            let r = p.apply(&target, state_values::to_pb(spec), key).await;
            progress.finish().await;
            r.map(Some)
        }
        Apply::Destroy { current, key } => {
            p.destroy(&target(ctx, current), key).await.map(|()| None)
        }
    }
}

/// The changes and event recording a create's or update's outcome, and what it means for the
/// schedule.
fn outcome(
    job: Apply,
    r: Result<Option<Applied>, Failure>,
) -> (Vec<Change>, NewEvent, Result<Done, String>) {
    let failed = |name: &str, ty: &str, f: &Failure| {
        NewEvent::new(
            "resource.failed",
            json!({ "resource": name, "type": ty, "reason": f.message }),
        )
    };
    match (job, r) {
        // No answer: the intent stays, with its key, for reconcile (or the next deploy) to
        // settle by asking the provider; the call is not taken as failed.
        (job, Err(f)) if f.unknown => {
            let (name, ty) = match &job {
                Apply::Create { name, ty, .. } => (name.clone(), ty.clone()),
                Apply::Update { current, .. } | Apply::Destroy { current, .. } => {
                    (current.name.clone(), current.resource_type.clone())
                }
            };
            let event = NewEvent::new(
                "resource.unresolved",
                json!({ "resource": name, "type": ty, "reason": f.message,
                        "hint": "reconcile settles it (trellis reconcile)" }),
            );
            (vec![], event, Err(f.message))
        }
        (Apply::Destroy { current, .. }, Ok(_)) => (
            vec![Change::ResourceRemoved {
                name: current.name.clone(),
            }],
            NewEvent::new(
                "resource.destroyed",
                json!({ "resource": current.name, "type": current.resource_type }),
            ),
            Ok(Done::Deleted { before: current }),
        ),
        (Apply::Destroy { current, .. }, Err(f)) => (
            vec![Change::ResourceFailed {
                name: current.name.clone(),
                reason: f.message.clone(),
            }],
            failed(&current.name, &current.resource_type, &f),
            Err(f.message),
        ),
        (job, Ok(None)) => {
            // A create or update always reports what it applied (`call`).
            let name = match &job {
                Apply::Create { name, .. } => name.clone(),
                Apply::Update { current, .. } | Apply::Destroy { current, .. } => {
                    current.name.clone()
                }
            };
            outcome(
                job,
                Err(Failure::new(format!(
                    "`{name}`: the provider reported nothing"
                ))),
            )
        }
        (Apply::Create { name, ty, .. }, Ok(Some(applied))) => (
            vec![Change::ResourceCreated {
                name: name.clone(),
                external_id: applied.external_id,
                state: applied.state.clone(),
            }],
            NewEvent::new("resource.created", json!({ "resource": name, "type": ty })),
            Ok(Done::Created {
                name,
                state: applied.state,
            }),
        ),
        (Apply::Update { current, .. }, Ok(Some(applied))) => (
            vec![Change::ResourceUpdated {
                name: current.name.clone(),
                external_id: Some(applied.external_id),
                state: applied.state.clone(),
            }],
            NewEvent::new(
                "resource.updated",
                json!({ "resource": current.name, "type": current.resource_type }),
            ),
            Ok(Done::Updated {
                before: current,
                state: applied.state,
            }),
        ),
        (
            Apply::Create {
                name,
                ty,
                spec,
                depends_on,
                metadata,
                key,
            },
            Err(f),
        ) => {
            // Something the provider created before failing is kept (as created, then failed
            // to reach its spec), so it is not orphaned and the next plan updates it.
            let mut changes = Vec::new();
            if let Some(Applied { external_id, state }) = &f.partial {
                changes.push(Change::ResourceCreated {
                    name: name.clone(),
                    external_id: external_id.clone(),
                    state: state.clone(),
                });
                changes.push(Change::IntendUpdate {
                    name: name.clone(),
                    spec,
                    depends_on,
                    metadata,
                    key,
                });
            }
            changes.push(Change::ResourceFailed {
                name: name.clone(),
                reason: f.message.clone(),
            });
            let event = failed(&name, &ty, &f);
            (changes, event, Err(f.message))
        }
        (Apply::Update { current, .. }, Err(f)) => (
            vec![Change::ResourceFailed {
                name: current.name.clone(),
                reason: f.message.clone(),
            }],
            failed(&current.name, &current.resource_type, &f),
            Err(f.message),
        ),
    }
}

/// Deploys `plan`. `prepared` is the evaluated blueprint the plan came from; `before` the
/// instance as it was when the operation started. Returns the outcome and what was done (in
/// completion order) for rollback.
pub fn deploy(
    ctx: &Arc<RunContext>,
    prepared: &mut Prepared,
    plan: &Plan,
    before: &InstanceState,
    plugins: &PluginContext<'_>,
) -> (Outcome, Vec<Done>) {
    let recorded: HashMap<&str, &Resource> = before
        .resources
        .iter()
        .map(|r| (r.name.as_str(), r))
        .collect();
    let mut completed: Vec<Done> = Vec::new();
    // Links the blueprint dropped go first, while both ends are as they were.
    if let Err(error) = run_links(ctx, &plan.links, true) {
        return (
            Outcome::Failed {
                error,
                stopped: ctx.stop.is_cancelled(),
            },
            completed,
        );
    }
    // Phase 0: what goes away (the old versions of recreated resources, and resources the
    // blueprint dropped) before anything is created, dependents first. A new resource may
    // take over what an old one held (an `each` element shifted onto its neighbour's file,
    // a recreated resource onto its old name), so it must not be created while the old one
    // can still be destroyed under it. Only a dropped resource that a resource being
    // updated still depends on waits until that update is done (phase 2).
    let (early, late) = removals(plan, &recorded);
    let (outcome, mut removed) =
        destroy_all(ctx, early.iter().map(|r| Cow::Borrowed(*r)), &before.links);
    completed.append(&mut removed);
    if let Outcome::Failed { .. } = outcome {
        return (outcome, completed);
    }
    // Phase 1: everything that stays, dependencies first, then the new and changed links
    // once both their ends are deployed. A resource that reads the data of such a link
    // (`${link(a, b)}`) waits for it: it deploys in a later round, after the links the earlier
    // rounds made ready (with everything that depends on it).
    let applies: Vec<&super::plan::PlannedResource> = plan
        .resources
        .iter()
        .filter(|r| r.action != Action::Delete)
        .collect();
    let index: HashMap<&str, usize> = applies
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.as_str(), i))
        .collect();
    let deps: Vec<Vec<usize>> = applies
        .iter()
        .map(|r| {
            r.depends_on
                .iter()
                .filter_map(|d| index.get(d.as_str()).copied())
                .collect()
        })
        .collect();
    let needs = link_needs(prepared, &applies, &plan.links);
    let mut deployed = vec![false; applies.len()];
    let mut linked: Vec<bool> = plan
        .links
        .iter()
        .map(|l| !matches!(l.action, Action::Create | Action::Update))
        .collect();
    // Fresh state of finished resources, for the evaluation of their dependents.
    let mut fresh: HashMap<String, Json> = before
        .resources
        .iter()
        .filter_map(|r| r.state.clone().map(|s| (r.name.clone(), s)))
        .collect();
    let start = |prepared: &mut Prepared,
                 fresh: &HashMap<String, Json>,
                 i: usize|
     -> Result<Option<Job>, String> {
        let p = applies[i];
        if p.action == Action::NoChange {
            return Ok(None);
        }
        let Some(idx) = prepared.find(&p.name) else {
            return Err(format!(
                "resource `{}` is no longer in the blueprint",
                p.name
            ));
        };
        // Dependencies' state as it is now, just before this resource is applied.
        for dep in &p.depends_on {
            if let (Some(state), Some(d)) = (fresh.get(dep), prepared.find(dep)) {
                let slot = prepared.evaluation.resources[d].instance;
                state_values::set_state(&mut prepared.evaluation.instances[slot], Some(state));
            }
        }
        let found = prepared.reevaluate(idx, plugins);
        if found.iter().any(|d| d.is_error()) {
            return Err(format!(
                "resource `{}` could not be evaluated:\n{}",
                p.name,
                prepared.render(&found)
            ));
        }
        let x = &prepared.evaluation.resources[idx];
        let spec_value = prepared.evaluation.spec(x);
        if spec_value.deep_contains_unknown() {
            return Err(format!(
                "resource `{}`: its spec still holds values known only after deploy once its \
                 dependencies are deployed",
                p.name
            ));
        }
        let masked = prepared.evaluation.instances[x.instance]
            .masked_spec
            .as_ref();
        let spec = state_values::eval_to_stored(spec_value, masked);
        let metadata = super::plan::stored_metadata(prepared, idx);
        let depends_on = p.depends_on.clone();
        // A recreated resource's old version went in phase 0: it is created like a new one.
        Ok(Some(Job::Apply(
            match (p.action, recorded.get(p.name.as_str())) {
                (Action::Update, Some(current)) => Apply::Update {
                    current: (*current).clone(),
                    key: unfinished_key(current, Call::Update, Some(&spec))
                        .unwrap_or_else(|| ctx.key(&p.name, "update")),
                    spec,
                    depends_on,
                    metadata,
                },
                (action, current) => Apply::Create {
                    name: p.name.clone(),
                    ty: p.resource_type.clone(),
                    // A create whose answer never came is asked again with its key (not a
                    // recreate: its old version is gone, and the new one is a new call).
                    key: current
                        .filter(|_| action == Action::Create)
                        .and_then(|r| unfinished_key(r, Call::Create, Some(&spec)))
                        .unwrap_or_else(|| ctx.key(&p.name, "create")),
                    spec,
                    depends_on,
                    metadata,
                },
            },
        )))
    };
    let failed = |error: String, completed: Vec<Done>| {
        let stopped = ctx.stop.is_cancelled();
        (Outcome::Failed { error, stopped }, completed)
    };
    loop {
        let round = next_round(&deps, &needs, &deployed, &linked);
        if !round.is_empty() {
            let position: HashMap<usize, usize> =
                round.iter().enumerate().map(|(k, &i)| (i, k)).collect();
            let mut nodes: Vec<Node> = round
                .iter()
                .map(|&i| Node {
                    // Dependencies of earlier rounds are deployed already.
                    deps: deps[i]
                        .iter()
                        .filter_map(|d| position.get(d).copied())
                        .collect(),
                    dependents: Vec::new(),
                    waiting: 0,
                })
                .collect();
            let fresh_cell = Mutex::new(&mut fresh);
            let scheduled = schedule(
                ctx,
                &mut nodes,
                DEPLOY,
                |k| {
                    let fresh = fresh_cell.lock().unwrap_or_else(|e| e.into_inner());
                    start(prepared, &fresh, round[k])
                },
                |_, d| {
                    let mut fresh = fresh_cell.lock().unwrap_or_else(|e| e.into_inner());
                    match &d {
                        Done::Created { name, state } => {
                            fresh.insert(name.clone(), state.clone());
                        }
                        Done::Updated { before, state } => {
                            fresh.insert(before.name.clone(), state.clone());
                        }
                        Done::Deleted { .. } | Done::Settled { .. } => {}
                    }
                    completed.push(d);
                },
            );
            if let Err((error, stopped)) = scheduled {
                return (Outcome::Failed { error, stopped }, completed);
            }
            for &i in &round {
                deployed[i] = true;
            }
        }
        // The links whose ends are all deployed now.
        let end_deployed = |name: &str| index.get(name).is_none_or(|&i| deployed[i]);
        let ready: Vec<usize> = (0..plan.links.len())
            .filter(|&l| {
                !linked[l] && end_deployed(&plan.links[l].a) && end_deployed(&plan.links[l].b)
            })
            .collect();
        let batch: Vec<PlannedLink> = ready.iter().map(|&l| plan.links[l].clone()).collect();
        if let Err(error) = run_links(ctx, &batch, false) {
            return failed(error, completed);
        }
        for &l in &ready {
            linked[l] = true;
        }
        if deployed.iter().all(|&d| d) {
            break;
        }
        if round.is_empty() && ready.is_empty() {
            return failed(
                waits_on_itself(&applies, &needs, &deployed, &plan.links),
                completed,
            );
        }
        if !ready.is_empty() {
            // The later rounds read the data these links recorded.
            match ctx
                .rt
                .block_on(ctx.store.load_state(&ctx.operation.instance_id))
            {
                Ok(state) => prepared.read_links(&state),
                Err(e) => return failed(ctx.store_error(&e), completed),
            }
        }
    }
    // Phase 2: what the blueprint dropped that an updated resource depended on, now that the
    // update is done; dependents first.
    let (outcome, mut removed) =
        destroy_all(ctx, late.iter().map(|r| Cow::Borrowed(*r)), &before.links);
    completed.append(&mut removed);
    (outcome, completed)
}

/// What a deploy destroys: before anything is created (the old versions of recreated
/// resources, dropped resources), and after the updates (dropped resources that a resource
/// being updated depends on in state, and what they depend on in turn).
fn removals<'a>(
    plan: &Plan,
    recorded: &HashMap<&str, &'a Resource>,
) -> (Vec<&'a Resource>, Vec<&'a Resource>) {
    let action: HashMap<&str, Action> = plan
        .resources
        .iter()
        .map(|r| (r.name.as_str(), r.action))
        .collect();
    let gone = |a: Option<&Action>| matches!(a, Some(Action::Delete | Action::Recreate));
    // Dropped resources held by an update, to a fixed point through dropped resources.
    let mut late: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let mut frontier: Vec<&str> = plan
        .resources
        .iter()
        .filter(|r| r.action == Action::Update)
        .filter_map(|r| recorded.get(r.name.as_str()))
        .flat_map(|r| r.depends_on.iter().map(String::as_str))
        .collect();
    while let Some(name) = frontier.pop() {
        if action.get(name) == Some(&Action::Delete)
            && late.insert(name)
            && let Some(r) = recorded.get(name)
        {
            frontier.extend(r.depends_on.iter().map(String::as_str));
        }
    }
    let mut early = Vec::new();
    let mut after = Vec::new();
    for r in &plan.resources {
        let Some(current) = recorded.get(r.name.as_str()).copied() else {
            continue;
        };
        if late.contains(r.name.as_str()) {
            after.push(current);
        } else if gone(Some(&r.action)) {
            early.push(current);
        }
    }
    (early, after)
}

/// For each resource of `applies`: the links of `links` being created or changed whose data
/// its spec reads (`${link(a, b)}`, either way round).
fn link_needs(
    prepared: &Prepared,
    applies: &[&super::plan::PlannedResource],
    links: &[PlannedLink],
) -> Vec<Vec<usize>> {
    let pending: Vec<usize> = (0..links.len())
        .filter(|&l| matches!(links[l].action, Action::Create | Action::Update))
        .collect();
    if pending.is_empty() {
        return vec![Vec::new(); applies.len()];
    }
    applies
        .iter()
        .map(|p| {
            let Some(idx) = prepared.find(&p.name) else {
                return Vec::new();
            };
            let reads = prepared.link_reads(idx);
            pending
                .iter()
                .copied()
                .filter(|&l| {
                    let (a, b) = (&links[l].a, &links[l].b);
                    reads
                        .iter()
                        .any(|(x, y)| (x == a && y == b) || (x == b && y == a))
                })
                .collect()
        })
        .collect()
}

/// The resources not deployed yet that can deploy now: none of the links they read is
/// waiting, and none of their dependencies is held back.
fn next_round(
    deps: &[Vec<usize>],
    needs: &[Vec<usize>],
    deployed: &[bool],
    linked: &[bool],
) -> Vec<usize> {
    let n = deps.len();
    let mut held: Vec<bool> = (0..n)
        .map(|i| !deployed[i] && needs[i].iter().any(|&l| !linked[l]))
        .collect();
    if held.iter().any(|&h| h) {
        // Held back with whatever depends on a held resource (to a fixed point: the plan's
        // order need not be a dependency order).
        let mut changed = true;
        while changed {
            changed = false;
            for i in 0..n {
                if !held[i] && !deployed[i] && deps[i].iter().any(|&d| held[d]) {
                    held[i] = true;
                    changed = true;
                }
            }
        }
    }
    (0..n).filter(|&i| !deployed[i] && !held[i]).collect()
}

/// Why no round can start: a resource reads the data of a link that needs it (or something
/// depending on it) deployed first.
fn waits_on_itself(
    applies: &[&super::plan::PlannedResource],
    needs: &[Vec<usize>],
    deployed: &[bool],
    links: &[PlannedLink],
) -> String {
    let waiting: Vec<String> = (0..applies.len())
        .filter(|&i| !deployed[i])
        .flat_map(|i| {
            needs[i].iter().map(move |&l| {
                format!(
                    "`{}` reads ${{link({}, {})}}",
                    applies[i].name, links[l].a, links[l].b
                )
            })
        })
        .collect();
    format!(
        "resources wait on link data that needs them deployed first: {} (a link is applied \
         once both its ends are deployed, so neither end, nor anything an end depends on, can \
         read its data in the deployment that creates it)",
        waiting.join("; ")
    )
}

/// Destroys `resources` (in parallel where no dependency orders them), each after everything
/// that depends on it. `links` are the instance's links as recorded: a resource with none is
/// destroyed in the scheduler's batches, one with some removes them first. Owned resources are
/// moved into their jobs; borrowed ones are copied when they start.
pub fn destroy_all<'a>(
    ctx: &Arc<RunContext>,
    resources: impl IntoIterator<Item = Cow<'a, Resource>>,
    links: &[crate::state::Link],
) -> (Outcome, Vec<Done>) {
    destroy_in_order(ctx, resources.into_iter().collect(), links, DEPLOY)
}

fn destroy_in_order(
    ctx: &Arc<RunContext>,
    resources: Vec<Cow<'_, Resource>>,
    links: &[crate::state::Link],
    policy: Policy,
) -> (Outcome, Vec<Done>) {
    use crate::state::ResourceStatus as S;
    // A create that never answered has no external id, so a destroy would ask the provider
    // nothing: ask first whether it happened (as reconcile's accept does), then destroy what
    // it made; a record of nothing is forgotten.
    let unanswered: Vec<&Resource> = resources
        .iter()
        .map(|r| &**r)
        .filter(|r| r.status == S::CreateRequested)
        .collect();
    let resources: Vec<Cow<'_, Resource>> = if unanswered.is_empty() {
        resources
    } else {
        let settled = match settle_unanswered(ctx, &unanswered, policy) {
            Ok(state) => state,
            Err(error) => {
                let stopped = ctx.stop.is_cancelled();
                return (Outcome::Failed { error, stopped }, Vec::new());
            }
        };
        resources
            .into_iter()
            .filter_map(|r| match r.status {
                S::CreateRequested => settled.resource(&r.name).cloned().map(Cow::Owned),
                _ => Some(r),
            })
            .collect()
    };
    let linked: std::collections::HashSet<&str> = links
        .iter()
        .flat_map(|l| [l.resource_a.as_str(), l.resource_b.as_str()])
        .collect();
    // A resource waits for the destruction of every resource that depends on it.
    let (mut nodes, unlink) = {
        let all: Vec<&Resource> = resources.iter().map(|r| &**r).collect();
        let unlink: Vec<bool> = all
            .iter()
            .map(|r| linked.contains(r.name.as_str()))
            .collect();
        (nodes_for(&all, Order::Reverse), unlink)
    };
    // Each node starts once: its resource moves into its job (the loop is the serial path of
    // a large destroy, so it does not copy 10,000 specs and states there).
    let mut slots: Vec<Option<Cow<'_, Resource>>> = resources.into_iter().map(Some).collect();
    let mut completed = Vec::new();
    let start = |i: usize| -> Result<Option<Job>, String> {
        let current = slots[i]
            .take()
            .ok_or("a destroy was started twice (a bug)")?
            .into_owned();
        // A destroy that never answered is asked again with its key, as deploy and reconcile do.
        let key = unfinished_key(&current, Call::Destroy, None)
            .unwrap_or_else(|| ctx.key(&current.name, "destroy"));
        Ok(Some(if unlink[i] {
            Job::Unlink { current, key }
        } else {
            Job::Apply(Apply::Destroy { current, key })
        }))
    };
    let finish = |_: usize, d: Done| completed.push(d);
    match schedule(ctx, &mut nodes, policy, start, finish) {
        Ok(()) => (Outcome::Succeeded, completed),
        Err((error, stopped)) => (Outcome::Failed { error, stopped }, completed),
    }
}

/// Asks the provider about creates that never answered (reconcile's accept, in parallel):
/// what exists is recorded as created, a record of nothing is forgotten. The instance's state
/// afterwards.
fn settle_unanswered(
    ctx: &Arc<RunContext>,
    unanswered: &[&Resource],
    policy: Policy,
) -> Result<InstanceState, String> {
    let inst = &ctx.operation.instance_id;
    let load = || {
        ctx.rt
            .block_on(ctx.store.load_state(inst))
            .map_err(|e| ctx.store_error(&e))
    };
    let checker = Arc::new(ctx.rt.block_on(super::drift::Checker::load(
        ctx.provisioner.as_ref(),
        &load()?,
    )));
    let mut nodes = nodes_for(unanswered, Order::Unordered);
    let start = |i: usize| -> Result<Option<Job>, String> {
        Ok(Some(Job::Settle {
            resource: unanswered[i].clone(),
            accept: true,
            checker: checker.clone(),
        }))
    };
    schedule(ctx, &mut nodes, policy, start, |_, _| {}).map_err(|(e, _)| e)?;
    load()
}

/// Puts the instance back as it was `before` a deploy that did `done`, in parallel where no
/// dependency orders the steps, whether or not the operation was asked to stop:
/// 1. what the deploy created, and what a failed create left behind, is destroyed, dependents
///    first (a failed create that left nothing is forgotten);
/// 2. what it updated, recreated or deleted, and what it failed to update, is put back to its
///    recorded spec, dependencies first: updated back, or created again.
///
/// The state is read once, when the rollback starts. Returns the first error.
pub fn rollback(
    ctx: &Arc<RunContext>,
    done: &[Done],
    before: &InstanceState,
) -> Result<(), String> {
    use crate::state::ResourceStatus as S;
    let inst = &ctx.operation.instance_id;
    let now = ctx
        .rt
        .block_on(ctx.store.load_state(inst))
        .map_err(|e| ctx.store_error(&e))?;
    let mut first_error: Option<String> = None;
    let mut note = |r: Result<(), String>| {
        if let Err(e) = r
            && first_error.is_none()
        {
            first_error = Some(e);
        }
    };
    // Recreated by the deploy (its old version destroyed, a new one created): the new one goes,
    // and the old one is created again, since what made the deploy recreate it cannot be
    // updated back either.
    let recreated: std::collections::HashSet<&str> = done
        .iter()
        .filter_map(|d| match d {
            Done::Deleted { before } if now.resource(&before.name).is_some() => {
                Some(before.name.as_str())
            }
            _ => None,
        })
        .collect();
    // 1. Destroy what was not there before; forget failed creates that left nothing.
    let mut forget = Vec::new();
    let mut doomed = Vec::new();
    for r in now
        .resources
        .iter()
        .filter(|r| before.resource(&r.name).is_none() || recreated.contains(r.name.as_str()))
    {
        if r.status == S::CreateFailed {
            forget.push(r.name.clone());
        } else {
            doomed.push(r);
        }
    }
    if !forget.is_empty() {
        let events = forget
            .iter()
            .map(|name| {
                NewEvent::new(
                    "resource.forgotten",
                    json!({ "resource": name, "reason": "its create failed; rolled back" }),
                )
            })
            .collect();
        let changes = forget
            .into_iter()
            .map(|name| Change::ResourceRemoved { name })
            .collect();
        note(
            ctx.commit_blocking(changes, events)
                .map(drop)
                .map_err(|e| ctx.store_error(&e)),
        );
    }
    let (outcome, _) = destroy_in_order(
        ctx,
        doomed.iter().map(|r| Cow::Borrowed(*r)).collect(),
        &now.links,
        ROLLBACK,
    );
    if let Outcome::Failed { error, .. } = outcome {
        note(Err(error));
    }
    // 2. Put back what was there before and changed: touched by the deploy (`done`), or left
    // failed or half-done by it.
    let touched: std::collections::HashSet<&str> = done
        .iter()
        .map(|d| match d {
            Done::Created { name, .. } => name.as_str(),
            Done::Updated { before, .. } | Done::Deleted { before } => before.name.as_str(),
            Done::Settled { name } => name.as_str(),
        })
        .collect();
    let restore: Vec<(&Resource, Option<&Resource>)> = before
        .resources
        .iter()
        .filter_map(|was| {
            let current = now
                .resource(&was.name)
                .filter(|_| !recreated.contains(was.name.as_str()));
            let changed = match current.map(|c| c.status) {
                None => true,
                // A destroy that failed leaves the resource as the provider left it: the
                // record says so, and reconcile settles it.
                Some(S::DestroyFailed | S::DestroyRequested) => false,
                Some(status) => {
                    touched.contains(was.name.as_str())
                        || status != was.status
                            && matches!(
                                status,
                                S::UpdateFailed
                                    | S::UpdateRequested
                                    | S::CreateFailed
                                    | S::CreateRequested
                            )
                }
            };
            changed.then_some((was, current))
        })
        .collect();
    let was: Vec<&Resource> = restore.iter().map(|(r, _)| *r).collect();
    let mut nodes = nodes_for(&was, Order::Forward);
    let start = |i: usize| -> Result<Option<Job>, String> {
        let (was, current) = restore[i];
        Ok(Some(Job::Apply(match current {
            // A record of a create that failed or never finished: created as it was.
            Some(c) if matches!(c.status, S::CreateRequested | S::CreateFailed) => {
                let key = unfinished_key(c, Call::Create, Some(&was.spec))
                    .unwrap_or_else(|| ctx.key(&was.name, "rollback-create"));
                create_job(was, key)
            }
            Some(c) => {
                let key = unfinished_key(c, Call::Update, Some(&was.spec))
                    .unwrap_or_else(|| ctx.key(&was.name, "rollback-update"));
                update_to(c, was, key)
            }
            None => create_job(was, ctx.key(&was.name, "rollback-create")),
        })))
    };
    if let Err((error, _)) = schedule(ctx, &mut nodes, ROLLBACK, start, |_, _| {}) {
        note(Err(error));
    }
    match first_error {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// How the heartbeat stops its operation.
pub struct Stopper {
    pub operation_id: String,
    pub stop: CancellationToken,
    /// Set when the stop is a cancel (not a lost lease).
    pub cancel_requested: Arc<AtomicBool>,
}

/// Renews the lease every third of its time to live until `done` fires; stops the run when the
/// lease is lost (another engine took the instance over), since its writes would be fenced,
/// and cancels it when a cancel request is recorded that this engine was not told about.
pub fn spawn_heartbeat(
    store: Arc<dyn StateStore>,
    lease: Arc<Mutex<Lease>>,
    ttl: Duration,
    done: CancellationToken,
    stopper: Stopper,
) {
    let Stopper {
        operation_id,
        stop,
        cancel_requested,
    } = stopper;
    tokio::spawn(async move {
        let period = ttl / 3;
        loop {
            tokio::select! {
                _ = done.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
            let current = lease.lock().unwrap_or_else(|e| e.into_inner()).clone();
            match store.heartbeat(&current, ttl).await {
                Ok(renewed) => {
                    *lease.lock().unwrap_or_else(|e| e.into_inner()) = renewed;
                    if !stop.is_cancelled()
                        && let Ok(true) = store.cancel_requested(&operation_id).await
                    {
                        tracing::info!(operation = %operation_id, "a cancel request was recorded: stopping the operation");
                        cancel_requested.store(true, Ordering::SeqCst);
                        stop.cancel();
                    }
                }
                Err(StateError::Fenced { .. }) => {
                    tracing::error!(instance = %current.instance_id, "lease lost; stopping the operation");
                    stop.cancel();
                    return;
                }
                Err(e) => {
                    tracing::warn!(instance = %current.instance_id, error = %e, "lease heartbeat failed")
                }
            }
        }
    });
}

/// The provider's view of a recorded resource.
pub fn target_of(instance_id: &str, configs: &ProviderConfigs, r: &Resource) -> Target {
    Target {
        instance_id: instance_id.to_owned(),
        name: r.name.clone(),
        resource_type: r.resource_type.clone(),
        external_id: r.external_id.clone(),
        current_spec: Some(r.spec.clone()),
        current_state: r.state.clone(),
        configs: configs.clone(),
        request_id: String::new(),
        progress: None,
    }
}

/// Settles one resource: a provider call left unfinished (after a crash) is made again with
/// the recorded spec; a drifted or missing resource is accepted as found (`accept`) or put back
/// to its recorded spec.
async fn reconcile_one(
    ctx: &Arc<RunContext>,
    r: &Resource,
    accept: bool,
    checker: &super::drift::Checker,
) -> Result<(), String> {
    use crate::state::ResourceStatus as S;
    let fail = |e: StateError| ctx.store_error(&e);
    let recreate = |ctx: &Arc<RunContext>| {
        let r = r.clone();
        let ctx = ctx.clone();
        async move {
            // A create whose answer never came is asked again with the key it was sent with,
            // so the provider's idempotency finds it instead of creating a second one.
            let key = unfinished_key(&r, Call::Create, None)
                .unwrap_or_else(|| ctx.key(&r.name, "create"));
            create(&ctx, &r, key).await.map(drop)
        }
    };
    match r.status {
        // Accept: the create may or may not have happened (no answer came, or the provider
        // failed after acting), so ask the provider and record what exists (as planned,
        // unless it reports another spec), or forget what does not.
        S::CreateRequested | S::CreateFailed if accept => {
            // No id was recorded (the answer never came): the provider is asked by the
            // resource's name and spec, as its idempotent create would find it.
            let asked = Target {
                external_id: Some(r.external_id.clone().unwrap_or_default()),
                ..target(ctx, r)
            };
            let observed = ctx.provisioner.read(&asked).await.map_err(|f| f.message)?;
            let unsettled = r.status == S::CreateRequested;
            let (changes, event) = match observed {
                // The intent settles as a failed create, which is then forgotten.
                super::provision::Observed::Missing => (
                    unsettled
                        .then(|| Change::ResourceFailed {
                            name: r.name.clone(),
                            reason: "its create did not happen".into(),
                        })
                        .into_iter()
                        .chain([Change::ResourceRemoved {
                            name: r.name.clone(),
                        }])
                        .collect(),
                    NewEvent::new(
                        "resource.forgotten",
                        json!({ "resource": r.name, "reason": "its create did not happen" }),
                    ),
                ),
                super::provision::Observed::Exists {
                    spec,
                    state,
                    external_id,
                } => {
                    let drifted = !checker.fields(r, &spec).is_empty();
                    let mut changes = Vec::new();
                    if !unsettled {
                        // A failed create that left something: its intent again, already
                        // answered (recorded only).
                        changes.push(Change::IntendCreate {
                            name: r.name.clone(),
                            resource_type: r.resource_type.clone(),
                            spec: r.spec.clone(),
                            depends_on: r.depends_on.clone(),
                            metadata: r.metadata.clone(),
                            key: String::new(),
                        });
                    }
                    changes.push(Change::ResourceCreated {
                        name: r.name.clone(),
                        external_id,
                        state: state.clone(),
                    });
                    if drifted {
                        changes.extend(record_as_found(r, spec, state));
                    }
                    (
                        changes,
                        NewEvent::new(
                            "resource.accepted",
                            json!({ "resource": r.name, "type": r.resource_type }),
                        ),
                    )
                }
            };
            ctx.commit(changes, vec![event])
                .await
                .map(drop)
                .map_err(fail)
        }
        // Reapply: the provider's idempotent apply settles an unfinished create.
        S::CreateRequested | S::CreateFailed => recreate(ctx).await,
        S::DestroyRequested | S::DestroyFailed => {
            let key = unfinished_key(r, Call::Destroy, None)
                .unwrap_or_else(|| ctx.key(&r.name, "destroy"));
            destroy(ctx, r, &key).await
        }
        S::UpdateRequested | S::UpdateFailed | S::Created | S::Updated => {
            let observed = ctx
                .provisioner
                .read(&target(ctx, r))
                .await
                .map_err(|f| f.message)?;
            match observed {
                super::provision::Observed::Missing if accept => ctx
                    .commit(
                        vec![
                            Change::IntendDestroy {
                                name: r.name.clone(),
                                key: String::new(),
                            },
                            Change::ResourceRemoved {
                                name: r.name.clone(),
                            },
                        ],
                        vec![NewEvent::new(
                            "resource.forgotten",
                            json!({ "resource": r.name, "reason": "it no longer exists" }),
                        )],
                    )
                    .await
                    .map(drop)
                    .map_err(fail),
                super::provision::Observed::Missing => {
                    ctx.commit(
                        vec![
                            Change::IntendDestroy {
                                name: r.name.clone(),
                                key: String::new(),
                            },
                            Change::ResourceRemoved {
                                name: r.name.clone(),
                            },
                        ],
                        vec![],
                    )
                    .await
                    .map_err(fail)?;
                    recreate(ctx).await
                }
                super::provision::Observed::Exists { spec, state, .. } => {
                    let drifted = !checker.fields(r, &spec).is_empty();
                    let unsettled = matches!(r.status, S::UpdateRequested | S::UpdateFailed);
                    if !drifted && !unsettled {
                        return Ok(());
                    }
                    if accept {
                        // Keep the secret marks of the recorded spec where values are unchanged.
                        let spec = if drifted { spec } else { r.spec.clone() };
                        let mut changes = Vec::new();
                        if r.status == S::UpdateRequested {
                            changes.push(Change::ResourceFailed {
                                name: r.name.clone(),
                                reason: "settled by reconcile".into(),
                            });
                        }
                        changes.extend(record_as_found(r, spec, state));
                        ctx.commit(
                            changes,
                            vec![NewEvent::new(
                                "resource.accepted",
                                json!({ "resource": r.name, "type": r.resource_type }),
                            )],
                        )
                        .await
                        .map(drop)
                        .map_err(fail)
                    } else {
                        let key = unfinished_key(r, Call::Update, None)
                            .unwrap_or_else(|| ctx.key(&r.name, "update"));
                        let job = update_to(r, r, key);
                        if r.status == S::UpdateRequested {
                            ctx.commit(
                                vec![Change::ResourceFailed {
                                    name: r.name.clone(),
                                    reason: "re-applied by reconcile".into(),
                                }],
                                vec![],
                            )
                            .await
                            .map_err(fail)?;
                        }
                        apply_one(ctx, job).await.map(drop)
                    }
                }
            }
        }
    }
}

/// Reconciles the resources of `state` named in `only` (all when empty), up to
/// `--max-parallel` at once: unfinished destroys first (dependents first), then everything
/// else (dependencies first). Returns the errors, each naming its resource.
pub fn reconcile_all(
    ctx: &Arc<RunContext>,
    state: &InstanceState,
    accept: bool,
    only: &[String],
) -> Vec<String> {
    use crate::state::ResourceStatus as S;
    // Drift leaves out the fields links own and the fields the blueprint does not set.
    let checker = Arc::new(
        ctx.rt
            .block_on(super::drift::Checker::load(ctx.provisioner.as_ref(), state)),
    );
    let chosen: Vec<&Resource> = state
        .resources
        .iter()
        .filter(|r| only.is_empty() || only.contains(&r.name))
        .collect();
    let destroying = |r: &&Resource| matches!(r.status, S::DestroyRequested | S::DestroyFailed);
    let (destroys, rest): (Vec<&Resource>, Vec<&Resource>) =
        chosen.into_iter().partition(destroying);
    let mut errors = Vec::new();
    for (group, order) in [(destroys, Order::Reverse), (rest, Order::Forward)] {
        let mut nodes = nodes_for(&group, order);
        let start = |i: usize| -> Result<Option<Job>, String> {
            Ok(Some(Job::Settle {
                resource: group[i].clone(),
                accept,
                checker: checker.clone(),
            }))
        };
        // Each error names its resource.
        if let Err((error, stopped)) = schedule(ctx, &mut nodes, RECONCILE, start, |_, _| {}) {
            errors.push(error);
            if stopped {
                break;
            }
        }
    }
    errors
}

/// The changes that record a resource as its provider reports it (reconcile accept): an
/// update to the observed spec, already done.
fn record_as_found(r: &Resource, spec: Json, state: Json) -> [Change; 2] {
    [
        Change::IntendUpdate {
            name: r.name.clone(),
            spec,
            depends_on: r.depends_on.clone(),
            metadata: r.metadata.clone(),
            // Only recorded: no call was made.
            key: String::new(),
        },
        Change::ResourceUpdated {
            name: r.name.clone(),
            external_id: None,
            state,
        },
    ]
}

fn annotations(metadata: &Json) -> Json {
    metadata.get("annotations").cloned().unwrap_or(Json::Null)
}

/// A lock per resource for an operation's link calls. Deploy applies links one at a time, but
/// destroys run in parallel and each first removes the links of its resource: without these,
/// two removals touching one resource (two files linked to one env file) would run at once,
/// and the destroys of both ends could remove the same link twice. Per resource rather than
/// one lock per run, so links of unrelated resources are still removed in parallel. Per
/// operation, since an instance runs one operation at a time; entries go once no call holds or
/// awaits them.
#[derive(Default)]
pub struct LinkLocks(Mutex<HashMap<String, std::sync::Weak<tokio::sync::Mutex<()>>>>);

/// Locks both ends of a link, in name order: every call takes its locks in the same order, so
/// two calls never wait on each other.
async fn lock_link_ends(
    locks: &LinkLocks,
    a: &str,
    b: &str,
) -> Vec<tokio::sync::OwnedMutexGuard<()>> {
    let mut ends = vec![a, b];
    ends.sort_unstable();
    ends.dedup();
    let locks: Vec<Arc<tokio::sync::Mutex<()>>> = {
        let mut map = locks.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, lock| lock.strong_count() > 0);
        ends.iter()
            .map(|name| {
                map.get(*name)
                    .and_then(std::sync::Weak::upgrade)
                    .unwrap_or_else(|| {
                        let lock = Arc::new(tokio::sync::Mutex::new(()));
                        map.insert((*name).to_owned(), Arc::downgrade(&lock));
                        lock
                    })
            })
            .collect()
    };
    let mut guards = Vec::with_capacity(locks.len());
    for lock in locks {
        guards.push(lock.lock_owned().await);
    }
    guards
}

/// Runs one link through its provider and records it (or its removal) with its event.
pub async fn apply_link(
    ctx: &RunContext,
    a: &str,
    b: &str,
    link_type: &str,
    provider: &str,
    update: LinkUpdate,
) -> Result<(), String> {
    let inst = ctx.operation.instance_id.clone();
    let fail = |e: StateError| ctx.store_error(&e);
    // Held across the state read, the provider call and the record: the next call on either
    // end sees this one's outcome (a link already removed is not removed again).
    let _ends = lock_link_ends(&ctx.link_locks, a, b).await;
    let state = ctx.store.load_state(&inst).await.map_err(fail)?;
    let (Some(ra), Some(rb)) = (state.resource(a), state.resource(b)) else {
        if update == LinkUpdate::Destroy {
            return Ok(());
        }
        return Err(format!("link {a} -> {b}: both resources must be deployed"));
    };
    let existing = state
        .links
        .iter()
        .find(|l| l.resource_a == a && l.resource_b == b);
    if update == LinkUpdate::Destroy && existing.is_none() {
        return Ok(());
    }
    let call = LinkCall {
        provider: provider.to_owned(),
        link_type: link_type.to_owned(),
        a: target(ctx, ra),
        b: target(ctx, rb),
        annotations_a: annotations(&ra.metadata),
        annotations_b: annotations(&rb.metadata),
        link_data: existing.map_or(Json::Null, |l| l.data.clone()),
        update,
    };
    let key = ctx.key(&format!("{a}::{b}"), "link");
    let payload = json!({ "resourceA": a, "resourceB": b, "linkType": link_type });
    match (ctx.provisioner.link(&call, &key).await, update) {
        (Ok(_), LinkUpdate::Destroy) => {
            let removed = ctx
                .commit(
                    vec![Change::RemoveLink {
                        resource_a: a.to_owned(),
                        resource_b: b.to_owned(),
                    }],
                    vec![NewEvent::new("link.destroyed", payload)],
                )
                .await;
            match removed {
                // Removed meanwhile by the other end's destroy.
                Err(StateError::NotFound { .. }) | Ok(_) => Ok(()),
                Err(e) => Err(fail(e)),
            }
        }
        (Ok(data), _) => {
            let (status, kind) = if update == LinkUpdate::Create {
                (crate::state::ResourceStatus::Created, "link.created")
            } else {
                (crate::state::ResourceStatus::Updated, "link.updated")
            };
            ctx.commit(
                vec![Change::PutLink {
                    resource_a: a.to_owned(),
                    resource_b: b.to_owned(),
                    link_type: link_type.to_owned(),
                    status,
                    data,
                }],
                vec![NewEvent::new(kind, payload)],
            )
            .await
            .map_err(fail)?;
            Ok(())
        }
        (Err(f), _) => {
            let status = match update {
                LinkUpdate::Create => crate::state::ResourceStatus::CreateFailed,
                LinkUpdate::Update => crate::state::ResourceStatus::UpdateFailed,
                LinkUpdate::Destroy => crate::state::ResourceStatus::DestroyFailed,
            };
            let mut p = payload;
            p["reason"] = Json::String(f.message.clone());
            ctx.commit(
                vec![Change::PutLink {
                    resource_a: a.to_owned(),
                    resource_b: b.to_owned(),
                    link_type: link_type.to_owned(),
                    status,
                    data: call.link_data,
                }],
                vec![NewEvent::new("link.failed", p)],
            )
            .await
            .map_err(fail)?;
            Err(f.message)
        }
    }
}

/// Removes every link that touches `name` (before the resource itself goes).
async fn unlink_all(ctx: &RunContext, name: &str) -> Result<(), String> {
    let state = ctx
        .store
        .load_state(&ctx.operation.instance_id)
        .await
        .map_err(|e| ctx.store_error(&e))?;
    for l in state
        .links
        .iter()
        .filter(|l| l.resource_a == name || l.resource_b == name)
    {
        apply_link(
            ctx,
            &l.resource_a,
            &l.resource_b,
            &l.link_type,
            &super::links::provider_of(&l.link_type),
            LinkUpdate::Destroy,
        )
        .await?;
    }
    Ok(())
}

/// Applies the planned links of one kind, one at a time: links that touch the same resource
/// never race, whatever the provider does with it (destroys, which run in parallel, rely on
/// the per-resource locks of [`apply_link`] instead).
pub fn run_links(
    ctx: &Arc<RunContext>,
    links: &[PlannedLink],
    removals: bool,
) -> Result<(), String> {
    for l in links {
        let update = match (l.action, removals) {
            (Action::Delete, true) => LinkUpdate::Destroy,
            (Action::Create, false) => LinkUpdate::Create,
            (Action::Update, false) => LinkUpdate::Update,
            _ => continue,
        };
        if ctx.stop.is_cancelled() {
            return Err("the operation was stopped before it finished".into());
        }
        ctx.rt.block_on(apply_link(
            ctx,
            &l.a,
            &l.b,
            &l.link_type,
            &l.provider,
            update,
        ))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(a: &str, b: &str, action: Action) -> PlannedLink {
        PlannedLink {
            a: a.into(),
            b: b.into(),
            link_type: "t::u".into(),
            provider: "p".into(),
            action,
        }
    }

    #[test]
    fn link_calls_sharing_a_resource_wait_for_each_other() {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        let mut cx = Context::from_waker(Waker::noop());
        let locks = LinkLocks::default();
        let mut first = Box::pin(lock_link_ends(&locks, "env", "a"));
        let Poll::Ready(first) = first.as_mut().poll(&mut cx) else {
            panic!("nothing holds these locks yet");
        };
        // Another link of `env` (listed the other way round) waits...
        let mut second = Box::pin(lock_link_ends(&locks, "b", "env"));
        assert!(second.as_mut().poll(&mut cx).is_pending());
        // ...links of other resources, or another operation's `env`, do not.
        assert!(
            Box::pin(lock_link_ends(&locks, "x", "y"))
                .as_mut()
                .poll(&mut cx)
                .is_ready()
        );
        assert!(
            Box::pin(lock_link_ends(&LinkLocks::default(), "env", "a"))
                .as_mut()
                .poll(&mut cx)
                .is_ready()
        );
        drop(first);
        assert!(second.as_mut().poll(&mut cx).is_ready());
    }

    #[test]
    fn readers_of_new_link_data_wait_with_their_dependents() {
        // 0 and 1 are the ends of link 0; 2 reads its data; 3 depends on 2; 4 is independent.
        let deps = vec![vec![], vec![], vec![0, 1], vec![2], vec![]];
        let needs = vec![vec![], vec![], vec![0], vec![], vec![]];
        let mut deployed = vec![false; 5];
        let mut linked = vec![false];
        assert_eq!(next_round(&deps, &needs, &deployed, &linked), [0, 1, 4]);
        for i in [0, 1, 4] {
            deployed[i] = true;
        }
        // Until the link is applied, nothing else may start.
        assert!(next_round(&deps, &needs, &deployed, &linked).is_empty());
        linked[0] = true;
        assert_eq!(next_round(&deps, &needs, &deployed, &linked), [2, 3]);
    }

    #[test]
    fn without_link_reads_everything_is_one_round() {
        // Dependents listed before their dependencies: the round still takes them all.
        let deps = vec![vec![1], vec![2], vec![]];
        let needs = vec![vec![]; 3];
        assert_eq!(next_round(&deps, &needs, &[false; 3], &[false]), [0, 1, 2]);
    }

    #[test]
    fn a_dependent_listed_before_a_held_resource_is_held_too() {
        // 0 depends on 1, which reads link 0's data: the fixed point holds 0 as well.
        let deps = vec![vec![1], vec![]];
        let needs = vec![vec![], vec![0]];
        assert!(next_round(&deps, &needs, &[false; 2], &[false]).is_empty());
    }

    #[test]
    fn a_resource_waiting_on_its_own_link_is_named() {
        let links = vec![link("env", "config", Action::Create)];
        let mk = |name: &str| super::super::plan::PlannedResource {
            name: name.into(),
            resource_type: "t".into(),
            action: Action::Create,
            fields: Vec::new(),
            reason: String::new(),
            depends_on: Vec::new(),
            derived_from: None,
        };
        let (env, config) = (mk("env"), mk("config"));
        let applies = vec![&env, &config];
        let message = waits_on_itself(&applies, &[vec![], vec![0]], &[true, false], &links);
        assert!(
            message.contains("`config` reads ${link(env, config)}"),
            "{message}"
        );
        assert!(!message.contains("`env`"), "{message}");
    }
}

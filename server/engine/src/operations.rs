//! Operations: leases, starting a recorded operation, running its body on a thread, recording
//! its end (or keeping it in memory until the store takes it), deploy, rollback, destroy and
//! reconcile.

use super::*;

/// What [`Engine::start_operation`] records.
pub(crate) struct OperationStart<'a> {
    pub kind: OperationKind,
    pub request_id: &'a str,
    pub request_digest: &'a str,
    pub change_set_id: Option<String>,
    pub instance_status: InstanceStatus,
    /// How many resources the operation changes, when known.
    pub total: Option<usize>,
}

/// What [`Engine::start_operation`] did.
pub(crate) enum Started {
    /// Recorded and marked running: the caller runs it.
    New(Operation),
    /// The request id already names this operation: nothing was started.
    Existing(Operation),
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

/// How an operation's body ended.
#[derive(Clone)]
pub struct Finish {
    pub error: Option<String>,
    pub instance_status: Option<InstanceStatus>,
    /// Written with the end of the operation (exports).
    pub changes: Vec<Change>,
}

impl Finish {
    pub(crate) fn failed(error: String) -> Finish {
        Finish {
            error: Some(error),
            instance_status: None,
            changes: vec![],
        }
    }
}

/// What identifies an execute request (besides its id); how long it may wait is not part of it.
pub(crate) fn execute_digest(change_set_id: &str, rollback_on_failure: bool) -> String {
    trellis_ids::digest(&[
        "execute",
        change_set_id,
        if rollback_on_failure { "rollback" } else { "" },
    ])
}

/// What identifies a destroy request.
pub(crate) fn destroy_digest(instance: &str) -> String {
    trellis_ids::digest(&["destroy", instance])
}

impl Engine {
    pub(crate) async fn lease(&self, instance_id: &str) -> Result<Lease> {
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
        crate::body::decode_plan(&cs.body)
            .ok()
            .map(|(plan, _)| count(&plan))
    }

    /// Records the operation and marks it running, under `lease`.
    pub(crate) async fn start_operation(
        &self,
        lease: &Lease,
        start: OperationStart<'_>,
    ) -> Result<Started> {
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
        tracing::info!(target: "trellis::operation", operation = %op.id, instance_id = %op.instance_id,
            kind = kind.as_str(), request_id, status = "running", "operation started");
        Ok(Started::New(self.store.get_operation(&op.id).await?))
    }

    /// Starts executing a change set.
    pub async fn execute(
        self: &Arc<Self>,
        request_id: &str,
        change_set_id: &str,
        rollback_on_failure: bool,
    ) -> Result<Operation> {
        let request_digest = execute_digest(change_set_id, rollback_on_failure);
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

    pub(crate) async fn start_execute(
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
        let request_digest = destroy_digest(instance);
        self.once(
            request_id,
            &request_digest,
            self.start_destroy(request_id, &request_digest, instance),
        )
        .await
    }

    pub(crate) async fn start_destroy(
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
        let request_digest =
            trellis_ids::digest(&["reconcile", instance, mode, &only.join("\u{0}")]);
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
        if !self.stop_running(operation_id) && !op.status.is_terminal() {
            // It runs on another engine sharing the store (or is about to start here): the
            // store records the request and tells the engine running it.
            self.store.request_cancel(operation_id).await?;
        }
        Ok(op)
    }

    /// Stops an operation running on this engine, as cancelled; whether it runs here.
    pub(crate) fn stop_running(&self, operation_id: &str) -> bool {
        match self.running.get(operation_id) {
            Some(r) => {
                r.cancel_requested.store(true, Ordering::SeqCst);
                r.stop.cancel();
                true
            }
            None => false,
        }
    }

    /// Runs an operation on a blocking thread (see `exec`) and records how it ended.
    pub(crate) fn spawn_run(
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
            configs: std::sync::OnceLock::new(),
            derivations: std::sync::OnceLock::new(),
        });
        let this = self.clone();
        // Every line the run logs (its plugin calls' included) names the operation and the
        // request that started it; the blocking thread enters the span too.
        let span = tracing::info_span!("operation", operation = %op.id, instance_id = %op.instance_id,
            kind = op.kind.as_str(), request_id = %op.request_id);
        let thread_span = span.clone();
        self.rt.spawn(tracing::Instrument::instrument(
            async move {
                exec::spawn_heartbeat(
                    this.store.clone(),
                    lease.clone(),
                    this.config.lease_ttl,
                    heartbeat_done.clone(),
                    exec::Stopper {
                        operation_id: op.id.clone(),
                        stop: stop.clone(),
                        cancel_requested: cancel_requested.clone(),
                    },
                );
                let runner = this.clone();
                let run_ctx = ctx.clone();
                let finish = tokio::task::spawn_blocking(move || {
                    let _entered = thread_span.enter();
                    let mut plugins = PluginContext::load(&runner.host, runner.rt.clone());
                    plugins.ask_providers = false;
                    plugins.request_id = Some(run_ctx.operation.request_id.clone());
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
            },
            span,
        ));
    }

    /// Records how an operation ended, with its lease given up. When the store refuses the
    /// write (a full disk, an I/O error), the ending is kept in memory, where reads, cancels
    /// and watches find it, and a task records it once the store accepts writes again (with
    /// backoff), or gives up when another engine took the instance over (which marks the
    /// operation interrupted). A restart marks it interrupted too.
    pub(crate) async fn record_end(
        self: &Arc<Self>,
        ctx: &Arc<RunContext>,
        f: Finish,
        cancelled: bool,
    ) {
        // Counted before the write: a client that sees the end finds it counted.
        crate::metrics::operation_ended(&ctx.operation, end_status(&f, cancelled));
        let Err(first) = self.finish(ctx, f.clone(), cancelled).await else {
            return;
        };
        let op = &ctx.operation;
        if let StateError::Fenced { .. } = first {
            // Taken over (this engine was frozen or cut off past its lease): the engine that
            // took it recorded it interrupted, and nothing here may write any more.
            tracing::warn!(operation = %op.id, instance = %op.instance_id, error = %first,
                "another engine took the instance over and recorded the operation as interrupted; its end here is not recorded");
            return;
        }
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
    pub(crate) async fn finish(
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
        ctx.commit(changes, vec![event]).await?;
        let (id, instance) = (&op.id, &op.instance_id);
        match &f.error {
            None => {
                tracing::info!(target: "trellis::operation", operation = %id, instance_id = %instance,
                kind = op.kind.as_str(), request_id = %op.request_id, status = status.as_str(),
                "operation ended")
            }
            Some(error) => tracing::warn!(target: "trellis::operation", operation = %id,
                instance_id = %instance, kind = op.kind.as_str(), request_id = %op.request_id,
                status = status.as_str(), error = %error, "operation ended"),
        }
        Ok(())
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
        let body = crate::body::decode(&cs.body).map_err(|e| e.to_string())?;
        let inputs = body.inputs;
        if inputs.digest() != digest {
            return Err("the change set's recorded inputs do not match its digest".into());
        }
        let merged = self.run_settings(ctx, &inputs.environment)?;
        let _held = crate::redact::hold(merged.secret_texts());
        let plugins = &plugins.with_configs(ctx.configs());
        let plan = body.plan;
        let cwd = self.config.cwd.display().to_string();
        let recorded = prepare::RecordedDataSources::new(&body.datasources, plugins);
        let prepared = prepare::prepare_with(
            &inputs,
            self.config.request_limits(),
            plugins,
            &cwd,
            Some(&recorded),
        );
        Ok((inputs, plan, prepared))
    }

    /// The provider settings of a deploy with `environment`; the run's calls use them from
    /// now on.
    fn run_settings(
        &self,
        ctx: &RunContext,
        environment: &settings::Environment,
    ) -> std::result::Result<settings::Merged, String> {
        let merged = settings::merge(&self.config.settings, environment)?;
        let _ = ctx.configs.set(merged.configs());
        Ok(merged)
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
        let merged = match self.run_settings(ctx, &inputs.environment) {
            Ok(m) => m,
            Err(e) => return fail(e),
        };
        // Events about generated resources name the abstract resource too.
        let _ = ctx.derivations.set(
            plan.resources
                .iter()
                .filter_map(|r| Some((r.name.clone(), r.derived_from.clone()?)))
                .collect(),
        );
        let plugins = &plugins.with_configs(ctx.configs());
        // Provider failures and plugin logs are cleaned of this deploy's secrets while it runs
        // (its children's and links' calls and its rollback included): see `crate::redact`.
        let mut secrets = prepared.evaluation.secret_texts();
        secrets.extend(state_values::instance_secrets(&before));
        secrets.extend(merged.secret_texts());
        let _secrets = crate::redact::hold(secrets);
        if prepared.diags.has_errors() {
            return fail(format!(
                "the blueprint no longer validates with the installed plugins:\n{}",
                prepared.errors_text()
            ));
        }
        // The instance records the environment it is deployed with, before any provider call
        // (destroy, drift and reconcile use it again), and the provider settings it used (for
        // display: no secret value).
        let record = json!({
            "environment": inputs.environment.to_json(),
            "providers": merged.record_json(),
        });
        if before.instance.environment != record
            && let Err(e) = ctx.commit_blocking(vec![Change::InstanceEnvironment(record)], vec![])
        {
            return fail(format!("state store: {e}"));
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
        let finish = match outcome {
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
        };
        // The evaluated blueprint, the plan, the state before and what was done each hold every
        // resource: freeing them is not worth delaying the recorded end for (as for a destroy).
        ctx.rt
            .spawn_blocking(move || drop((prepared, plan, done, before, undo, inputs)));
        finish
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

    /// Waits until an operation ends.
    pub(crate) async fn wait_operation(&self, id: &str) -> Result<Operation> {
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
        let mut state = match ctx
            .rt
            .block_on(ctx.store.load_state(&ctx.operation.instance_id))
        {
            Ok(s) => s,
            Err(e) => return Finish::failed(e.to_string()),
        };
        let _secrets = crate::redact::hold(state_values::instance_secrets(&state));
        let recorded = self.recorded_settings(&state.instance.environment);
        let _settings_secrets = crate::redact::hold(recorded.secret_texts());
        let _ = ctx.configs.set(recorded.configs());
        // Each resource moves into its destroy: the state is not read again.
        let resources = std::mem::take(&mut state.resources);
        let (mut outcome, destroyed) = exec::destroy_all(
            ctx,
            resources.into_iter().map(std::borrow::Cow::Owned),
            &state.links,
        );
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
        let finish = match outcome {
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
        };
        // The state read at the start and the records of what was destroyed are two copies of
        // every resource: freeing them is not worth delaying the recorded end for.
        ctx.rt.spawn_blocking(move || drop((state, destroyed)));
        finish
    }

    fn run_reconcile(&self, ctx: &Arc<RunContext>, accept: bool, only: &[String]) -> Finish {
        let inst = ctx.operation.instance_id.clone();
        let state = match ctx.rt.block_on(ctx.store.load_state(&inst)) {
            Ok(s) => s,
            Err(e) => return Finish::failed(e.to_string()),
        };
        let _secrets = crate::redact::hold(state_values::instance_secrets(&state));
        let recorded = self.recorded_settings(&state.instance.environment);
        let _settings_secrets = crate::redact::hold(recorded.secret_texts());
        let _ = ctx.configs.set(recorded.configs());
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
}

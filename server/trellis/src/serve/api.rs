//! The engine API over gRPC: decode, call the [`Engine`], encode. No business rules here.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use serde_json::Value as Json;
use tonic::{Request, Response, Status};
use trellis_proto::engine::v1 as api;
use trellis_proto::plugin::v1 as pb;

use super::auth::{Caller, Role};
use crate::engine::diff::{FieldChange, Shown};
use crate::engine::links::PlannedLink;
use crate::engine::plan::{Action, ChildPlan, PlannedResource};
use crate::engine::settings::Environment;
use crate::engine::{
    ChangeSetView, DriftKind, DriftReport, Engine, EngineError, Source, state_values,
};
use crate::state::{
    self, ChangeSetStatus, InstanceStatus, OperationKind, OperationStatus, ResourceStatus,
    StateError,
};

/// How often a watch with nothing to send sends a heartbeat.
pub(super) const HEARTBEAT: Duration = Duration::from_secs(5);

pub(super) struct EngineApi {
    engine: Arc<Engine>,
    /// Ends open watch streams at shutdown (after the drain, so watchers see how operations
    /// ended), so the server's graceful stop does not wait on followers forever.
    shutdown: tokio_util::sync::CancellationToken,
}

impl EngineApi {
    pub(super) fn new(
        engine: Arc<Engine>,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> EngineApi {
        EngineApi { engine, shutdown }
    }
}

fn status(e: EngineError) -> Status {
    match e {
        EngineError::NotFound(m) => Status::not_found(m),
        EngineError::InvalidArgument(m) => Status::invalid_argument(m),
        // The diagnostics go in a response where there is one (CreateChangeSet): a status
        // travels in HTTP/2 trailers, where hundreds of rendered diagnostics do not fit.
        EngineError::InvalidBlueprint { diagnostics, .. } => {
            Status::invalid_argument(invalid_summary(&diagnostics))
        }
        EngineError::FailedPrecondition(m) => Status::failed_precondition(m),
        EngineError::Aborted(m) => Status::aborted(m),
        EngineError::AlreadyExists(m) => Status::already_exists(m),
        EngineError::PermissionDenied(m) => Status::permission_denied(m),
        EngineError::Unavailable(m) => Status::unavailable(m),
        EngineError::Internal(m) => Status::internal(m),
    }
}

/// "the blueprint has 3 errors" (and the first), one line however many there are.
pub(super) fn invalid_summary(diagnostics: &[Json]) -> String {
    let errors: Vec<&Json> = diagnostics
        .iter()
        .filter(|d| d.get("severity").and_then(Json::as_str) == Some("error"))
        .collect();
    let n = errors.len();
    let mut out = format!(
        "the blueprint has {n} error{}",
        if n == 1 { "" } else { "s" }
    );
    if let Some(first) = errors.first() {
        let d = diagnostic(first);
        let mut message: String = d.message.chars().take(200).collect();
        if message.len() < d.message.len() {
            message.push_str("...");
        }
        let at = if d.line > 0 {
            format!(" at {}:{}:{}", d.file, d.line, d.column)
        } else {
            String::new()
        };
        out.push_str(&format!("; first: error[{}]{at}: {message}", d.code));
    }
    out
}

fn state_status(e: StateError) -> Status {
    status(EngineError::from(e))
}

/// The request's blueprint source and its local assets (checked and hashed, not kept yet).
fn source(
    s: Option<api::BlueprintSource>,
) -> Result<(Source, Vec<crate::engine::assets::Received>), Status> {
    match s.and_then(|s| s.source) {
        Some(api::blueprint_source::Source::Inline(b)) => Ok((
            Source::Inline {
                file_name: b.file_name,
                content: b.content,
                children: b
                    .children
                    .into_iter()
                    .map(|c| (c.path, c.content))
                    .collect(),
                assets: Default::default(),
            },
            crate::engine::assets::receive(b.assets).map_err(Status::invalid_argument)?,
        )),
        Some(api::blueprint_source::Source::Path(p)) => Ok((Source::Path(p.into()), Vec::new())),
        None => Err(Status::invalid_argument(
            "a blueprint source (inline or path) is required",
        )),
    }
}

/// The variables as text, and the request's environment with the names of the variables it
/// marked secret.
fn variables(
    v: Vec<api::Variable>,
    environment: Option<api::Environment>,
) -> Result<(Vec<(String, String)>, Environment), Status> {
    let mut env = match environment {
        Some(e) => decode_environment(e)?,
        None => Environment::default(),
    };
    env.secret_variables = v
        .iter()
        .filter(|v| v.secret)
        .map(|v| v.name.clone())
        .collect();
    Ok((v.into_iter().map(|v| (v.name, v.value)).collect(), env))
}

type Object = serde_json::Map<String, Json>;

/// A map value's entries as JSON objects (secrets wrapped), each named by `what.<key>`.
fn object_entries(v: Option<pb::Value>, what: &str) -> Result<Vec<(String, Object)>, Status> {
    let Some(v) = v else { return Ok(Vec::new()) };
    let entries = match v.kind {
        None | Some(pb::value::Kind::Null(_)) => return Ok(Vec::new()),
        Some(pb::value::Kind::Map(m)) => m.entries,
        Some(_) => {
            return Err(Status::invalid_argument(format!(
                "environment.{what} must be a map"
            )));
        }
    };
    entries
        .into_iter()
        .map(
            |e| match crate::engine::state_values::from_pb(&e.value.unwrap_or_default()) {
                Json::Object(o)
                    if crate::engine::state_values::sensitive_inner(&Json::Object(o.clone()))
                        .is_none() =>
                {
                    Ok((e.key, o))
                }
                _ => Err(Status::invalid_argument(format!(
                    "environment.{what}.{} must be a map",
                    e.key
                ))),
            },
        )
        .collect()
}

fn decode_environment(e: api::Environment) -> Result<Environment, Status> {
    Ok(Environment {
        name: e.name,
        file_digest: e.digest,
        providers: object_entries(e.providers, "providers")?
            .into_iter()
            .collect(),
        injectors: object_entries(e.injectors, "injectors")?
            .into_iter()
            .map(|(k, v)| (k, Json::Object(v)))
            .collect(),
        secret_variables: Vec::new(),
    })
}

// ---- encoding ---------------------------------------------------------------------------------

pub(super) fn diagnostic(d: &Json) -> api::Diagnostic {
    let s = |k: &str| {
        d.get(k)
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let n = |k: &str| d.get(k).and_then(Json::as_u64).unwrap_or(0) as u32;
    let severity = match d.get("severity").and_then(Json::as_str) {
        Some("error") => api::Severity::Error,
        Some("warning") => api::Severity::Warning,
        Some("info") => api::Severity::Info,
        _ => api::Severity::Unspecified,
    };
    api::Diagnostic {
        code: s("code"),
        severity: severity as i32,
        message: s("message"),
        file: s("file"),
        line: n("line"),
        column: n("column"),
        end_line: n("end_line"),
        end_column: n("end_column"),
        hint: s("hint"),
    }
}

fn shown(s: &Shown) -> pb::Value {
    match s {
        Shown::Value(v) => crate::plugins::values::from_json(v),
        Shown::Unknown => pb::Value {
            kind: Some(pb::value::Kind::Unknown(pb::Unknown {})),
            sensitive: false,
        },
        Shown::Sensitive => pb::Value {
            kind: None,
            sensitive: true,
        },
    }
}

fn field(f: &FieldChange) -> api::FieldChange {
    api::FieldChange {
        path: f.path.clone(),
        previous: f.previous.as_ref().map(shown),
        new: f.new.as_ref().map(shown),
        must_recreate: f.must_recreate,
        origin: f.origin.clone().unwrap_or_default(),
    }
}

fn action(a: Action) -> api::ChangeAction {
    match a {
        Action::Create => api::ChangeAction::Create,
        Action::Update => api::ChangeAction::Update,
        Action::Recreate => api::ChangeAction::Recreate,
        Action::Delete => api::ChangeAction::Delete,
        Action::NoChange => api::ChangeAction::NoChange,
    }
}

fn change_set_status(s: ChangeSetStatus) -> api::ChangeSetStatus {
    match s {
        ChangeSetStatus::Planned => api::ChangeSetStatus::Planned,
        ChangeSetStatus::Executing => api::ChangeSetStatus::Executing,
        ChangeSetStatus::Executed => api::ChangeSetStatus::Executed,
        ChangeSetStatus::Failed => api::ChangeSetStatus::Failed,
        ChangeSetStatus::Superseded => api::ChangeSetStatus::Superseded,
    }
}

fn resource_change(r: &PlannedResource) -> api::ResourceChange {
    api::ResourceChange {
        name: r.name.clone(),
        resource_type: r.resource_type.clone(),
        action: action(r.action) as i32,
        fields: r.fields.iter().map(field).collect(),
        reason: r.reason.clone(),
        depends_on: r.depends_on.clone(),
        derived_from: r.derived_from.as_ref().map(|d| api::DerivedFrom {
            resource: d.resource.clone(),
            transform: d.transform.clone(),
        }),
    }
}

fn link_change(l: &PlannedLink) -> api::LinkChange {
    api::LinkChange {
        resource_a: l.a.clone(),
        resource_b: l.b.clone(),
        link_type: l.link_type.clone(),
        action: action(l.action) as i32,
    }
}

fn child_change(c: &ChildPlan) -> api::ChildChange {
    api::ChildChange {
        name: c.name.clone(),
        instance: c.instance.clone(),
        action: action(c.action) as i32,
        planned_version: c.planned_version,
        resources: c.plan.resources.iter().map(resource_change).collect(),
        links: c.plan.links.iter().map(link_change).collect(),
        exports: c
            .exports
            .iter()
            .map(|e| api::ExportChange {
                name: e.name.clone(),
                action: action(e.action) as i32,
                previous: e.previous.as_ref().map(shown),
                new: e.shown_new().as_ref().map(shown),
            })
            .collect(),
        children: c.plan.children.iter().map(child_change).collect(),
        summary: c.summary(),
        unknown_variables: c.unknown_variables.clone(),
        deferred: c.deferred.clone(),
        diagnostics: c.diagnostics.iter().map(diagnostic).collect(),
    }
}

pub(super) fn change_set(v: &ChangeSetView) -> api::ChangeSet {
    let cs = &v.change_set;
    api::ChangeSet {
        id: cs.id.clone(),
        instance: v.instance_name.clone(),
        instance_id: cs.instance_id.clone(),
        status: change_set_status(cs.status) as i32,
        planned_version: cs.planned_version,
        digest: cs.digest.clone(),
        resources: v.plan.resources.iter().map(resource_change).collect(),
        exports: vec![],
        diagnostics: v.diagnostics.iter().map(diagnostic).collect(),
        summary: v.plan.summary(),
        created_at_unix_ms: cs.created_at.as_millis(),
        links: v.plan.links.iter().map(link_change).collect(),
        children: v.plan.children.iter().map(child_change).collect(),
        missing_assets: vec![],
    }
}

fn instance_status(s: InstanceStatus) -> api::InstanceStatus {
    use api::InstanceStatus as A;
    match s {
        InstanceStatus::New => A::New,
        InstanceStatus::Deploying => A::Deploying,
        InstanceStatus::Deployed => A::Deployed,
        InstanceStatus::DeployFailed => A::DeployFailed,
        InstanceStatus::Updating => A::Updating,
        InstanceStatus::Updated => A::Updated,
        InstanceStatus::UpdateFailed => A::UpdateFailed,
        InstanceStatus::RollingBack => A::RollingBack,
        InstanceStatus::RollbackComplete => A::RollbackComplete,
        InstanceStatus::RollbackFailed => A::RollbackFailed,
        InstanceStatus::Destroying => A::Destroying,
        InstanceStatus::Destroyed => A::Destroyed,
        InstanceStatus::DestroyFailed => A::DestroyFailed,
        InstanceStatus::Interrupted => A::Interrupted,
    }
}

fn resource_status(s: ResourceStatus) -> api::ResourceStatus {
    use api::ResourceStatus as A;
    match s {
        ResourceStatus::CreateRequested => A::Creating,
        ResourceStatus::Created => A::Created,
        ResourceStatus::CreateFailed => A::CreateFailed,
        ResourceStatus::UpdateRequested => A::Updating,
        ResourceStatus::Updated => A::Updated,
        ResourceStatus::UpdateFailed => A::UpdateFailed,
        ResourceStatus::DestroyRequested => A::Destroying,
        ResourceStatus::DestroyFailed => A::DestroyFailed,
    }
}

fn instance_summary(i: &state::Instance) -> api::Instance {
    api::Instance {
        id: i.id.clone(),
        name: i.name.clone(),
        status: instance_status(i.status) as i32,
        version: i.version,
        last_seq: i.last_seq,
        resources: vec![],
        links: vec![],
        children: vec![],
        exports: vec![],
        created_at_unix_ms: i.created_at.as_millis(),
        updated_at_unix_ms: i.updated_at.as_millis(),
        environment: instance_environment(&i.environment),
        queued: vec![],
    }
}

/// The requests waiting for their turn on an instance.
fn queued(list: Vec<crate::engine::Queued>) -> Vec<api::QueuedOperation> {
    list.into_iter()
        .map(|q| api::QueuedOperation {
            kind: operation_kind(q.kind) as i32,
            request_id: q.request_id,
            caller: q.caller,
            change_set_id: q.change_set_id.unwrap_or_default(),
            since_unix_ms: q.since_ms,
        })
        .collect()
}

/// How long a request may wait for its turn (absent: not at all).
fn wait(w: Option<api::Wait>) -> crate::engine::Wait {
    use crate::engine::Wait;
    match w {
        None => Wait::No,
        Some(api::Wait { timeout_ms: 0 }) => Wait::Forever,
        Some(api::Wait { timeout_ms }) => Wait::Up(Duration::from_millis(timeout_ms)),
    }
}

/// Who a queued request belongs to, as `Instance.queued` shows it.
fn caller_name(caller: &Caller) -> String {
    match caller {
        Caller::Open => String::new(),
        Caller::Token(t) => t.name.clone(),
    }
}

/// The instance's record of its last deployment's environment, secrets masked.
fn instance_environment(recorded: &Json) -> Option<api::InstanceEnvironment> {
    if recorded.is_null() {
        return None;
    }
    let env = Environment::from_json(recorded.get("environment").unwrap_or(&Json::Null))
        .unwrap_or_default();
    Some(api::InstanceEnvironment {
        digest: env.digest(),
        name: env.name,
        providers: recorded
            .get("providers")
            .map(crate::engine::state_values::to_api),
    })
}

/// A stored value for an answer: secrets masked, or with `reveal` sent with their values (and
/// the `sensitive` flag).
fn stored_value(v: &Json, reveal: bool) -> pb::Value {
    if reveal {
        state_values::to_pb(v)
    } else {
        state_values::to_api(v)
    }
}

fn export(e: &state::Export, reveal: bool) -> api::Export {
    api::Export {
        name: e.name.clone(),
        r#type: e.export_type.clone(),
        value: Some(stored_value(&e.value, reveal)),
    }
}

/// An instance's whole state; secrets masked unless `reveal`.
pub(super) fn instance(s: &state::InstanceState, reveal: bool) -> api::Instance {
    let mut out = instance_summary(&s.instance);
    // An external id is a plain text, but a provider may build it from a secret (a path):
    // it is masked when it quotes a secret the instance records.
    let secrets = if reveal {
        Vec::new()
    } else {
        state_values::instance_secrets(s)
    };
    let external_id = |id: &Option<String>| match id {
        Some(id) if crate::redact::mentions_secret(id, &secrets) => {
            crate::eval::render::SENSITIVE_TEXT.to_owned()
        }
        other => other.clone().unwrap_or_default(),
    };
    out.resources = s
        .resources
        .iter()
        .map(|r| api::Resource {
            name: r.name.clone(),
            resource_type: r.resource_type.clone(),
            status: resource_status(r.status) as i32,
            spec: Some(stored_value(&r.spec, reveal)),
            state: r.state.as_ref().map(|v| stored_value(v, reveal)),
            external_id: external_id(&r.external_id),
            failure_reason: r.failure_reason.clone().unwrap_or_default(),
            depends_on: r.depends_on.clone(),
            updated_at_unix_ms: r.updated_at.as_millis(),
        })
        .collect();
    out.links = s
        .links
        .iter()
        .map(|l| api::Link {
            resource_a: l.resource_a.clone(),
            resource_b: l.resource_b.clone(),
            link_type: l.link_type.clone(),
            status: resource_status(l.status) as i32,
            data: Some(stored_value(
                &crate::engine::links::link_data(&l.data),
                reveal,
            )),
        })
        .collect();
    out.children = s
        .children
        .iter()
        .map(|c| api::Child {
            name: c.name.clone(),
            instance_id: c.child_instance_id.clone(),
        })
        .collect();
    out.exports = s.exports.iter().map(|e| export(e, reveal)).collect();
    out
}

fn operation_kind(kind: OperationKind) -> api::OperationKind {
    match kind {
        OperationKind::Deploy => api::OperationKind::Deploy,
        OperationKind::Destroy => api::OperationKind::Destroy,
        OperationKind::Reconcile => api::OperationKind::Reconcile,
        OperationKind::Import => api::OperationKind::Import,
    }
}

fn operation(op: &state::Operation, instance_name: &str, start_seq: u64) -> api::Operation {
    api::Operation {
        id: op.id.clone(),
        instance: instance_name.to_owned(),
        instance_id: op.instance_id.clone(),
        kind: operation_kind(op.kind) as i32,
        status: match op.status {
            OperationStatus::Pending => api::OperationStatus::Pending,
            OperationStatus::Running => api::OperationStatus::Running,
            OperationStatus::Succeeded => api::OperationStatus::Succeeded,
            OperationStatus::Failed => api::OperationStatus::Failed,
            OperationStatus::Cancelled => api::OperationStatus::Cancelled,
            OperationStatus::Interrupted => api::OperationStatus::Interrupted,
        } as i32,
        request_id: op.request_id.clone(),
        change_set_id: op.change_set_id.clone().unwrap_or_default(),
        error: op.error.clone().unwrap_or_default(),
        created_at_unix_ms: op.created_at.as_millis(),
        finished_at_unix_ms: op.finished_at.map_or(0, |t| t.as_millis()),
        start_seq,
    }
}

fn event(e: &state::Event) -> api::Event {
    let operation_id = e
        .payload
        .get("operation")
        .and_then(Json::as_str)
        .unwrap_or_default()
        .to_owned();
    api::Event {
        instance_id: e.instance_id.clone(),
        seq: e.seq,
        kind: e.kind.clone(),
        payload_json: e.payload.to_string(),
        at_unix_ms: e.at.as_millis(),
        operation_id,
    }
}

fn drift(r: &DriftReport) -> api::DriftReport {
    api::DriftReport {
        instance: r.instance.clone(),
        drifted: r.drifted(),
        resources: r
            .resources
            .iter()
            .map(|d| api::ResourceDrift {
                name: d.name.clone(),
                resource_type: d.resource_type.clone(),
                kind: match d.kind {
                    DriftKind::Changed => api::DriftKind::Changed,
                    DriftKind::Missing => api::DriftKind::Missing,
                    DriftKind::Unresolved => api::DriftKind::Unresolved,
                } as i32,
                fields: d.fields.iter().map(field).collect(),
                detail: d.detail.clone(),
            })
            .collect(),
        errors: r.errors.clone(),
    }
}

// ---- watching ---------------------------------------------------------------------------------

type WatchStream = Pin<Box<dyn Stream<Item = Result<api::WatchResponse, Status>> + Send>>;

/// What a watch follows.
#[derive(Clone)]
enum Watch {
    /// One operation's events, ending after its terminal event.
    Operation(String),
    /// Every event of the instance; `follow` keeps the stream open.
    Instance { follow: bool },
}

fn is_terminal_for(e: &state::Event, op: &str) -> bool {
    matches!(
        e.kind.as_str(),
        "operation.finished" | "operation.interrupted"
    ) && e.payload.get("operation").and_then(Json::as_str) == Some(op)
}

/// Streams events after `after_seq`: from the store, then as they are committed, with
/// heartbeats while idle. The sequence numbers make a resumed stream exact.
fn watch(
    engine: Arc<Engine>,
    instance_id: String,
    after_seq: u64,
    what: Watch,
    shutdown: tokio_util::sync::CancellationToken,
) -> WatchStream {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<api::WatchResponse, Status>>(256);
    tokio::spawn(async move {
        let _open = super::metrics::watch_opened();
        let store = engine.store().clone();
        let mut seq = after_seq;
        let mut sub = store.subscribe(&instance_id);
        let mut ended_seen = false;
        loop {
            let batch = match store.events_since(&instance_id, seq, 512).await {
                Ok(b) => b,
                Err(e) => {
                    let _ = tx.send(Err(state_status(e))).await;
                    return;
                }
            };
            if batch.is_empty() {
                if let Watch::Instance { follow: false } = what {
                    return;
                }
                // A terminal event may have been before `after_seq` (resuming a finished
                // operation): end when the operation is over and nothing is left to send. The
                // status is read after the events, so one more read of the events follows before
                // giving up: the operation may have ended (status and event in one commit)
                // between the two reads. An ending the store refused to record counts too
                // (the engine keeps it until it is recorded).
                if let Watch::Operation(op) = &what
                    && engine
                        .get_operation(op)
                        .await
                        .is_ok_and(|o| o.status.is_terminal())
                {
                    if ended_seen {
                        return;
                    }
                    ended_seen = true;
                    continue;
                }
                tokio::select! {
                    changed = sub.changed() => {
                        if changed.is_none() {
                            return;
                        }
                    }
                    _ = tokio::time::sleep(HEARTBEAT) => {
                        let hb = api::WatchResponse {
                            item: Some(api::watch_response::Item::Heartbeat(api::Heartbeat { last_seq: seq })),
                        };
                        if tx.send(Ok(hb)).await.is_err() {
                            return;
                        }
                    }
                    _ = tx.closed() => return,
                    _ = shutdown.cancelled() => {
                        let _ = tx.send(Err(Status::unavailable("the engine is shutting down; resume the watch from the last sequence number"))).await;
                        return;
                    }
                }
                continue;
            }
            for e in &batch {
                seq = e.seq;
                let (send, last) = match &what {
                    Watch::Instance { .. } => (true, false),
                    Watch::Operation(op) => {
                        let mine =
                            e.payload.get("operation").and_then(Json::as_str) == Some(op.as_str());
                        (mine, is_terminal_for(e, op))
                    }
                };
                if send {
                    let item = api::WatchResponse {
                        item: Some(api::watch_response::Item::Event(event(e))),
                    };
                    if tx.send(Ok(item)).await.is_err() {
                        return;
                    }
                }
                if last {
                    return;
                }
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

// ---- the service ------------------------------------------------------------------------------

type DiagStream = Pin<Box<dyn Stream<Item = Result<api::Diagnostic, Status>> + Send>>;

#[tonic::async_trait]
impl api::engine_server::Engine for EngineApi {
    type ValidateStream = DiagStream;
    type WatchOperationStream = WatchStream;
    type WatchInstanceStream = WatchStream;
    type BackupStream = BackupStream;

    async fn validate(
        &self,
        req: Request<api::ValidateRequest>,
    ) -> Result<Response<DiagStream>, Status> {
        let r = req.into_inner();
        let (vars, env) = variables(r.variables, r.environment)?;
        // Validation does not read assets: they matter only to what is deployed.
        let diags = self
            .engine
            .validate(source(r.source)?.0, vars, env)
            .await
            .map_err(status)?;
        let items: Vec<Result<api::Diagnostic, Status>> =
            diags.iter().map(|d| Ok(diagnostic(d))).collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }

    async fn create_change_set(
        &self,
        req: Request<api::CreateChangeSetRequest>,
    ) -> Result<Response<api::ChangeSet>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        caller.check(&r.instance, Role::Planner, "CreateChangeSet")?;
        let (vars, env) = variables(r.variables, r.environment)?;
        let (mut src, received) = source(r.source)?;
        if !received.is_empty() {
            let kept = self.engine.keep_assets(received).await.map_err(status)?;
            if let Source::Inline { assets, .. } = &mut src {
                *assets = kept;
            }
        }
        let planned = self
            .engine
            .create_change_set(&r.request_id, &r.instance, src, vars, env)
            .await;
        match planned {
            Ok(v) => Ok(Response::new(change_set(&v))),
            // An answer, not an error: every diagnostic reaches every client (docs/engine-api.md).
            Err(EngineError::InvalidBlueprint {
                diagnostics,
                missing_assets,
                ..
            }) => Ok(Response::new(api::ChangeSet {
                instance: r.instance,
                status: api::ChangeSetStatus::Invalid as i32,
                summary: invalid_summary(&diagnostics),
                diagnostics: diagnostics.iter().map(diagnostic).collect(),
                missing_assets,
                ..Default::default()
            })),
            Err(e) => Err(status(e)),
        }
    }

    async fn get_change_set(
        &self,
        req: Request<api::GetChangeSetRequest>,
    ) -> Result<Response<api::ChangeSet>, Status> {
        let caller = Caller::of(&req)?;
        let v = self
            .engine
            .get_change_set(&req.into_inner().change_set_id)
            .await
            .map_err(status)?;
        caller.check(&v.instance_name, Role::Viewer, "GetChangeSet")?;
        Ok(Response::new(change_set(&v)))
    }

    async fn list_change_sets(
        &self,
        req: Request<api::ListChangeSetsRequest>,
    ) -> Result<Response<api::ListChangeSetsResponse>, Status> {
        let caller = Caller::of(&req)?;
        let name = req.into_inner().instance;
        caller.check(&name, Role::Viewer, "ListChangeSets")?;
        let list = self.engine.list_change_sets(&name).await.map_err(status)?;
        Ok(Response::new(api::ListChangeSetsResponse {
            change_sets: list.iter().map(change_set).collect(),
        }))
    }

    async fn execute_change_set(
        &self,
        req: Request<api::ExecuteChangeSetRequest>,
    ) -> Result<Response<api::Operation>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        if !matches!(caller, Caller::Open) {
            let planned = self
                .engine
                .get_change_set(&r.change_set_id)
                .await
                .map_err(status)?;
            caller.check(&planned.instance_name, Role::Deployer, "ExecuteChangeSet")?;
        }
        let op = self
            .engine
            .execute_waiting(
                &r.request_id,
                &r.change_set_id,
                r.rollback_on_failure,
                &caller_name(&caller),
                wait(r.wait),
            )
            .await
            .map_err(status)?;
        self.encode_operation(op).await
    }

    async fn destroy(
        &self,
        req: Request<api::DestroyRequest>,
    ) -> Result<Response<api::Operation>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        caller.check(&r.instance, Role::Deployer, "Destroy")?;
        let op = self
            .engine
            .destroy_waiting(
                &r.request_id,
                &r.instance,
                &caller_name(&caller),
                wait(r.wait),
            )
            .await
            .map_err(status)?;
        self.encode_operation(op).await
    }

    async fn get_instance(
        &self,
        req: Request<api::GetInstanceRequest>,
    ) -> Result<Response<api::Instance>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        check_read(&caller, &r.instance, r.reveal_secrets, "GetInstance")?;
        let s = self
            .engine
            .get_instance(&r.instance)
            .await
            .map_err(status)?;
        let mut out = instance(&s, r.reveal_secrets);
        out.queued = queued(self.engine.queued(&s.instance.id));
        Ok(Response::new(out))
    }

    async fn list_instances(
        &self,
        req: Request<api::ListInstancesRequest>,
    ) -> Result<Response<api::ListInstancesResponse>, Status> {
        let caller = Caller::of(&req)?;
        let list = self.engine.list_instances().await.map_err(status)?;
        // A token limited to some instances sees only those.
        Ok(Response::new(api::ListInstancesResponse {
            instances: list
                .iter()
                .filter(|i| caller.may_see(&i.name))
                .map(instance_summary)
                .collect(),
        }))
    }

    async fn get_exports(
        &self,
        req: Request<api::GetExportsRequest>,
    ) -> Result<Response<api::GetExportsResponse>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        check_read(&caller, &r.instance, r.reveal_secrets, "GetExports")?;
        let s = self
            .engine
            .get_instance(&r.instance)
            .await
            .map_err(status)?;
        Ok(Response::new(api::GetExportsResponse {
            exports: s
                .exports
                .iter()
                .map(|e| export(e, r.reveal_secrets))
                .collect(),
        }))
    }

    async fn get_operation(
        &self,
        req: Request<api::GetOperationRequest>,
    ) -> Result<Response<api::Operation>, Status> {
        let caller = Caller::of(&req)?;
        let op = self
            .engine
            .get_operation(&req.into_inner().operation_id)
            .await
            .map_err(status)?;
        self.check_operation(&caller, &op, Role::Viewer, "GetOperation")
            .await?;
        self.encode_operation(op).await
    }

    async fn list_operations(
        &self,
        req: Request<api::ListOperationsRequest>,
    ) -> Result<Response<api::ListOperationsResponse>, Status> {
        let caller = Caller::of(&req)?;
        let name = req.into_inner().instance;
        caller.check(&name, Role::Viewer, "ListOperations")?;
        let ops = self.engine.list_operations(&name).await.map_err(status)?;
        Ok(Response::new(api::ListOperationsResponse {
            operations: ops.iter().map(|o| operation(o, &name, 0)).collect(),
        }))
    }

    async fn watch_operation(
        &self,
        req: Request<api::WatchOperationRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        let op = self
            .engine
            .get_operation(&r.operation_id)
            .await
            .map_err(status)?;
        let store = self.engine.store().clone();
        let inst = store
            .get_instance(&op.instance_id)
            .await
            .map_err(state_status)?;
        caller.check(&inst.name, Role::Viewer, "WatchOperation")?;
        // Without a position, start at the operation's: its events all come after the
        // instance's last one when it was recorded (or where retention left off, if later), so
        // a long history is not read to find them.
        let after = r.after_seq.max(inst.pruned_through).max(op.events_after);
        Ok(Response::new(watch(
            self.engine.clone(),
            op.instance_id,
            after,
            Watch::Operation(op.id),
            self.shutdown.clone(),
        )))
    }

    async fn watch_instance(
        &self,
        req: Request<api::WatchInstanceRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        caller.check(&r.instance, Role::Viewer, "WatchInstance")?;
        let id = self.engine.instance_id(&r.instance).await.map_err(status)?;
        Ok(Response::new(watch(
            self.engine.clone(),
            id,
            r.after_seq,
            Watch::Instance { follow: r.follow },
            self.shutdown.clone(),
        )))
    }

    async fn cancel_operation(
        &self,
        req: Request<api::CancelOperationRequest>,
    ) -> Result<Response<api::Operation>, Status> {
        // `request_id` is not needed: cancelling is idempotent (see the proto).
        let caller = Caller::of(&req)?;
        let id = req.into_inner().operation_id;
        if !matches!(caller, Caller::Open) {
            let op = self.engine.get_operation(&id).await.map_err(status)?;
            self.check_operation(&caller, &op, Role::Deployer, "CancelOperation")
                .await?;
        }
        let op = self.engine.cancel(&id).await.map_err(status)?;
        self.encode_operation(op).await
    }

    async fn check_drift(
        &self,
        req: Request<api::CheckDriftRequest>,
    ) -> Result<Response<api::DriftReport>, Status> {
        let caller = Caller::of(&req)?;
        let name = req.into_inner().instance;
        caller.check(&name, Role::Deployer, "CheckDrift")?;
        let report = self.engine.check_drift(&name).await.map_err(status)?;
        Ok(Response::new(drift(&report)))
    }

    async fn reconcile(
        &self,
        req: Request<api::ReconcileRequest>,
    ) -> Result<Response<api::Operation>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        caller.check(&r.instance, Role::Deployer, "Reconcile")?;
        let accept = match api::ReconcileMode::try_from(r.mode) {
            Ok(api::ReconcileMode::AcceptExternal) => true,
            Ok(api::ReconcileMode::Reapply) => false,
            _ => {
                return Err(Status::invalid_argument(
                    "mode must be RECONCILE_MODE_ACCEPT_EXTERNAL or RECONCILE_MODE_REAPPLY",
                ));
            }
        };
        let op = self
            .engine
            .reconcile(&r.request_id, &r.instance, accept, r.resources)
            .await
            .map_err(status)?;
        self.encode_operation(op).await
    }

    async fn import_resource(
        &self,
        req: Request<api::ImportResourceRequest>,
    ) -> Result<Response<api::Operation>, Status> {
        let caller = Caller::of(&req)?;
        let r = req.into_inner();
        caller.check(&r.instance, Role::Deployer, "ImportResource")?;
        let environment = r.environment.map(decode_environment).transpose()?;
        let request = crate::engine::ImportRequest {
            instance: r.instance,
            name: r.name,
            resource_type: r.resource_type,
            external_id: r.external_id,
            environment,
        };
        let op = self
            .engine
            .import(&r.request_id, request)
            .await
            .map_err(status)?;
        self.encode_operation(op).await
    }

    async fn backup(
        &self,
        req: Request<api::BackupRequest>,
    ) -> Result<Response<BackupStream>, Status> {
        let caller = Caller::of(&req)?;
        check_backup(&caller)?;
        let backup = self.engine.backup().await.map_err(status)?;
        tracing::info!(bytes = backup.size, "state backup taken");
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::task::spawn_blocking(move || send_backup(backup, tx));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

// ---- backup -----------------------------------------------------------------------------------

type BackupStream = Pin<Box<dyn Stream<Item = Result<api::BackupChunk, Status>> + Send>>;

/// Bytes per backup chunk: well under the message size limits of gRPC clients.
const BACKUP_CHUNK: usize = 1024 * 1024;

/// A backup copies every instance: a token limited to some instances may not take one, whatever
/// its role (the layer has checked the role).
fn check_backup(caller: &Caller) -> Result<(), Status> {
    let Caller::Token(t) = caller else {
        return Ok(());
    };
    if t.instances.iter().any(|p| p == "*") {
        tracing::info!(token = %t.name, role = %t.role, action = "Backup", decision = "allowed", "authorization");
        return Ok(());
    }
    let patterns = t.instances.join(", ");
    tracing::warn!(token = %t.name, role = %t.role, patterns = %patterns, action = "Backup", decision = "denied", "authorization");
    Err(Status::permission_denied(format!(
        "token `{}` (role {}) is limited to instances `{patterns}`: Backup copies every instance \
         and needs a token for `*`",
        t.name, t.role
    )))
}

/// Streams the copy in chunks, the last one with its SHA-256 (on the blocking pool: file
/// reads). A client that goes away ends it; the copy's file goes with `backup`.
fn send_backup(
    backup: state::StateBackup,
    tx: tokio::sync::mpsc::Sender<Result<api::BackupChunk, Status>>,
) {
    use std::io::Read;
    let state::StateBackup {
        mut file,
        size,
        sha256,
    } = backup;
    let mut sent = 0u64;
    loop {
        let mut buf = vec![0u8; BACKUP_CHUNK];
        let mut n = 0;
        while n < buf.len() {
            match file.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let _ = tx.blocking_send(Err(Status::internal(format!(
                        "cannot read the state copy: {e}"
                    ))));
                    return;
                }
            }
        }
        buf.truncate(n);
        sent += n as u64;
        let last = n < BACKUP_CHUNK || sent >= size;
        let chunk = api::BackupChunk {
            data: buf,
            total_bytes: size,
            sha256: if last { sha256.clone() } else { String::new() },
        };
        if tx.blocking_send(Ok(chunk)).is_err() || last {
            return;
        }
    }
}

/// Reading an instance: `viewer`, and `admin` to see secret values.
fn check_read(
    caller: &Caller,
    name: &str,
    reveal_secrets: bool,
    method: &str,
) -> Result<(), Status> {
    if reveal_secrets {
        caller.check(name, Role::Admin, &format!("{method} with reveal_secrets"))
    } else {
        caller.check(name, Role::Viewer, method)
    }
}

impl EngineApi {
    /// The caller may do `what` (needing `need`) on the instance of operation `op`.
    async fn check_operation(
        &self,
        caller: &Caller,
        op: &state::Operation,
        need: Role,
        what: &str,
    ) -> Result<(), Status> {
        if matches!(caller, Caller::Open) {
            return Ok(());
        }
        let name = self
            .engine
            .instance_name(&op.instance_id)
            .await
            .map_err(status)?;
        caller.check(&name, need, what)
    }

    async fn encode_operation(
        &self,
        op: state::Operation,
    ) -> Result<Response<api::Operation>, Status> {
        let name = self
            .engine
            .instance_name(&op.instance_id)
            .await
            .map_err(status)?;
        Ok(Response::new(operation(&op, &name, 0)))
    }
}

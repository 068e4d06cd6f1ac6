//! The gRPC services behind `serve_*` and the test harness: Plugin,
//! Provider and Transformer, built from the author's trait objects.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use futures_util::FutureExt as _;
use indexmap::IndexMap;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{Stream, StreamExt as _};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;
use trellis_proto::plugin::v1 as pb;
use trellis_proto::plugin::v1::plugin_server::{Plugin, PluginServer};
use trellis_proto::plugin::v1::provider_server::{Provider as ProviderRpc, ProviderServer};
use trellis_proto::plugin::v1::transformer_server::{
    Transformer as TransformerRpc, TransformerServer,
};

use crate::context::Context;
use crate::error::{Diagnostic, PluginError, Result};
use crate::provider::{
    Applied, CreateRequest, CustomVariableType, DataSource, Filter, Function, ImportRequest, Link,
    LinkKind, LinkPriority, LinkRequest, PlanRequest, Provider, ReadState, Resource, ResourceState,
    Signature, UpdateRequest, ValidateRequest,
};
use crate::schema::Schema;
use crate::serve::PROTOCOL_VERSION;
use crate::transformer::Transformer;
use crate::value::Value;

/// Largest message accepted or sent (blueprints for Transform can be big).
pub(crate) const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

// ---------------------------------------------------------------------------
// In-flight calls, for Cancel and shutdown.

#[derive(Clone, Default)]
pub(crate) struct Calls {
    inner: Arc<CallsInner>,
}

#[derive(Default)]
struct CallsInner {
    root: CancellationToken,
    by_id: Mutex<HashMap<String, (u64, CancellationToken)>>,
    next: AtomicU64,
    in_flight: AtomicU64,
}

pub(crate) struct CallGuard {
    calls: Calls,
    id: String,
    serial: u64,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.calls.inner.in_flight.fetch_sub(1, Ordering::SeqCst);
        if self.id.is_empty() {
            return;
        }
        let mut map = lock(&self.calls.inner.by_id);
        if map.get(&self.id).is_some_and(|(s, _)| *s == self.serial) {
            map.remove(&self.id);
        }
    }
}

impl Calls {
    fn begin(&self, call_id: &str) -> (CancellationToken, CallGuard) {
        let token = self.inner.root.child_token();
        let serial = self.inner.next.fetch_add(1, Ordering::SeqCst);
        self.inner.in_flight.fetch_add(1, Ordering::SeqCst);
        if !call_id.is_empty() {
            lock(&self.inner.by_id).insert(call_id.to_owned(), (serial, token.clone()));
        }
        let guard = CallGuard {
            calls: self.clone(),
            id: call_id.to_owned(),
            serial,
        };
        (token, guard)
    }

    /// Cancels the call with this id; false when no such call is in flight.
    pub(crate) fn cancel(&self, call_id: &str) -> bool {
        match lock(&self.inner.by_id).get(call_id) {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    /// Cancels every call, current and future (shutdown).
    pub(crate) fn cancel_all(&self) {
        self.inner.root.cancel();
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.inner.in_flight.load(Ordering::SeqCst)
    }

    /// A context for a call, registered for Cancel until the guard drops.
    fn context(
        &self,
        call: Option<pb::CallContext>,
        progress: Option<mpsc::UnboundedSender<pb::ApplyResourceEvent>>,
    ) -> (Context, CallGuard) {
        let call = call.unwrap_or_default();
        let (token, guard) = self.begin(&call.call_id);
        (Context::from_call(call, token, progress), guard)
    }
}

fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a non-string panic payload)".to_owned()
    }
}

/// Runs a callback: catches panics (INTERNAL), cancels the context at the
/// call's deadline (the callback still decides when to stop), and logs the
/// outcome. Never logs values.
async fn guarded<T>(
    ctx: &Context,
    method: &'static str,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    let span =
        tracing::info_span!("call", method, id = %ctx.call_id(), request_id = %ctx.request_id());
    async move {
        let started = Instant::now();
        tracing::debug!("started");
        let fut = AssertUnwindSafe(fut).catch_unwind();
        tokio::pin!(fut);
        let outcome = match ctx.remaining() {
            None => fut.await,
            Some(left) => {
                let sleep = tokio::time::sleep(left);
                tokio::pin!(sleep);
                tokio::select! {
                    r = &mut fut => r,
                    () = &mut sleep => {
                        tracing::warn!("deadline passed; cancelling the call");
                        ctx.cancellation_token().cancel();
                        fut.await
                    }
                }
            }
        };
        let result = outcome.unwrap_or_else(|p| {
            let msg = panic_message(p.as_ref());
            Err(PluginError::internal(format!(
                "the plugin panicked in {method}: {msg}"
            )))
        });
        let ms = started.elapsed().as_millis();
        match &result {
            Ok(_) => tracing::debug!(ms, "done"),
            Err(e) => tracing::warn!(ms, class = %e.class, "failed: {}", e.message),
        }
        result
    }
    .instrument(span)
    .await
}

/// `work`'s result; if the engine drops the streamed call first (`tx` closed), the call's
/// context is cancelled and `work` still answers (with whatever it made, for an apply).
async fn unless_dropped<T, M>(
    ctx: &Context,
    tx: &mpsc::UnboundedSender<M>,
    work: impl Future<Output = T>,
) -> T {
    tokio::pin!(work);
    tokio::select! {
        r = &mut work => r,
        () = tx.closed() => {
            tracing::info!(id = %ctx.call_id(), "the engine dropped the call; cancelling it");
            ctx.cancellation_token().cancel();
            work.await
        }
    }
}

fn diagnostics(r: Result<Vec<Diagnostic>>) -> Vec<pb::Diagnostic> {
    match r {
        Ok(ds) => ds.iter().map(Diagnostic::to_proto).collect(),
        Err(e) => vec![Diagnostic::from(e).to_proto()],
    }
}

fn value(v: Option<pb::Value>) -> Value {
    v.map_or(Value::Null, Value::from)
}

// ---------------------------------------------------------------------------
// Plugin service.

pub(crate) struct PluginCore {
    nonce: String,
    manifest: pb::Manifest,
    capabilities: pb::Capabilities,
}

#[derive(Clone)]
pub(crate) struct PluginSvc(Arc<PluginCore>);

fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[tonic::async_trait]
impl Plugin for PluginSvc {
    async fn handshake(
        &self,
        request: Request<pb::HandshakeRequest>,
    ) -> std::result::Result<Response<pb::HandshakeResponse>, Status> {
        let req = request.into_inner();
        if !same_secret(&req.nonce, &self.0.nonce) {
            tracing::warn!("handshake with a wrong nonce refused");
            return Err(Status::failed_precondition(
                "the nonce does not match TRELLIS_PLUGIN_NONCE",
            ));
        }
        if !req.protocol_versions.contains(&PROTOCOL_VERSION) {
            return Err(Status::failed_precondition(format!(
                "this plugin speaks protocol version {PROTOCOL_VERSION}; the engine offered {:?}",
                req.protocol_versions
            )));
        }
        tracing::debug!(host = %req.host_address, "handshake accepted");
        Ok(Response::new(pb::HandshakeResponse {
            protocol_version: PROTOCOL_VERSION,
            plugin: self.0.manifest.plugin.clone(),
            capabilities: Some(self.0.capabilities),
        }))
    }

    async fn get_manifest(
        &self,
        _request: Request<pb::GetManifestRequest>,
    ) -> std::result::Result<Response<pb::Manifest>, Status> {
        Ok(Response::new(self.0.manifest.clone()))
    }
}

// ---------------------------------------------------------------------------
// Provider service.

pub(crate) struct ProviderCore {
    provider: Box<dyn Provider>,
    resources: IndexMap<String, (Arc<dyn Resource>, Schema)>,
    data_sources: IndexMap<String, Arc<dyn DataSource>>,
    links: Vec<Arc<dyn Link>>,
    functions: IndexMap<String, (Arc<dyn Function>, Signature)>,
    variable_types: IndexMap<String, Arc<dyn CustomVariableType>>,
    calls: Calls,
}

#[derive(Clone)]
pub(crate) struct ProviderSvc(Arc<ProviderCore>);

/// What `serve` and the harness need to run a plugin.
pub(crate) struct Services {
    pub(crate) name: String,
    pub(crate) plugin: PluginSvc,
    pub(crate) kind: ServiceKind,
    pub(crate) calls: Calls,
}

pub(crate) enum ServiceKind {
    Provider(ProviderSvc),
    Transformer(TransformerSvc),
}

impl Services {
    pub(crate) fn capabilities(&self) -> pb::Capabilities {
        self.plugin.0.capabilities
    }

    /// Marks every service NOT_SERVING (at shutdown).
    pub(crate) async fn set_not_serving(&self, health: &tonic_health::server::HealthReporter) {
        health.set_not_serving::<PluginServer<PluginSvc>>().await;
        match &self.kind {
            ServiceKind::Provider(_) => {
                health
                    .set_not_serving::<ProviderServer<ProviderSvc>>()
                    .await
            }
            ServiceKind::Transformer(_) => {
                health
                    .set_not_serving::<TransformerServer<TransformerSvc>>()
                    .await;
            }
        }
        health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
    }

    /// The tonic router serving Plugin, Provider or Transformer, and
    /// grpc.health.v1 (every service SERVING).
    pub(crate) async fn router(
        &self,
        builder: &mut tonic::transport::Server,
    ) -> (
        tonic::transport::server::Router,
        tonic_health::server::HealthReporter,
    ) {
        let (health, health_svc) = tonic_health::server::health_reporter();
        health.set_serving::<PluginServer<PluginSvc>>().await;
        let plugin = PluginServer::new(self.plugin.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let router = builder.add_service(health_svc).add_service(plugin);
        let router = match &self.kind {
            ServiceKind::Provider(p) => {
                health.set_serving::<ProviderServer<ProviderSvc>>().await;
                router.add_service(
                    ProviderServer::new(p.clone())
                        .max_decoding_message_size(MAX_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_MESSAGE_BYTES),
                )
            }
            ServiceKind::Transformer(t) => {
                health
                    .set_serving::<TransformerServer<TransformerSvc>>()
                    .await;
                router.add_service(
                    TransformerServer::new(t.clone())
                        .max_decoding_message_size(MAX_MESSAGE_BYTES)
                        .max_encoding_message_size(MAX_MESSAGE_BYTES),
                )
            }
        };
        (router, health)
    }
}

fn check_name(kind: &str, name: &str, seen: &mut Vec<String>) -> Result<()> {
    if name.is_empty() {
        return Err(PluginError::internal(format!("a {kind} has an empty name")));
    }
    if seen.iter().any(|s| s == name) {
        return Err(PluginError::internal(format!(
            "{kind} `{name}` is declared twice"
        )));
    }
    seen.push(name.to_owned());
    Ok(())
}

/// Builds the services of a provider; fails (INTERNAL) on a malformed
/// declaration, such as a resource type declared twice.
pub(crate) fn provider_services<P: Provider>(provider: P, nonce: String) -> Result<Services> {
    if provider.namespace().is_empty() {
        return Err(PluginError::internal("the provider namespace is empty"));
    }
    let mut seen = Vec::new();
    let mut resources = IndexMap::new();
    for r in provider.resources() {
        let r: Arc<dyn Resource> = Arc::from(r);
        check_name("resource type", r.type_name(), &mut seen)?;
        resources.insert(r.type_name().to_owned(), (r.clone(), r.schema()));
    }
    let mut seen = Vec::new();
    let mut data_sources = IndexMap::new();
    for d in provider.data_sources() {
        let d: Arc<dyn DataSource> = Arc::from(d);
        check_name("data source type", d.type_name(), &mut seen)?;
        data_sources.insert(d.type_name().to_owned(), d);
    }
    let mut seen = Vec::new();
    let mut links = Vec::new();
    for l in provider.links() {
        let l: Arc<dyn Link> = Arc::from(l);
        check_name("link type", &l.link_type(), &mut seen)?;
        links.push(l);
    }
    let mut seen = Vec::new();
    let mut functions = IndexMap::new();
    for f in provider.functions() {
        let f: Arc<dyn Function> = Arc::from(f);
        let sig = f.signature();
        check_name("function", &sig.name, &mut seen)?;
        functions.insert(sig.name.clone(), (f, sig));
    }
    let mut seen = Vec::new();
    let mut variable_types = IndexMap::new();
    for v in provider.custom_variable_types() {
        let v: Arc<dyn CustomVariableType> = Arc::from(v);
        check_name("custom variable type", v.type_name(), &mut seen)?;
        variable_types.insert(v.type_name().to_owned(), v);
    }

    let info = pb::PluginInfo {
        kind: pb::PluginKind::Provider as i32,
        name: provider.namespace().to_owned(),
        version: provider.version().to_owned(),
    };
    let capabilities = pb::Capabilities {
        plan_resource: resources.values().any(|(r, _)| r.supports_plan()),
        read_resource: resources.values().any(|(r, _)| r.supports_read()),
        links: !links.is_empty(),
        data_sources: !data_sources.is_empty(),
        functions: !functions.is_empty(),
        custom_variable_types: !variable_types.is_empty(),
        cancel: true,
        destroy_resources: true,
        import_resource: resources.values().any(|(r, _)| r.supports_import()),
    };
    let manifest = pb::Manifest {
        plugin: Some(info.clone()),
        resource_types: resources
            .iter()
            .map(|(t, (r, schema))| pb::ResourceTypeDef {
                r#type: t.clone(),
                description: r.description().to_owned(),
                spec_schema: Some(schema.to_proto()),
                importable: r.supports_import(),
            })
            .collect(),
        data_source_types: data_sources
            .iter()
            .map(|(t, d)| pb::DataSourceTypeDef {
                r#type: t.clone(),
                description: d.description().to_owned(),
                filter_fields: d
                    .filter_fields()
                    .fields()
                    .iter()
                    .map(|(n, f)| f.to_proto(n))
                    .collect(),
                exports: d
                    .exports()
                    .fields()
                    .iter()
                    .map(|(n, f)| f.to_proto(n))
                    .collect(),
            })
            .collect(),
        link_types: links
            .iter()
            .map(|l| pb::LinkTypeDef {
                resource_type_a: l.resource_type_a().to_owned(),
                resource_type_b: l.resource_type_b().to_owned(),
                kind: match l.kind() {
                    LinkKind::Hard => pb::LinkKind::Hard,
                    LinkKind::Soft => pb::LinkKind::Soft,
                } as i32,
                priority: match l.priority() {
                    LinkPriority::ResourceA => pb::LinkPriority::ResourceA,
                    LinkPriority::ResourceB => pb::LinkPriority::ResourceB,
                } as i32,
                annotations: l.annotations().iter().map(|a| a.to_proto()).collect(),
                description: l.description().to_owned(),
            })
            .collect(),
        custom_variable_types: variable_types
            .iter()
            .map(|(t, v)| pb::CustomVariableTypeDef {
                r#type: t.clone(),
                description: v.description().to_owned(),
            })
            .collect(),
        functions: functions.values().map(|(_, sig)| sig.to_proto()).collect(),
        retry_policy: Some(provider.retry_policy().to_proto()),
        config_schema: Some(provider.config_schema().to_proto()),
        abstract_resource_types: Vec::new(),
    };
    let calls = Calls::default();
    let plugin = PluginSvc(Arc::new(PluginCore {
        nonce,
        manifest,
        capabilities,
    }));
    let name = provider.namespace().to_owned();
    let core = ProviderCore {
        provider: Box::new(provider),
        resources,
        data_sources,
        links,
        functions,
        variable_types,
        calls: calls.clone(),
    };
    Ok(Services {
        name,
        plugin,
        kind: ServiceKind::Provider(ProviderSvc(Arc::new(core))),
        calls,
    })
}

type Reply<T> = std::result::Result<Response<T>, Status>;

impl ProviderCore {
    fn resource(&self, resource_type: &str) -> Result<&(Arc<dyn Resource>, Schema)> {
        self.resources.get(resource_type).ok_or_else(|| {
            PluginError::bad_input(format!(
                "provider `{}` has no resource type `{resource_type}`",
                self.provider.namespace()
            ))
        })
    }

    /// The resource type of a PlanResource call: as sent, else from `current`,
    /// else the only type that plans (engines older than `resource_type`).
    fn plan_target(
        &self,
        resource_type: &str,
        current: Option<&ResourceState>,
    ) -> Result<&(Arc<dyn Resource>, Schema)> {
        if !resource_type.is_empty() {
            return self.resource(resource_type);
        }
        if let Some(c) = current.filter(|c| !c.resource_type.is_empty()) {
            return self.resource(&c.resource_type);
        }
        let mut planners = self.resources.values().filter(|(r, _)| r.supports_plan());
        match (planners.next(), planners.next()) {
            (Some(only), None) => Ok(only),
            _ => Err(PluginError::bad_input(
                "PlanResource for a new resource does not name its type, and this provider plans more than one type",
            )),
        }
    }

    fn link(&self, req: &LinkRequest) -> Result<&Arc<dyn Link>> {
        let by_name = self.links.iter().find(|l| l.link_type() == req.link_type);
        let by_types = || {
            self.links.iter().find(|l| {
                l.resource_type_a() == req.resource_a.resource_type
                    && l.resource_type_b() == req.resource_b.resource_type
            })
        };
        by_name.or_else(by_types).ok_or_else(|| {
            PluginError::bad_input(format!(
                "provider `{}` has no link type `{}` ({} -> {})",
                self.provider.namespace(),
                req.link_type,
                req.resource_a.resource_type,
                req.resource_b.resource_type
            ))
        })
    }

    fn mark(schema: &Schema, mut v: Value) -> Value {
        schema.mark_sensitive(&mut v);
        v
    }
}

fn apply_result(schema: &Schema, r: Result<Applied>) -> pb::ApplyResult {
    match r {
        Ok(a) => pb::ApplyResult {
            external_id: a.external_id,
            state: Some(ProviderCore::mark(schema, a.state).to_proto()),
            error: None,
        },
        Err(mut e) => {
            if let Some(ps) = e.partial_state.as_deref_mut() {
                schema.mark_sensitive(ps);
            }
            pb::ApplyResult {
                external_id: e.partial_external_id.clone().unwrap_or_default(),
                state: e.partial_state.as_deref().map(Value::to_proto),
                error: Some(e.to_proto()),
            }
        }
    }
}

fn result_event(r: pb::ApplyResult) -> pb::ApplyResourceEvent {
    pb::ApplyResourceEvent {
        event: Some(pb::apply_resource_event::Event::Result(r)),
    }
}

type ApplyStream =
    Pin<Box<dyn Stream<Item = std::result::Result<pb::ApplyResourceEvent, Status>> + Send>>;

type DestroyStream =
    Pin<Box<dyn Stream<Item = std::result::Result<pb::DestroyResourcesEvent, Status>> + Send>>;

#[tonic::async_trait]
impl ProviderRpc for ProviderSvc {
    async fn validate_config(
        &self,
        request: Request<pb::ValidateConfigRequest>,
    ) -> Reply<pb::ValidateResponse> {
        let req = request.into_inner();
        let (ctx, _guard) = self.0.calls.context(req.context, None);
        let r = guarded(
            &ctx,
            "ValidateConfig",
            self.0.provider.validate_config(&ctx),
        )
        .await;
        Ok(Response::new(pb::ValidateResponse {
            diagnostics: diagnostics(r),
        }))
    }

    async fn validate_resource(
        &self,
        request: Request<pb::ValidateResourceRequest>,
    ) -> Reply<pb::ValidateResponse> {
        let req = request.into_inner();
        let (ctx, _guard) = self.0.calls.context(req.context, None);
        let r = match self.0.resource(&req.resource_type) {
            Err(e) => Err(e),
            Ok((resource, schema)) => {
                let mut spec = value(req.spec);
                schema.apply_defaults(&mut spec);
                let vr = ValidateRequest {
                    resource_type: req.resource_type,
                    name: req.resource_name,
                    spec,
                };
                guarded(&ctx, "ValidateResource", resource.validate(&ctx, &vr)).await
            }
        };
        Ok(Response::new(pb::ValidateResponse {
            diagnostics: diagnostics(r),
        }))
    }

    async fn plan_resource(
        &self,
        request: Request<pb::PlanResourceRequest>,
    ) -> Reply<pb::PlanResourceResponse> {
        let req = request.into_inner();
        let (ctx, _guard) = self.0.calls.context(req.context, None);
        let current = req.current.map(ResourceState::from_proto);
        let r = match self.0.plan_target(&req.resource_type, current.as_ref()) {
            Err(e) => Err(e),
            Ok((resource, schema)) => {
                let name = if req.resource_name.is_empty() {
                    current.as_ref().map(|c| c.name.clone()).unwrap_or_default()
                } else {
                    req.resource_name.clone()
                };
                let pr = PlanRequest {
                    name,
                    current,
                    desired: value(req.desired_spec),
                };
                guarded(&ctx, "PlanResource", resource.plan(&ctx, &pr))
                    .await
                    .map(|p| (p, schema))
            }
        };
        Ok(Response::new(match r {
            Ok((plan, schema)) => pb::PlanResourceResponse {
                recreate_paths: plan.recreate_paths.iter().map(|p| p.to_proto()).collect(),
                planned_state: Some(ProviderCore::mark(schema, plan.planned_state).to_proto()),
                error: None,
                diagnostics: plan.diagnostics.iter().map(Diagnostic::to_proto).collect(),
            },
            Err(e) => pb::PlanResourceResponse {
                error: Some(e.to_proto()),
                ..Default::default()
            },
        }))
    }

    type ApplyResourceStream = ApplyStream;

    async fn apply_resource(
        &self,
        request: Request<pb::ApplyResourceRequest>,
    ) -> Reply<ApplyStream> {
        let req = request.into_inner();
        let (tx, rx) = mpsc::unbounded_channel();
        let current = req.current.map(ResourceState::from_proto);
        let resource_type = if req.resource_type.is_empty() {
            current
                .as_ref()
                .map(|c| c.resource_type.clone())
                .unwrap_or_default()
        } else {
            req.resource_type
        };
        let core = self.0.clone();
        let (ctx, guard) = core.calls.context(req.context, Some(tx.clone()));
        tokio::spawn(async move {
            let _guard = guard;
            let (resource, schema) = match core.resource(&resource_type) {
                Ok((r, s)) => (r.clone(), s.clone()),
                Err(e) => {
                    let _ = tx.send(result_event(apply_result(&Schema::any(), Err(e))));
                    return;
                }
            };
            // Fields the blueprint leaves out arrive with their schema
            // defaults, so resources need not repeat them.
            let mut spec = value(req.desired_spec);
            schema.apply_defaults(&mut spec);
            let name = req.resource_name;
            let work = async {
                match current {
                    None => {
                        let cr = CreateRequest {
                            resource_type,
                            name,
                            spec,
                        };
                        guarded(&ctx, "ApplyResource(create)", resource.create(&ctx, &cr)).await
                    }
                    Some(current) => {
                        let ur = UpdateRequest {
                            resource_type,
                            name,
                            spec,
                            current,
                        };
                        guarded(&ctx, "ApplyResource(update)", resource.update(&ctx, &ur)).await
                    }
                }
            };
            let r = unless_dropped(&ctx, &tx, work).await;
            let _ = tx.send(result_event(apply_result(&schema, r)));
        });
        let stream = UnboundedReceiverStream::new(rx).map(Ok);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn destroy_resource(
        &self,
        request: Request<pb::DestroyResourceRequest>,
    ) -> Reply<pb::DestroyResourceResponse> {
        let req = request.into_inner();
        let (ctx, _guard) = self.0.calls.context(req.context, None);
        let r = match req.current.map(ResourceState::from_proto) {
            None => Err(PluginError::bad_input(
                "DestroyResource needs the resource's current state",
            )),
            Some(current) => match self.0.resource(&current.resource_type) {
                Err(e) => Err(e),
                Ok((resource, _)) => {
                    guarded(&ctx, "DestroyResource", resource.destroy(&ctx, &current)).await
                }
            },
        };
        Ok(Response::new(pb::DestroyResourceResponse {
            error: r.err().map(|e| e.to_proto()),
        }))
    }

    type DestroyResourcesStream = DestroyStream;

    /// Each item runs on its own task through the resource's `destroy`, as DestroyResource
    /// would run it, with the batch's context and the item's idempotency key; the batch is one
    /// call for Cancel and for a drain. Outcomes go out as they come.
    async fn destroy_resources(
        &self,
        request: Request<pb::DestroyResourcesRequest>,
    ) -> Reply<DestroyStream> {
        let req = request.into_inner();
        let (base, guard) = self.0.calls.context(req.context, None);
        let guard = Arc::new(guard);
        let (tx, rx) = mpsc::unbounded_channel();
        for (index, item) in (0u32..).zip(req.items) {
            let core = self.0.clone();
            let tx = tx.clone();
            let guard = guard.clone();
            let ctx = base.for_item(item.idempotency_key);
            tokio::spawn(async move {
                let _guard = guard;
                let work = async {
                    let current = item.current.map(ResourceState::from_proto).ok_or_else(|| {
                        PluginError::bad_input("a DestroyResources item needs its current state")
                    })?;
                    let (resource, _) = core.resource(&current.resource_type)?;
                    guarded(&ctx, "DestroyResource", resource.destroy(&ctx, &current)).await
                };
                // The items share one token: dropping the call cancels what is left of it.
                let r = unless_dropped(&ctx, &tx, work).await;
                let error = r.err().map(|e| e.to_proto());
                let _ = tx.send(Ok(pb::DestroyResourcesEvent { index, error }));
            });
        }
        drop(tx);
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }

    async fn read_resource(
        &self,
        request: Request<pb::ReadResourceRequest>,
    ) -> Reply<pb::ReadResourceResponse> {
        let req = request.into_inner();
        let (ctx, _guard) = self.0.calls.context(req.context, None);
        let sent_id = req
            .current
            .as_ref()
            .map(|c| c.external_id.clone())
            .unwrap_or_default();
        let r: Result<(Option<ReadState>, &Schema)> =
            match req.current.map(ResourceState::from_proto) {
                None => Err(PluginError::bad_input(
                    "ReadResource needs the resource's current state",
                )),
                Some(current) => match self.0.resource(&current.resource_type) {
                    Err(e) => Err(e),
                    Ok((resource, schema)) if resource.supports_read() => {
                        guarded(&ctx, "ReadResource", resource.read(&ctx, &current))
                            .await
                            .map(|r| (r, schema))
                    }
                    Ok(_) => Err(PluginError::internal(format!(
                        "{} does not implement ReadResource",
                        current.resource_type
                    ))),
                },
            };
        Ok(Response::new(match r {
            Ok((Some(rs), schema)) => pb::ReadResourceResponse {
                exists: true,
                spec: Some(ProviderCore::mark(schema, rs.spec).to_proto()),
                state: Some(ProviderCore::mark(schema, rs.state).to_proto()),
                error: None,
                external_id: rs.external_id.unwrap_or(sent_id),
            },
            Ok((None, _)) => pb::ReadResourceResponse::default(),
            Err(e) => pb::ReadResourceResponse {
                error: Some(e.to_proto()),
                ..Default::default()
            },
        }))
    }

    async fn import_resource(
        &self,
        request: Request<pb::ImportResourceRequest>,
    ) -> Reply<pb::ImportResourceResponse> {
        let req = request.into_inner();
        let (ctx, _guard) = self.0.calls.context(req.context, None);
        let asked = ImportRequest {
            resource_type: req.resource_type,
            name: req.resource_name,
            external_id: req.external_id,
        };
        let r: Result<(Option<ReadState>, &Schema)> = match self.0.resource(&asked.resource_type) {
            Err(e) => Err(e),
            Ok((resource, schema)) if resource.supports_import() => {
                guarded(&ctx, "ImportResource", resource.import(&ctx, &asked))
                    .await
                    .map(|r| (r, schema))
            }
            Ok(_) => Err(PluginError::bad_input(format!(
                "{} cannot be imported (the type is not declared importable)",
                asked.resource_type
            ))),
        };
        Ok(Response::new(match r {
            Ok((Some(rs), schema)) => pb::ImportResourceResponse {
                exists: true,
                spec: Some(ProviderCore::mark(schema, rs.spec).to_proto()),
                state: Some(ProviderCore::mark(schema, rs.state).to_proto()),
                external_id: rs.external_id.unwrap_or(asked.external_id),
                error: None,
            },
            Ok((None, _)) => pb::ImportResourceResponse::default(),
            Err(e) => pb::ImportResourceResponse {
                error: Some(e.to_proto()),
                ..Default::default()
            },
        }))
    }

    async fn fetch_data_source(
        &self,
        request: Request<pb::FetchDataSourceRequest>,
    ) -> Reply<pb::FetchDataSourceResponse> {
        let req = request.into_inner();
        let (ctx, _guard) = self.0.calls.context(req.context, None);
        let r = match self.0.data_sources.get(&req.data_source_type) {
            None => Err(PluginError::bad_input(format!(
                "provider `{}` has no data source type `{}`",
                self.0.provider.namespace(),
                req.data_source_type
            ))),
            Some(ds) => {
                let filters: Vec<Filter> = req
                    .filters
                    .into_iter()
                    .map(|f| Filter {
                        field: f.field,
                        operator: f.operator,
                        search: value(f.search),
                    })
                    .collect();
                guarded(&ctx, "FetchDataSource", ds.fetch(&ctx, &filters)).await
            }
        };
        Ok(Response::new(match r {
            Ok(items) => pb::FetchDataSourceResponse {
                items: items.into_iter().map(pb::Value::from).collect(),
                error: None,
            },
            Err(e) => pb::FetchDataSourceResponse {
                items: Vec::new(),
                error: Some(e.to_proto()),
            },
        }))
    }

    async fn call_function(
        &self,
        request: Request<pb::CallFunctionRequest>,
    ) -> Reply<pb::CallFunctionResponse> {
        let req = request.into_inner();
        let (ctx, _guard) = self.0.calls.context(req.context, None);
        let r = match self.0.functions.get(&req.name) {
            None => Err(PluginError::bad_input(format!(
                "provider `{}` has no function `{}`",
                self.0.provider.namespace(),
                req.name
            ))),
            Some((f, sig)) => {
                let args: Vec<Value> = req.args.into_iter().map(Value::from).collect();
                match sig.check_args(&args) {
                    Err(e) => Err(e),
                    Ok(()) => guarded(&ctx, "CallFunction", f.call(&ctx, args)).await,
                }
            }
        };
        Ok(Response::new(match r {
            Ok(v) => pb::CallFunctionResponse {
                result: Some(v.into()),
                error: None,
            },
            Err(e) => pb::CallFunctionResponse {
                result: None,
                error: Some(e.to_proto()),
            },
        }))
    }

    async fn custom_variable_options(
        &self,
        request: Request<pb::CustomVariableOptionsRequest>,
    ) -> Reply<pb::CustomVariableOptionsResponse> {
        let req = request.into_inner();
        let (ctx, _guard) = self.0.calls.context(req.context, None);
        let r = match self.0.variable_types.get(&req.variable_type) {
            None => Err(PluginError::bad_input(format!(
                "provider `{}` has no custom variable type `{}`",
                self.0.provider.namespace(),
                req.variable_type
            ))),
            Some(v) => guarded(&ctx, "CustomVariableOptions", v.options(&ctx)).await,
        };
        Ok(Response::new(match r {
            Ok(opts) => pb::CustomVariableOptionsResponse {
                options: opts
                    .into_iter()
                    .map(|o| pb::CustomVariableOption {
                        label: o.label,
                        value: Some(o.value.into()),
                        description: o.description,
                    })
                    .collect(),
                error: None,
            },
            Err(e) => pb::CustomVariableOptionsResponse {
                options: Vec::new(),
                error: Some(e.to_proto()),
            },
        }))
    }

    async fn stage_link(
        &self,
        request: Request<pb::StageLinkRequest>,
    ) -> Reply<pb::StageLinkResponse> {
        let (call, link) = LinkRequest::from_proto(request.into_inner().link.unwrap_or_default());
        let (ctx, _guard) = self.0.calls.context(call, None);
        let r = match self.0.link(&link) {
            Err(e) => Err(e),
            Ok(l) => guarded(&ctx, "StageLink", l.stage(&ctx, &link)).await,
        };
        Ok(Response::new(match r {
            Ok(s) => pb::StageLinkResponse {
                owned_paths_a: s.owned_paths_a.iter().map(|p| p.to_proto()).collect(),
                owned_paths_b: s.owned_paths_b.iter().map(|p| p.to_proto()).collect(),
                diagnostics: s.diagnostics.iter().map(Diagnostic::to_proto).collect(),
                error: None,
            },
            Err(e) => pb::StageLinkResponse {
                error: Some(e.to_proto()),
                ..Default::default()
            },
        }))
    }

    async fn update_link_resource_a(
        &self,
        request: Request<pb::UpdateLinkResourceRequest>,
    ) -> Reply<pb::UpdateLinkResourceResponse> {
        let (call, link) = LinkRequest::from_proto(request.into_inner().link.unwrap_or_default());
        let (ctx, _guard) = self.0.calls.context(call, None);
        let r = match self.0.link(&link) {
            Err(e) => Err(e),
            Ok(l) => {
                guarded(
                    &ctx,
                    "UpdateLinkResourceA",
                    l.update_resource_a(&ctx, &link),
                )
                .await
            }
        };
        Ok(Response::new(link_data_response(r)))
    }

    async fn update_link_resource_b(
        &self,
        request: Request<pb::UpdateLinkResourceRequest>,
    ) -> Reply<pb::UpdateLinkResourceResponse> {
        let (call, link) = LinkRequest::from_proto(request.into_inner().link.unwrap_or_default());
        let (ctx, _guard) = self.0.calls.context(call, None);
        let r = match self.0.link(&link) {
            Err(e) => Err(e),
            Ok(l) => {
                guarded(
                    &ctx,
                    "UpdateLinkResourceB",
                    l.update_resource_b(&ctx, &link),
                )
                .await
            }
        };
        Ok(Response::new(link_data_response(r)))
    }

    async fn update_link_intermediaries(
        &self,
        request: Request<pb::UpdateLinkIntermediariesRequest>,
    ) -> Reply<pb::UpdateLinkIntermediariesResponse> {
        let (call, link) = LinkRequest::from_proto(request.into_inner().link.unwrap_or_default());
        let (ctx, _guard) = self.0.calls.context(call, None);
        let r = match self.0.link(&link) {
            Err(e) => Err(e),
            Ok(l) => {
                guarded(
                    &ctx,
                    "UpdateLinkIntermediaries",
                    l.update_intermediaries(&ctx, &link),
                )
                .await
            }
        };
        Ok(Response::new(match r {
            Ok(u) => pb::UpdateLinkIntermediariesResponse {
                link_data: Some(u.link_data.into()),
                intermediaries: u
                    .intermediaries
                    .iter()
                    .map(ResourceState::to_proto)
                    .collect(),
                error: None,
            },
            Err(e) => pb::UpdateLinkIntermediariesResponse {
                error: Some(e.to_proto()),
                ..Default::default()
            },
        }))
    }

    async fn read_link_intermediaries(
        &self,
        request: Request<pb::ReadLinkIntermediariesRequest>,
    ) -> Reply<pb::ReadLinkIntermediariesResponse> {
        let (call, link) = LinkRequest::from_proto(request.into_inner().link.unwrap_or_default());
        let (ctx, _guard) = self.0.calls.context(call, None);
        let r = match self.0.link(&link) {
            Err(e) => Err(e),
            Ok(l) => {
                guarded(
                    &ctx,
                    "ReadLinkIntermediaries",
                    l.read_intermediaries(&ctx, &link),
                )
                .await
            }
        };
        Ok(Response::new(match r {
            Ok(list) => pb::ReadLinkIntermediariesResponse {
                intermediaries: list.iter().map(ResourceState::to_proto).collect(),
                error: None,
            },
            Err(e) => pb::ReadLinkIntermediariesResponse {
                intermediaries: Vec::new(),
                error: Some(e.to_proto()),
            },
        }))
    }

    async fn cancel(&self, request: Request<pb::CancelRequest>) -> Reply<pb::CancelResponse> {
        let id = request.into_inner().call_id;
        let cancelled = !id.is_empty() && self.0.calls.cancel(&id);
        tracing::info!(id = %id, cancelled, "cancel requested");
        Ok(Response::new(pb::CancelResponse { cancelled }))
    }
}

fn link_data_response(r: Result<Value>) -> pb::UpdateLinkResourceResponse {
    match r {
        Ok(v) => pb::UpdateLinkResourceResponse {
            link_data: Some(v.into()),
            error: None,
        },
        Err(e) => pb::UpdateLinkResourceResponse {
            link_data: None,
            error: Some(e.to_proto()),
        },
    }
}

// ---------------------------------------------------------------------------
// Transformer service.

pub(crate) struct TransformerCore {
    transformer: Box<dyn Transformer>,
    calls: Calls,
}

#[derive(Clone)]
pub(crate) struct TransformerSvc(Arc<TransformerCore>);

pub(crate) fn transformer_services<T: Transformer>(
    transformer: T,
    nonce: String,
) -> Result<Services> {
    if transformer.name().is_empty() {
        return Err(PluginError::internal("the transformer name is empty"));
    }
    let abstract_types = transformer.abstract_resources();
    let mut seen = Vec::new();
    for a in &abstract_types {
        check_name("abstract resource type", &a.type_name, &mut seen)?;
    }
    let info = pb::PluginInfo {
        kind: pb::PluginKind::Transformer as i32,
        name: transformer.name().to_owned(),
        version: transformer.version().to_owned(),
    };
    let manifest = pb::Manifest {
        plugin: Some(info),
        config_schema: Some(transformer.config_schema().to_proto()),
        abstract_resource_types: abstract_types.iter().map(|a| a.to_proto()).collect(),
        ..Default::default()
    };
    let calls = Calls::default();
    let plugin = PluginSvc(Arc::new(PluginCore {
        nonce,
        manifest,
        capabilities: pb::Capabilities::default(),
    }));
    let name = transformer.name().to_owned();
    Ok(Services {
        name,
        plugin,
        kind: ServiceKind::Transformer(TransformerSvc(Arc::new(TransformerCore {
            transformer: Box::new(transformer),
            calls: calls.clone(),
        }))),
        calls,
    })
}

#[tonic::async_trait]
impl TransformerRpc for TransformerSvc {
    async fn transform(
        &self,
        request: Request<pb::TransformRequest>,
    ) -> Reply<pb::TransformResponse> {
        let req = request.into_inner();
        let (ctx, _guard) = self.0.calls.context(req.context, None);
        let r = match serde_json::from_str::<serde_json::Value>(&req.blueprint_json) {
            Err(e) => Err(PluginError::bad_input(format!(
                "the blueprint is not valid JSON: {e}"
            ))),
            Ok(doc) => guarded(&ctx, "Transform", self.0.transformer.transform(&ctx, doc)).await,
        };
        let r = r.and_then(|t| {
            serde_json::to_string(&t.blueprint)
                .map(|json| (json, t))
                .map_err(|e| {
                    PluginError::internal(format!(
                        "the transformed blueprint cannot be serialised: {e}"
                    ))
                })
        });
        Ok(Response::new(match r {
            Ok((json, t)) => pb::TransformResponse {
                blueprint_json: json,
                diagnostics: t.diagnostics.iter().map(Diagnostic::to_proto).collect(),
                derivations: t
                    .derivations
                    .into_iter()
                    .map(|d| pb::Derivation {
                        generated_resource: d.generated_resource,
                        abstract_resource: d.abstract_resource,
                    })
                    .collect(),
                error: None,
            },
            Err(e) => pb::TransformResponse {
                error: Some(e.to_proto()),
                ..Default::default()
            },
        }))
    }

    async fn validate_abstract_resource(
        &self,
        request: Request<pb::ValidateResourceRequest>,
    ) -> Reply<pb::ValidateResponse> {
        let req = request.into_inner();
        let (ctx, _guard) = self.0.calls.context(req.context, None);
        let vr = ValidateRequest {
            resource_type: req.resource_type,
            name: req.resource_name,
            spec: value(req.spec),
        };
        let r = guarded(
            &ctx,
            "ValidateAbstractResource",
            self.0.transformer.validate_abstract_resource(&ctx, &vr),
        )
        .await;
        Ok(Response::new(pb::ValidateResponse {
            diagnostics: diagnostics(r),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_cancel_by_id_and_forget_finished_calls() {
        let calls = Calls::default();
        let (t1, g1) = calls.begin("a");
        let (t2, _g2) = calls.begin("b");
        assert_eq!(calls.in_flight(), 2);
        assert!(calls.cancel("a"));
        assert!(t1.is_cancelled() && !t2.is_cancelled());
        drop(g1);
        assert!(!calls.cancel("a"));
        assert_eq!(calls.in_flight(), 1);
        calls.cancel_all();
        assert!(t2.is_cancelled());
        let (t3, _g3) = calls.begin("");
        assert!(
            t3.is_cancelled(),
            "calls started after shutdown are cancelled at once"
        );
    }

    #[test]
    fn nonce_comparison() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
    }
}

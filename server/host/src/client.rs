//! Typed clients for Provider and Transformer calls.
//!
//! Every call has a deadline (per call kind by default, see
//! [`super::Deadlines`]) sent as the gRPC timeout and as
//! `CallContext.deadline_unix_ms`; retries share it. `CallContext` is filled
//! in: a fresh `call_id` per attempt, the same `idempotency_key` across
//! attempts (given, or generated per logical call), the instance id and
//! provider configuration from [`CallOptions`].
//!
//! Retries: only application errors of class TRANSIENT, only as the
//! plugin's manifest `RetryPolicy` allows (attempts, initial backoff,
//! multiplier, maximum backoff), and only while the deadline leaves room.
//! Other classes are returned at once. A plugin that dies during a call
//! fails the call with [`PluginError::Crashed`] (never retried blindly: the
//! next call restarts the plugin).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;
use tonic::Status;
use tonic::transport::Channel;
use trellis_proto::plugin::v1 as pb;
use trellis_proto::plugin::v1::provider_client::ProviderClient as RawProvider;
use trellis_proto::plugin::v1::transformer_client::TransformerClient as RawTransformer;

use super::config::CallKind;
use super::error::{AppError, PluginError};
use super::metrics;
use super::supervisor::{Instance, Slot};

use super::values;

/// How long a stream's end (its trailers) is waited for once its result has arrived.
const STREAM_END_GRACE: Duration = Duration::from_secs(2);
/// Per-call settings.
#[derive(Clone, Debug, Default)]
pub struct CallOptions {
    /// Overrides the default deadline of the call kind.
    pub deadline: Option<Duration>,
    /// The same key means the same operation; generated when absent.
    pub idempotency_key: Option<String>,
    /// The blueprint instance the call is made for.
    pub instance_id: String,
    /// The provider configuration sent with the call.
    pub provider_config: Option<pb::Value>,
    /// The engine API request the call serves, for the plugin's logs.
    pub request_id: Option<String>,
}

/// Requests that carry a `CallContext`.
pub trait WithContext {
    fn context_mut(&mut self) -> &mut pb::CallContext;
    /// The resource type the call is about, if any (a metrics label).
    fn resource_type(&self) -> &str {
        ""
    }
}

macro_rules! with_context {
    ($($t:ty $(=> |$r:ident| $ty:expr)?),* $(,)?) => {$(
        impl WithContext for $t {
            fn context_mut(&mut self) -> &mut pb::CallContext {
                self.context.get_or_insert_with(Default::default)
            }
            $(fn resource_type(&self) -> &str {
                let $r = self;
                $ty
            })?
        }
    )*};
}
with_context!(
    pb::ValidateConfigRequest,
    pb::ValidateResourceRequest => |r| &r.resource_type,
    pb::PlanResourceRequest => |r| &r.resource_type,
    pb::ApplyResourceRequest => |r| &r.resource_type,
    pb::DestroyResourceRequest => |r| r.current.as_ref().map_or("", |c| &c.resource_type),
    // A batch may hold several types of the provider: labelled by its first.
    pb::DestroyResourcesRequest => |r| r
        .items
        .first()
        .and_then(|i| i.current.as_ref())
        .map_or("", |c| &c.resource_type),
    pb::ReadResourceRequest => |r| r.current.as_ref().map_or("", |c| &c.resource_type),
    pb::ImportResourceRequest => |r| &r.resource_type,
    pb::FetchDataSourceRequest,
    pb::CallFunctionRequest,
    pb::CustomVariableOptionsRequest,
    pb::TransformRequest
);

macro_rules! link_context {
    ($($t:ty),*) => {$(
        impl WithContext for $t {
            fn context_mut(&mut self) -> &mut pb::CallContext {
                self.link
                    .get_or_insert_with(Default::default)
                    .context
                    .get_or_insert_with(Default::default)
            }
        }
    )*};
}
link_context!(
    pb::StageLinkRequest,
    pb::UpdateLinkResourceRequest,
    pb::UpdateLinkIntermediariesRequest,
    pb::ReadLinkIntermediariesRequest
);

/// Responses that may carry an application error.
pub trait AppResult {
    fn app_error(&self) -> Option<&pb::Error>;
    /// What was created before a failure (ApplyResult: external id, state).
    fn partial(&self) -> (Option<String>, Option<pb::Value>) {
        (None, None)
    }
}

macro_rules! app_result {
    ($($t:ty),*) => {$(
        impl AppResult for $t {
            fn app_error(&self) -> Option<&pb::Error> {
                self.error.as_ref()
            }
        }
    )*};
}
impl AppResult for pb::ApplyResult {
    fn app_error(&self) -> Option<&pb::Error> {
        self.error.as_ref()
    }

    fn partial(&self) -> (Option<String>, Option<pb::Value>) {
        (
            (!self.external_id.is_empty()).then(|| self.external_id.clone()),
            self.state.clone(),
        )
    }
}

app_result!(
    pb::PlanResourceResponse,
    pb::DestroyResourceResponse,
    pb::ReadResourceResponse,
    pb::ImportResourceResponse,
    pb::FetchDataSourceResponse,
    pb::CallFunctionResponse,
    pb::CustomVariableOptionsResponse,
    pb::StageLinkResponse,
    pb::UpdateLinkResourceResponse,
    pb::UpdateLinkIntermediariesResponse,
    pb::ReadLinkIntermediariesResponse,
    pb::TransformResponse
);

/// A streamed call whose outcomes went to a callback as they came: nothing is left to report.
struct Streamed;

impl AppResult for Streamed {
    fn app_error(&self) -> Option<&pb::Error> {
        None
    }
}

impl AppResult for pb::ValidateResponse {
    fn app_error(&self) -> Option<&pb::Error> {
        None
    }
}

/// Why one attempt did not produce a response.
enum Fail {
    Status(Status),
    Protocol(String),
}

impl From<Status> for Fail {
    fn from(s: Status) -> Self {
        Fail::Status(s)
    }
}

/// The retry policy of a manifest, sanitised.
#[derive(Clone, Debug)]
struct Retry {
    attempts: u32,
    initial: Duration,
    max: Duration,
    multiplier: f64,
}

impl Retry {
    fn from_manifest(m: &pb::Manifest, cap: u32) -> Retry {
        let p = m.retry_policy.unwrap_or_default();
        let initial = Duration::from_millis(p.initial_backoff_ms);
        Retry {
            attempts: p.max_attempts.clamp(1, cap.max(1)),
            initial,
            max: if p.max_backoff_ms == 0 {
                Duration::from_secs(60).max(initial)
            } else {
                Duration::from_millis(p.max_backoff_ms)
            },
            multiplier: if p.multiplier.is_finite() && p.multiplier >= 1.0 {
                p.multiplier
            } else {
                1.0
            },
        }
    }

    /// The pause after the `n`-th failed attempt (1-based).
    fn backoff(&self, n: u32) -> Duration {
        let secs = self.initial.as_secs_f64() * self.multiplier.powi(n as i32 - 1);
        let max = self.max.as_secs_f64();
        Duration::from_secs_f64(if secs.is_finite() { secs.min(max) } else { max })
    }
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A capability a call needs: its name and how to read it.
type Capability = (&'static str, fn(&pb::Capabilities) -> bool);

/// Shared call machinery of both clients.
#[derive(Clone)]
struct Caller {
    slot: Arc<Slot>,
}

impl Caller {
    fn name(&self) -> &str {
        self.slot.name()
    }

    /// The manifest (disk cache or GetManifest).
    async fn manifest(&self) -> Result<Arc<pb::Manifest>, PluginError> {
        let d = self.slot.shared.config.deadlines.manifest;
        self.slot.manifest(Instant::now() + d).await
    }

    /// Starts the plugin if it is not running; returns its pid.
    async fn start(&self) -> Result<u32, PluginError> {
        let d = self.slot.shared.config.launch_timeout + Duration::from_secs(1);
        Ok(self
            .slot
            .instance(Instant::now() + d, "start")
            .await?
            .process
            .pid)
    }

    /// The running process, if any.
    fn pid(&self) -> Option<u32> {
        self.slot.live().map(|i| i.process.pid)
    }

    fn max_message_bytes(&self) -> usize {
        self.slot.shared.config.max_message_bytes
    }

    /// Every call to a plugin goes through here: [`Caller::call_counted`], measured.
    async fn call<Req, Resp, F, Fut>(
        &self,
        kind: CallKind,
        label: String,
        opts: &CallOptions,
        req: Req,
        capability: Option<Capability>,
        f: F,
    ) -> Result<Resp, PluginError>
    where
        Req: WithContext + Clone,
        Resp: AppResult,
        F: Fn(Channel, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<Resp, Fail>>,
    {
        let started = Instant::now();
        let ty = self.slot.type_label(req.resource_type());
        let call = metrics::call_name(&label).to_owned();
        let result = self
            .call_counted(kind, label, opts, req, capability, f)
            .await;
        let outcome = metrics::outcome(&result);
        metrics::call_ended(self.name(), &ty, &call, outcome, started.elapsed());
        result
    }

    async fn call_counted<Req, Resp, F, Fut>(
        &self,
        kind: CallKind,
        label: String,
        opts: &CallOptions,
        mut req: Req,
        capability: Option<Capability>,
        f: F,
    ) -> Result<Resp, PluginError>
    where
        Req: WithContext + Clone,
        Resp: AppResult,
        F: Fn(Channel, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<Resp, Fail>>,
    {
        let config = &self.slot.shared.config;
        let budget = opts.deadline.unwrap_or_else(|| config.deadlines.get(kind));
        let deadline = Instant::now() + budget;
        let deadline_unix_ms = unix_ms(SystemTime::now() + budget);
        let idempotency_key = opts
            .idempotency_key
            .clone()
            .unwrap_or_else(|| trellis_ids::new_id("key"));
        {
            let ctx = req.context_mut();
            ctx.idempotency_key = idempotency_key;
            ctx.deadline_unix_ms = deadline_unix_ms;
            if !opts.instance_id.is_empty() {
                ctx.instance_id = opts.instance_id.clone();
            }
            if let Some(id) = &opts.request_id {
                ctx.request_id = id.clone();
            }
            // A call made without a request's config (a plugin calling another's function
            // through the host, the CLI) still carries the engine's settings for a provider.
            let fallback = || {
                (self.slot.binary.kind == super::discovery::PluginKind::Provider)
                    .then(|| self.slot.shared.default_configs.get())
                    .flatten()
                    .and_then(|m| m.get(self.slot.name()))
            };
            if let Some(cfg) = opts.provider_config.as_ref().or_else(fallback) {
                ctx.provider_config = Some(cfg.clone());
            }
        }
        let instance_id = req.context_mut().instance_id.clone();
        let mut retry: Option<Retry> = None;
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let inst = self.slot.instance(deadline, &label).await?;
            // While the call runs, this process may look up the instance's resources.
            let _serving = (!instance_id.is_empty())
                .then(|| self.slot.shared.serving.enter(inst.id, &instance_id));
            if let Some((cap, has)) = capability
                && !has(&inst.capabilities)
            {
                return Err(PluginError::Protocol {
                    plugin: self.name().to_owned(),
                    call: label,
                    message: format!("the plugin does not declare the `{cap}` capability"),
                });
            }
            let call_id = trellis_ids::new_id("call");
            req.context_mut().call_id = call_id.clone();
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(self.deadline_exceeded(&label, budget));
            }
            let mut request = tonic::Request::new(req.clone());
            request.set_timeout(remaining);
            let outcome = run(&inst, remaining, f(inst.channel.clone(), request)).await;
            let resp = match outcome {
                Ok(resp) => resp,
                Err(Run::Exited(info)) => return Err(self.exited(label, &info)),
                Err(Run::Timeout) => {
                    self.cancel_in_background(&inst, call_id);
                    return Err(self.deadline_exceeded(&label, budget));
                }
                Err(Run::Fail(Fail::Protocol(message))) => {
                    return Err(PluginError::Protocol {
                        plugin: self.name().to_owned(),
                        call: label,
                        message,
                    });
                }
                Err(Run::Fail(Fail::Status(status)))
                    if matches!(
                        status.code(),
                        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
                    ) && Instant::now() + Duration::from_millis(20) >= deadline =>
                {
                    // gRPC's own timeout (the grpc-timeout we sent) fired first.
                    self.cancel_in_background(&inst, call_id);
                    return Err(self.deadline_exceeded(&label, budget));
                }
                Err(Run::Fail(Fail::Status(status))) => {
                    return Err(self.transport_error(&inst, label, status).await);
                }
            };
            let Some(err) = resp.app_error() else {
                return Ok(resp);
            };
            if err.error_class == pb::ErrorClass::Transient as i32 {
                if retry.is_none() {
                    retry = Some(match self.slot.manifest(deadline).await {
                        Ok(m) => Retry::from_manifest(&m, config.max_retry_attempts),
                        Err(e) => {
                            tracing::warn!(plugin = %self.name(), error = %e, "no retry policy (manifest unavailable); not retrying");
                            Retry::from_manifest(&pb::Manifest::default(), 1)
                        }
                    });
                }
                if let Some(policy) = &retry {
                    let pause = policy.backoff(attempt);
                    let fits = Instant::now() + pause < deadline;
                    if attempt < policy.attempts && fits {
                        tracing::info!(
                            plugin = %self.name(),
                            call = %label,
                            attempt,
                            "transient error, retrying in {:.0} ms: {}",
                            pause.as_secs_f64() * 1e3,
                            err.message
                        );
                        tokio::time::sleep(pause).await;
                        continue;
                    }
                }
            }
            let (external_id, state) = resp.partial();
            return Err(app_error(
                self.name(),
                label,
                attempt,
                err,
                external_id,
                state,
            ));
        }
    }

    /// The process ended under a call: a crash, or a stop the engine asked for.
    fn exited(&self, label: String, info: &super::error::ExitInfo) -> PluginError {
        if info.expected {
            PluginError::ShutDown {
                plugin: self.name().to_owned(),
            }
        } else {
            PluginError::Crashed {
                plugin: self.name().to_owned(),
                call: label,
                exit: Box::new(info.clone()),
            }
        }
    }

    fn deadline_exceeded(&self, label: &str, budget: Duration) -> PluginError {
        PluginError::DeadlineExceeded {
            plugin: self.name().to_owned(),
            call: label.to_owned(),
            deadline: budget,
        }
    }

    /// A gRPC error: a crash if the process is gone (or goes within 500 ms),
    /// else a transport error.
    async fn transport_error(&self, inst: &Instance, label: String, status: Status) -> PluginError {
        let exited = tokio::time::timeout(Duration::from_millis(500), inst.exited())
            .await
            .ok();
        match exited {
            Some(info) => self.exited(label, &info),
            None => PluginError::Transport {
                plugin: self.name().to_owned(),
                call: label,
                code: status.code(),
                message: status.message().to_owned(),
            },
        }
    }

    fn cancel_in_background(&self, inst: &Arc<Instance>, call_id: String) {
        if !inst.capabilities.cancel || inst.info.kind != pb::PluginKind::Provider as i32 {
            return;
        }
        let channel = inst.channel.clone();
        let timeout = self.slot.shared.config.deadlines.cancel;
        let name = self.name().to_owned();
        tokio::spawn(async move {
            let mut req = tonic::Request::new(pb::CancelRequest {
                call_id: call_id.clone(),
            });
            req.set_timeout(timeout);
            let r = tokio::time::timeout(timeout, RawProvider::new(channel).cancel(req)).await;
            tracing::debug!(plugin = %name, call_id = %call_id, ok = matches!(r, Ok(Ok(_))), "Cancel sent after deadline");
        });
    }
}

fn app_error(
    plugin: &str,
    call: String,
    attempts: u32,
    err: &pb::Error,
    external_id: Option<String>,
    state: Option<pb::Value>,
) -> PluginError {
    PluginError::Application(Box::new(AppError {
        plugin: plugin.to_owned(),
        call,
        attempts,
        error: err.clone(),
        external_id,
        state,
    }))
}

enum Run<T> {
    Exited(Arc<super::error::ExitInfo>),
    Timeout,
    Fail(T),
}

/// Runs one attempt against `inst`: the response, or the crash of the
/// process (whichever comes first), or the deadline.
async fn run<T>(
    inst: &Instance,
    remaining: Duration,
    fut: impl Future<Output = Result<T, Fail>>,
) -> Result<T, Run<Fail>> {
    tokio::select! {
        biased;
        r = tokio::time::timeout(remaining, fut) => match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(f)) => Err(Run::Fail(f)),
            Err(_) => Err(Run::Timeout),
        },
        info = inst.exited() => Err(Run::Exited(info)),
    }
}

/// A provider plugin. Cheap to clone; launching happens on first call.
#[derive(Clone)]
pub struct ProviderClient {
    c: Caller,
}

/// Extracts the unary response.
async fn unary<T>(r: impl Future<Output = Result<tonic::Response<T>, Status>>) -> Result<T, Fail> {
    Ok(r.await?.into_inner())
}

impl ProviderClient {
    pub(crate) fn new(slot: Arc<Slot>) -> ProviderClient {
        ProviderClient { c: Caller { slot } }
    }

    /// The provider namespace.
    pub fn namespace(&self) -> &str {
        self.c.name()
    }

    fn raw(&self, ch: Channel) -> RawProvider<Channel> {
        let max = self.c.max_message_bytes();
        RawProvider::new(ch)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max)
    }

    /// The manifest (disk cache or GetManifest).
    pub async fn manifest(&self) -> Result<Arc<pb::Manifest>, PluginError> {
        self.c.manifest().await
    }

    /// Starts the plugin if it is not running; returns its pid.
    pub async fn start(&self) -> Result<u32, PluginError> {
        self.c.start().await
    }

    /// The running process, if any.
    pub fn pid(&self) -> Option<u32> {
        self.c.pid()
    }

    /// The capabilities declared at handshake (starts the plugin).
    pub async fn capabilities(&self) -> Result<pb::Capabilities, PluginError> {
        let d = self.c.slot.shared.config.launch_timeout + Duration::from_secs(1);
        Ok(self
            .c
            .slot
            .instance(Instant::now() + d, "start")
            .await?
            .capabilities)
    }

    pub async fn validate_config(
        &self,
        opts: &CallOptions,
    ) -> Result<pb::ValidateResponse, PluginError> {
        let this = self.clone();
        self.c
            .call(
                CallKind::Validate,
                "ValidateConfig".into(),
                opts,
                pb::ValidateConfigRequest::default(),
                None,
                move |ch, r| {
                    let mut c = this.raw(ch);
                    async move { unary(c.validate_config(r)).await }
                },
            )
            .await
    }

    pub async fn validate_resource(
        &self,
        req: pb::ValidateResourceRequest,
        opts: &CallOptions,
    ) -> Result<pb::ValidateResponse, PluginError> {
        let label = format!(
            "ValidateResource({} {})",
            req.resource_type, req.resource_name
        );
        let this = self.clone();
        self.c
            .call(CallKind::Validate, label, opts, req, None, move |ch, r| {
                let mut c = this.raw(ch);
                async move { unary(c.validate_resource(r)).await }
            })
            .await
    }

    pub async fn plan_resource(
        &self,
        req: pb::PlanResourceRequest,
        opts: &CallOptions,
    ) -> Result<pb::PlanResourceResponse, PluginError> {
        let this = self.clone();
        self.c
            .call(
                CallKind::PlanResource,
                "PlanResource".into(),
                opts,
                req,
                Some(("plan_resource", |c| c.plan_resource)),
                move |ch, r| {
                    let mut c = this.raw(ch);
                    async move { unary(c.plan_resource(r)).await }
                },
            )
            .await
    }

    /// Creates or updates a resource; `on_progress` sees each progress
    /// event. An application error in the result becomes
    /// [`PluginError::Application`] carrying the result's external id and
    /// state, so nothing created before the failure is lost.
    pub async fn apply_resource(
        &self,
        req: pb::ApplyResourceRequest,
        opts: &CallOptions,
        on_progress: impl Fn(&pb::Progress) + Send + Sync + 'static,
    ) -> Result<pb::ApplyResult, PluginError> {
        let label = format!("ApplyResource({} {})", req.resource_type, req.resource_name);
        let on_progress = Arc::new(on_progress);
        let this = self.clone();
        self.c
            .call(
                CallKind::ApplyResource,
                label.clone(),
                opts,
                req,
                None,
                move |ch, r| {
                    let mut c = this.raw(ch);
                    let on_progress = on_progress.clone();
                    async move {
                        let mut stream = c.apply_resource(r).await?.into_inner();
                        loop {
                            match stream.message().await? {
                                Some(pb::ApplyResourceEvent {
                                    event: Some(pb::apply_resource_event::Event::Progress(p)),
                                }) => on_progress(&p),
                                Some(pb::ApplyResourceEvent {
                                    event: Some(pb::apply_resource_event::Event::Result(res)),
                                }) => {
                                    // Read to the end of the stream (its trailers): a stream
                                    // dropped before it is the client resetting it, and a
                                    // plugin's HTTP/2 server answers a flood of resets (a
                                    // deploy of thousands of quick calls) with ENHANCE_YOUR_CALM,
                                    // failing every call on the connection. The result stands
                                    // whatever comes after it; a plugin that never ends the
                                    // stream gets a moment, not the call's deadline.
                                    let _ = tokio::time::timeout(STREAM_END_GRACE, async {
                                        while let Ok(Some(_)) = stream.message().await {}
                                    })
                                    .await;
                                    return Ok(res);
                                }
                                Some(pb::ApplyResourceEvent { event: None }) => {}
                                None => {
                                    return Err(Fail::Protocol(
                                        "the ApplyResource stream ended without a result".into(),
                                    ));
                                }
                            }
                        }
                    }
                },
            )
            .await
    }

    pub async fn destroy_resource(
        &self,
        req: pb::DestroyResourceRequest,
        opts: &CallOptions,
    ) -> Result<pb::DestroyResourceResponse, PluginError> {
        let this = self.clone();
        self.c
            .call(
                CallKind::DestroyResource,
                "DestroyResource".into(),
                opts,
                req,
                None,
                move |ch, r| {
                    let mut c = this.raw(ch);
                    async move { unary(c.destroy_resource(r)).await }
                },
            )
            .await
    }

    /// Destroys several resources in one call (capability `destroy_resources`); `on_item`
    /// sees each item's outcome as it comes, in any order. The call as a whole is attempted
    /// once (an item that fails transiently is its caller's to retry); an `Err` says no
    /// further outcome will come, and the items without one are unknown.
    pub async fn destroy_resources(
        &self,
        req: pb::DestroyResourcesRequest,
        opts: &CallOptions,
        on_item: impl Fn(pb::DestroyResourcesEvent) + Send + Sync + 'static,
    ) -> Result<(), PluginError> {
        let items = req.items.len();
        let on_item = Arc::new(on_item);
        let this = self.clone();
        self.c
            .call(
                CallKind::DestroyResource,
                "DestroyResources".into(),
                opts,
                req,
                Some(("destroy_resources", |c| c.destroy_resources)),
                move |ch, r| {
                    let mut c = this.raw(ch);
                    let on_item = on_item.clone();
                    async move {
                        let mut stream = c.destroy_resources(r).await?.into_inner();
                        let mut answered = vec![false; items];
                        while let Some(event) = stream.message().await? {
                            // An index out of range or answered twice would be a broken
                            // plugin; its first answer stands.
                            match answered.get_mut(event.index as usize) {
                                Some(seen @ false) => {
                                    *seen = true;
                                    on_item(event);
                                }
                                _ => {
                                    return Err(Fail::Protocol(format!(
                                        "DestroyResources answered item {} {}",
                                        event.index,
                                        if (event.index as usize) < items {
                                            "twice"
                                        } else {
                                            "which it was not sent"
                                        }
                                    )));
                                }
                            }
                        }
                        match answered.iter().filter(|a| !**a).count() {
                            0 => Ok(Streamed),
                            n => Err(Fail::Protocol(format!(
                                "the DestroyResources stream ended with {n} of {items} items unanswered"
                            ))),
                        }
                    }
                },
            )
            .await
            .map(|Streamed| ())
    }

    pub async fn read_resource(
        &self,
        req: pb::ReadResourceRequest,
        opts: &CallOptions,
    ) -> Result<pb::ReadResourceResponse, PluginError> {
        let this = self.clone();
        self.c
            .call(
                CallKind::ReadResource,
                "ReadResource".into(),
                opts,
                req,
                Some(("read_resource", |c| c.read_resource)),
                move |ch, r| {
                    let mut c = this.raw(ch);
                    async move { unary(c.read_resource(r)).await }
                },
            )
            .await
    }

    /// ImportResource, under the read deadline (it is a read).
    pub async fn import_resource(
        &self,
        req: pb::ImportResourceRequest,
        opts: &CallOptions,
    ) -> Result<pb::ImportResourceResponse, PluginError> {
        let this = self.clone();
        self.c
            .call(
                CallKind::ReadResource,
                "ImportResource".into(),
                opts,
                req,
                Some(("import_resource", |c| c.import_resource)),
                move |ch, r| {
                    let mut c = this.raw(ch);
                    async move { unary(c.import_resource(r)).await }
                },
            )
            .await
    }

    pub async fn fetch_data_source(
        &self,
        req: pb::FetchDataSourceRequest,
        opts: &CallOptions,
    ) -> Result<pb::FetchDataSourceResponse, PluginError> {
        let label = format!("FetchDataSource({})", req.data_source_type);
        let this = self.clone();
        self.c
            .call(
                CallKind::FetchDataSource,
                label,
                opts,
                req,
                Some(("data_sources", |c| c.data_sources)),
                move |ch, r| {
                    let mut c = this.raw(ch);
                    async move { unary(c.fetch_data_source(r)).await }
                },
            )
            .await
    }

    /// Calls a provider function; the result (null when the plugin sent none).
    pub async fn call_function(
        &self,
        name: &str,
        args: Vec<pb::Value>,
        opts: &CallOptions,
    ) -> Result<pb::Value, PluginError> {
        let req = pb::CallFunctionRequest {
            context: None,
            name: name.to_owned(),
            args,
        };
        let this = self.clone();
        let resp = self
            .c
            .call(
                CallKind::CallFunction,
                format!("CallFunction({name})"),
                opts,
                req,
                Some(("functions", |c| c.functions)),
                move |ch, r| {
                    let mut c = this.raw(ch);
                    async move { unary(c.call_function(r)).await }
                },
            )
            .await?;
        Ok(resp.result.unwrap_or_else(values::null))
    }

    pub async fn custom_variable_options(
        &self,
        variable_type: &str,
        opts: &CallOptions,
    ) -> Result<pb::CustomVariableOptionsResponse, PluginError> {
        let req = pb::CustomVariableOptionsRequest {
            context: None,
            variable_type: variable_type.to_owned(),
        };
        let this = self.clone();
        self.c
            .call(
                CallKind::CustomVariableOptions,
                format!("CustomVariableOptions({variable_type})"),
                opts,
                req,
                Some(("custom_variable_types", |c| c.custom_variable_types)),
                move |ch, r| {
                    let mut c = this.raw(ch);
                    async move { unary(c.custom_variable_options(r)).await }
                },
            )
            .await
    }

    pub async fn stage_link(
        &self,
        req: pb::StageLinkRequest,
        opts: &CallOptions,
    ) -> Result<pb::StageLinkResponse, PluginError> {
        let this = self.clone();
        self.c
            .call(
                CallKind::Link,
                "StageLink".into(),
                opts,
                req,
                Some(("links", |c| c.links)),
                move |ch, r| {
                    let mut c = this.raw(ch);
                    async move { unary(c.stage_link(r)).await }
                },
            )
            .await
    }

    pub async fn update_link_resource_a(
        &self,
        req: pb::UpdateLinkResourceRequest,
        opts: &CallOptions,
    ) -> Result<pb::UpdateLinkResourceResponse, PluginError> {
        let this = self.clone();
        self.c
            .call(
                CallKind::Link,
                "UpdateLinkResourceA".into(),
                opts,
                req,
                Some(("links", |c| c.links)),
                move |ch, r| {
                    let mut c = this.raw(ch);
                    async move { unary(c.update_link_resource_a(r)).await }
                },
            )
            .await
    }

    pub async fn update_link_resource_b(
        &self,
        req: pb::UpdateLinkResourceRequest,
        opts: &CallOptions,
    ) -> Result<pb::UpdateLinkResourceResponse, PluginError> {
        let this = self.clone();
        self.c
            .call(
                CallKind::Link,
                "UpdateLinkResourceB".into(),
                opts,
                req,
                Some(("links", |c| c.links)),
                move |ch, r| {
                    let mut c = this.raw(ch);
                    async move { unary(c.update_link_resource_b(r)).await }
                },
            )
            .await
    }

    pub async fn update_link_intermediaries(
        &self,
        req: pb::UpdateLinkIntermediariesRequest,
        opts: &CallOptions,
    ) -> Result<pb::UpdateLinkIntermediariesResponse, PluginError> {
        let this = self.clone();
        self.c
            .call(
                CallKind::Link,
                "UpdateLinkIntermediaries".into(),
                opts,
                req,
                Some(("links", |c| c.links)),
                move |ch, r| {
                    let mut c = this.raw(ch);
                    async move { unary(c.update_link_intermediaries(r)).await }
                },
            )
            .await
    }

    pub async fn read_link_intermediaries(
        &self,
        req: pb::ReadLinkIntermediariesRequest,
        opts: &CallOptions,
    ) -> Result<pb::ReadLinkIntermediariesResponse, PluginError> {
        let this = self.clone();
        self.c
            .call(
                CallKind::Link,
                "ReadLinkIntermediaries".into(),
                opts,
                req,
                Some(("links", |c| c.links)),
                move |ch, r| {
                    let mut c = this.raw(ch);
                    async move { unary(c.read_link_intermediaries(r)).await }
                },
            )
            .await
    }
}

/// A transformer plugin. Cheap to clone; launching happens on first call.
#[derive(Clone)]
pub struct TransformerClient {
    c: Caller,
}

impl TransformerClient {
    pub(crate) fn new(slot: Arc<Slot>) -> TransformerClient {
        TransformerClient { c: Caller { slot } }
    }

    pub fn name(&self) -> &str {
        self.c.name()
    }

    fn raw(&self, ch: Channel) -> RawTransformer<Channel> {
        let max = self.c.max_message_bytes();
        RawTransformer::new(ch)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max)
    }

    /// The manifest (disk cache or GetManifest).
    pub async fn manifest(&self) -> Result<Arc<pb::Manifest>, PluginError> {
        self.c.manifest().await
    }

    /// Starts the plugin if it is not running; returns its pid.
    pub async fn start(&self) -> Result<u32, PluginError> {
        self.c.start().await
    }

    /// The running process, if any.
    pub fn pid(&self) -> Option<u32> {
        self.c.pid()
    }

    /// Expands abstract resources; the blueprint travels as JSON.
    pub async fn transform(
        &self,
        blueprint_json: String,
        opts: &CallOptions,
    ) -> Result<pb::TransformResponse, PluginError> {
        let req = pb::TransformRequest {
            context: None,
            blueprint_json,
        };
        let this = self.clone();
        self.c
            .call(
                CallKind::Transform,
                "Transform".into(),
                opts,
                req,
                None,
                move |ch, r| {
                    let mut c = this.raw(ch);
                    async move { unary(c.transform(r)).await }
                },
            )
            .await
    }

    pub async fn validate_abstract_resource(
        &self,
        req: pb::ValidateResourceRequest,
        opts: &CallOptions,
    ) -> Result<pb::ValidateResponse, PluginError> {
        let label = format!(
            "ValidateAbstractResource({} {})",
            req.resource_type, req.resource_name
        );
        let this = self.clone();
        self.c
            .call(CallKind::Validate, label, opts, req, None, move |ch, r| {
                let mut c = this.raw(ch);
                async move { unary(c.validate_abstract_resource(r)).await }
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_policy_is_sanitised() {
        let m = |p: pb::RetryPolicy| pb::Manifest {
            retry_policy: Some(p),
            ..Default::default()
        };
        let r = Retry::from_manifest(&pb::Manifest::default(), 10);
        assert_eq!(r.attempts, 1);
        let r = Retry::from_manifest(
            &m(pb::RetryPolicy {
                max_attempts: 1000,
                initial_backoff_ms: 10,
                max_backoff_ms: 25,
                multiplier: 2.0,
            }),
            10,
        );
        assert_eq!(r.attempts, 10);
        assert_eq!(r.backoff(1), Duration::from_millis(10));
        assert_eq!(r.backoff(2), Duration::from_millis(20));
        assert_eq!(r.backoff(3), Duration::from_millis(25));
        let r = Retry::from_manifest(
            &m(pb::RetryPolicy {
                max_attempts: 3,
                initial_backoff_ms: 10,
                max_backoff_ms: 0,
                multiplier: f64::NAN,
            }),
            10,
        );
        assert_eq!(r.backoff(5), Duration::from_millis(10));
    }
}

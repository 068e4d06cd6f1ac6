//! An in-process test harness: runs your plugin's real gRPC services on a
//! temporary Unix socket inside the test process and calls them through a
//! real gRPC client, so tests exercise the protocol without spawning a
//! process.
//!
//! ```
//! # use trellis_plugin_sdk::prelude::*;
//! # use trellis_plugin_sdk::testing::Harness;
//! # struct P;
//! # impl Provider for P { fn namespace(&self) -> &str { "p" } }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<()> {
//! let h = Harness::provider(P).await?;
//! let hs = h.handshake().await?;
//! assert_eq!(hs.protocol_version, 1);
//! let manifest = h.manifest().await?;
//! assert_eq!(manifest.plugin.map(|p| p.name), Some("p".to_owned()));
//! # Ok(()) }
//! ```
//!
//! Application errors come back as the [`PluginError`] the plugin returned
//! (class, message, path, partial state). Transport failures, which a
//! working plugin never causes, come back as INTERNAL errors whose message
//! starts with `gRPC status`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Uri};
use trellis_proto::plugin::v1 as pb;
use trellis_proto::plugin::v1::plugin_client::PluginClient;
use trellis_proto::plugin::v1::provider_client::ProviderClient;
use trellis_proto::plugin::v1::transformer_client::TransformerClient;

use crate::error::{Diagnostic, PluginError, Result};
use crate::provider::{
    Filter, IntermediariesUpdate, LinkRequest, Plan, Provider, ReadState, ResourceState,
    StagedLink, VariableOption,
};
use crate::serve::PROTOCOL_VERSION;
use crate::service::{MAX_MESSAGE_BYTES, Services, provider_services, transformer_services};
use crate::transformer::{Derivation, Transformed, Transformer};
use crate::value::{AttrPath, Value};

static NEXT: AtomicU64 = AtomicU64::new(0);

fn unique() -> u64 {
    NEXT.fetch_add(1, Ordering::SeqCst)
}

fn transport(s: tonic::Status) -> PluginError {
    PluginError::internal(format!("gRPC status {:?}: {}", s.code(), s.message()))
}

/// What ReadResource or ImportResource found, if anything.
fn found(
    exists: bool,
    spec: Option<pb::Value>,
    state: Option<pb::Value>,
    external_id: String,
) -> Option<ReadState> {
    exists.then(|| ReadState {
        spec: value(spec),
        state: value(state),
        external_id: (!external_id.is_empty()).then_some(external_id),
    })
}

fn err_or<T>(e: Option<pb::Error>, ok: T) -> Result<T> {
    match e {
        Some(e) => Err(PluginError::from_proto(e)),
        None => Ok(ok),
    }
}

fn value(v: Option<pb::Value>) -> Value {
    v.map_or(Value::Null, Value::from)
}

/// Connects a gRPC channel to a Unix socket (what the engine does).
pub async fn connect_unix(
    path: impl AsRef<Path>,
) -> std::result::Result<Channel, tonic::transport::Error> {
    let path = path.as_ref().to_path_buf();
    // The URI is required by tonic but unused: the connector dials the socket.
    Endpoint::from_static("http://plugin.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}

/// What an ApplyResource stream delivered.
#[derive(Clone, Debug)]
pub struct ApplyOutcome {
    /// Progress messages, in order: (message, fraction; negative when unknown).
    pub progress: Vec<(String, f64)>,
    /// The resource after the call, or the error (with any partial state).
    pub result: Result<ResourceState>,
}

/// A plugin served in the test process. Drop it (or call
/// [`Harness::shutdown`]) to stop the server and remove the socket.
pub struct Harness {
    dir: PathBuf,
    socket: PathBuf,
    nonce: String,
    config: Value,
    channel: Channel,
    capabilities: pb::Capabilities,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl Harness {
    /// Starts `provider`'s services. Must run inside a tokio runtime
    /// (`#[tokio::test]`).
    pub async fn provider<P: Provider>(provider: P) -> Result<Harness> {
        let nonce = format!("harness-nonce-{}-{}", std::process::id(), unique());
        Harness::start(provider_services(provider, nonce.clone())?, nonce).await
    }

    /// Starts `transformer`'s services.
    pub async fn transformer<T: Transformer>(transformer: T) -> Result<Harness> {
        let nonce = format!("harness-nonce-{}-{}", std::process::id(), unique());
        Harness::start(transformer_services(transformer, nonce.clone())?, nonce).await
    }

    async fn start(services: Services, nonce: String) -> Result<Harness> {
        let dir = std::env::temp_dir().join(format!(
            "trellis-harness-{}-{}",
            std::process::id(),
            unique()
        ));
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("plugin.sock");
        let listener = UnixListener::bind(&socket)?;
        let mut builder = tonic::transport::Server::builder();
        let (router, _health) = services.router(&mut builder).await;
        let (tx, rx) = oneshot::channel::<()>();
        let incoming = UnixListenerStream::new(listener);
        let server = tokio::spawn(async move {
            let stop = async {
                let _ = rx.await;
            };
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, stop).await {
                tracing::error!("harness server failed: {e}");
            }
        });
        let channel = connect_unix(&socket).await.map_err(|e| {
            PluginError::internal(format!("cannot connect to the harness socket: {e}"))
        })?;
        Ok(Harness {
            dir,
            socket,
            nonce,
            config: Value::Null,
            channel,
            capabilities: services.capabilities(),
            shutdown: Some(tx),
            server: Some(server),
        })
    }

    /// Sets the provider config sent with every call.
    pub fn with_config(mut self, config: impl Into<Value>) -> Harness {
        self.config = config.into();
        self
    }

    /// The socket the plugin listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The nonce the plugin expects in Handshake.
    pub fn nonce(&self) -> &str {
        &self.nonce
    }

    /// The capabilities the plugin declares.
    pub fn capabilities(&self) -> pb::Capabilities {
        self.capabilities
    }

    /// A raw Plugin client on the harness connection.
    pub fn plugin_client(&self) -> PluginClient<Channel> {
        PluginClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// A raw Provider client.
    pub fn provider_client(&self) -> ProviderClient<Channel> {
        ProviderClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// A raw Transformer client.
    pub fn transformer_client(&self) -> TransformerClient<Channel> {
        TransformerClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// The gRPC channel, for other clients (e.g. grpc.health.v1).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// A fresh call context: the harness config, a unique call id
    /// (`harness-call-N`), an idempotency key and no deadline. Edit it and
    /// pass it to the `*_with` methods.
    pub fn call_context(&self) -> pb::CallContext {
        let n = unique();
        pb::CallContext {
            call_id: format!("harness-call-{n}"),
            provider_config: Some(self.config.to_proto()),
            instance_id: "harness-instance".to_owned(),
            idempotency_key: format!("harness-key-{n}"),
            deadline_unix_ms: 0,
            local_assets: Default::default(),
            request_id: String::new(),
        }
    }

    /// A call context whose deadline is `after` from now.
    pub fn call_context_with_deadline(&self, after: Duration) -> pb::CallContext {
        let mut c = self.call_context();
        let at = SystemTime::now() + after;
        c.deadline_unix_ms = at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        c
    }

    /// Handshake with the right nonce and protocol version 1.
    pub async fn handshake(&self) -> Result<pb::HandshakeResponse> {
        self.handshake_with(&self.nonce, vec![PROTOCOL_VERSION])
            .await
            .map_err(transport)
    }

    /// Handshake with any nonce and versions; the gRPC status on refusal.
    pub async fn handshake_with(
        &self,
        nonce: &str,
        versions: Vec<u32>,
    ) -> std::result::Result<pb::HandshakeResponse, tonic::Status> {
        let req = pb::HandshakeRequest {
            nonce: nonce.to_owned(),
            protocol_versions: versions,
            host_address: "unix:/nonexistent/harness-host.sock".to_owned(),
            host_token: "harness-token".to_owned(),
            ..Default::default()
        };
        Ok(self.plugin_client().handshake(req).await?.into_inner())
    }

    pub async fn manifest(&self) -> Result<pb::Manifest> {
        Ok(self
            .plugin_client()
            .get_manifest(pb::GetManifestRequest {})
            .await
            .map_err(transport)?
            .into_inner())
    }

    /// ValidateConfig with the harness config.
    pub async fn validate_config(&self) -> Result<Vec<Diagnostic>> {
        let req = pb::ValidateConfigRequest {
            context: Some(self.call_context()),
        };
        let resp = self
            .provider_client()
            .validate_config(req)
            .await
            .map_err(transport)?;
        Ok(resp
            .into_inner()
            .diagnostics
            .into_iter()
            .map(Diagnostic::from_proto)
            .collect())
    }

    /// ValidateResource.
    pub async fn validate(
        &self,
        resource_type: &str,
        name: &str,
        spec: impl Into<Value>,
    ) -> Result<Vec<Diagnostic>> {
        let req = pb::ValidateResourceRequest {
            context: Some(self.call_context()),
            resource_type: resource_type.to_owned(),
            resource_name: name.to_owned(),
            spec: Some(spec.into().to_proto()),
        };
        let resp = self
            .provider_client()
            .validate_resource(req)
            .await
            .map_err(transport)?;
        Ok(resp
            .into_inner()
            .diagnostics
            .into_iter()
            .map(Diagnostic::from_proto)
            .collect())
    }

    fn require(&self, declared: bool, what: &str, how: &str) -> Result<()> {
        if declared {
            Ok(())
        } else {
            Err(PluginError::internal(format!(
                "harness: the engine would not call {what}: the plugin does not declare the capability ({how})"
            )))
        }
    }

    /// PlanResource (requires Capabilities.plan_resource, as the engine does).
    pub async fn plan(
        &self,
        current: Option<&ResourceState>,
        desired: impl Into<Value>,
    ) -> Result<Plan> {
        self.require(
            self.capabilities.plan_resource,
            "PlanResource",
            "override Resource::supports_plan",
        )?;
        let current = current.map(ResourceState::to_proto);
        let req = pb::PlanResourceRequest {
            context: Some(self.call_context()),
            resource_type: current
                .as_ref()
                .map(|c| c.resource_type.clone())
                .unwrap_or_default(),
            resource_name: current
                .as_ref()
                .map(|c| c.resource_name.clone())
                .unwrap_or_default(),
            current,
            desired_spec: Some(desired.into().to_proto()),
        };
        let r = self
            .provider_client()
            .plan_resource(req)
            .await
            .map_err(transport)?
            .into_inner();
        err_or(
            r.error,
            Plan {
                recreate_paths: r.recreate_paths.into_iter().map(AttrPath::from).collect(),
                planned_state: value(r.planned_state),
                diagnostics: r
                    .diagnostics
                    .into_iter()
                    .map(Diagnostic::from_proto)
                    .collect(),
            },
        )
    }

    /// ApplyResource for a new resource; the state the engine would record.
    pub async fn create(
        &self,
        resource_type: &str,
        name: &str,
        spec: impl Into<Value>,
    ) -> Result<ResourceState> {
        let req = pb::ApplyResourceRequest {
            context: Some(self.call_context()),
            current: None,
            resource_type: resource_type.to_owned(),
            resource_name: name.to_owned(),
            desired_spec: Some(spec.into().to_proto()),
        };
        self.apply_with(req).await?.result
    }

    /// ApplyResource for an existing resource.
    pub async fn update(
        &self,
        current: &ResourceState,
        spec: impl Into<Value>,
    ) -> Result<ResourceState> {
        let req = pb::ApplyResourceRequest {
            context: Some(self.call_context()),
            current: Some(current.to_proto()),
            resource_type: current.resource_type.clone(),
            resource_name: current.name.clone(),
            desired_spec: Some(spec.into().to_proto()),
        };
        self.apply_with(req).await?.result
    }

    /// ApplyResource with a request of your own (set its `context` from
    /// [`Harness::call_context`] to choose the call id or a deadline).
    /// Collects the progress events and the result. `Err` only for transport
    /// failures or a stream without a result.
    pub async fn apply_with(&self, req: pb::ApplyResourceRequest) -> Result<ApplyOutcome> {
        let resource_type = req.resource_type.clone();
        let name = req.resource_name.clone();
        let spec = value(req.desired_spec.clone());
        let mut stream = self
            .provider_client()
            .apply_resource(req)
            .await
            .map_err(transport)?
            .into_inner();
        let mut progress = Vec::new();
        while let Some(ev) = stream.message().await.map_err(transport)? {
            match ev.event {
                Some(pb::apply_resource_event::Event::Progress(p)) => {
                    progress.push((p.message, p.fraction))
                }
                Some(pb::apply_resource_event::Event::Result(r)) => {
                    let result = match r.error {
                        Some(e) => {
                            let mut e = PluginError::from_proto(e);
                            if !r.external_id.is_empty() {
                                e.partial_external_id = Some(r.external_id);
                            }
                            Err(e)
                        }
                        None => Ok(ResourceState {
                            resource_type,
                            name,
                            external_id: r.external_id,
                            spec,
                            state: value(r.state),
                        }),
                    };
                    return Ok(ApplyOutcome { progress, result });
                }
                None => {}
            }
        }
        Err(PluginError::internal(
            "ApplyResource stream ended without a result",
        ))
    }

    /// DestroyResource.
    pub async fn destroy(&self, current: &ResourceState) -> Result<()> {
        let req = pb::DestroyResourceRequest {
            context: Some(self.call_context()),
            current: Some(current.to_proto()),
        };
        let r = self
            .provider_client()
            .destroy_resource(req)
            .await
            .map_err(transport)?
            .into_inner();
        err_or(r.error, ())
    }

    /// ReadResource (requires Capabilities.read_resource); None when gone.
    pub async fn read(&self, current: &ResourceState) -> Result<Option<ReadState>> {
        self.require(
            self.capabilities.read_resource,
            "ReadResource",
            "override Resource::supports_read",
        )?;
        let req = pb::ReadResourceRequest {
            context: Some(self.call_context()),
            current: Some(current.to_proto()),
        };
        let r = self
            .provider_client()
            .read_resource(req)
            .await
            .map_err(transport)?
            .into_inner();
        let found = found(r.exists, r.spec, r.state, r.external_id);
        err_or(r.error, found)
    }

    /// ImportResource (requires Capabilities.import_resource); None when there is no such
    /// resource.
    pub async fn import(
        &self,
        resource_type: &str,
        name: &str,
        external_id: &str,
    ) -> Result<Option<ReadState>> {
        self.require(
            self.capabilities.import_resource,
            "ImportResource",
            "override Resource::supports_import",
        )?;
        let req = pb::ImportResourceRequest {
            context: Some(self.call_context()),
            resource_type: resource_type.to_owned(),
            resource_name: name.to_owned(),
            external_id: external_id.to_owned(),
        };
        let r = self
            .provider_client()
            .import_resource(req)
            .await
            .map_err(transport)?
            .into_inner();
        let found = found(r.exists, r.spec, r.state, r.external_id);
        err_or(r.error, found)
    }

    /// FetchDataSource.
    pub async fn fetch(&self, data_source_type: &str, filters: Vec<Filter>) -> Result<Vec<Value>> {
        self.require(
            self.capabilities.data_sources,
            "FetchDataSource",
            "Provider::data_sources",
        )?;
        let req = pb::FetchDataSourceRequest {
            context: Some(self.call_context()),
            data_source_type: data_source_type.to_owned(),
            filters: filters
                .into_iter()
                .map(|f| pb::Filter {
                    field: f.field,
                    operator: f.operator,
                    search: Some(f.search.into()),
                })
                .collect(),
        };
        let r = self
            .provider_client()
            .fetch_data_source(req)
            .await
            .map_err(transport)?
            .into_inner();
        err_or(r.error, r.items.into_iter().map(Value::from).collect())
    }

    /// CallFunction.
    pub async fn call_function(&self, name: &str, args: Vec<Value>) -> Result<Value> {
        self.require(
            self.capabilities.functions,
            "CallFunction",
            "Provider::functions",
        )?;
        let req = pb::CallFunctionRequest {
            context: Some(self.call_context()),
            name: name.to_owned(),
            args: args.into_iter().map(pb::Value::from).collect(),
        };
        let r = self
            .provider_client()
            .call_function(req)
            .await
            .map_err(transport)?
            .into_inner();
        err_or(r.error, value(r.result))
    }

    /// CustomVariableOptions.
    pub async fn variable_options(&self, variable_type: &str) -> Result<Vec<VariableOption>> {
        self.require(
            self.capabilities.custom_variable_types,
            "CustomVariableOptions",
            "Provider::custom_variable_types",
        )?;
        let req = pb::CustomVariableOptionsRequest {
            context: Some(self.call_context()),
            variable_type: variable_type.to_owned(),
        };
        let r = self
            .provider_client()
            .custom_variable_options(req)
            .await
            .map_err(transport)?
            .into_inner();
        let opts = r
            .options
            .into_iter()
            .map(|o| VariableOption {
                label: o.label,
                value: value(o.value),
                description: o.description,
            })
            .collect();
        err_or(r.error, opts)
    }

    fn link_ctx(&self, link: &LinkRequest) -> Result<pb::LinkContext> {
        self.require(self.capabilities.links, "link RPCs", "Provider::links")?;
        Ok(link.to_proto(self.call_context()))
    }

    /// StageLink.
    pub async fn stage_link(&self, link: &LinkRequest) -> Result<StagedLink> {
        let req = pb::StageLinkRequest {
            link: Some(self.link_ctx(link)?),
        };
        let r = self
            .provider_client()
            .stage_link(req)
            .await
            .map_err(transport)?
            .into_inner();
        let staged = StagedLink {
            owned_paths_a: r.owned_paths_a.into_iter().map(AttrPath::from).collect(),
            owned_paths_b: r.owned_paths_b.into_iter().map(AttrPath::from).collect(),
            diagnostics: r
                .diagnostics
                .into_iter()
                .map(Diagnostic::from_proto)
                .collect(),
        };
        err_or(r.error, staged)
    }

    /// UpdateLinkResourceA; the link data returned.
    pub async fn update_link_resource_a(&self, link: &LinkRequest) -> Result<Value> {
        let req = pb::UpdateLinkResourceRequest {
            link: Some(self.link_ctx(link)?),
        };
        let r = self
            .provider_client()
            .update_link_resource_a(req)
            .await
            .map_err(transport)?
            .into_inner();
        err_or(r.error, value(r.link_data))
    }

    /// UpdateLinkResourceB; the link data returned.
    pub async fn update_link_resource_b(&self, link: &LinkRequest) -> Result<Value> {
        let req = pb::UpdateLinkResourceRequest {
            link: Some(self.link_ctx(link)?),
        };
        let r = self
            .provider_client()
            .update_link_resource_b(req)
            .await
            .map_err(transport)?
            .into_inner();
        err_or(r.error, value(r.link_data))
    }

    /// UpdateLinkIntermediaries.
    pub async fn update_link_intermediaries(
        &self,
        link: &LinkRequest,
    ) -> Result<IntermediariesUpdate> {
        let req = pb::UpdateLinkIntermediariesRequest {
            link: Some(self.link_ctx(link)?),
        };
        let r = self
            .provider_client()
            .update_link_intermediaries(req)
            .await
            .map_err(transport)?
            .into_inner();
        let upd = IntermediariesUpdate {
            link_data: value(r.link_data),
            intermediaries: r
                .intermediaries
                .into_iter()
                .map(ResourceState::from_proto)
                .collect(),
        };
        err_or(r.error, upd)
    }

    /// ReadLinkIntermediaries.
    pub async fn read_link_intermediaries(&self, link: &LinkRequest) -> Result<Vec<ResourceState>> {
        let req = pb::ReadLinkIntermediariesRequest {
            link: Some(self.link_ctx(link)?),
        };
        let r = self
            .provider_client()
            .read_link_intermediaries(req)
            .await
            .map_err(transport)?
            .into_inner();
        err_or(
            r.error,
            r.intermediaries
                .into_iter()
                .map(ResourceState::from_proto)
                .collect(),
        )
    }

    /// Cancel; whether a call with that id was in flight.
    pub async fn cancel(&self, call_id: &str) -> Result<bool> {
        let req = pb::CancelRequest {
            call_id: call_id.to_owned(),
        };
        Ok(self
            .provider_client()
            .cancel(req)
            .await
            .map_err(transport)?
            .into_inner()
            .cancelled)
    }

    /// Transform (transformer plugins).
    pub async fn transform(&self, blueprint: &serde_json::Value) -> Result<Transformed> {
        let req = pb::TransformRequest {
            context: Some(self.call_context()),
            blueprint_json: serde_json::to_string(blueprint)?,
        };
        let r = self
            .transformer_client()
            .transform(req)
            .await
            .map_err(transport)?
            .into_inner();
        if let Some(e) = r.error {
            return Err(PluginError::from_proto(e));
        }
        Ok(Transformed {
            blueprint: serde_json::from_str(&r.blueprint_json)?,
            diagnostics: r
                .diagnostics
                .into_iter()
                .map(Diagnostic::from_proto)
                .collect(),
            derivations: r
                .derivations
                .into_iter()
                .map(|d| Derivation::new(d.generated_resource, d.abstract_resource))
                .collect(),
        })
    }

    /// ValidateAbstractResource (transformer plugins).
    pub async fn validate_abstract(
        &self,
        resource_type: &str,
        name: &str,
        spec: impl Into<Value>,
    ) -> Result<Vec<Diagnostic>> {
        let req = pb::ValidateResourceRequest {
            context: Some(self.call_context()),
            resource_type: resource_type.to_owned(),
            resource_name: name.to_owned(),
            spec: Some(spec.into().to_proto()),
        };
        let r = self
            .transformer_client()
            .validate_abstract_resource(req)
            .await
            .map_err(transport)?;
        Ok(r.into_inner()
            .diagnostics
            .into_iter()
            .map(Diagnostic::from_proto)
            .collect())
    }

    /// Stops the server gracefully (in-flight calls finish) and removes the socket.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

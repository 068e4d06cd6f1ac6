//! The plugin host: discovers provider and transformer plugins, launches
//! them lazily as child processes, speaks the plugin protocol
//! (`proto/trellis/plugin/v1/plugin.proto`) to them over Unix sockets,
//! supervises and restarts them, caches their manifests, serves them the
//! Host service and stops them. docs/plugin-host.md describes the behaviour;
//! this is the API.
//!
//! ```no_run
//! # async fn demo() -> Result<(), trellis_host::PluginError> {
//! use trellis_host::{CallOptions, HostConfig, PluginHost, values};
//! let host = PluginHost::new(HostConfig::with_data_dir(".trellis".as_ref()));
//! let manifest = host.manifest("sim").await?; // cached on disk after the first time
//! let sim = host.provider("sim")?;
//! let v = sim.call_function("echo", vec![values::string("hi")], &CallOptions::default()).await?;
//! host.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Invariants:
//! - No plugin outlives the engine: every child gets `PR_SET_PDEATHSIG`
//!   (SIGKILL) and an stdin pipe the engine holds; shutdown sends SIGTERM,
//!   then SIGKILL after the grace period; dropping the host kills and reaps
//!   whatever is left.
//! - Every child is reaped (no zombies) and its socket directory removed,
//!   whether it exits, crashes or is stopped.
//! - A call to a plugin that dies fails at once with the plugin's name, exit
//!   status and last stderr lines; it is never retried blindly.
//! - Only TRANSIENT application errors are retried, and only as the
//!   plugin's manifest allows.
//! - The Host service answers only requests bearing a token issued to a
//!   live plugin.

use trellis_lang::{eval, functions, redact};

mod client;
mod config;
mod discovery;
mod error;
mod host_service;
mod manifest_cache;
pub mod metrics;
mod plugin_log;
mod process;
mod supervisor;
mod util;
pub mod values;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use trellis_proto::plugin::v1 as pb;

pub use client::{AppResult, CallOptions, ProviderClient, TransformerClient, WithContext};
pub use config::{BreakerPolicy, CallKind, Deadlines, HealthPolicy, HostConfig, RestartPolicy};
pub use discovery::{
    PROVIDER_PREFIX, PluginBinary, PluginKind, TRANSFORMER_PREFIX, discover, parse_file_name,
    search_dirs,
};
pub use error::{AppError, ExitInfo, PluginError};
pub use host_service::{Caller, HOST_TOKEN_METADATA, StateLookup};
pub use process::STDERR_TAIL_LINES;
pub use supervisor::{
    ENV_NONCE, ENV_PROTOCOL_VERSIONS, ENV_SOCKET_DIR, HANDSHAKE_PREFIX, PROTOCOL_VERSIONS,
    PluginStatus, connect as connect_plugin_socket, parse_handshake_line,
};
pub use util::describe_exit;

use supervisor::{Shared, Slot};

/// The plugin host. Cheap to clone (all clones share the same plugins).
/// Call [`PluginHost::shutdown`] before dropping the last clone; dropping it
/// without shutting down kills (SIGKILL) and reaps every plugin.
#[derive(Clone)]
pub struct PluginHost {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    shared: Arc<Shared>,
    searched: Vec<PathBuf>,
    slots: Vec<Arc<Slot>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.shutting_down.store(true, Ordering::Release);
        for p in self.shared.live_processes() {
            p.kill_and_reap_blocking();
        }
        if let Some(h) = self.shared.host_service.get() {
            h.abort();
        }
    }
}

impl PluginHost {
    /// Discovers plugins (see [`discover`]); starts nothing.
    pub fn new(config: HostConfig) -> PluginHost {
        let searched = search_dirs(&config.plugin_dirs, config.search_exe_dir);
        let plugins = discover(&searched);
        for p in &plugins {
            tracing::debug!(kind = %p.kind, plugin = %p.name, path = %p.path.display(), "discovered plugin");
        }
        let inner = Arc::new_cyclic(|weak| {
            let shared = Arc::new(Shared::new(config, weak.clone()));
            let slots = plugins
                .into_iter()
                .map(|b| Arc::new(Slot::new(b, shared.clone())))
                .collect();
            Inner {
                shared,
                searched,
                slots,
            }
        });
        PluginHost { inner }
    }

    pub fn config(&self) -> &HostConfig {
        &self.inner.shared.config
    }

    /// The directories searched, in order.
    pub fn search_dirs(&self) -> &[PathBuf] {
        &self.inner.searched
    }

    /// Where socket directories are created.
    pub fn runtime_dir(&self) -> &std::path::Path {
        &self.inner.shared.runtime_dir
    }

    /// Every discovered plugin, in discovery order.
    pub fn plugins(&self) -> Vec<PluginBinary> {
        self.inner.slots.iter().map(|s| s.binary.clone()).collect()
    }

    fn slot(&self, kind: PluginKind, name: &str) -> Result<&Arc<Slot>, PluginError> {
        self.inner
            .slots
            .iter()
            .find(|s| s.binary.kind == kind && s.binary.name == name)
            .ok_or_else(|| PluginError::NotFound {
                kind,
                name: name.to_owned(),
                searched: self.inner.searched.clone(),
            })
    }

    /// The provider config sent with every call to a provider whose caller gives none (a
    /// plugin calling a function through the host, for one), by namespace. Set once; later
    /// calls are ignored.
    pub fn set_default_configs(&self, configs: HashMap<String, pb::Value>) {
        let _ = self.inner.shared.default_configs.set(configs);
    }

    /// Where the Host service's `LookupResource` reads resources (the engine's state). Set
    /// once; later calls are ignored. Without it, lookups answer `UNAVAILABLE`.
    pub fn set_state_lookup(&self, lookup: Arc<dyn StateLookup>) {
        let _ = self.inner.shared.state_lookup.set(lookup);
    }

    /// The provider for a namespace (not started until first used).
    pub fn provider(&self, namespace: &str) -> Result<ProviderClient, PluginError> {
        Ok(ProviderClient::new(
            self.slot(PluginKind::Provider, namespace)?.clone(),
        ))
    }

    /// The transformer of that name (not started until first used).
    pub fn transformer(&self, name: &str) -> Result<TransformerClient, PluginError> {
        Ok(TransformerClient::new(
            self.slot(PluginKind::Transformer, name)?.clone(),
        ))
    }

    /// Starts the given plugins concurrently (those not running yet).
    pub async fn start(&self, plugins: &[(PluginKind, &str)]) -> Vec<Result<u32, PluginError>> {
        let d = self.config().launch_timeout + Duration::from_secs(1);
        futures_util::future::join_all(plugins.iter().map(|(kind, name)| async move {
            let slot = self.slot(*kind, name)?;
            let deadline = tokio::time::Instant::now() + d;
            Ok(slot.instance(deadline, "start").await?.process.pid)
        }))
        .await
    }

    /// The manifest of a provider (by namespace) or, if there is none of
    /// that name, of a transformer. From memory or the disk cache when the
    /// binary is unchanged; otherwise the plugin is started for GetManifest.
    pub async fn manifest(&self, name: &str) -> Result<Arc<pb::Manifest>, PluginError> {
        match self.slot(PluginKind::Provider, name) {
            Ok(_) => self.manifest_of(PluginKind::Provider, name).await,
            Err(_) => self.manifest_of(PluginKind::Transformer, name).await,
        }
    }

    pub async fn manifest_of(
        &self,
        kind: PluginKind,
        name: &str,
    ) -> Result<Arc<pb::Manifest>, PluginError> {
        let slot = self.slot(kind, name)?;
        let deadline = tokio::time::Instant::now()
            + self.config().launch_timeout
            + self.config().deadlines.manifest;
        slot.manifest(deadline).await
    }

    /// Manifests of several plugins, fetched concurrently (each from the
    /// cache or by starting the plugin), in the order asked.
    pub async fn manifests(
        &self,
        plugins: &[(PluginKind, &str)],
    ) -> Vec<Result<Arc<pb::Manifest>, PluginError>> {
        futures_util::future::join_all(
            plugins
                .iter()
                .map(|(kind, name)| self.manifest_of(*kind, name)),
        )
        .await
    }

    /// The manifests of every discovered provider, in discovery order.
    pub async fn provider_manifests(
        &self,
    ) -> Vec<(String, Result<Arc<pb::Manifest>, PluginError>)> {
        let names: Vec<(PluginKind, &str)> = self
            .inner
            .slots
            .iter()
            .filter(|s| s.binary.kind == PluginKind::Provider)
            .map(|s| (PluginKind::Provider, s.binary.name.as_str()))
            .collect();
        let results = self.manifests(&names).await;
        names
            .iter()
            .map(|(_, n)| (*n).to_owned())
            .zip(results)
            .collect()
    }

    /// The first provider (in discovery order) whose manifest declares the
    /// function.
    pub async fn function_provider(&self, function: &str) -> Option<ProviderClient> {
        for (name, manifest) in self.provider_manifests().await {
            match manifest {
                Ok(m) if m.functions.iter().any(|f| f.name == function) => {
                    return self.provider(&name).ok();
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(plugin = %name, error = %e, "manifest unavailable while looking up function `{function}`")
                }
            }
        }
        None
    }

    /// The state of every discovered plugin.
    /// Forgets the cached manifests of `plugins` (memory and disk), so the next use asks each
    /// plugin again. Whether each had one cached on disk.
    pub fn forget_manifests(&self, plugins: &[(PluginKind, &str)]) -> Vec<Result<bool, String>> {
        plugins
            .iter()
            .map(|(kind, name)| {
                let slot = self.slot(*kind, name).map_err(|e| e.to_string())?;
                slot.forget_manifest();
                match &self.inner.shared.cache {
                    Some(cache) => cache
                        .forget(&slot.binary.path)
                        .map_err(|e| format!("cannot clear the cached manifest of {name}: {e}")),
                    None => Ok(false),
                }
            })
            .collect()
    }

    pub fn status(&self) -> Vec<PluginStatus> {
        self.inner.slots.iter().map(|s| s.status()).collect()
    }

    /// The Host service's socket (starts the service if needed).
    pub async fn host_socket(&self) -> Result<PathBuf, PluginError> {
        match self.inner.shared.host_service().await {
            Ok(h) => Ok(h.socket.clone()),
            Err(e) => Err(PluginError::Io {
                plugin: String::new(),
                context: format!("cannot start the Host service: {e}"),
            }),
        }
    }

    /// Issues a Host service token to an in-process client (a plugin
    /// running inside the engine, or a test). Plugin processes get theirs
    /// at handshake.
    pub fn issue_host_token(&self, identity: &str) -> String {
        let token = trellis_ids::random_hex(32);
        self.inner.shared.auth.register(
            &token,
            Caller {
                plugin: identity.to_owned(),
                instance: self.inner.shared.next_id(),
            },
        );
        token
    }

    pub fn revoke_host_token(&self, token: &str) {
        self.inner.shared.auth.revoke(token);
    }

    /// Stops one plugin (graceful: SIGTERM, then SIGKILL after the grace
    /// period). It starts again on next use.
    pub async fn stop(&self, kind: PluginKind, name: &str) -> Result<(), PluginError> {
        self.slot(kind, name)?.stop().await;
        Ok(())
    }

    /// Graceful shutdown: no new launches; every plugin gets SIGTERM (and
    /// its stdin closed), then SIGKILL after the grace period; every child
    /// is reaped and every socket directory removed, then the Host service
    /// stops.
    pub async fn shutdown(&self) {
        let shared = &self.inner.shared;
        shared.shutting_down.store(true, Ordering::Release);
        futures_util::future::join_all(self.inner.slots.iter().map(|s| s.stop())).await;
        // Launches still in progress.
        for p in shared.live_processes() {
            p.close_stdin();
            p.signal_group(libc::SIGKILL);
            let _ = tokio::time::timeout(Duration::from_secs(5), process::wait_for_exit(&p)).await;
            p.kill_and_reap_blocking();
        }
        if let Some(h) = shared.host_service.get() {
            h.stop().await;
        }
    }
}

//! Per-plugin state: lazy launch, the handshake, the supervisor task of each
//! child, restart backoff and the circuit breaker.
//!
//! A [`Slot`] exists per discovered plugin for the host's lifetime; it holds
//! at most one live [`Instance`] (one process). Launches of one slot are
//! serialised by `launch`; launches of different slots run in parallel.
//! A launch runs in its own task, so a caller that gives up (deadline,
//! cancellation) never leaves a half-started plugin behind: the launch
//! finishes and installs the instance, or fails and cleans up.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tokio::io::BufReader;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint, Uri};
use trellis_proto::plugin::v1 as pb;
use trellis_proto::plugin::v1::plugin_client::PluginClient;

use super::config::{HealthPolicy, HostConfig};
use super::discovery::PluginBinary;
use super::error::{ExitInfo, PluginError};
use super::host_service::{AuthRegistry, Caller, HostServiceHandle, LockTable};
use super::manifest_cache::{Fingerprint, ManifestCache};
use super::metrics;
use super::process::{self, MAX_LINE_BYTES, Process, lock};
use super::util::{describe_exit, read_line_bounded};
use trellis_ids::random_hex;

pub const ENV_NONCE: &str = "TRELLIS_PLUGIN_NONCE";
pub const ENV_PROTOCOL_VERSIONS: &str = "TRELLIS_PLUGIN_PROTOCOL_VERSIONS";
pub const ENV_SOCKET_DIR: &str = "TRELLIS_PLUGIN_SOCKET_DIR";
pub const HANDSHAKE_PREFIX: &str = "TRELLIS_PLUGIN|";
/// Protocol versions this engine speaks.
pub const PROTOCOL_VERSIONS: &[u32] = &[1];

/// What every slot shares: configuration, the Host service, tokens, locks.
pub(crate) struct Shared {
    pub config: HostConfig,
    pub runtime_dir: PathBuf,
    pub cache: Option<ManifestCache>,
    pub auth: Arc<AuthRegistry>,
    pub locks: Arc<LockTable>,
    pub shutting_down: AtomicBool,
    pub host_service: tokio::sync::OnceCell<HostServiceHandle>,
    /// For the Host service, which routes CallFunction to other plugins.
    pub inner: Weak<super::Inner>,
    /// Every process not yet cleaned up, for the last-resort kill on drop.
    processes: Mutex<HashMap<u64, Weak<Process>>>,
    next_instance: AtomicU64,
    /// The provider config a call to a provider carries when its caller gives none (the
    /// engine's own settings), by namespace; set once.
    pub default_configs: std::sync::OnceLock<HashMap<String, pb::Value>>,
    /// Which instances each plugin process serves a call for (scopes `LookupResource`).
    pub serving: Arc<super::host_service::Serving>,
    /// Where `LookupResource` reads; set once by the engine.
    pub state_lookup: std::sync::OnceLock<Arc<dyn super::host_service::StateLookup>>,
}

impl Shared {
    pub(crate) fn new(config: HostConfig, inner: Weak<super::Inner>) -> Shared {
        let runtime_dir = process::resolve_runtime_dir(config.runtime_dir.as_deref());
        let cache = config.cache_dir.clone().map(ManifestCache::new);
        Shared {
            config,
            runtime_dir,
            cache,
            auth: Arc::new(AuthRegistry::default()),
            locks: Arc::new(LockTable::default()),
            shutting_down: AtomicBool::new(false),
            host_service: tokio::sync::OnceCell::new(),
            inner,
            processes: Mutex::new(HashMap::new()),
            next_instance: AtomicU64::new(1),
            default_configs: std::sync::OnceLock::new(),
            serving: Arc::default(),
            state_lookup: std::sync::OnceLock::new(),
        }
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_instance.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Processes still registered (launching, running or exiting).
    pub(crate) fn live_processes(&self) -> Vec<Arc<Process>> {
        lock(&self.processes)
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }

    pub(crate) async fn host_service(
        self: &Arc<Self>,
    ) -> Result<&HostServiceHandle, std::io::Error> {
        self.host_service
            .get_or_try_init(|| super::host_service::start(self.clone()))
            .await
    }
}

const LAUNCHING: u8 = 0;
const LIVE: u8 = 1;
const STOPPING: u8 = 2;
const FAILED: u8 = 3;

/// One running plugin process, connected and handshaken.
pub(crate) struct Instance {
    pub id: u64,
    pub name: String,
    pub process: Arc<Process>,
    pub channel: Channel,
    pub info: pb::PluginInfo,
    pub capabilities: pb::Capabilities,
    pub exit: watch::Receiver<Option<Arc<ExitInfo>>>,
    pub started: Instant,
    phase: Arc<AtomicU8>,
}

impl Instance {
    pub(crate) fn is_alive(&self) -> bool {
        self.exit.borrow().is_none()
    }

    /// Waits until the process has exited and been cleaned up.
    pub(crate) async fn exited(&self) -> Arc<ExitInfo> {
        wait_exit(&self.exit, self.process.pid).await
    }

    /// Graceful stop: close stdin, SIGTERM, wait up to `grace`, then SIGKILL
    /// the process group; returns once the child is reaped.
    pub(crate) async fn terminate(&self, grace: Duration) {
        self.phase.store(STOPPING, Ordering::Release);
        self.process.close_stdin();
        self.process.signal(libc::SIGTERM);
        let graceful = tokio::time::timeout(grace, exit_signal(&self.exit)).await;
        if graceful.is_err() {
            tracing::warn!(
                plugin = %self.name,
                pid = self.process.pid,
                "plugin did not exit within {:.1}s of SIGTERM; sending SIGKILL",
                grace.as_secs_f64()
            );
            self.process.signal_group(libc::SIGKILL);
            let _ = tokio::time::timeout(Duration::from_secs(5), exit_signal(&self.exit)).await;
        }
    }
}

/// Resolves once the exit has been published (or the supervisor is gone).
pub(crate) async fn exit_signal(rx: &watch::Receiver<Option<Arc<ExitInfo>>>) {
    let mut rx = rx.clone();
    let _ = rx.wait_for(Option::is_some).await;
}

pub(crate) async fn wait_exit(
    rx: &watch::Receiver<Option<Arc<ExitInfo>>>,
    pid: u32,
) -> Arc<ExitInfo> {
    let mut rx = rx.clone();
    match rx.wait_for(Option::is_some).await {
        Ok(v) => v.clone().unwrap_or_else(|| unknown_exit(pid)),
        Err(_) => unknown_exit(pid),
    }
}

fn unknown_exit(pid: u32) -> Arc<ExitInfo> {
    Arc::new(ExitInfo {
        pid,
        status: "exited (status unknown: supervisor stopped)".into(),
        code: None,
        signal: None,
        stderr_tail: Vec::new(),
        expected: false,
    })
}

#[derive(Default)]
struct Health {
    /// Failures (crashes and failed launches) inside the breaker window.
    failures: VecDeque<Instant>,
    consecutive: u32,
    last_failure: Option<Instant>,
    last_error: String,
    open_until: Option<Instant>,
    half_open: bool,
    launches: u64,
    crashes: u64,
    last_exit: Option<String>,
    /// When a launch waiting out its backoff will start (callers queued behind it whose
    /// deadline comes first fail at once instead of waiting for nothing).
    next_start: Option<Instant>,
}

/// What [`super::PluginHost::status`] reports per plugin.
#[derive(Clone, Debug)]
pub struct PluginStatus {
    pub binary: PluginBinary,
    /// The pid of the running process.
    pub pid: Option<u32>,
    /// How long the running process has been up.
    pub uptime: Option<Duration>,
    /// Successful launches so far.
    pub launches: u64,
    /// Unexpected exits of a running plugin.
    pub crashes: u64,
    /// Failures inside the breaker window.
    pub recent_failures: usize,
    pub breaker_open: bool,
    pub last_error: Option<String>,
    /// How the last process ended (`exit code 0`, `killed by signal 9
    /// (SIGKILL)`): shows whether a stop was graceful.
    pub last_exit: Option<String>,
}

pub(crate) struct Slot {
    pub binary: PluginBinary,
    pub shared: Arc<Shared>,
    current: Mutex<Option<Arc<Instance>>>,
    launch: Arc<tokio::sync::Mutex<()>>,
    health: Mutex<Health>,
    manifest: Mutex<Option<(Fingerprint, Arc<pb::Manifest>)>>,
}

impl Slot {
    pub(crate) fn new(binary: PluginBinary, shared: Arc<Shared>) -> Slot {
        Slot {
            binary,
            shared,
            current: Mutex::new(None),
            launch: Arc::new(tokio::sync::Mutex::new(())),
            health: Mutex::new(Health::default()),
            manifest: Mutex::new(None),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.binary.name
    }

    /// `ty` as a metrics label: kept when the plugin's manifest (in memory) declares it, else
    /// `other`, so no request can grow the set of labels; empty for a call about no resource.
    pub(crate) fn type_label(&self, ty: &str) -> String {
        if ty.is_empty() {
            return String::new();
        }
        let declared = lock(&self.manifest).as_ref().is_some_and(|(_, m)| {
            m.resource_types
                .iter()
                .chain(&m.abstract_resource_types)
                .any(|d| d.r#type == ty)
        });
        if declared { ty } else { "other" }.to_owned()
    }

    /// The live instance, if any (never launches).
    pub(crate) fn live(&self) -> Option<Arc<Instance>> {
        lock(&self.current)
            .as_ref()
            .filter(|i| i.is_alive())
            .cloned()
    }

    pub(crate) fn status(&self) -> PluginStatus {
        let live = self.live();
        let pid = live.as_ref().map(|i| i.process.pid);
        let uptime = live.as_ref().map(|i| i.started.elapsed());
        let h = lock(&self.health);
        let now = Instant::now();
        let window = self.shared.config.breaker.window;
        PluginStatus {
            binary: self.binary.clone(),
            pid,
            uptime,
            launches: h.launches,
            crashes: h.crashes,
            recent_failures: h
                .failures
                .iter()
                .filter(|t| now.duration_since(**t) <= window)
                .count(),
            breaker_open: h.open_until.is_some_and(|u| u > now),
            last_error: (!h.last_error.is_empty()).then(|| h.last_error.clone()),
            last_exit: h.last_exit.clone(),
        }
    }

    /// The running instance, launching it if needed (waiting out a restart
    /// backoff, failing fast while the breaker is open). Gives up at
    /// `deadline`; a launch in progress then continues in the background.
    pub(crate) async fn instance(
        self: &Arc<Self>,
        deadline: tokio::time::Instant,
        call: &str,
    ) -> Result<Arc<Instance>, PluginError> {
        if let Some(i) = self.live() {
            return Ok(i);
        }
        // The budget this wait had, for the message: measured at the end it would read 0 s.
        let budget = deadline.saturating_duration_since(tokio::time::Instant::now());
        let deadline_exceeded = || {
            // Waiting behind a restart of a failing plugin: say so, with its last failure.
            self.restarting(None)
                .unwrap_or_else(|| PluginError::DeadlineExceeded {
                    plugin: self.binary.name.clone(),
                    call: format!("{call} (waiting for the plugin to start)"),
                    deadline: budget,
                })
        };
        if self.shared.is_shutting_down() {
            return Err(PluginError::ShutDown {
                plugin: self.binary.name.clone(),
            });
        }
        // A launch is waiting out its backoff (or the breaker is open) past this caller's
        // deadline: fail now rather than queue for the launch lock until the deadline.
        if let Some(e) = self.restarting(Some(deadline.into_std())) {
            return Err(e);
        }
        let guard = tokio::time::timeout_at(deadline, self.launch.clone().lock_owned())
            .await
            .map_err(|_| deadline_exceeded())?;
        if let Some(i) = self.live() {
            return Ok(i);
        }
        let wait = self.admit(deadline.into_std())?;
        let slot = self.clone();
        let task = tokio::spawn(async move {
            let _guard = guard;
            if !wait.is_zero() {
                tracing::info!(
                    plugin = %slot.binary.name,
                    "restarting in {:.1}s (backoff)",
                    wait.as_secs_f64()
                );
                tokio::time::sleep(wait).await;
            }
            lock(&slot.health).next_start = None;
            slot.launch_and_install().await
        });
        match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(PluginError::Io {
                plugin: self.binary.name.clone(),
                context: format!("launch task failed: {e}"),
            }),
            Err(_) => Err(deadline_exceeded()),
        }
    }

    /// The breaker's refusal, open for `retry_in` more.
    fn circuit_open(&self, h: &Health, retry_in: Duration) -> PluginError {
        PluginError::CircuitOpen {
            plugin: self.binary.name.clone(),
            crashes: h.failures.len().max(h.consecutive as usize),
            window: self.shared.config.breaker.window,
            retry_in,
            last_error: h.last_error.clone(),
        }
    }

    /// Why a caller should not wait for a launch, if the plugin is failing: the breaker is
    /// open, or (given the caller's `deadline`) a launch is scheduled after it. Without a
    /// deadline (the caller's has passed), any launch still waiting out its backoff.
    fn restarting(&self, deadline: Option<Instant>) -> Option<PluginError> {
        let h = lock(&self.health);
        let now = Instant::now();
        if let Some(until) = h.open_until.filter(|u| *u > now) {
            return Some(self.circuit_open(&h, until - now));
        }
        let failing = match (deadline, h.next_start) {
            (Some(deadline), Some(at)) => at > deadline,
            (Some(_), None) => false,
            (None, at) => at.is_some(),
        };
        failing.then(|| PluginError::Restarting {
            plugin: self.binary.name.clone(),
            retry_in: h
                .next_start
                .map_or(Duration::ZERO, |at| at.saturating_duration_since(now)),
            last_error: h.last_error.clone(),
        })
    }

    /// Breaker and backoff: how long to wait before the next launch, or why
    /// not to launch now.
    fn admit(&self, deadline: Instant) -> Result<Duration, PluginError> {
        let cfg = &self.shared.config;
        let mut h = lock(&self.health);
        let now = Instant::now();
        if let Some(until) = h.open_until {
            if now < until {
                return Err(self.circuit_open(&h, until - now));
            }
            // Half-open: one launch may try.
            h.open_until = None;
            h.half_open = true;
            metrics::breaker(&self.binary.name, metrics::Breaker::HalfOpen);
            tracing::info!(plugin = %self.binary.name, "circuit breaker half-open: trying one start");
            return Ok(Duration::ZERO);
        }
        let Some(last) = h.last_failure else {
            return Ok(Duration::ZERO);
        };
        let ready_at = last + cfg.restart.backoff(h.consecutive);
        if ready_at <= now {
            return Ok(Duration::ZERO);
        }
        if ready_at > deadline {
            return Err(PluginError::Restarting {
                plugin: self.binary.name.clone(),
                retry_in: ready_at - now,
                last_error: h.last_error.clone(),
            });
        }
        h.next_start = Some(ready_at);
        Ok(ready_at - now)
    }

    fn record_failure(&self, message: &str, uptime: Option<Duration>) {
        let cfg = &self.shared.config;
        let mut h = lock(&self.health);
        let now = Instant::now();
        h.failures.push_back(now);
        while h
            .failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > cfg.breaker.window)
        {
            h.failures.pop_front();
        }
        h.consecutive = match uptime {
            Some(u) if u >= cfg.restart.reset_after => 1,
            _ => h.consecutive.saturating_add(1),
        };
        h.last_failure = Some(now);
        h.last_error = message.to_owned();
        // Consecutive failures count too: the restart backoff grows (to 30 s by default), and
        // failures spaced by it would never fill the window, leaving a crash loop to stall
        // every caller behind ever longer backoffs instead of failing fast.
        if h.half_open
            || h.failures.len() >= cfg.breaker.max_failures
            || h.consecutive as usize >= cfg.breaker.max_failures
        {
            h.half_open = false;
            h.open_until = Some(now + cfg.breaker.cooldown);
            metrics::breaker(&self.binary.name, metrics::Breaker::Open);
            tracing::error!(
                plugin = %self.binary.name,
                failures = h.failures.len(),
                "circuit breaker open for {:.1}s after repeated failures; last: {message}",
                cfg.breaker.cooldown.as_secs_f64()
            );
        }
    }

    async fn launch_and_install(self: &Arc<Self>) -> Result<Arc<Instance>, PluginError> {
        match launch(self).await {
            Ok(inst) => {
                if self.shared.is_shutting_down() {
                    inst.terminate(self.shared.config.shutdown_grace).await;
                    return Err(PluginError::ShutDown {
                        plugin: self.binary.name.clone(),
                    });
                }
                {
                    let mut h = lock(&self.health);
                    h.launches += 1;
                    metrics::started(&self.binary.name, h.launches);
                    if h.half_open {
                        h.half_open = false;
                        h.failures.clear();
                        metrics::breaker(&self.binary.name, metrics::Breaker::Closed);
                        tracing::info!(plugin = %self.binary.name, "circuit breaker closed");
                    }
                }
                *lock(&self.current) = Some(inst.clone());
                Ok(inst)
            }
            Err(e) => {
                if !matches!(e, PluginError::ShutDown { .. }) {
                    self.record_failure(&e.to_string(), None);
                }
                Err(e)
            }
        }
    }

    /// Called by the supervisor task when an instance's process is gone.
    fn on_exit(&self, inst_id: u64, info: &ExitInfo, uptime: Duration, was_live: bool) {
        {
            let mut cur = lock(&self.current);
            if cur.as_ref().is_some_and(|i| i.id == inst_id) {
                *cur = None;
            }
        }
        lock(&self.health).last_exit = Some(info.status.clone());
        if was_live && !info.expected {
            lock(&self.health).crashes += 1;
            metrics::crashed(&self.binary.name);
            let mut msg = format!("pid {} exited unexpectedly: {}", info.pid, info.status);
            if let Some(last) = info.stderr_tail.last() {
                msg.push_str(&format!(" (last stderr line: {last})"));
            }
            self.record_failure(&msg, Some(uptime));
        }
    }

    /// Stops the running instance, if any.
    pub(crate) async fn stop(&self) {
        let inst = lock(&self.current).take();
        if let Some(inst) = inst {
            inst.terminate(self.shared.config.shutdown_grace).await;
        }
    }

    /// Forgets the manifest held in memory (see `PluginHost::forget_manifests`).
    pub(crate) fn forget_manifest(&self) {
        *lock(&self.manifest) = None;
    }

    /// The manifest: from memory, else from the disk cache (keyed by the
    /// binary's SHA-256), else from GetManifest on a (launched) instance.
    pub(crate) async fn manifest(
        self: &Arc<Self>,
        deadline: tokio::time::Instant,
    ) -> Result<Arc<pb::Manifest>, PluginError> {
        let path = self.binary.path.clone();
        let fp = Fingerprint::of(&path).ok();
        if let (Some(fp), Some((cached_fp, m))) = (&fp, lock(&self.manifest).as_ref())
            && fp == cached_fp
        {
            return Ok(m.clone());
        }
        let hashed = match &self.shared.cache {
            Some(cache) => {
                let cache = cache.clone();
                let p = path.clone();
                tokio::task::spawn_blocking(move || cache.binary_hash(&p))
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
            None => None,
        };
        if let (Some(cache), Some((fp, sha))) = (&self.shared.cache, &hashed)
            && let Some(m) = cache.load(sha, &self.binary)
        {
            tracing::debug!(plugin = %self.binary.name, sha = %sha, "manifest from cache");
            let m = Arc::new(m);
            *lock(&self.manifest) = Some((fp.clone(), m.clone()));
            return Ok(m);
        }
        let inst = self.instance(deadline, "GetManifest").await?;
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let mut client = PluginClient::new(inst.channel.clone())
            .max_decoding_message_size(self.shared.config.max_message_bytes);
        let mut req = tonic::Request::new(pb::GetManifestRequest {});
        req.set_timeout(remaining);
        let res = tokio::select! {
            biased;
            r = tokio::time::timeout(remaining, client.get_manifest(req)) => r,
            info = inst.exited() => {
                return Err(PluginError::Crashed {
                    plugin: self.binary.name.clone(),
                    call: "GetManifest".into(),
                    exit: Box::new((*info).clone()),
                });
            }
        };
        let manifest = match res {
            Err(_) => {
                return Err(PluginError::DeadlineExceeded {
                    plugin: self.binary.name.clone(),
                    call: "GetManifest".into(),
                    deadline: remaining,
                });
            }
            Ok(Err(status)) => {
                return Err(PluginError::Transport {
                    plugin: self.binary.name.clone(),
                    call: "GetManifest".into(),
                    code: status.code(),
                    message: status.message().to_owned(),
                });
            }
            Ok(Ok(resp)) => resp.into_inner(),
        };
        let matches = manifest.plugin.as_ref().is_some_and(|p| {
            p.name == self.binary.name && p.kind == self.binary.kind.to_proto() as i32
        });
        if !matches {
            return Err(PluginError::Protocol {
                plugin: self.binary.name.clone(),
                call: "GetManifest".into(),
                message: format!(
                    "the manifest names {:?}, expected {} `{}`",
                    manifest.plugin, self.binary.kind, self.binary.name
                ),
            });
        }
        if let (Some(cache), Some((_, sha))) = (&self.shared.cache, &hashed) {
            let cache = cache.clone();
            let sha = sha.clone();
            let m = manifest.clone();
            let name = self.binary.name.clone();
            // Awaited: a short-lived command (`trellis plugins list`) exits right after, and a
            // write still queued then would be lost, so the next command launches the plugin.
            let _ = tokio::task::spawn_blocking(move || {
                if let Err(e) = cache.store(&sha, &m) {
                    tracing::warn!(plugin = %name, error = %e, "cannot write the manifest cache");
                }
            })
            .await;
        }
        let m = Arc::new(manifest);
        if let Some(fp) = fp {
            *lock(&self.manifest) = Some((fp, m.clone()));
        }
        Ok(m)
    }
}

fn launch_error(
    bin: &PluginBinary,
    reason: impl Into<String>,
    exit: Option<&ExitInfo>,
    tail: Vec<String>,
) -> PluginError {
    PluginError::Launch {
        plugin: bin.name.clone(),
        path: bin.path.clone(),
        reason: reason.into(),
        exit: exit.map(|e| e.status.clone()),
        stderr_tail: tail,
    }
}

/// Starts the plugin process and completes the handshake.
async fn launch(slot: &Arc<Slot>) -> Result<Arc<Instance>, PluginError> {
    let shared = &slot.shared;
    let bin = &slot.binary;
    let io_err = |context: String| PluginError::Io {
        plugin: bin.name.clone(),
        context,
    };
    let host = shared
        .host_service()
        .await
        .map_err(|e| io_err(format!("cannot start the Host service: {e}")))?;
    let host_address = format!("unix:{}", host.socket.display());
    let dir = process::fresh_private_dir(&shared.runtime_dir, "p").map_err(|e| {
        io_err(format!(
            "cannot create a socket directory in {}: {e}",
            shared.runtime_dir.display()
        ))
    })?;
    let nonce = random_hex(16);
    let token = random_hex(32);
    let versions: Vec<String> = PROTOCOL_VERSIONS.iter().map(u32::to_string).collect();
    let versions = versions.join(",");
    let dir_str = dir.to_string_lossy().into_owned();
    tracing::debug!(plugin = %bin.name, path = %bin.path.display(), "launching plugin");
    let child = match process::spawn(
        &bin.path,
        &[
            (ENV_NONCE, &nonce),
            (ENV_PROTOCOL_VERSIONS, &versions),
            (ENV_SOCKET_DIR, &dir_str),
        ],
    )
    .await
    {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(launch_error(
                bin,
                format!("cannot execute: {e}"),
                None,
                Vec::new(),
            ));
        }
    };
    let started = Instant::now();
    let proc = Arc::new(Process::new(child, dir.clone()));
    let id = shared.next_id();
    lock(&shared.processes).insert(id, Arc::downgrade(&proc));
    let (stdout, stderr) = proc.take_pipes();

    let (stderr_done_tx, stderr_done_rx) = tokio::sync::oneshot::channel();
    if let Some(stderr) = stderr {
        tokio::spawn(read_stderr(
            bin.name.clone(),
            proc.clone(),
            stderr,
            stderr_done_tx,
        ));
    }
    let (exit_tx, exit_rx) = watch::channel(None);
    let phase = Arc::new(AtomicU8::new(LAUNCHING));
    shared.auth.register(
        &token,
        Caller {
            plugin: bin.name.clone(),
            instance: id,
        },
    );
    tokio::spawn(supervise(Supervised {
        proc: proc.clone(),
        exit_tx,
        stderr_done: stderr_done_rx,
        slot: Arc::downgrade(slot),
        shared: shared.clone(),
        id,
        token: token.clone(),
        phase: phase.clone(),
        started,
    }));

    let handshake = handshake(
        slot,
        stdout,
        &exit_rx,
        &dir,
        pb::HandshakeRequest {
            nonce,
            protocol_versions: PROTOCOL_VERSIONS.to_vec(),
            host_address,
            host_token: token,
            // What this engine does of the optional parts (docs/plugin-protocol.md).
            engine_capabilities: Some(pb::EngineCapabilities {
                plan_resource: true,
                apply_progress: true,
                lookup_resource: true,
                host_locks: true,
                host_functions: true,
                cancel: true,
            }),
        },
    );
    let result = match tokio::time::timeout(shared.config.launch_timeout, handshake).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "no handshake within {:.1}s",
            shared.config.launch_timeout.as_secs_f64()
        )),
    };
    match result {
        Ok((channel, resp, stdout)) => {
            phase.store(LIVE, Ordering::Release);
            if let Some(stdout) = stdout {
                tokio::spawn(log_stdout(bin.name.clone(), stdout));
            }
            if let Some(policy) = shared.config.health.clone() {
                tokio::spawn(health_checks(
                    bin.name.clone(),
                    proc.clone(),
                    channel.clone(),
                    exit_rx.clone(),
                    policy,
                ));
            }
            let info = resp.plugin.unwrap_or_default();
            tracing::info!(
                plugin = %bin.name,
                pid = proc.pid,
                version = %info.version,
                "plugin started in {:.1} ms",
                started.elapsed().as_secs_f64() * 1e3
            );
            Ok(Arc::new(Instance {
                id,
                name: bin.name.clone(),
                process: proc,
                channel,
                info,
                capabilities: resp.capabilities.unwrap_or_default(),
                exit: exit_rx,
                started: Instant::now(),
                phase,
            }))
        }
        Err(reason) => {
            // Exited on its own, or still running (then we end it).
            let exited_first = exit_rx.borrow().clone();
            phase.store(FAILED, Ordering::Release);
            proc.close_stdin();
            proc.signal_group(libc::SIGKILL);
            let _ = tokio::time::timeout(Duration::from_secs(5), exit_signal(&exit_rx)).await;
            let tail = exit_rx
                .borrow()
                .as_ref()
                .map(|e| e.stderr_tail.clone())
                .unwrap_or_else(|| proc.tail.snapshot());
            Err(launch_error(bin, reason, exited_first.as_deref(), tail))
        }
    }
}

type StdoutReader = BufReader<tokio::process::ChildStdout>;

/// Reads the handshake line, connects, calls Handshake and checks the answer.
async fn handshake(
    slot: &Slot,
    stdout: Option<std::process::ChildStdout>,
    exit: &watch::Receiver<Option<Arc<ExitInfo>>>,
    dir: &Path,
    request: pb::HandshakeRequest,
) -> Result<(Channel, pb::HandshakeResponse, Option<StdoutReader>), String> {
    let bin = &slot.binary;
    let exited = |what: &str| format!("exited {what}");
    let stdout = stdout.ok_or("stdout is not a pipe")?;
    let stdout = tokio::process::ChildStdout::from_std(stdout)
        .map_err(|e| format!("cannot read stdout: {e}"))?;
    let mut reader = BufReader::new(stdout);
    let address = loop {
        let line = tokio::select! {
            line = read_line_bounded(&mut reader, MAX_LINE_BYTES) => line,
            _ = exit_signal(exit) => return Err(exited("before printing the handshake line")),
        };
        match line {
            Ok(Some(line)) => {
                if let Some(rest) = line.strip_prefix(HANDSHAKE_PREFIX) {
                    break parse_handshake_line(rest, dir)?;
                }
                tracing::info!(target: "trellis::plugin", plugin = %bin.name, stream = "stdout", "{line}");
            }
            Ok(None) => {
                // stdout closed: wait briefly for the exit status.
                let _ = tokio::time::timeout(Duration::from_millis(500), exit_signal(exit)).await;
                return Err(if exit.borrow().is_some() {
                    exited("before printing the handshake line")
                } else {
                    "closed stdout before printing the handshake line".into()
                });
            }
            Err(e) => return Err(format!("cannot read stdout: {e}")),
        }
    };

    let channel = tokio::select! {
        c = connect(address.clone()) => c.map_err(|e| format!("cannot connect to {}: {e}", address.display()))?,
        _ = exit_signal(exit) => return Err(exited("before accepting the connection")),
    };
    let mut client = PluginClient::new(channel.clone());
    let resp = tokio::select! {
        r = client.handshake(request) => r.map_err(|s| format!("Handshake failed: {:?}: {}", s.code(), s.message()))?,
        _ = exit_signal(exit) => return Err(exited("during Handshake")),
    }
    .into_inner();
    if !PROTOCOL_VERSIONS.contains(&resp.protocol_version) {
        return Err(format!(
            "Handshake chose protocol version {}, the engine speaks {PROTOCOL_VERSIONS:?}",
            resp.protocol_version
        ));
    }
    let Some(info) = &resp.plugin else {
        return Err("Handshake response has no plugin info".into());
    };
    if info.kind != bin.kind.to_proto() as i32 {
        return Err(format!(
            "Handshake says kind {:?}, but the file name says {}",
            pb::PluginKind::try_from(info.kind).unwrap_or(pb::PluginKind::Unspecified),
            bin.kind
        ));
    }
    if info.name != bin.name {
        return Err(format!(
            "Handshake says name `{}`, but the file name says `{}`",
            info.name, bin.name
        ));
    }
    Ok((channel, resp, Some(reader)))
}

/// The socket path of a handshake line (after `TRELLIS_PLUGIN|`), which must lie in `dir`.
pub fn parse_handshake_line(rest: &str, dir: &Path) -> Result<PathBuf, String> {
    let mut parts = rest.splitn(3, '|');
    let (Some(version), Some(network), Some(address)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(format!(
            "malformed handshake line `{HANDSHAKE_PREFIX}{rest}` (expected `TRELLIS_PLUGIN|1|unix|/path`)"
        ));
    };
    let version_ok = version
        .parse::<u32>()
        .is_ok_and(|v| PROTOCOL_VERSIONS.contains(&v));
    if !version_ok {
        return Err(format!(
            "handshake line announces protocol version `{version}`, the engine speaks {PROTOCOL_VERSIONS:?}"
        ));
    }
    if network != "unix" {
        return Err(format!(
            "handshake line announces network `{network}`; only `unix` is supported"
        ));
    }
    let path = PathBuf::from(address.trim());
    if !path.is_absolute() || !path.starts_with(dir) {
        return Err(format!(
            "handshake address `{address}` is not inside the socket directory {}",
            dir.display()
        ));
    }
    Ok(path)
}

/// A gRPC channel over the Unix socket at `path`.
/// A gRPC channel to a plugin's Unix socket.
pub async fn connect(path: PathBuf) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_static("http://trellis-plugin.invalid")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
}

struct Supervised {
    proc: Arc<Process>,
    exit_tx: watch::Sender<Option<Arc<ExitInfo>>>,
    stderr_done: tokio::sync::oneshot::Receiver<()>,
    slot: Weak<Slot>,
    shared: Arc<Shared>,
    id: u64,
    token: String,
    phase: Arc<AtomicU8>,
    started: Instant,
}

/// The task watching one child: on exit it reaps it, fails in-flight calls
/// (through the exit watch), revokes its token and locks, removes its socket
/// directory, and tells the slot.
async fn supervise(s: Supervised) {
    let Supervised {
        proc,
        exit_tx,
        mut stderr_done,
        slot,
        shared,
        id,
        token,
        phase,
        started,
    } = s;
    process::wait_for_exit(&proc).await;
    let status = proc.reap_exited();
    // Let the stderr reader drain what the plugin wrote before dying.
    let _ = tokio::time::timeout(Duration::from_millis(250), &mut stderr_done).await;
    let phase_now = phase.load(Ordering::Acquire);
    let was_live = phase_now == LIVE;
    let expected = phase_now == STOPPING || shared.is_shutting_down();
    use std::os::unix::process::ExitStatusExt;
    let info = Arc::new(ExitInfo {
        pid: proc.pid,
        status: {
            let s = status.map_or_else(|| "exited (status unknown)".to_owned(), describe_exit);
            match proc.kill_reason() {
                Some(why) => format!("{s}, killed by the engine: {why}"),
                None => s,
            }
        },
        code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        stderr_tail: proc.tail.snapshot(),
        expected,
    });
    // Clean up first, then publish: whoever waits for the exit (shutdown,
    // failed calls) finds the socket directory, token and locks gone.
    shared.auth.revoke(&token);
    shared.locks.release_owner(id);
    proc.remove_socket_dir();
    lock(&shared.processes).remove(&id);
    // The slot's record (current instance, crash count, last exit) too, so
    // a status read right after the exit is published shows it.
    let slot = slot.upgrade();
    if let Some(slot) = &slot {
        slot.on_exit(id, &info, started.elapsed(), was_live);
    }
    exit_tx.send_replace(Some(info.clone()));
    let name = slot
        .as_ref()
        .map(|s| s.binary.name.clone())
        .unwrap_or_default();
    if was_live && !expected {
        tracing::error!(
            plugin = %name,
            pid = proc.pid,
            status = %info.status,
            "plugin exited unexpectedly; it restarts on next use"
        );
    } else {
        tracing::debug!(plugin = %name, pid = proc.pid, status = %info.status, "plugin exited");
    }
}

/// Liveness checks of a running plugin (see [`HealthPolicy`]). Ends when
/// the process exits.
async fn health_checks(
    plugin: String,
    proc: Arc<Process>,
    channel: Channel,
    exit: watch::Receiver<Option<Arc<ExitInfo>>>,
    policy: HealthPolicy,
) {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let mut client = HealthClient::new(channel);
    let mut failures = 0u32;
    loop {
        tokio::select! {
            _ = exit_signal(&exit) => return,
            _ = tokio::time::sleep(policy.interval) => {}
        }
        let mut req = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        req.set_timeout(policy.timeout);
        let answer = tokio::select! {
            _ = exit_signal(&exit) => return,
            r = tokio::time::timeout(policy.timeout, client.check(req)) => r,
        };
        // Any answer proves the plugin responsive, except NOT_SERVING (a
        // plugin without the Health service answers UNIMPLEMENTED: alive).
        let problem = match answer {
            Err(_) => Some(format!(
                "no answer within {:.1}s",
                policy.timeout.as_secs_f64()
            )),
            Ok(Ok(r)) if r.get_ref().status == ServingStatus::NotServing as i32 => {
                Some("NOT_SERVING".to_owned())
            }
            Ok(Err(s))
                if matches!(
                    s.code(),
                    tonic::Code::DeadlineExceeded
                        | tonic::Code::Cancelled
                        | tonic::Code::Unavailable
                ) =>
            {
                Some(format!("{:?}: {}", s.code(), s.message()))
            }
            Ok(_) => None,
        };
        match problem {
            None => failures = 0,
            Some(why) => {
                failures += 1;
                tracing::warn!(plugin = %plugin, pid = proc.pid, failures, "health check failed: {why}");
                if failures >= policy.max_failures {
                    let reason = format!("{failures} health checks failed in a row (last: {why})");
                    tracing::error!(plugin = %plugin, pid = proc.pid, "killing the plugin: {reason}");
                    proc.kill_because(reason);
                    return;
                }
            }
        }
    }
}

async fn read_stderr(
    plugin: String,
    proc: Arc<Process>,
    stderr: std::process::ChildStderr,
    done: tokio::sync::oneshot::Sender<()>,
) {
    if let Ok(stderr) = tokio::process::ChildStderr::from_std(stderr) {
        let mut reader = BufReader::new(stderr);
        while let Ok(Some(line)) = read_line_bounded(&mut reader, MAX_LINE_BYTES).await {
            // A plugin may log what it was sent: secrets of running operations are cut.
            let line = crate::redact::scrub(&line);
            match super::plugin_log::Structured::parse(&line) {
                Some(s) => {
                    proc.tail.push(&s.readable());
                    s.emit(&plugin, "stderr");
                }
                None => {
                    proc.tail.push(&line);
                    log_line(&plugin, "stderr", &line);
                }
            }
        }
    }
    let _ = done.send(());
}

async fn log_stdout(plugin: String, mut reader: StdoutReader) {
    while let Ok(Some(line)) = read_line_bounded(&mut reader, MAX_LINE_BYTES).await {
        log_line(&plugin, "stdout", &crate::redact::scrub(&line));
    }
}

/// The level a log line announces (`ERROR`, `WARN`, `level=info`, ... among
/// its first words), else INFO.
pub(crate) fn detect_level(line: &str) -> tracing::Level {
    for word in line.split_whitespace().take(4) {
        let word = strip_ansi(word);
        let w = word
            .trim_start_matches("level=")
            .trim_matches(|c: char| !c.is_ascii_alphabetic());
        match w.to_ascii_uppercase().as_str() {
            "ERROR" | "ERR" | "FATAL" | "CRITICAL" => return tracing::Level::ERROR,
            "WARN" | "WARNING" => return tracing::Level::WARN,
            "INFO" => return tracing::Level::INFO,
            "DEBUG" => return tracing::Level::DEBUG,
            "TRACE" => return tracing::Level::TRACE,
            _ => {}
        }
    }
    tracing::Level::INFO
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// One plugin output line as a tracing event (target `trellis::plugin`,
/// fields `plugin` and `stream`).
pub(crate) fn log_line(plugin: &str, stream: &'static str, line: &str) {
    if let Some(s) = super::plugin_log::Structured::parse(line) {
        return s.emit(plugin, stream);
    }
    match detect_level(line) {
        tracing::Level::ERROR => {
            tracing::error!(target: "trellis::plugin", plugin = %plugin, stream, "{line}")
        }
        tracing::Level::WARN => {
            tracing::warn!(target: "trellis::plugin", plugin = %plugin, stream, "{line}")
        }
        tracing::Level::INFO => {
            tracing::info!(target: "trellis::plugin", plugin = %plugin, stream, "{line}")
        }
        tracing::Level::DEBUG => {
            tracing::debug!(target: "trellis::plugin", plugin = %plugin, stream, "{line}")
        }
        tracing::Level::TRACE => {
            tracing::trace!(target: "trellis::plugin", plugin = %plugin, stream, "{line}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_lines() {
        let dir = Path::new("/run/x/p-1");
        assert_eq!(
            parse_handshake_line("1|unix|/run/x/p-1/plugin.sock", dir),
            Ok(PathBuf::from("/run/x/p-1/plugin.sock"))
        );
        assert!(parse_handshake_line("2|unix|/run/x/p-1/s", dir).is_err());
        assert!(parse_handshake_line("1|tcp|127.0.0.1:1", dir).is_err());
        assert!(parse_handshake_line("1|unix|/tmp/elsewhere.sock", dir).is_err());
        assert!(parse_handshake_line("1|unix", dir).is_err());
    }

    #[test]
    fn log_levels() {
        assert_eq!(
            detect_level("2026-01-01T00:00:00Z ERROR boom"),
            tracing::Level::ERROR
        );
        assert_eq!(
            detect_level("\u{1b}[33m WARN\u{1b}[0m x"),
            tracing::Level::WARN
        );
        assert_eq!(detect_level("level=debug msg=x"), tracing::Level::DEBUG);
        assert_eq!(detect_level("[INFO] ready"), tracing::Level::INFO);
        assert_eq!(detect_level("thread 'main' panicked"), tracing::Level::INFO);
    }
}

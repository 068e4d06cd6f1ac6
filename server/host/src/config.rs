//! Configuration of the plugin host. Every knob has a default suited to a
//! long-running engine; tests and the CLI shorten some of them.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The kinds of plugin calls, each with its own default deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// Handshake and GetManifest.
    Manifest,
    /// ValidateConfig, ValidateResource, ValidateAbstractResource.
    Validate,
    PlanResource,
    ApplyResource,
    DestroyResource,
    ReadResource,
    FetchDataSource,
    CallFunction,
    CustomVariableOptions,
    /// StageLink, UpdateLink*, ReadLinkIntermediaries.
    Link,
    Transform,
    Cancel,
}

/// Default deadline per call kind. A call may override it
/// ([`super::CallOptions::deadline`]); retries of a call share its deadline.
#[derive(Clone, Debug)]
pub struct Deadlines {
    pub manifest: Duration,
    pub validate: Duration,
    pub plan: Duration,
    pub apply: Duration,
    pub destroy: Duration,
    pub read: Duration,
    pub fetch_data_source: Duration,
    pub call_function: Duration,
    pub custom_variable_options: Duration,
    pub link: Duration,
    pub transform: Duration,
    pub cancel: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            manifest: Duration::from_secs(30),
            validate: Duration::from_secs(30),
            plan: Duration::from_secs(60),
            apply: Duration::from_secs(600),
            destroy: Duration::from_secs(600),
            read: Duration::from_secs(60),
            fetch_data_source: Duration::from_secs(60),
            call_function: Duration::from_secs(30),
            custom_variable_options: Duration::from_secs(30),
            link: Duration::from_secs(300),
            transform: Duration::from_secs(120),
            cancel: Duration::from_secs(5),
        }
    }
}

impl Deadlines {
    pub fn get(&self, kind: CallKind) -> Duration {
        match kind {
            CallKind::Manifest => self.manifest,
            CallKind::Validate => self.validate,
            CallKind::PlanResource => self.plan,
            CallKind::ApplyResource => self.apply,
            CallKind::DestroyResource => self.destroy,
            CallKind::ReadResource => self.read,
            CallKind::FetchDataSource => self.fetch_data_source,
            CallKind::CallFunction => self.call_function,
            CallKind::CustomVariableOptions => self.custom_variable_options,
            CallKind::Link => self.link,
            CallKind::Transform => self.transform,
            CallKind::Cancel => self.cancel,
        }
    }
}

/// Restarts after a crash (or a failed launch): the n-th consecutive
/// failure delays the next start by `initial * multiplier^(n-1)`, capped at
/// `max`. A plugin that ran at least `reset_after` before crashing starts
/// the sequence again.
#[derive(Clone, Debug)]
pub struct RestartPolicy {
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub multiplier: f64,
    pub reset_after: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
            multiplier: 2.0,
            reset_after: Duration::from_secs(60),
        }
    }
}

impl RestartPolicy {
    /// The delay before the next start after `consecutive` failures.
    pub fn backoff(&self, consecutive: u32) -> Duration {
        if consecutive == 0 {
            return Duration::ZERO;
        }
        let mult = if self.multiplier.is_finite() && self.multiplier >= 1.0 {
            self.multiplier
        } else {
            1.0
        };
        let secs = self.initial_backoff.as_secs_f64() * mult.powi(consecutive as i32 - 1);
        let max = self.max_backoff.as_secs_f64();
        Duration::from_secs_f64(if secs.is_finite() { secs.min(max) } else { max })
    }
}

/// The circuit breaker: after `max_failures` crashes or failed launches
/// within `window`, the plugin is not started again for `cooldown`; calls
/// fail at once. After the cooldown one start is tried (half-open): success
/// closes the breaker, failure opens it again.
#[derive(Clone, Debug)]
pub struct BreakerPolicy {
    pub max_failures: usize,
    pub window: Duration,
    pub cooldown: Duration,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        BreakerPolicy {
            max_failures: 5,
            window: Duration::from_secs(60),
            cooldown: Duration::from_secs(30),
        }
    }
}

#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Directories searched for plugin executables, in order, before the
    /// executable's own directory.
    pub plugin_dirs: Vec<PathBuf>,
    /// Also search the directory of the running executable (where
    /// `cargo build --workspace` puts the bundled plugins), after
    /// `plugin_dirs`.
    pub search_exe_dir: bool,
    /// Parent of the per-launch socket directories and of the Host service's
    /// socket directory. `None`: `$TMPDIR/trellis-<uid>`. A path too long for
    /// a Unix socket address falls back to the default.
    pub runtime_dir: Option<PathBuf>,
    /// Manifest cache directory; `None` disables the cache.
    pub cache_dir: Option<PathBuf>,
    /// From spawn to a verified Handshake (handshake line, connect, RPC).
    pub launch_timeout: Duration,
    /// Between SIGTERM and SIGKILL at shutdown.
    pub shutdown_grace: Duration,
    pub deadlines: Deadlines,
    pub restart: RestartPolicy,
    pub breaker: BreakerPolicy,
    /// Upper bound on the attempts a plugin's RetryPolicy may ask for.
    pub max_retry_attempts: u32,
    /// Largest gRPC message accepted from a plugin.
    pub max_message_bytes: usize,
    /// Liveness checks of running plugins (grpc.health.v1); `None` disables
    /// them. A plugin whose process has exited is noticed at once anyway;
    /// this catches one that is alive but stuck.
    pub health: Option<HealthPolicy>,
}

/// Every `interval`, a running plugin gets a Health.Check with `timeout`;
/// after `max_failures` checks in a row without an answer (or answered
/// NOT_SERVING), the engine kills it (SIGKILL) and it counts as a crash.
#[derive(Clone, Debug)]
pub struct HealthPolicy {
    pub interval: Duration,
    pub timeout: Duration,
    pub max_failures: u32,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy {
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
            max_failures: 3,
        }
    }
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            plugin_dirs: Vec::new(),
            search_exe_dir: true,
            runtime_dir: None,
            cache_dir: None,
            launch_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(5),
            deadlines: Deadlines::default(),
            restart: RestartPolicy::default(),
            breaker: BreakerPolicy::default(),
            max_retry_attempts: 10,
            max_message_bytes: 64 << 20,
            health: Some(HealthPolicy::default()),
        }
    }
}

impl HostConfig {
    /// Defaults with the runtime directory at `<data_dir>/run` and the
    /// manifest cache at `<data_dir>/plugin-cache`.
    pub fn with_data_dir(data_dir: &Path) -> Self {
        HostConfig {
            runtime_dir: Some(data_dir.join("run")),
            cache_dir: Some(data_dir.join("plugin-cache")),
            ..HostConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_backoff_grows_and_caps() {
        let p = RestartPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
            multiplier: 2.0,
            reset_after: Duration::from_secs(1),
        };
        assert_eq!(p.backoff(0), Duration::ZERO);
        assert_eq!(p.backoff(1), Duration::from_millis(100));
        assert_eq!(p.backoff(2), Duration::from_millis(200));
        assert_eq!(p.backoff(3), Duration::from_millis(350));
        assert_eq!(p.backoff(1000), Duration::from_millis(350));
    }
}

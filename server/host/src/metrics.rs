//! The plugin host's metrics (docs/serve.md, "Metrics"): calls to plugins, restarts and
//! circuit breakers. Recorded whether or not the engine serves them; `trellis serve
//! --metrics-listen` registers them. Every label is bounded: plugin names are the installed
//! plugins, call names are the protocol's RPCs, a resource type is kept only when the plugin's
//! manifest declares it.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::error::PluginError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    plugin: String,
    r#type: String,
    call: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    plugin: String,
    r#type: String,
    call: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabel {
    plugin: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

static CALLS: LazyLock<Family<CallLabels, Counter>> = LazyLock::new(Family::default);

/// From 1 ms to about 3 min (a slow cloud create).
static CALL_SECONDS: LazyLock<Histograms<LatencyLabels>> = LazyLock::new(|| {
    Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 3.0, 12)))
});

static STARTS: LazyLock<Family<PluginLabel, Counter>> = LazyLock::new(Family::default);
static RESTARTS: LazyLock<Family<PluginLabel, Counter>> = LazyLock::new(Family::default);
static CRASHES: LazyLock<Family<PluginLabel, Counter>> = LazyLock::new(Family::default);
static BREAKER: LazyLock<Family<PluginLabel, Gauge>> = LazyLock::new(Family::default);

/// The circuit breaker's states, as the gauge's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Breaker {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
}

/// The RPC a call label names: `ApplyResource(aws/s3/bucket b)` is `ApplyResource`. Labels
/// start with the RPC's name, a constant of the client; what follows may be user-chosen.
pub(crate) fn call_name(label: &str) -> &str {
    label.split('(').next().unwrap_or(label)
}

/// What ended a call: `ok`, or the kind of error.
pub(crate) fn outcome(result: &Result<impl Sized, PluginError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => match e {
            PluginError::NotFound { .. } => "not_found",
            PluginError::Launch { .. } => "launch_failed",
            PluginError::Crashed { .. } => "crashed",
            PluginError::CircuitOpen { .. } => "circuit_open",
            PluginError::Restarting { .. } => "restarting",
            PluginError::DeadlineExceeded { .. } => "deadline_exceeded",
            PluginError::Transport { .. } => "transport",
            PluginError::Protocol { .. } => "protocol",
            PluginError::Application(_) => "application_error",
            PluginError::ShutDown { .. } => "shut_down",
            PluginError::Io { .. } => "io",
        },
    }
}

/// One call (its retries included) ended with `outcome` after `took`.
pub(crate) fn call_ended(
    plugin: &str,
    ty: &str,
    call: &str,
    outcome: &'static str,
    took: Duration,
) {
    CALLS
        .get_or_create(&CallLabels {
            plugin: plugin.to_owned(),
            r#type: ty.to_owned(),
            call: call.to_owned(),
            outcome,
        })
        .inc();
    CALL_SECONDS
        .get_or_create(&LatencyLabels {
            plugin: plugin.to_owned(),
            r#type: ty.to_owned(),
            call: call.to_owned(),
        })
        .observe(took.as_secs_f64());
}

/// A plugin process started; `launches` counts this one.
pub(crate) fn started(plugin: &str, launches: u64) {
    let label = PluginLabel {
        plugin: plugin.to_owned(),
    };
    STARTS.get_or_create(&label).inc();
    // The breaker's series exists from the first start (closed, 0), not from its first change.
    drop(BREAKER.get_or_create(&label));
    if launches > 1 {
        RESTARTS.get_or_create(&label).inc();
    }
}

pub(crate) fn crashed(plugin: &str) {
    CRASHES
        .get_or_create(&PluginLabel {
            plugin: plugin.to_owned(),
        })
        .inc();
}

pub(crate) fn breaker(plugin: &str, state: Breaker) {
    BREAKER
        .get_or_create(&PluginLabel {
            plugin: plugin.to_owned(),
        })
        .set(state as i64);
}

/// Adds the plugin host's metrics to `registry`.
pub fn register(registry: &mut Registry) {
    registry.register(
        "trellis_plugin_calls",
        "Calls to plugins (retries of a call included in it), by plugin, resource type, RPC and outcome",
        CALLS.clone(),
    );
    registry.register(
        "trellis_plugin_call_duration_seconds",
        "How long calls to plugins took, retries included, by plugin, resource type and RPC",
        CALL_SECONDS.clone(),
    );
    registry.register(
        "trellis_plugin_starts",
        "Plugin processes started",
        STARTS.clone(),
    );
    registry.register(
        "trellis_plugin_restarts",
        "Plugin processes started after an earlier process of the same plugin (after a crash or a stop)",
        RESTARTS.clone(),
    );
    registry.register(
        "trellis_plugin_crashes",
        "Plugin processes that exited unexpectedly",
        CRASHES.clone(),
    );
    registry.register(
        "trellis_plugin_breaker_state",
        "Each plugin's circuit breaker: 0 closed, 1 open (calls fail fast), 2 half-open (one start is being tried)",
        BREAKER.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(plugin: &str) -> PluginLabel {
        PluginLabel {
            plugin: plugin.to_owned(),
        }
    }

    #[test]
    fn a_start_after_the_first_is_a_restart_and_the_breaker_shows_from_the_first() {
        // A plugin name no other test uses: the metrics are process-wide.
        let p = "metrics-test-plugin";
        started(p, 1);
        assert_eq!(STARTS.get_or_create(&label(p)).get(), 1);
        assert_eq!(RESTARTS.get_or_create(&label(p)).get(), 0);
        assert_eq!(BREAKER.get(&label(p)).map(|g| g.get()), Some(0));
        breaker(p, Breaker::Open);
        assert_eq!(BREAKER.get_or_create(&label(p)).get(), 1);
        started(p, 2);
        assert_eq!(STARTS.get_or_create(&label(p)).get(), 2);
        assert_eq!(RESTARTS.get_or_create(&label(p)).get(), 1);
        assert_eq!(
            BREAKER.get_or_create(&label(p)).get(),
            1,
            "a start leaves the breaker as it is"
        );
    }

    #[test]
    fn call_names_drop_what_follows_the_rpc() {
        assert_eq!(
            call_name("ApplyResource(sim/resource my-name)"),
            "ApplyResource"
        );
        assert_eq!(call_name("PlanResource"), "PlanResource");
    }
}

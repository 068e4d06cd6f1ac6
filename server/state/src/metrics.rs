//! The state store's metrics (docs/serve.md, "Metrics"). They are recorded whether or not the
//! engine serves them (an atomic add each); `trellis serve --metrics-listen` registers them.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// From 0.1 ms (a commit that skips the disk) to about 2.4 s (a disk in trouble).
static COMMIT_SECONDS: LazyLock<Histogram> =
    LazyLock::new(|| Histogram::new(exponential_buckets(0.0001, 2.5, 12)));

static EVENTS_WRITTEN: LazyLock<Counter> = LazyLock::new(Counter::default);

/// From 0.1 ms to about 2.4 s, as commits: a checkpoint copies up to a few thousand pages and
/// fsyncs `state.db`.
static CHECKPOINT_SECONDS: LazyLock<Histogram> =
    LazyLock::new(|| Histogram::new(exponential_buckets(0.0001, 2.5, 12)));

static WRITER_CHECKPOINTS: LazyLock<Counter> = LazyLock::new(Counter::default);

/// One write transaction (a group commit of one or more units) took `took`, commit included.
pub(crate) fn commit_took(took: Duration) {
    COMMIT_SECONDS.observe(took.as_secs_f64());
}

/// `n` events were committed.
pub(crate) fn events_written(n: usize) {
    EVENTS_WRITTEN.inc_by(n as u64);
}

/// A WAL checkpoint of the SQLite store took `took`.
pub(crate) fn checkpoint_took(took: Duration) {
    CHECKPOINT_SECONDS.observe(took.as_secs_f64());
}

/// The SQLite writer checkpointed the WAL itself: the checkpoint thread fell behind.
pub(crate) fn writer_checkpointed() {
    WRITER_CHECKPOINTS.inc();
}

/// Adds the state store's metrics to `registry`.
pub fn register(registry: &mut Registry) {
    registry.register(
        "trellis_state_commit_duration_seconds",
        "Write transactions of the state store (a group commit of one or more units), from BEGIN to COMMIT",
        COMMIT_SECONDS.clone(),
    );
    registry.register(
        "trellis_state_checkpoint_duration_seconds",
        "WAL checkpoints of the SQLite state store, copying committed pages into state.db",
        CHECKPOINT_SECONDS.clone(),
    );
    registry.register(
        "trellis_state_writer_checkpoints",
        "WAL checkpoints the SQLite writer ran itself because the checkpoint thread fell behind",
        WRITER_CHECKPOINTS.clone(),
    );
    registry.register(
        "trellis_events_written",
        "Deployment events committed to the state store",
        EVENTS_WRITTEN.clone(),
    );
}

//! The engine's metrics (docs/serve.md, "Metrics"): operations by kind and how they ended.
//! Recorded whether or not the engine serves them; `trellis serve --metrics-listen` registers
//! them. Labels are bounded: no instance names (users choose those).

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::state::{Operation, OperationStatus};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    kind: &'static str,
    outcome: &'static str,
}

static OPERATIONS: LazyLock<Family<OperationLabels, Counter>> = LazyLock::new(Family::default);

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// From 10 ms to about 30 min.
static OPERATION_SECONDS: LazyLock<Histograms<OperationLabels>> = LazyLock::new(|| {
    Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.01, 3.0, 12)))
});

/// `op` ended as `status` (succeeded, failed, cancelled or interrupted). Its duration runs from
/// its acceptance to now.
pub(crate) fn operation_ended(op: &Operation, status: OperationStatus) {
    let labels = OperationLabels {
        kind: op.kind.as_str(),
        outcome: status.as_str(),
    };
    OPERATIONS.get_or_create(&labels).inc();
    let now_ms = crate::now_nanos() / 1_000_000;
    let took = u64::try_from(now_ms - i128::from(op.created_at.as_millis())).unwrap_or(0);
    OPERATION_SECONDS
        .get_or_create(&labels)
        .observe(Duration::from_millis(took).as_secs_f64());
}

/// Adds the engine's metrics to `registry`.
pub fn register(registry: &mut Registry) {
    registry.register(
        "trellis_operations",
        "Operations (deploy, destroy, reconcile) that ended, by kind and outcome",
        OPERATIONS.clone(),
    );
    registry.register(
        "trellis_operation_duration_seconds",
        "How long operations took from acceptance to their end, by kind and outcome",
        OPERATION_SECONDS.clone(),
    );
}

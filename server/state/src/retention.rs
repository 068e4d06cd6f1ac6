//! Retention that runs by itself: a tokio task calling [`StateStore::prune`] on an interval.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::{RetentionPolicy, StateStore};

/// The running retention task; dropping it stops the task.
#[derive(Debug)]
pub struct RetentionTask {
    handle: JoinHandle<()>,
}

impl RetentionTask {
    /// Stops the task (also done on drop).
    pub fn stop(self) {}
}

impl Drop for RetentionTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// Prunes now and then every `every`. A failed pass is logged and retried at the next tick:
/// retention is housekeeping and must never take the engine down. Must be called inside a tokio
/// runtime.
pub fn spawn_retention(
    store: Arc<dyn StateStore>,
    policy: RetentionPolicy,
    every: Duration,
) -> RetentionTask {
    let every = every.max(Duration::from_millis(1));
    let handle = tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        // After a long pause (suspended machine), one pass is enough; do not burst.
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match store.prune(&policy).await {
                Ok(report) if report.skipped => tracing::debug!(
                    "state retention skipped: another engine sharing the store is pruning it"
                ),
                Ok(report) if report != Default::default() => tracing::info!(
                    events = report.events_deleted,
                    change_sets = report.change_sets_deleted,
                    "state retention pruned old records"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "state retention failed; retrying later"),
            }
        }
    });
    RetentionTask { handle }
}

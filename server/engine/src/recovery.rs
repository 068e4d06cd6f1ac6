//! Start and stop: operations a previous run left behind are marked interrupted at start; a
//! drain lets operations finish within its time, then stops them at a safe point.

use super::*;

/// After the drain timeout, how long operations asked to stop get to reach a safe point (the
/// provider calls in flight come back) before they are marked interrupted.
const STOP_GRACE: Duration = Duration::from_secs(5);

impl Engine {
    /// At start: operations a previous run of this engine left pending or running are marked
    /// interrupted (so are operations whose lease expired), and so are their instances.
    pub async fn recover(&self) -> Result<Vec<Operation>> {
        let mut ops = self
            .store
            .mark_interrupted(InterruptScope::Owner(self.config.owner.clone()))
            .await?;
        ops.extend(self.store.mark_interrupted(InterruptScope::Expired).await?);
        self.mark_instances_interrupted(&ops).await;
        Ok(ops)
    }

    /// Operations of other engines sharing the store whose lease expired (the engine died or
    /// froze) are marked interrupted, with their instances; an engine that wakes up after
    /// that is fenced. Called periodically when the store is shared (`--lease-check-interval`).
    pub async fn take_over_expired(&self) -> Result<Vec<Operation>> {
        let ops = self.store.mark_interrupted(InterruptScope::Expired).await?;
        for op in &ops {
            tracing::warn!(operation = %op.id, instance = %op.instance_id, owner = %op.owner,
                "the operation's lease expired (its engine stopped renewing it): marking it interrupted");
            crate::metrics::operation_ended(op, OperationStatus::Interrupted);
        }
        self.mark_instances_interrupted(&ops).await;
        Ok(ops)
    }

    async fn mark_instances_interrupted(&self, ops: &[Operation]) {
        let mut seen = std::collections::HashSet::new();
        for op in ops {
            if !seen.insert(op.instance_id.clone()) {
                continue;
            }
            let result = async {
                let lease = self.lease(&op.instance_id).await?;
                let r = self
                    .store
                    .commit(
                        &lease,
                        vec![Change::InstanceStatus(InstanceStatus::Interrupted)],
                        vec![NewEvent::new(
                            "instance.interrupted",
                            json!({ "operation": op.id,
                                    "hint": "check drift and reconcile (trellis drift / trellis reconcile)" }),
                        )],
                    )
                    .await;
                let _ = self.store.release_lease(&lease).await;
                r.map_err(EngineError::from)
            }
            .await;
            match result {
                Ok(_) => {
                    tracing::warn!(target: "trellis::operation", operation = %op.id, instance_id = %op.instance_id,
                        kind = op.kind.as_str(), request_id = %op.request_id, status = "interrupted",
                        "operation ended: interrupted; instance marked interrupted")
                }
                Err(e) => {
                    tracing::error!(operation = %op.id, error = %e, "could not mark the instance interrupted")
                }
            }
        }
    }

    /// Graceful stop: refuse new mutations and let running operations finish for up to
    /// `timeout`; those still running then are asked to stop at a safe point (no new provider
    /// call starts) and get [`STOP_GRACE`] to reach it; what is left is marked interrupted.
    pub async fn drain(&self, timeout: Duration) {
        self.draining.store(true, Ordering::SeqCst);
        self.queues.close();
        let deadline = tokio::time::Instant::now() + timeout;
        if !self.wait_idle(deadline).await {
            let left = self.running.len();
            tracing::warn!(timeout = ?timeout, operations = left, "drain timeout reached: stopping running operations at a safe point");
            for r in self.running.iter() {
                r.stop.cancel();
            }
            if !self
                .wait_idle(tokio::time::Instant::now() + STOP_GRACE)
                .await
            {
                tracing::warn!(grace = ?STOP_GRACE, "operations did not reach a safe point in time");
            }
        }
        match self
            .store
            .mark_interrupted(InterruptScope::ShutDown(self.config.owner.clone()))
            .await
        {
            Ok(ops) => {
                for op in &ops {
                    crate::metrics::operation_ended(op, OperationStatus::Interrupted);
                }
                self.mark_instances_interrupted(&ops).await
            }
            Err(e) => tracing::error!(error = %e, "could not mark operations interrupted"),
        }
    }

    /// Waits until no operation runs, or `deadline`; whether none runs.
    async fn wait_idle(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            let notified = self.finished.notified();
            if self.running.is_empty() {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

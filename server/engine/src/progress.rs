//! Progress a provider reports while it applies a resource (`ApplyResource`'s progress
//! messages), recorded as `resource.progress` events so that `trellis deploy` and `trellis
//! events` show them.
//!
//! Rate-limited by time, not by count: a call is sampled once a second, starting a second after
//! it began, and its newest message is recorded if it changed since the last sample. A call
//! that finishes within a second (most of them) records nothing: its `resource.created` says
//! enough, and a deploy of thousands of resources does not double its writes. The sampler is
//! stopped and awaited before the call's outcome is recorded, so no progress event follows it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use trellis_proto::plugin::v1 as pb;

use crate::exec::RunContext;
use crate::provision::ProgressSink;
use crate::state::NewEvent;

/// How often a running call's progress is sampled (and how long it runs before the first).
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// The recorder of one provider call's progress.
pub(crate) struct Progress {
    sink: ProgressSink,
    done: CancellationToken,
    sampler: JoinHandle<()>,
}

impl Progress {
    /// Starts sampling the progress of `resource`'s call (of type `ty`).
    pub(crate) fn start(ctx: &RunContext, resource: &str, ty: &str) -> Progress {
        let (tx, mut rx) = watch::channel::<Option<pb::Progress>>(None);
        let sink = ProgressSink::new(move |p: &pb::Progress| {
            tx.send_replace(Some(p.clone()));
        });
        let done = CancellationToken::new();
        let stopped = done.clone();
        let (store, lease) = (ctx.store.clone(), ctx.lease.clone());
        // What `RunContext::commit` adds to every event of a run: watchers of the operation
        // select its events by `operation`.
        let operation = ctx.operation.id.clone();
        let derived = ctx
            .derivations
            .get()
            .and_then(|all| all.get(resource))
            .map(|d| json!({ "resource": d.resource, "transform": d.transform }));
        let (resource, ty) = (resource.to_owned(), ty.to_owned());
        let sampler = tokio::spawn(async move {
            let start = tokio::time::Instant::now() + SAMPLE_EVERY;
            let mut ticks = tokio::time::interval_at(start, SAMPLE_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    _ = ticks.tick() => {}
                }
                if !rx.has_changed().unwrap_or(false) {
                    continue;
                }
                let Some(p) = rx.borrow_and_update().clone() else {
                    continue;
                };
                let mut payload = json!({ "resource": resource, "type": ty, "message": p.message });
                if (0.0..=1.0).contains(&p.fraction) {
                    payload["fraction"] = json!(p.fraction);
                }
                if let Some(d) = &derived {
                    payload["derivedFrom"] = d.clone();
                }
                payload["operation"] = json!(operation);
                let lease = lease.lock().unwrap_or_else(|e| e.into_inner()).clone();
                // Progress is a courtesy: a refused write (a lost lease, a full disk) is for
                // the call's own outcome to report.
                if let Err(e) = store
                    .commit(
                        &lease,
                        vec![],
                        vec![NewEvent::new("resource.progress", payload)],
                    )
                    .await
                {
                    tracing::debug!(resource = %resource, error = %e, "progress not recorded");
                }
            }
        });
        Progress {
            sink,
            done,
            sampler,
        }
    }

    /// What the provider call reports its progress to.
    pub(crate) fn sink(&self) -> ProgressSink {
        self.sink.clone()
    }

    /// Stops sampling; returns once a progress event being written is written.
    pub(crate) async fn finish(self) {
        self.done.cancel();
        let _ = self.sampler.await;
    }
}

impl ProgressSink {
    pub fn new(f: impl Fn(&pb::Progress) + Send + Sync + 'static) -> ProgressSink {
        ProgressSink(Arc::new(f))
    }
}

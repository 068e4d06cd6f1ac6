//! Requests that wait their turn on a busy instance (`--wait`) instead of being refused.
//!
//! Each instance with waiting requests has a FIFO queue. Only the request at its front tries
//! to start, each time the instance's lease may have come free (a commit on the instance, or
//! the time the current lease expires); the others wait for the queue to move. A request that
//! starts, fails for another reason, reaches its deadline or is dropped (the client went away)
//! leaves its queue, which wakes the next one. The queue lives in this engine's memory: it
//! orders the requests this engine holds; a request through another engine on the same store
//! competes for the lease as before.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use tokio::sync::watch;
use tokio::time::Instant;

use super::*;

/// A request waiting for its turn, as `GetInstance` shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Queued {
    pub kind: OperationKind,
    pub request_id: String,
    /// Who asked (the token's name; empty without `[auth]`).
    pub caller: String,
    /// The change set a deploy executes.
    pub change_set_id: Option<String>,
    /// When it started waiting, milliseconds since the Unix epoch.
    pub since_ms: i64,
}

struct Entry {
    ticket: u64,
    queued: Queued,
}

struct Queue {
    waiters: Mutex<VecDeque<Entry>>,
    /// Bumped whenever the queue changes, so waiters behind the front look again.
    moved: watch::Sender<u64>,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Entry>> {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Every instance's queue (instance id → queue), and the signal that ends all waiting when
/// the engine drains.
#[derive(Default)]
pub(crate) struct Queues {
    map: DashMap<String, Arc<Queue>>,
    next: AtomicU64,
    closed: CancellationToken,
}

/// A request's place in its instance's queue; leaves the queue when dropped.
pub(crate) struct Place<'a> {
    queues: &'a Queues,
    instance_id: String,
    queue: Arc<Queue>,
    ticket: u64,
}

impl Queues {
    /// Joins the back of `instance_id`'s queue.
    pub(crate) fn join(&self, instance_id: &str, queued: Queued) -> Place<'_> {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        // Pushed under the map's entry lock: a queue being removed as empty cannot take
        // this request with it.
        let entry = self.map.entry(instance_id.to_owned()).or_insert_with(|| {
            Arc::new(Queue {
                waiters: Mutex::new(VecDeque::new()),
                moved: watch::channel(0).0,
            })
        });
        entry.lock().push_back(Entry { ticket, queued });
        let queue = entry.clone();
        drop(entry);
        queue.moved.send_modify(|n| *n += 1);
        Place {
            queues: self,
            instance_id: instance_id.to_owned(),
            queue,
            ticket,
        }
    }

    /// The requests waiting on `instance_id`, first first.
    pub(crate) fn list(&self, instance_id: &str) -> Vec<Queued> {
        self.map
            .get(instance_id)
            .map(|q| q.lock().iter().map(|e| e.queued.clone()).collect())
            .unwrap_or_default()
    }

    /// Ends every wait (drain): waiting requests answer UNAVAILABLE.
    pub(crate) fn close(&self) {
        self.closed.cancel();
    }
}

impl Place<'_> {
    /// 1 for the front of the queue.
    pub(crate) fn position(&self) -> usize {
        self.queue
            .lock()
            .iter()
            .position(|e| e.ticket == self.ticket)
            .map_or(0, |i| i + 1)
    }

    fn watch(&self) -> watch::Receiver<u64> {
        self.queue.moved.subscribe()
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.queue.lock().retain(|e| e.ticket != self.ticket);
        self.queue.moved.send_modify(|n| *n += 1);
        self.queues
            .map
            .remove_if(&self.instance_id, |_, q| q.lock().is_empty());
    }
}

/// How long a request may wait for its turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Refused at once while another operation holds the instance (the default).
    No,
    /// Until its turn, however long.
    Forever,
    /// At most this long, then refused as without waiting, saying how long it waited.
    Up(Duration),
}

impl Engine {
    /// [`Engine::execute`], waiting for its turn on a busy instance as `wait` says.
    /// `caller` is who asks, shown while it waits.
    pub async fn execute_waiting(
        self: &Arc<Self>,
        request_id: &str,
        change_set_id: &str,
        rollback_on_failure: bool,
        caller: &str,
        wait: Wait,
    ) -> Result<Operation> {
        if wait == Wait::No {
            return self
                .execute(request_id, change_set_id, rollback_on_failure)
                .await;
        }
        let digest = operations::execute_digest(change_set_id, rollback_on_failure);
        self.once(request_id, &digest, async {
            self.accepting()?;
            let cs = self.store.get_change_set_head(change_set_id).await?;
            let queued = Queued {
                kind: OperationKind::Deploy,
                request_id: request_id.to_owned(),
                caller: caller.to_owned(),
                change_set_id: Some(cs.id.clone()),
                since_ms: now_ms(),
            };
            self.in_turn(&cs.instance_id, queued, wait, || {
                self.start_execute(request_id, &digest, change_set_id, rollback_on_failure)
            })
            .await
        })
        .await
    }

    /// [`Engine::destroy`], waiting for its turn on a busy instance as `wait` says.
    pub async fn destroy_waiting(
        self: &Arc<Self>,
        request_id: &str,
        instance: &str,
        caller: &str,
        wait: Wait,
    ) -> Result<Operation> {
        if wait == Wait::No {
            return self.destroy(request_id, instance).await;
        }
        let digest = operations::destroy_digest(instance);
        self.once(request_id, &digest, async {
            self.accepting()?;
            let inst = self.instance_named(instance).await?;
            let queued = Queued {
                kind: OperationKind::Destroy,
                request_id: request_id.to_owned(),
                caller: caller.to_owned(),
                change_set_id: None,
                since_ms: now_ms(),
            };
            self.in_turn(&inst.id, queued, wait, || {
                self.start_destroy(request_id, &digest, instance)
            })
            .await
        })
        .await
    }

    /// The requests waiting for their turn on `instance_id`, in order.
    pub fn queued(&self, instance_id: &str) -> Vec<Queued> {
        self.queues.list(instance_id)
    }

    /// Runs `start` when it is `queued`'s turn on `instance_id`: at once without `wait`
    /// (or when nobody holds the instance), else after the operations ahead of it. `start`
    /// may run several times: each time the front finds the lease taken (ABORTED), it waits
    /// again. Any other answer, an operation or an error, ends the wait.
    pub(crate) async fn in_turn<F, Fut>(
        &self,
        instance_id: &str,
        queued: Queued,
        wait: Wait,
        mut start: F,
    ) -> Result<Operation>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Operation>>,
    {
        let limit = match wait {
            Wait::No => return start().await,
            Wait::Forever => None,
            Wait::Up(d) => Some(d),
        };
        let began = Instant::now();
        let deadline = limit.map(|d| began + d);
        let place = self.queues.join(instance_id, queued);
        let mut refused: Option<String> = None;
        loop {
            // Subscribe before looking: a change after the look still wakes the wait.
            let mut moved = place.watch();
            moved.borrow_and_update();
            let mut commits = self.store.subscribe(instance_id);
            let front = place.position() == 1;
            let mut lease_expiry = None;
            if front {
                self.accepting()?;
                match self.lease_free_at(instance_id).await? {
                    None => match start().await {
                        Err(EngineError::Aborted(m)) => refused = Some(m),
                        other => return other,
                    },
                    Some(at) => {
                        lease_expiry = Some(at);
                        refused.get_or_insert_with(|| {
                            "another operation is running on the instance".to_owned()
                        });
                    }
                }
            }
            let expiry = lease_expiry.unwrap_or_else(|| began + Duration::from_secs(86_400 * 365));
            tokio::select! {
                _ = moved.changed() => {}
                _ = commits.changed(), if front => {}
                _ = tokio::time::sleep_until(expiry), if lease_expiry.is_some() => {}
                _ = tokio::time::sleep_until(deadline.unwrap_or(expiry)), if deadline.is_some() => {
                    let ahead = place.position().saturating_sub(1);
                    let why = refused.unwrap_or_else(|| {
                        format!("another operation is running on the instance, and {ahead} \
                                 request(s) were ahead of this one")
                    });
                    // The timer may fire a tick before the deadline; the wait was the limit.
                    let waited_for = began.elapsed().max(limit.unwrap_or_default());
                    return Err(EngineError::Aborted(format!(
                        "{why} (waited {})",
                        waited(waited_for)
                    )));
                }
                _ = self.queues.closed.cancelled() => {
                    return Err(EngineError::Unavailable(format!(
                        "the engine is shutting down: the request waited {} for its turn and \
                         did not start; send it again to the engine that replaces this one",
                        waited(began.elapsed())
                    )));
                }
            }
        }
    }

    /// `None` when nobody holds `instance_id`'s lease (released, or expired), else when the
    /// current lease expires (as an instant of this clock).
    async fn lease_free_at(&self, instance_id: &str) -> Result<Option<Instant>> {
        let inst = self.store.get_instance(instance_id).await?;
        let Some(holder) = inst.lease else {
            return Ok(None);
        };
        let left = holder.expires_at.as_millis() - now_ms();
        if left <= 0 {
            return Ok(None);
        }
        // A little after expiry, so the store agrees it expired (a heartbeat may extend it).
        let expiry =
            Instant::now() + Duration::from_millis(left as u64) + Duration::from_millis(50);
        // Held by this engine: an operation's end commits (and wakes the waiter), but a request
        // that took the lease and was then refused (a stale change set) gives it back without
        // an event, so look again soon rather than at expiry.
        if holder.owner == self.config.owner {
            return Ok(Some(expiry.min(Instant::now() + OWN_LEASE_RECHECK)));
        }
        Ok(Some(expiry))
    }
}

/// How often the front of a queue looks again at a lease this engine holds (see
/// [`Engine::lease_free_at`]).
const OWN_LEASE_RECHECK: Duration = Duration::from_secs(1);

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `2.3s`, `3m 5s`.
fn waited(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{}.{}s", s, d.subsec_millis() / 100)
    } else {
        format!("{}m {}s", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(request_id: &str) -> Queued {
        Queued {
            kind: OperationKind::Deploy,
            request_id: request_id.to_owned(),
            caller: String::new(),
            change_set_id: None,
            since_ms: 0,
        }
    }

    fn ids(q: &Queues, instance: &str) -> Vec<String> {
        q.list(instance).into_iter().map(|e| e.request_id).collect()
    }

    #[test]
    fn places_are_first_come_first_served_and_leave_when_dropped() {
        let q = Queues::default();
        let a = q.join("i", queued("a"));
        let b = q.join("i", queued("b"));
        let c = q.join("i", queued("c"));
        let other = q.join("j", queued("x"));
        assert_eq!(ids(&q, "i"), ["a", "b", "c"]);
        assert_eq!(
            (a.position(), b.position(), c.position(), other.position()),
            (1, 2, 3, 1)
        );
        // A waiter in the middle goes away (its client disconnected): the others keep order.
        drop(b);
        assert_eq!(ids(&q, "i"), ["a", "c"]);
        assert_eq!(c.position(), 2);
        drop(a);
        assert_eq!(c.position(), 1);
        let d = q.join("i", queued("d"));
        assert_eq!(ids(&q, "i"), ["c", "d"]);
        drop(c);
        drop(d);
        // Empty queues are forgotten.
        assert!(q.list("i").is_empty());
        assert!(q.map.get("i").is_none());
        assert_eq!(ids(&q, "j"), ["x"]);
    }

    #[tokio::test]
    async fn leaving_the_front_wakes_the_next() {
        let q = Queues::default();
        let a = q.join("i", queued("a"));
        let b = q.join("i", queued("b"));
        let mut moved = b.watch();
        moved.borrow_and_update();
        drop(a);
        moved.changed().await.unwrap();
        assert_eq!(b.position(), 1);
    }

    #[test]
    fn waited_reads_well() {
        assert_eq!(waited(Duration::from_millis(2_340)), "2.3s");
        assert_eq!(waited(Duration::from_secs(185)), "3m 5s");
    }
}

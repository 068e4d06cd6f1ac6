//! The state layer: what the engine knows about deployed instances, behind one trait.
//!
//! [`StateStore`] is implemented by [`SqliteStore`] (embedded, one engine per data directory)
//! and [`PostgresStore`] (a database server). Both must pass [`conformance`], the
//! store-agnostic test suite that pins down the semantics below. docs/state.md is the long form.
//!
//! Invariants every implementation keeps:
//! - **Atomicity.** A unit of work ([`StateStore::commit`]) applies its changes and appends its
//!   events in one transaction: all or nothing.
//! - **Fencing.** Writes to an instance's deployed state present a [`Lease`]; a lease that is
//!   no longer the instance's current one (a newer epoch exists, or it was released or revoked)
//!   is rejected with [`StateError::Fenced`], so a stale engine cannot overwrite a newer one.
//! - **Intents.** A resource is recorded as `CreateRequested` before the provider is asked to
//!   create it, so a crash never orphans a resource.
//! - **Sequences.** Each instance's events are numbered 1, 2, 3... with no gaps and no reuse;
//!   [`StateStore::events_since`] resumes exactly after any number.
//! - **Idempotency.** An operation's `request_id` maps to one operation forever, and a change
//!   set's to one change set until retention removes it; a retry with different content is
//!   [`StateError::RequestIdReused`].

mod clock;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
mod error;
pub mod metrics;
mod model;
mod notify;
pub mod postgres;
mod retention;
pub mod sqlite;

use std::time::Duration;

use serde_json::{Value, json};

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{Conflict, Result, StateError};
pub use model::*;
pub use notify::{EventSubscription, Notifier};
pub use postgres::{PostgresOptions, PostgresStore};
pub use retention::{RetentionTask, spawn_retention};
pub use sqlite::{SqliteOptions, SqliteStore, StateBackup};

/// The engine's state store. Object safe (`Arc<dyn StateStore>`); every method is a single
/// transaction unless documented otherwise. Lists come back in insertion order.
#[async_trait::async_trait]
pub trait StateStore: Send + Sync + 'static {
    // ---- instances ----------------------------------------------------------------------------

    /// Creates an instance (status `New`, version 0) and its `instance.created` event.
    /// A taken name is `Conflict::NameTaken`.
    async fn create_instance(&self, name: &str) -> Result<Instance>;
    async fn get_instance(&self, instance_id: &str) -> Result<Instance>;
    async fn find_instance(&self, name: &str) -> Result<Option<Instance>>;
    async fn list_instances(&self) -> Result<Vec<Instance>>;
    /// The instance with its resources, links, children and exports, from one snapshot.
    async fn load_state(&self, instance_id: &str) -> Result<InstanceState>;
    /// How many resources the instance records (without reading them).
    async fn count_resources(&self, instance_id: &str) -> Result<u64>;
    /// One resource of the instance, `None` if it records none of that name (without reading
    /// the others).
    async fn get_resource(&self, instance_id: &str, name: &str) -> Result<Option<Resource>>;

    // ---- leases -------------------------------------------------------------------------------

    /// Takes the instance's lease for `ttl`, with the next epoch. `Conflict::LeaseHeld` while
    /// another unexpired lease exists (whoever owns it: an engine serializes its own work).
    async fn acquire_lease(&self, instance_id: &str, owner: &str, ttl: Duration) -> Result<Lease>;
    /// Extends the lease to now + `ttl`. `Fenced` if it is no longer current. A lease that
    /// expired but was not taken over or revoked is still current and can be renewed.
    async fn heartbeat(&self, lease: &Lease, ttl: Duration) -> Result<Lease>;
    /// Gives the lease up; later writes with it are `Fenced`.
    async fn release_lease(&self, lease: &Lease) -> Result<()>;

    // ---- the unit of work ---------------------------------------------------------------------

    /// Applies `changes` in order and appends `events`, atomically, fenced by `lease`, and
    /// increments the instance version. The first change that does not apply fails the whole
    /// unit: nothing is written and no sequence number is used.
    async fn commit(
        &self,
        lease: &Lease,
        changes: Vec<Change>,
        events: Vec<NewEvent>,
    ) -> Result<Committed>;

    // ---- change sets --------------------------------------------------------------------------

    /// Records a plan (status `Planned`) and a `change_set.planned` event. Not fenced: planning
    /// does not change the instance. With a request key whose id is already recorded, returns
    /// that change set (same digest) and records nothing, or is `RequestIdReused`.
    async fn create_change_set(&self, new: NewChangeSet) -> Result<ChangeSet>;
    async fn get_change_set(&self, change_set_id: &str) -> Result<ChangeSet>;
    /// The change set with its body left out (`Value::Null`), for callers that need only its
    /// status, digest or planned version: a body holds the whole plan.
    async fn get_change_set_head(&self, change_set_id: &str) -> Result<ChangeSet>;
    async fn list_change_sets(&self, instance_id: &str) -> Result<Vec<ChangeSet>>;
    /// The change set recorded for `request`'s id (with its body), `None` if the id is unused,
    /// `RequestIdReused` if it was recorded for another request (digest).
    async fn find_change_set(&self, request: &RequestKey) -> Result<Option<ChangeSet>>;
    /// Atomically checks that the change set is `Planned` and that the instance is still at the
    /// version it was planned against, then marks it `Executing`, supersedes the instance's
    /// other planned change sets, and increments the version (fenced by `lease`).
    /// `AlreadyExecuted` if it is executing or done; `Stale` if the instance moved on (the
    /// change set is then marked `Superseded`) or it was superseded.
    async fn begin_execution(&self, change_set_id: &str, lease: &Lease) -> Result<Committed>;

    // ---- operations ---------------------------------------------------------------------------

    /// Records an operation (status `Pending`) and an `operation.accepted` event, or, for a
    /// retry with the same `request_id` and digest, returns the existing one (`created: false`).
    /// The same `request_id` with another digest is `RequestIdReused`.
    async fn create_operation(&self, new: NewOperation) -> Result<Accepted>;
    async fn get_operation(&self, operation_id: &str) -> Result<Operation>;
    async fn find_operation(&self, request_id: &str) -> Result<Option<Operation>>;
    async fn list_operations(&self, instance_id: &str) -> Result<Vec<Operation>>;
    /// Recovery at engine start: marks operations left pending/running by a dead engine (or
    /// whose lease expired) `Interrupted`, fails the change sets they were executing, revokes
    /// their leases, and appends an `operation.interrupted` event for each. Returns them.
    async fn mark_interrupted(&self, scope: InterruptScope) -> Result<Vec<Operation>>;
    /// Asks for the operation to be cancelled wherever it runs: records the request and tells
    /// every engine sharing the store (see [`StateStore::cancel_requests`]). `Ok(false)` when
    /// the operation already ended: there is nothing to cancel.
    async fn request_cancel(&self, operation_id: &str) -> Result<bool>;
    /// Whether a cancel was requested for the operation: the engine running it checks with each
    /// heartbeat, in case it missed the notification.
    async fn cancel_requested(&self, operation_id: &str) -> Result<bool>;
    /// The ids of operations whose cancellation [`StateStore::request_cancel`] asked for, by any
    /// engine sharing the store (best effort: a receiver that lags loses the oldest).
    fn cancel_requests(&self) -> tokio::sync::broadcast::Receiver<String>;

    // ---- events -------------------------------------------------------------------------------

    /// Up to `limit` events with `seq > after_seq`, in order. `EventsPruned` if retention
    /// removed some of them (a resume must not silently skip events).
    async fn events_since(
        &self,
        instance_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<Event>>;
    /// Wakes on every commit that appends events to the instance (in this process).
    fn subscribe(&self, instance_id: &str) -> EventSubscription;

    // ---- retention ----------------------------------------------------------------------------

    /// Removes old events (each instance keeps its newest `keep_last_events`, and removal is
    /// always a prefix of the sequence) and old change sets that are not executing.
    async fn prune(&self, policy: &RetentionPolicy) -> Result<PruneReport>;

    // ---- backup -------------------------------------------------------------------------------

    /// A consistent copy of the whole state as it was at one moment, made while the store
    /// keeps serving (writes are not held up). SQLite: a database file in the same format as
    /// `state.db`, which becomes a data directory's `state.db` to restore it (docs/state.md).
    /// A store that cannot copy itself (the PostgreSQL one, whose backups are `pg_dump`'s job)
    /// answers an error saying so.
    async fn backup(&self) -> Result<StateBackup>;

    // ---- local assets -------------------------------------------------------------------------

    /// Whether engines sharing this store also share local assets through it: true for
    /// PostgreSQL (replicas: a plan through one, its execution through another), false for
    /// SQLite (one engine, which keeps them in its data directory).
    fn shares_assets(&self) -> bool {
        false
    }
    /// Keeps an asset's content under `key` (`sha256:<hex>/<name>`, a content digest: keeping
    /// it again does nothing). `Unsupported` where [`StateStore::shares_assets`] is false.
    async fn put_asset(&self, key: &str, content: Vec<u8>) -> Result<()>;
    /// The content kept under `key`, `None` if none is. `Unsupported` where
    /// [`StateStore::shares_assets`] is false.
    async fn get_asset(&self, key: &str) -> Result<Option<Vec<u8>>>;

    // ---- provided on top of the above -------------------------------------------------------

    /// Like `events_since`, but waits until at least one event exists (cancel by dropping).
    async fn wait_events(
        &self,
        instance_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<Event>> {
        // Subscribe first: a commit between the read and the wait still wakes us.
        let mut sub = self.subscribe(instance_id);
        loop {
            let events = self.events_since(instance_id, after_seq, limit).await?;
            if !events.is_empty() || limit == 0 {
                return Ok(events);
            }
            if sub.changed().await.is_none() {
                return Err(StateError::Db("state store closed".into()));
            }
        }
    }

    /// Records the intent to create `name` before calling the provider.
    async fn record_intent(
        &self,
        lease: &Lease,
        name: &str,
        resource_type: &str,
        spec: Value,
    ) -> Result<Committed> {
        let event = NewEvent::new(
            "resource.create_requested",
            json!({ "resource": name, "type": resource_type }),
        );
        let change = Change::IntendCreate {
            name: name.into(),
            resource_type: resource_type.into(),
            spec,
            depends_on: Vec::new(),
            metadata: Value::Null,
            key: String::new(),
        };
        self.commit(lease, vec![change], vec![event]).await
    }

    /// The provider created `name`: records its external id and computed state.
    async fn complete_create(
        &self,
        lease: &Lease,
        name: &str,
        external_id: &str,
        state: Value,
    ) -> Result<Committed> {
        let event = NewEvent::new(
            "resource.created",
            json!({ "resource": name, "externalId": external_id }),
        );
        let change = Change::ResourceCreated {
            name: name.into(),
            external_id: external_id.into(),
            state,
        };
        self.commit(lease, vec![change], vec![event]).await
    }

    /// The requested provider call for `name` failed.
    async fn fail_resource(&self, lease: &Lease, name: &str, reason: &str) -> Result<Committed> {
        let event = NewEvent::new(
            "resource.failed",
            json!({ "resource": name, "reason": reason }),
        );
        let change = Change::ResourceFailed {
            name: name.into(),
            reason: reason.into(),
        };
        self.commit(lease, vec![change], vec![event]).await
    }
}

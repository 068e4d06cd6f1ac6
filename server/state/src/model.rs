//! The data model of the state layer, shared by every [`StateStore`](super::StateStore)
//! implementation: records, statuses, the changes a unit of work applies, and the status
//! transition rules (kept here, not in a backend, so SQLite and PostgreSQL enforce the same ones).

use std::time::Duration;

use serde_json::Value;

use super::error::{Result, StateError};

/// Milliseconds since the Unix epoch. Stored as an integer so every backend compares and
/// orders it the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    pub const fn from_millis(ms: i64) -> Self {
        Timestamp(ms)
    }

    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// `self + d`, saturating (a huge TTL means "forever", not an overflow).
    pub fn plus(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_ms(d)))
    }

    /// `self - d`, saturating.
    pub fn minus(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_sub(duration_ms(d)))
    }
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Declares a status enum with its stable storage spelling. The strings are part of the
/// database format: never change one, only add.
macro_rules! status_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)*
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }

            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($text => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

status_enum! {
    /// Where a blueprint instance is in its life.
    InstanceStatus {
        /// Created, nothing deployed yet.
        New = "new",
        Deploying = "deploying",
        Deployed = "deployed",
        DeployFailed = "deploy_failed",
        Destroying = "destroying",
        Destroyed = "destroyed",
        DestroyFailed = "destroy_failed",
        /// A deployed instance is being changed.
        Updating = "updating",
        Updated = "updated",
        UpdateFailed = "update_failed",
        /// A failed operation is being undone.
        RollingBack = "rolling_back",
        RollbackComplete = "rollback_complete",
        RollbackFailed = "rollback_failed",
        /// The engine stopped while an operation ran; drift check and reconcile recover it.
        Interrupted = "interrupted",
    }
}

status_enum! {
    /// Where a resource (or link) is in its life. `*Requested` is an intent: written before the
    /// provider call, so after a crash the engine knows a call may have happened and checks with
    /// the provider instead of forgetting (orphaning) what it may have created.
    ResourceStatus {
        CreateRequested = "create_requested",
        Created = "created",
        CreateFailed = "create_failed",
        UpdateRequested = "update_requested",
        Updated = "updated",
        UpdateFailed = "update_failed",
        DestroyRequested = "destroy_requested",
        DestroyFailed = "destroy_failed",
    }
}

/// Links share the resource life cycle (a link's provider calls change resources too).
pub type LinkStatus = ResourceStatus;

status_enum! {
    ChangeSetStatus {
        Planned = "planned",
        Executing = "executing",
        Executed = "executed",
        Failed = "failed",
        /// Another change set of the instance started executing, or the instance moved on.
        Superseded = "superseded",
    }
}

status_enum! {
    OperationKind {
        Deploy = "deploy",
        Destroy = "destroy",
        Reconcile = "reconcile",
        Import = "import",
    }
}

status_enum! {
    OperationStatus {
        /// Accepted, not yet running under a lease.
        Pending = "pending",
        Running = "running",
        Succeeded = "succeeded",
        Failed = "failed",
        Cancelled = "cancelled",
        /// Its engine died or lost the lease; see `mark_interrupted`.
        Interrupted = "interrupted",
    }
}

impl OperationStatus {
    pub fn is_terminal(self) -> bool {
        !matches!(self, OperationStatus::Pending | OperationStatus::Running)
    }
}

/// A deployed (or being deployed) blueprint.
#[derive(Clone, Debug, PartialEq)]
pub struct Instance {
    pub id: String,
    pub name: String,
    pub status: InstanceStatus,
    /// Incremented by every fenced commit; change sets record the version they were planned
    /// against.
    pub version: u64,
    /// Sequence number of the newest event (0: none yet).
    pub last_seq: u64,
    /// Retention removed every event up to and including this sequence number.
    pub pruned_through: u64,
    /// The epoch of the newest lease ever granted on the instance (0: never leased).
    pub lease_epoch: u64,
    /// The current lease holder, if the lease is not released (it may have expired).
    pub lease: Option<LeaseHolder>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// The environment and provider settings its last deployment used (`null`: none recorded);
    /// secrets wrapped as in specs. The engine gives it meaning.
    pub environment: Value,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LeaseHolder {
    pub owner: String,
    pub expires_at: Timestamp,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    pub instance_id: String,
    pub name: String,
    pub resource_type: String,
    /// The spec last intended (written with the intent).
    pub spec: Value,
    /// The computed state last reported by the provider.
    pub state: Option<Value>,
    pub status: ResourceStatus,
    /// The resources it waits for, as last intended.
    pub depends_on: Vec<String>,
    /// Its evaluated metadata (labels, annotations); null when never recorded.
    pub metadata: Value,
    pub external_id: Option<String>,
    pub failure_reason: Option<String>,
    /// The idempotency key of the provider call its last intent announced (kept when the
    /// call fails): a call whose outcome is unknown is settled with the same key.
    pub call_key: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    pub instance_id: String,
    pub resource_a: String,
    pub resource_b: String,
    pub link_type: String,
    pub status: LinkStatus,
    pub data: Value,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Child {
    pub instance_id: String,
    pub name: String,
    pub child_instance_id: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Export {
    pub instance_id: String,
    pub name: String,
    pub export_type: String,
    pub value: Value,
    pub updated_at: Timestamp,
}

/// Everything deployed in one instance, read in one consistent snapshot. Lists are in
/// insertion order.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceState {
    pub instance: Instance,
    pub resources: Vec<Resource>,
    pub links: Vec<Link>,
    pub children: Vec<Child>,
    pub exports: Vec<Export>,
}

impl InstanceState {
    pub fn resource(&self, name: &str) -> Option<&Resource> {
        self.resources.iter().find(|r| r.name == name)
    }

    pub fn export(&self, name: &str) -> Option<&Export> {
        self.exports.iter().find(|e| e.name == name)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct NewChangeSet {
    pub instance_id: String,
    /// The instance version the plan read.
    pub planned_version: u64,
    /// Digest of the exact documents and variables planned (computed by the planner).
    pub digest: String,
    pub body: Value,
    /// The client's idempotency key, if it sent one: a retry of the same request gets this
    /// change set back instead of a new one.
    pub request: Option<RequestKey>,
}

/// A client-chosen request id and the digest of the request it was first used for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestKey {
    pub id: String,
    pub digest: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ChangeSet {
    pub id: String,
    pub instance_id: String,
    pub planned_version: u64,
    pub digest: String,
    pub body: Value,
    pub status: ChangeSetStatus,
    pub request: Option<RequestKey>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NewOperation {
    pub instance_id: String,
    pub kind: OperationKind,
    /// Client-chosen idempotency key, unique across the store.
    pub request_id: String,
    /// Digest of the request; a retry must carry the same one.
    pub request_digest: String,
    pub change_set_id: Option<String>,
    /// The engine that accepted the request.
    pub owner: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Operation {
    pub id: String,
    pub instance_id: String,
    pub kind: OperationKind,
    pub request_id: String,
    pub request_digest: String,
    /// `None` also when retention removed the change set.
    pub change_set_id: Option<String>,
    pub owner: String,
    pub status: OperationStatus,
    /// The lease it ran under (set when it became `Running`).
    pub lease_owner: Option<String>,
    pub lease_epoch: Option<u64>,
    pub error: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub finished_at: Option<Timestamp>,
    /// The instance's last event sequence number when the operation was recorded: all of the
    /// operation's events come after it, so watching it need not read the instance's history
    /// (0 for operations recorded before this was kept).
    pub events_after: u64,
}

/// What `create_operation` returns: the operation, and whether this call created it (`false`
/// for a retry of the same request).
#[derive(Clone, Debug, PartialEq)]
pub struct Accepted {
    pub operation: Operation,
    pub created: bool,
}

/// A lease on an instance. Every fenced write presents it; the store rejects it with
/// [`StateError::Fenced`] once a newer lease exists or it was released.
#[derive(Clone, Debug, PartialEq)]
pub struct Lease {
    pub instance_id: String,
    pub owner: String,
    /// Random per acquisition: tells two acquisitions apart even at the same epoch.
    pub token: String,
    /// Incremented on every acquisition of the instance's lease.
    pub epoch: u64,
    pub expires_at: Timestamp,
}

/// An event to append to an instance's stream.
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    pub kind: String,
    pub payload: Value,
}

impl NewEvent {
    pub fn new(kind: impl Into<String>, payload: Value) -> Self {
        NewEvent {
            kind: kind.into(),
            payload,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub instance_id: String,
    /// Per instance, from 1, strictly increasing without gaps.
    pub seq: u64,
    pub kind: String,
    pub payload: Value,
    pub at: Timestamp,
}

/// The result of a committed unit of work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Committed {
    /// The instance version after the commit.
    pub version: u64,
    /// The events written are `first_seq..=last_seq`; with no events `first_seq == last_seq + 1`
    /// and `last_seq` is the instance's newest sequence number.
    pub first_seq: u64,
    pub last_seq: u64,
}

impl Committed {
    pub fn event_count(&self) -> u64 {
        (self.last_seq + 1).saturating_sub(self.first_seq)
    }
}

/// One state change inside a unit of work ([`StateStore::commit`](super::StateStore::commit)).
/// Each is checked against the current state; the first that does not apply fails the whole
/// unit of work and nothing is written.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    InstanceStatus(InstanceStatus),
    /// Records the environment a deployment runs with (replaces the previous record).
    InstanceEnvironment(Value),
    /// Intent to create: written BEFORE the provider call (status `CreateRequested`). Allowed
    /// when the resource is absent, or its create failed or is still unresolved.
    IntendCreate {
        name: String,
        resource_type: String,
        spec: Value,
        /// The resources it waits for (kept so removal and destroy order survive the blueprint).
        depends_on: Vec<String>,
        /// Its evaluated metadata (labels, annotations).
        metadata: Value,
        /// The idempotency key of the create call.
        key: String,
    },
    /// The provider created it (from `CreateRequested`).
    ResourceCreated {
        name: String,
        external_id: String,
        state: Value,
    },
    /// Intent to update (from `Created`, `Updated` or `UpdateFailed`).
    IntendUpdate {
        name: String,
        spec: Value,
        depends_on: Vec<String>,
        metadata: Value,
        /// The idempotency key of the update call.
        key: String,
    },
    /// The provider updated it (from `UpdateRequested`); `external_id` when it changed.
    ResourceUpdated {
        name: String,
        external_id: Option<String>,
        state: Value,
    },
    /// Intent to destroy (from any status).
    IntendDestroy {
        name: String,
        /// The idempotency key of the destroy call.
        key: String,
    },
    /// The requested call failed: `XRequested` becomes `XFailed`, with the reason.
    ResourceFailed {
        name: String,
        reason: String,
    },
    /// The record goes away (from `DestroyRequested` or `CreateFailed`; no links may use it).
    ResourceRemoved {
        name: String,
    },
    PutLink {
        resource_a: String,
        resource_b: String,
        link_type: String,
        status: LinkStatus,
        data: Value,
    },
    RemoveLink {
        resource_a: String,
        resource_b: String,
    },
    PutChild {
        name: String,
        child_instance_id: String,
    },
    RemoveChild {
        name: String,
    },
    PutExport {
        name: String,
        export_type: String,
        value: Value,
    },
    RemoveExport {
        name: String,
    },
    /// `Executing` to `Executed`/`Failed`, or `Planned` to `Superseded`. (`Planned` to
    /// `Executing` only through `begin_execution`, which checks staleness.)
    ChangeSetStatus {
        id: String,
        status: ChangeSetStatus,
    },
    /// `Pending` to `Running` (records the committing lease), and from `Pending`/`Running` to a
    /// terminal status. (`Interrupted` only through `mark_interrupted`.)
    OperationStatus {
        id: String,
        status: OperationStatus,
        error: Option<String>,
    },
    /// Gives the lease up with this unit of work (an operation's last commit), so whoever
    /// sees its events can take the lease at once. Only as the last change.
    ReleaseLease,
}

/// Which operations `mark_interrupted` recovers.
#[derive(Clone, Debug, PartialEq)]
pub enum InterruptScope {
    /// Everything the named engine accepted or ran (it restarted, so none of it is running);
    /// its leases are released.
    Owner(String),
    /// As `Owner`, when the named engine is shutting down and its drain time ran out.
    ShutDown(String),
    /// Running operations whose lease expired or was taken over; an expired lease is revoked,
    /// so a paused engine that wakes up is fenced.
    Expired,
}

/// What retention removes (see [`StateStore::prune`](super::StateStore::prune)).
#[derive(Clone, Debug, PartialEq)]
pub struct RetentionPolicy {
    /// Events older than this may go...
    pub events_older_than: Duration,
    /// ...but the newest `keep_last_events` of every instance stay.
    pub keep_last_events: u64,
    /// Change sets older than this go, unless executing.
    pub change_sets_older_than: Duration,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        const DAY: Duration = Duration::from_secs(24 * 60 * 60);
        RetentionPolicy {
            events_older_than: 30 * DAY,
            keep_last_events: 1000,
            change_sets_older_than: 30 * DAY,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub events_deleted: u64,
    pub change_sets_deleted: u64,
    /// Nothing was done because another engine sharing the store was pruning it.
    pub skipped: bool,
}

// ---- transition rules -------------------------------------------------------------------------

/// The status a resource has after `change`, given its current status (`None`: no record).
/// Returns `Ok(None)` when the record is removed. Only resource changes are accepted.
pub fn resource_transition(
    current: Option<ResourceStatus>,
    change: &Change,
) -> Result<Option<ResourceStatus>> {
    use ResourceStatus as S;
    let (name, next, allowed): (&str, Option<S>, bool) = match change {
        Change::IntendCreate { name, .. } => (
            name,
            Some(S::CreateRequested),
            matches!(current, None | Some(S::CreateRequested | S::CreateFailed)),
        ),
        Change::ResourceCreated { name, .. } => {
            (name, Some(S::Created), current == Some(S::CreateRequested))
        }
        Change::IntendUpdate { name, .. } => (
            name,
            Some(S::UpdateRequested),
            // Again from `UpdateRequested`: an update whose answer never came is asked again.
            // From a destroy that did not finish: the blueprint wants the resource after all.
            matches!(
                current,
                Some(
                    S::Created
                        | S::Updated
                        | S::UpdateFailed
                        | S::UpdateRequested
                        | S::DestroyFailed
                        | S::DestroyRequested
                )
            ),
        ),
        Change::ResourceUpdated { name, .. } => {
            (name, Some(S::Updated), current == Some(S::UpdateRequested))
        }
        Change::IntendDestroy { name, .. } => (name, Some(S::DestroyRequested), current.is_some()),
        Change::ResourceFailed { name, .. } => {
            let next = match current {
                Some(S::CreateRequested) => Some(S::CreateFailed),
                Some(S::UpdateRequested) => Some(S::UpdateFailed),
                Some(S::DestroyRequested) => Some(S::DestroyFailed),
                _ => None,
            };
            (name, next, next.is_some())
        }
        Change::ResourceRemoved { name } => (
            name,
            None,
            matches!(current, Some(S::DestroyRequested | S::CreateFailed)),
        ),
        other => {
            return Err(StateError::rejected(format!(
                "not a resource change: {other:?}"
            )));
        }
    };
    if allowed {
        return Ok(next);
    }
    if current.is_none() && !matches!(change, Change::IntendCreate { .. }) {
        return Err(StateError::not_found("resource", name));
    }
    Err(StateError::transition(
        "resource",
        name,
        current.map_or("absent", |s| s.as_str()),
        next.map_or_else(
            || change_label(change).to_owned(),
            |s| s.as_str().to_owned(),
        ),
    ))
}

fn change_label(change: &Change) -> &'static str {
    match change {
        Change::ResourceRemoved { .. } => "removed",
        Change::ResourceFailed { .. } => "failed",
        _ => "changed",
    }
}

/// Checks a change set status change made through `Change::ChangeSetStatus`.
pub fn change_set_transition(id: &str, from: ChangeSetStatus, to: ChangeSetStatus) -> Result<()> {
    use ChangeSetStatus as S;
    let ok = matches!(
        (from, to),
        (S::Executing, S::Executed | S::Failed) | (S::Planned, S::Superseded)
    );
    if ok {
        Ok(())
    } else {
        Err(StateError::transition(
            "change set",
            id,
            from.as_str(),
            to.as_str(),
        ))
    }
}

/// Checks an operation status change made through `Change::OperationStatus`.
pub fn operation_transition(id: &str, from: OperationStatus, to: OperationStatus) -> Result<()> {
    use OperationStatus as S;
    let ok = match from {
        S::Pending => to != S::Pending && to != S::Interrupted,
        S::Running => to.is_terminal() && to != S::Interrupted,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(StateError::transition(
            "operation",
            id,
            from.as_str(),
            to.as_str(),
        ))
    }
}

/// Decodes a stored status, reporting unknown text as corruption instead of panicking.
pub(crate) fn parse_status<T>(parse: fn(&str) -> Option<T>, text: &str, what: &str) -> Result<T> {
    parse(text).ok_or_else(|| StateError::Corrupt(format!("{what}: unknown status {text:?}")))
}

// ---- shared by the stores ---------------------------------------------------------------------

/// Counters are u64 in the API and signed 64-bit in both databases; a negative stored value is
/// corruption.
pub(crate) fn to_u64(v: i64, what: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| StateError::Corrupt(format!("{what}: negative value {v}")))
}

/// API numbers beyond i64 cannot exist in the database; clamp instead of wrapping.
pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(crate) fn non_empty(what: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(StateError::rejected(format!("{what} must not be empty")));
    }
    Ok(())
}

/// The resource a change is about ("" for changes about no resource).
pub(crate) fn resource_name(change: &Change) -> &str {
    match change {
        Change::IntendCreate { name, .. }
        | Change::ResourceCreated { name, .. }
        | Change::IntendUpdate { name, .. }
        | Change::ResourceUpdated { name, .. }
        | Change::IntendDestroy { name, .. }
        | Change::ResourceFailed { name, .. }
        | Change::ResourceRemoved { name } => name,
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip() {
        for s in ResourceStatus::ALL {
            assert_eq!(ResourceStatus::parse(s.as_str()), Some(*s));
        }
        for s in OperationStatus::ALL {
            assert_eq!(OperationStatus::parse(s.as_str()), Some(*s));
        }
        assert_eq!(InstanceStatus::parse("nope"), None);
    }

    #[test]
    fn resource_transitions() {
        use ResourceStatus as S;
        let create = Change::IntendCreate {
            name: "r".into(),
            resource_type: "t".into(),
            spec: Value::Null,
            depends_on: vec![],
            metadata: Value::Null,
            key: "k".into(),
        };
        assert_eq!(
            resource_transition(None, &create).unwrap(),
            Some(S::CreateRequested)
        );
        assert!(resource_transition(Some(S::Created), &create).is_err());
        let failed = Change::ResourceFailed {
            name: "r".into(),
            reason: "x".into(),
        };
        assert_eq!(
            resource_transition(Some(S::UpdateRequested), &failed).unwrap(),
            Some(S::UpdateFailed)
        );
        assert!(matches!(
            resource_transition(None, &failed),
            Err(StateError::NotFound { .. })
        ));
        let removed = Change::ResourceRemoved { name: "r".into() };
        assert_eq!(
            resource_transition(Some(S::DestroyRequested), &removed).unwrap(),
            None
        );
        assert!(resource_transition(Some(S::Created), &removed).is_err());
    }
}

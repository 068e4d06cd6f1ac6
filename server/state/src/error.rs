//! Typed errors of the state layer.
//!
//! Callers branch on these (the API maps `Conflict` to "instance busy", `Fenced` to "this engine
//! lost its lease", `Stale` to "plan again"...), so every rule the store enforces has its own
//! variant and every variant carries what a message needs. Bad data read back from a store is
//! `Corrupt`, never a panic.

use std::fmt;
use std::path::PathBuf;

use super::model::{ChangeSetStatus, Timestamp};

pub type Result<T, E = StateError> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq)]
pub enum StateError {
    /// No such record. `kind` is "instance", "resource", "change set", ...
    NotFound { kind: &'static str, id: String },
    /// The write contradicts the current state (see [`Conflict`]).
    Conflict(Conflict),
    /// The lease presented is no longer the instance's current lease: another owner acquired it
    /// (a higher epoch) or it was released or revoked. The writer must stop; nothing was written.
    Fenced {
        instance_id: String,
        epoch: u64,
        current_epoch: u64,
    },
    /// The change set was planned against an older version of the instance (or was superseded).
    Stale {
        change_set_id: String,
        planned_version: u64,
        current_version: u64,
    },
    /// The change set is executing or was executed already; it cannot run twice.
    AlreadyExecuted {
        change_set_id: String,
        status: ChangeSetStatus,
    },
    /// A mutation reused a `request_id` with a different request (digest mismatch).
    RequestIdReused { request_id: String },
    /// Events up to `pruned_through` were removed by retention; a resume from an earlier
    /// sequence number would silently miss events, so it is refused.
    EventsPruned {
        instance_id: String,
        after_seq: u64,
        pruned_through: u64,
    },
    /// Another engine holds the data directory (`<data dir>/engine.lock`).
    DataDirLocked {
        lock_file: PathBuf,
        pid: Option<u32>,
    },
    /// Stored data that cannot be decoded (unknown status, invalid JSON, negative counter...).
    Corrupt(String),
    /// File system failure (data directory, lock file).
    Io(String),
    /// Database failure (including "busy" and "store closed").
    Db(String),
    /// Something this kind of store does not do (a backup of PostgreSQL: pg_dump's job).
    Unsupported(String),
}

/// Why a write conflicts with the current state.
#[derive(Debug, Clone, PartialEq)]
pub enum Conflict {
    /// Another unexpired lease exists on the instance.
    LeaseHeld {
        instance_id: String,
        owner: String,
        epoch: u64,
        expires_at: Timestamp,
    },
    /// An instance with this name exists.
    NameTaken { name: String },
    /// The change does not apply to the record's current status, e.g. completing a create that
    /// was never requested. `from` is the current status ("absent" when there is no record).
    InvalidTransition {
        kind: &'static str,
        id: String,
        from: String,
        to: String,
    },
    /// The record is still referenced (a resource with links, an instance that is a child).
    InUse {
        kind: &'static str,
        id: String,
        by: String,
    },
    /// Any other rule: a record of another instance, a version from the future...
    Rejected(String),
}

impl StateError {
    pub(crate) fn not_found(kind: &'static str, id: impl Into<String>) -> Self {
        StateError::NotFound {
            kind,
            id: id.into(),
        }
    }

    pub(crate) fn rejected(msg: impl Into<String>) -> Self {
        StateError::Conflict(Conflict::Rejected(msg.into()))
    }

    pub(crate) fn transition(
        kind: &'static str,
        id: impl Into<String>,
        from: impl Into<String>,
        to: impl Into<String>,
    ) -> Self {
        StateError::Conflict(Conflict::InvalidTransition {
            kind,
            id: id.into(),
            from: from.into(),
            to: to.into(),
        })
    }
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::NotFound { kind, id } => write!(f, "{kind} `{id}` not found"),
            StateError::Conflict(c) => write!(f, "conflict: {c}"),
            StateError::Fenced {
                instance_id,
                epoch,
                current_epoch,
            } => write!(
                f,
                "lease epoch {epoch} on instance `{instance_id}` is no longer valid (current \
                 epoch {current_epoch}); another engine took over or the lease was released"
            ),
            StateError::Stale {
                change_set_id,
                planned_version,
                current_version,
            } => write!(
                f,
                "change set `{change_set_id}` was planned against instance version \
                 {planned_version} but the instance is at version {current_version}; plan again"
            ),
            StateError::AlreadyExecuted {
                change_set_id,
                status,
            } => write!(
                f,
                "change set `{change_set_id}` cannot be executed: it is {}",
                status.as_str()
            ),
            StateError::RequestIdReused { request_id } => write!(
                f,
                "request id `{request_id}` was already used for a different request"
            ),
            StateError::EventsPruned {
                instance_id,
                after_seq,
                pruned_through,
            } => write!(
                f,
                "events of instance `{instance_id}` after {after_seq} are no longer available: \
                 retention removed everything up to {pruned_through}"
            ),
            StateError::DataDirLocked { lock_file, pid } => {
                write!(
                    f,
                    "the data directory is in use by another engine (lock file {}",
                    lock_file.display()
                )?;
                match pid {
                    Some(pid) => write!(f, ", held by pid {pid})"),
                    None => write!(f, ")"),
                }
            }
            StateError::Corrupt(msg) => write!(f, "corrupt state: {msg}"),
            StateError::Io(msg) => write!(f, "state i/o error: {msg}"),
            StateError::Db(msg) => write!(f, "state database error: {msg}"),
            StateError::Unsupported(msg) => f.write_str(msg),
        }
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Conflict::LeaseHeld {
                instance_id,
                owner,
                epoch,
                expires_at,
            } => write!(
                f,
                "instance `{instance_id}` is leased by `{owner}` (epoch {epoch}) until {}",
                expires_at.as_millis()
            ),
            Conflict::NameTaken { name } => write!(f, "an instance named `{name}` exists"),
            Conflict::InvalidTransition { kind, id, from, to } => {
                write!(f, "{kind} `{id}` cannot go from {from} to {to}")
            }
            Conflict::InUse { kind, id, by } => write!(f, "{kind} `{id}` is still used by {by}"),
            Conflict::Rejected(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for StateError {}

impl From<std::io::Error> for StateError {
    fn from(e: std::io::Error) -> Self {
        StateError::Io(e.to_string())
    }
}

impl From<serde_json::Error> for StateError {
    fn from(e: serde_json::Error) -> Self {
        StateError::Corrupt(format!("invalid JSON: {e}"))
    }
}

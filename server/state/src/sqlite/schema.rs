//! Schema migrations, embedded and numbered. Applied at open inside one transaction and recorded
//! in `schema_migrations`, so opening is idempotent and a half-applied migration cannot exist.
//! Never edit a released migration: add the next number.

use rusqlite::{Connection, TransactionBehavior, params};

use crate::error::{Result, StateError};
use crate::model::Timestamp;

pub(crate) struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: &'static str,
}

/// Tables are STRICT (SQLite checks column types) and every JSON value is TEXT holding one
/// serialized `serde_json::Value`. Timestamps are milliseconds since the Unix epoch. Rowid tables
/// keep insertion order (`ORDER BY rowid`), which the API promises for lists.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial",
        sql: r#"
CREATE TABLE instances (
    id               TEXT PRIMARY KEY,
    name             TEXT NOT NULL UNIQUE,
    status           TEXT NOT NULL,
    version          INTEGER NOT NULL,
    last_seq         INTEGER NOT NULL,
    pruned_through   INTEGER NOT NULL,
    -- The lease: epoch survives release (the next acquisition is epoch + 1); owner, token and
    -- expiry are NULL when released or revoked.
    lease_epoch      INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_token      TEXT,
    lease_expires_at INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
) STRICT;

CREATE TABLE resources (
    instance_id    TEXT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
    name           TEXT NOT NULL,
    type           TEXT NOT NULL,
    spec           TEXT NOT NULL,
    state          TEXT,
    status         TEXT NOT NULL,
    external_id    TEXT,
    failure_reason TEXT,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    PRIMARY KEY (instance_id, name)
) STRICT;

CREATE TABLE links (
    instance_id TEXT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
    resource_a  TEXT NOT NULL,
    resource_b  TEXT NOT NULL,
    link_type   TEXT NOT NULL,
    status      TEXT NOT NULL,
    data        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (instance_id, resource_a, resource_b),
    FOREIGN KEY (instance_id, resource_a) REFERENCES resources(instance_id, name),
    FOREIGN KEY (instance_id, resource_b) REFERENCES resources(instance_id, name)
) STRICT;
CREATE INDEX links_by_b ON links(instance_id, resource_b);

CREATE TABLE children (
    instance_id       TEXT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
    name              TEXT NOT NULL,
    child_instance_id TEXT NOT NULL REFERENCES instances(id),
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    PRIMARY KEY (instance_id, name)
) STRICT;
CREATE INDEX children_by_child ON children(child_instance_id);

CREATE TABLE exports (
    instance_id TEXT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    type        TEXT NOT NULL,
    value       TEXT NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (instance_id, name)
) STRICT;

CREATE TABLE change_sets (
    id              TEXT PRIMARY KEY,
    instance_id     TEXT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
    planned_version INTEGER NOT NULL,
    digest          TEXT NOT NULL,
    body            TEXT NOT NULL,
    status          TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
) STRICT;
CREATE INDEX change_sets_by_instance ON change_sets(instance_id, status);
CREATE INDEX change_sets_by_age ON change_sets(created_at);

CREATE TABLE operations (
    id             TEXT PRIMARY KEY,
    instance_id    TEXT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
    kind           TEXT NOT NULL,
    request_id     TEXT NOT NULL UNIQUE,
    request_digest TEXT NOT NULL,
    -- Retention may remove the change set; the operation (the idempotency record) stays.
    change_set_id  TEXT REFERENCES change_sets(id) ON DELETE SET NULL,
    owner          TEXT NOT NULL,
    status         TEXT NOT NULL,
    lease_owner    TEXT,
    lease_epoch    INTEGER,
    error          TEXT,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    finished_at    INTEGER
) STRICT;
CREATE INDEX operations_by_instance ON operations(instance_id);
CREATE INDEX operations_by_status ON operations(status);
CREATE INDEX operations_by_change_set ON operations(change_set_id);

CREATE TABLE events (
    instance_id TEXT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    payload     TEXT NOT NULL,
    at          INTEGER NOT NULL,
    PRIMARY KEY (instance_id, seq)
) STRICT, WITHOUT ROWID;
"#,
    },
    Migration {
        version: 2,
        name: "resource graph",
        // What a resource waited for and its metadata (labels): removal and destroy order, and
        // link changes, are planned from state after the blueprint no longer names it.
        sql: r#"
ALTER TABLE resources ADD COLUMN depends_on TEXT NOT NULL DEFAULT '[]';
ALTER TABLE resources ADD COLUMN metadata TEXT NOT NULL DEFAULT 'null';
"#,
    },
    Migration {
        version: 3,
        name: "change set request ids",
        // CreateChangeSet's idempotency key; NULLs (no key sent) never collide.
        sql: r#"
ALTER TABLE change_sets ADD COLUMN request_id TEXT;
ALTER TABLE change_sets ADD COLUMN request_digest TEXT;
CREATE UNIQUE INDEX change_sets_by_request ON change_sets(request_id);
"#,
    },
    Migration {
        version: 4,
        name: "store identity",
        // Which store this is and how many write transactions it has committed: the data
        // directory's `state.marker` records both, so a missing, emptied or replaced database
        // and a lost WAL are refused at open (sqlite/marker.rs).
        sql: r#"
CREATE TABLE store_meta (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    store_id TEXT NOT NULL,
    commits  INTEGER NOT NULL
) STRICT;
INSERT INTO store_meta (id, store_id, commits) VALUES (1, lower(hex(randomblob(16))), 0);
"#,
    },
    Migration {
        version: 5,
        name: "call keys",
        // The idempotency key of the provider call an intent announces: whoever settles an
        // unfinished call asks with the same key.
        sql: r#"
ALTER TABLE resources ADD COLUMN call_key TEXT;
"#,
    },
    Migration {
        version: 6,
        name: "instance environments",
        // The environment and provider settings the instance's last deployment used (JSON,
        // secrets wrapped like in specs): destroy, drift and reconcile use them again.
        sql: r#"
ALTER TABLE instances ADD COLUMN environment TEXT NOT NULL DEFAULT 'null';
"#,
    },
    Migration {
        version: 7,
        name: "cancel requests",
        // Set by `request_cancel` on a pending or running operation: the engine running it
        // stops it at a safe point (it is told, and checks with every heartbeat).
        sql: r#"
ALTER TABLE operations ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
"#,
    },
    Migration {
        version: 8,
        name: "operation event positions",
        // The instance's last event sequence number when the operation was recorded: a watch
        // of the operation starts there instead of reading the instance's whole history.
        sql: r#"
ALTER TABLE operations ADD COLUMN events_after INTEGER NOT NULL DEFAULT 0;
"#,
    },
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS[MIGRATIONS.len() - 1].version;

/// Brings the database up to [`SCHEMA_VERSION`]. Refuses a database written by a newer engine
/// rather than guessing at tables it does not know.
pub(crate) fn migrate(conn: &mut Connection, now: Timestamp) -> Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    INTEGER PRIMARY KEY,
             name       TEXT NOT NULL,
             applied_at INTEGER NOT NULL
         ) STRICT;",
    )?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let current: i64 = tx.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |row| row.get(0),
    )?;
    if current > SCHEMA_VERSION {
        return Err(StateError::Db(format!(
            "state.db has schema version {current}, newer than this engine supports \
             ({SCHEMA_VERSION}); run a newer trellis"
        )));
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > current) {
        tx.execute_batch(m.sql)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
            params![m.version, m.name, now.as_millis()],
        )?;
    }
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_order() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i64 + 1, "{}", m.name);
        }
    }

    #[test]
    fn migrate_twice_is_a_no_op() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn, Timestamp::from_millis(1)).unwrap();
        migrate(&mut conn, Timestamp::from_millis(2)).unwrap();
        let n: i64 = conn
            .query_row("SELECT COUNT(*) FROM schema_migrations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, MIGRATIONS.len() as i64);
    }
}

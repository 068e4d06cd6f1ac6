//! The PostgreSQL schema, embedded and numbered like SQLite's (`sqlite/schema.rs`) but its own
//! sequence: the two stores share semantics, not a database format. Never edit a released
//! migration: add the next number.
//!
//! Several replicas may start at once against one database: migrations run in one transaction
//! that first takes a transaction-level advisory lock (keyed by the schema), so one replica
//! migrates while the others wait and then find nothing left to do. A failed migration rolls
//! back whole.

use tokio_postgres::Client;

use crate::error::{Result, StateError};
use crate::model::Timestamp;

pub(super) struct Migration {
    pub(super) version: i64,
    pub(super) name: &'static str,
    pub(super) sql: &'static str,
}

/// JSON values are TEXT holding one serialized `serde_json::Value` (not JSONB, which would
/// reorder keys and drop duplicates: a value reads back exactly as written, as in SQLite).
/// Timestamps are milliseconds since the Unix epoch, from the store's clock (never `now()`).
/// `pos` (an identity column) keeps insertion order, which the API promises for lists.
pub(super) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial",
        sql: r#"
CREATE TABLE instances (
    pos              BIGINT GENERATED ALWAYS AS IDENTITY,
    id               TEXT PRIMARY KEY,
    name             TEXT NOT NULL UNIQUE,
    status           TEXT NOT NULL,
    version          BIGINT NOT NULL,
    last_seq         BIGINT NOT NULL,
    pruned_through   BIGINT NOT NULL,
    -- The lease: epoch survives release (the next acquisition is epoch + 1); owner, token and
    -- expiry are NULL when released or revoked.
    lease_epoch      BIGINT NOT NULL,
    lease_owner      TEXT,
    lease_token      TEXT,
    lease_expires_at BIGINT,
    environment      TEXT NOT NULL DEFAULT 'null',
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);
CREATE INDEX instances_by_lease_owner ON instances(lease_owner);

CREATE TABLE resources (
    pos            BIGINT GENERATED ALWAYS AS IDENTITY,
    instance_id    TEXT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
    name           TEXT NOT NULL,
    type           TEXT NOT NULL,
    spec           TEXT NOT NULL,
    state          TEXT,
    status         TEXT NOT NULL,
    external_id    TEXT,
    failure_reason TEXT,
    depends_on     TEXT NOT NULL DEFAULT '[]',
    metadata       TEXT NOT NULL DEFAULT 'null',
    call_key       TEXT,
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL,
    PRIMARY KEY (instance_id, name)
);

CREATE TABLE links (
    pos         BIGINT GENERATED ALWAYS AS IDENTITY,
    instance_id TEXT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
    resource_a  TEXT NOT NULL,
    resource_b  TEXT NOT NULL,
    link_type   TEXT NOT NULL,
    status      TEXT NOT NULL,
    data        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (instance_id, resource_a, resource_b),
    FOREIGN KEY (instance_id, resource_a) REFERENCES resources(instance_id, name),
    FOREIGN KEY (instance_id, resource_b) REFERENCES resources(instance_id, name)
);
CREATE INDEX links_by_b ON links(instance_id, resource_b);

CREATE TABLE children (
    pos               BIGINT GENERATED ALWAYS AS IDENTITY,
    instance_id       TEXT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
    name              TEXT NOT NULL,
    child_instance_id TEXT NOT NULL REFERENCES instances(id),
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL,
    PRIMARY KEY (instance_id, name)
);
CREATE INDEX children_by_child ON children(child_instance_id);

CREATE TABLE exports (
    pos         BIGINT GENERATED ALWAYS AS IDENTITY,
    instance_id TEXT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    type        TEXT NOT NULL,
    value       TEXT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (instance_id, name)
);

CREATE TABLE change_sets (
    pos             BIGINT GENERATED ALWAYS AS IDENTITY,
    id              TEXT PRIMARY KEY,
    instance_id     TEXT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
    planned_version BIGINT NOT NULL,
    digest          TEXT NOT NULL,
    body            TEXT NOT NULL,
    status          TEXT NOT NULL,
    -- CreateChangeSet's idempotency key; NULLs (no key sent) never collide.
    request_id      TEXT UNIQUE,
    request_digest  TEXT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);
CREATE INDEX change_sets_by_instance ON change_sets(instance_id, status);
CREATE INDEX change_sets_by_age ON change_sets(created_at);

CREATE TABLE operations (
    pos            BIGINT GENERATED ALWAYS AS IDENTITY,
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
    lease_epoch    BIGINT,
    error          TEXT,
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL,
    finished_at    BIGINT
);
CREATE INDEX operations_by_instance ON operations(instance_id);
CREATE INDEX operations_by_status ON operations(status);
CREATE INDEX operations_by_change_set ON operations(change_set_id);

CREATE TABLE events (
    instance_id TEXT NOT NULL REFERENCES instances(id) ON DELETE CASCADE,
    seq         BIGINT NOT NULL,
    kind        TEXT NOT NULL,
    payload     TEXT NOT NULL,
    at          BIGINT NOT NULL,
    PRIMARY KEY (instance_id, seq)
);
"#,
    },
    Migration {
        version: 2,
        name: "cancel requests",
        // Set by `request_cancel` on a pending or running operation: the replica running it stops
        // it at a safe point (it is notified, and checks with every heartbeat).
        sql: r#"
ALTER TABLE operations ADD COLUMN cancel_requested BOOLEAN NOT NULL DEFAULT FALSE;
"#,
    },
    Migration {
        version: 3,
        name: "shared assets",
        // Local assets a plan carried, so any replica can execute it: keyed by
        // `sha256:<hex>/<name>` (a content digest), the content as the engine encodes it.
        sql: r#"
CREATE TABLE assets (
    key        TEXT PRIMARY KEY,
    content    BYTEA NOT NULL,
    created_at BIGINT NOT NULL
);
"#,
    },
    Migration {
        version: 4,
        name: "operation event positions",
        // The instance's last event sequence number when the operation was recorded: a watch
        // of the operation starts there instead of reading the instance's whole history.
        sql: r#"
ALTER TABLE operations ADD COLUMN events_after BIGINT NOT NULL DEFAULT 0;
"#,
    },
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS[MIGRATIONS.len() - 1].version;

/// Brings the schema (the connection's `search_path`) up to [`SCHEMA_VERSION`]. Refuses a
/// schema written by a newer engine rather than guessing at tables it does not know.
pub(super) async fn migrate(client: &mut Client, now: Timestamp) -> Result<()> {
    let tx = client.transaction().await?;
    // Serializes replicas migrating the same schema; released at commit or rollback.
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('trellis-state migrations ' || current_schema()))",
        &[],
    )
    .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    BIGINT PRIMARY KEY,
             name       TEXT NOT NULL,
             applied_at BIGINT NOT NULL
         )",
    )
    .await?;
    let current: i64 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_migrations",
            &[],
        )
        .await?
        .try_get(0)?;
    if current > SCHEMA_VERSION {
        return Err(StateError::Db(format!(
            "the PostgreSQL state schema has version {current}, newer than this engine supports \
             ({SCHEMA_VERSION}); run a newer trellis"
        )));
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > current) {
        tx.batch_execute(m.sql).await?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
            &[&m.version, &m.name, &now.as_millis()],
        )
        .await?;
        tracing::info!(
            version = m.version,
            name = m.name,
            "PostgreSQL state schema migrated"
        );
    }
    tx.commit().await?;
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
}

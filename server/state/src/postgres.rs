//! [`PostgresStore`]: the state store on PostgreSQL, for engines that keep their state in a
//! database server rather than a data directory.
//!
//! - Same semantics as [`SqliteStore`](crate::SqliteStore) (the conformance suite runs against
//!   both). Every call is one transaction on a pooled connection.
//! - Serialization: SQLite has one writer; here every write to an instance first locks the
//!   instance's row (`SELECT ... FOR NO KEY UPDATE`) and checks fencing, versions and statuses
//!   under that lock. The row holds the instance's `last_seq`, so sequence numbers are assigned
//!   under the lock too: gap-free and never reused however many writers (or replicas) there are.
//!   Writes that touch several instances (interruption recovery, retention) lock them in id
//!   order, so two of them cannot deadlock. Idempotent creates (operations, change sets) take a
//!   transaction-level advisory lock on the request id, so concurrent retries of one request
//!   record it once.
//! - Reads run in a `REPEATABLE READ READ ONLY` transaction: one snapshot per call.
//! - Time comes from the store's [`Clock`], never the server's `now()`.
//! - Every connection has a `statement_timeout`, so a stuck lock or query fails a call instead
//!   of hanging it.
//! - Waiting for events and cancel requests: the in-process [`Notifier`], woken after each
//!   commit of this process and, through `LISTEN`/`NOTIFY`, of every other replica's
//!   (`postgres/listen.rs`): a commit notifies in its own transaction.
//! - Backups are `pg_dump`'s job: [`StateStore::backup`] says so.
//! - The password (in the URL or [`PostgresOptions::password`]) never appears in a message:
//!   [`redact_url`] is what gets printed.

mod listen;
mod pool;
mod rows;
mod schema;

use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_postgres::error::SqlState;
use tokio_postgres::{IsolationLevel, Transaction};
use trellis_ids::new_id;

use super::StateStore;
use super::clock::{Clock, SystemClock};
use super::error::{Conflict, Result, StateError};
use super::model::*;
use super::notify::{EventSubscription, Notifier};
use super::sqlite::StateBackup;
use rows::*;

pub use schema::SCHEMA_VERSION;

#[derive(Clone)]
pub struct PostgresOptions {
    /// The time source for timestamps, lease expiry and retention.
    pub clock: Arc<dyn Clock>,
    /// Set on every connection: a statement running longer fails instead of hanging a call.
    pub statement_timeout: Duration,
    /// How long opening a connection may take.
    pub connect_timeout: Duration,
    /// Connections open at most; callers beyond that wait for one.
    pub max_connections: usize,
    /// The password, when it is not in the URL (from the environment or a file); overrides one
    /// that is.
    pub password: Option<String>,
    /// The schema holding the tables (created if missing); `None` is the server's default
    /// `search_path` (normally `public`).
    pub schema: Option<String>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            clock: Arc::new(SystemClock),
            statement_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            max_connections: 10,
            password: None,
            schema: None,
        }
    }
}

impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("statement_timeout", &self.statement_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_connections", &self.max_connections)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

/// `url` with its password (URL userinfo or a `password=` setting) replaced by `***`: what to
/// print wherever a state URL is shown.
pub fn redact_url(url: &str) -> String {
    if let Some(scheme_end) = url.find("://") {
        let rest = &url[scheme_end + 3..];
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let authority = match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                match userinfo.find(':') {
                    Some(colon) => format!("{}:***{}", &userinfo[..colon], &authority[at..]),
                    None => authority.to_owned(),
                }
            }
            None => authority.to_owned(),
        };
        let tail = redact_password_params(tail, '&');
        return format!("{}://{authority}{tail}", &url[..scheme_end]);
    }
    // The key=value form: `host=... password=...`.
    redact_password_params(url, ' ')
}

fn redact_password_params(s: &str, sep: char) -> String {
    s.split(sep)
        .map(|part| {
            let (lead, item) = match part.find('?') {
                Some(q) if sep == '&' => part.split_at(q + 1),
                _ => ("", part),
            };
            match item.split_once('=') {
                Some((key, _)) if key.trim().eq_ignore_ascii_case("password") => {
                    format!("{lead}{key}=***")
                }
                _ => part.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(&sep.to_string())
}

/// The PostgreSQL state store. Cheap to clone (shared handle).
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: pool::Pool,
    notifier: Arc<Notifier>,
    /// Where commits and cancel requests are announced to every replica.
    channel: String,
    _listener: listen::Listener,
    options: PostgresOptions,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.inner.pool.target())
            .finish_non_exhaustive()
    }
}

/// A write's body: gets the open transaction, returns a future borrowing it.
type WriteFn<T> =
    Box<dyn for<'a, 't> FnOnce(&'a mut W<'t>) -> BoxFuture<'a, Result<T>> + Send + 'static>;
type ReadFn<T> =
    Box<dyn for<'a, 't> FnOnce(&'a Transaction<'t>) -> BoxFuture<'a, Result<T>> + Send + 'static>;
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl PostgresStore {
    /// Connects to `url` (`postgres://user@host:port/db?...` or `host=... dbname=...`), creates
    /// the schema if `options.schema` names one, and migrates it (safe when several engines
    /// start at once).
    pub async fn connect(url: &str, options: PostgresOptions) -> Result<Self> {
        let shown = redact_url(url);
        let mut config = tokio_postgres::Config::from_str(url)
            .map_err(|e| StateError::Db(format!("invalid PostgreSQL URL {shown}: {e}")))?;
        if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            return Err(StateError::Db(format!(
                "{shown} asks for TLS (sslmode=require), which this engine does not speak to \
                 PostgreSQL yet: reach the database over a private network without it"
            )));
        }
        if let Some(password) = &options.password {
            config.password(password.as_bytes());
        }
        if config.get_application_name().is_none() {
            config.application_name("trellis");
        }
        config.connect_timeout(options.connect_timeout);
        let timeout_ms = options.statement_timeout.as_millis().max(1);
        let mut setup = format!("SET statement_timeout = {timeout_ms};");
        if let Some(schema) = &options.schema {
            setup.push_str(&format!(" SET search_path TO {};", quote_ident(schema)));
        }
        let pool = pool::Pool::new(
            config.clone(),
            setup,
            shown.clone(),
            options.max_connections,
        );
        {
            let mut conn = pool.get().await?;
            let client = conn.client();
            if let Some(schema) = &options.schema {
                // Replicas may race to create it; IF NOT EXISTS can still fail on the catalog's
                // unique index then, so the lock serializes them.
                let tx = client.transaction().await?;
                tx.execute(
                    "SELECT pg_advisory_xact_lock(hashtext('trellis-state schema ' || $1))",
                    &[schema],
                )
                .await?;
                tx.batch_execute(&format!(
                    "CREATE SCHEMA IF NOT EXISTS {}",
                    quote_ident(schema)
                ))
                .await?;
                tx.commit().await?;
            }
            schema::migrate(client, options.clock.now())
                .await
                .map_err(|e| match e {
                    StateError::Db(m) => StateError::Db(format!(
                        "migrating the PostgreSQL state at {}: {m}",
                        pool.target()
                    )),
                    other => other,
                })?;
        }
        let notifier = Arc::new(Notifier::default());
        let channel = listen::channel(options.schema.as_deref());
        let listener = listen::start(config, shown, channel.clone(), notifier.clone()).await?;
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                pool,
                notifier,
                channel,
                _listener: listener,
                options,
            }),
        })
    }

    /// The database server's clock minus the store's clock, in milliseconds (the query's
    /// round trip halved out). Timestamps and lease expiry come from each engine's clock, so
    /// replicas must agree on the time: a large skew is worth a warning.
    pub async fn clock_skew(&self) -> Result<i64> {
        let mut conn = self.inner.pool.get().await?;
        let before = self.inner.options.clock.now().as_millis();
        let server: i64 = conn
            .client()
            .query_one(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT",
                &[],
            )
            .await?
            .try_get(0)?;
        let after = self.inner.options.clock.now().as_millis();
        Ok(server - (before + after) / 2)
    }

    /// Runs `f` as one write transaction and returns once it committed; then wakes the watchers
    /// of every instance that got events. An error from `f` rolls everything back. It runs on
    /// a task of its own, so a caller that stops waiting (its future dropped) does not cut a
    /// unit of work in half: it still commits or rolls back, as with SQLite.
    async fn write<T: Send + 'static>(&self, f: WriteFn<T>) -> Result<T> {
        let store = self.clone();
        tokio::spawn(async move { store.write_now(f).await })
            .await
            .map_err(|e| StateError::Db(format!("state task failed: {e}")))?
    }

    async fn write_now<T: Send + 'static>(&self, f: WriteFn<T>) -> Result<T> {
        let started = std::time::Instant::now();
        let mut conn = self.inner.pool.get().await?;
        let statements = conn.statements();
        let tx = conn.client().transaction().await?;
        let mut w = W {
            statements: &statements,
            tx: &tx,
            now: self.inner.options.clock.now(),
            appended: Vec::new(),
            channel: &self.inner.channel,
        };
        let result = f(&mut w).await;
        let appended = std::mem::take(&mut w.appended);
        let value = match result {
            Ok(value) => value,
            Err(e) => {
                // A rollback that fails leaves a broken connection, which the pool drops.
                let _ = tx.rollback().await;
                return Err(e);
            }
        };
        if !appended.is_empty() {
            // Delivered to the other replicas when (and only if) the transaction commits.
            let payloads: Vec<String> = appended
                .iter()
                .map(|(instance_id, last_seq, _)| {
                    listen::Message::Events {
                        instance_id,
                        last_seq: *last_seq,
                    }
                    .encode()
                })
                .collect();
            let notify = w
                .stmt("SELECT pg_notify($1, p) FROM unnest($2::TEXT[]) AS p")
                .await?;
            tx.execute(&notify, &[&self.inner.channel, &payloads])
                .await?;
        }
        tx.commit().await?;
        crate::metrics::commit_took(started.elapsed());
        for (instance_id, last_seq, events) in appended {
            crate::metrics::events_written(events);
            self.inner.notifier.notify(&instance_id, last_seq);
        }
        Ok(value)
    }

    /// Runs `f` in one read-only snapshot.
    async fn read<T: Send + 'static>(&self, f: ReadFn<T>) -> Result<T> {
        let mut conn = self.inner.pool.get().await?;
        let tx = conn
            .client()
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let out = f(&tx).await?;
        tx.commit().await?;
        Ok(out)
    }
}

/// A quoted SQL identifier (a schema name from configuration).
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl From<tokio_postgres::Error> for StateError {
    fn from(e: tokio_postgres::Error) -> Self {
        // The server's own words (and code) say more than the driver's summary.
        match e.as_db_error() {
            Some(db) if *db.code() == SqlState::QUERY_CANCELED => {
                StateError::Db(format!("PostgreSQL: {} (statement_timeout)", db.message()))
            }
            Some(db) => {
                StateError::Db(format!("PostgreSQL {}: {}", db.code().code(), db.message()))
            }
            None => StateError::Db(format!("PostgreSQL: {e}")),
        }
    }
}

/// Serializes concurrent transactions about one idempotency key until they end.
async fn lock_request(tx: &Transaction<'_>, scope: &str, request_id: &str) -> Result<()> {
    let key = format!("trellis-state {scope} {request_id}");
    tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&key])
        .await?;
    Ok(())
}

// ---- the write side ---------------------------------------------------------------------------

/// One write transaction: its time, and the instances that got events (to notify after commit).
struct W<'t> {
    tx: &'t Transaction<'t>,
    now: Timestamp,
    /// Per append: the instance, its new last sequence number and how many events.
    appended: Vec<(String, u64, usize)>,
    /// The store's notification channel.
    channel: &'t str,
    /// The connection's prepared statements.
    statements: &'t pool::Statements,
}

impl W<'_> {
    /// `sql` prepared on this connection, once.
    async fn stmt(&self, sql: &str) -> Result<tokio_postgres::Statement> {
        let cached = self
            .statements
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(sql)
            .cloned();
        if let Some(statement) = cached {
            return Ok(statement);
        }
        let statement = self.tx.prepare(sql).await?;
        self.statements
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    fn now_ms(&self) -> i64 {
        self.now.as_millis()
    }

    /// Locks the instance and rejects a lease that is not its current one.
    async fn fence(&self, lease: &Lease) -> Result<Instance> {
        let row = self.tx.query_opt(&self.stmt("SELECT lease_token, lease_epoch FROM instances WHERE id = $1 FOR NO KEY UPDATE").await?,
                &[&lease.instance_id],
            )
            .await?;
        let Some(row) = row else {
            return Err(StateError::not_found("instance", &lease.instance_id));
        };
        let token: Option<String> = col(&row, 0)?;
        let epoch = to_u64(col(&row, 1)?, "lease epoch")?;
        if epoch != lease.epoch || token.as_deref() != Some(lease.token.as_str()) {
            return Err(StateError::Fenced {
                instance_id: lease.instance_id.clone(),
                epoch: lease.epoch,
                current_epoch: epoch,
            });
        }
        get_instance(self.tx, &lease.instance_id).await
    }

    /// Appends events with the next sequence numbers. Returns `(first, last)`.
    async fn append_events(
        &mut self,
        instance_id: &str,
        events: &[NewEvent],
    ) -> Result<(u64, u64)> {
        // Locked (again, if the caller already did): the number is read and advanced under the
        // instance's row lock, so no two transactions get the same one.
        let row = self
            .tx
            .query_opt(
                &self
                    .stmt("SELECT last_seq FROM instances WHERE id = $1 FOR NO KEY UPDATE")
                    .await?,
                &[&instance_id],
            )
            .await?
            .ok_or_else(|| StateError::not_found("instance", instance_id))?;
        let last = to_u64(col(&row, 0)?, "last_seq")?;
        if events.is_empty() {
            return Ok((last + 1, last));
        }
        let insert = self
            .stmt(
                "INSERT INTO events (instance_id, seq, kind, payload, at) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .await?;
        for (i, e) in events.iter().enumerate() {
            let seq = to_i64(last + 1 + i as u64);
            let payload = e.payload.to_string();
            self.tx
                .execute(
                    &insert,
                    &[&instance_id, &seq, &e.kind, &payload, &self.now_ms()],
                )
                .await?;
        }
        let new_last = last + events.len() as u64;
        self.tx
            .execute(
                &self
                    .stmt("UPDATE instances SET last_seq = $2 WHERE id = $1")
                    .await?,
                &[&instance_id, &to_i64(new_last)],
            )
            .await?;
        self.appended
            .push((instance_id.to_owned(), new_last, events.len()));
        Ok((last + 1, new_last))
    }

    async fn bump_version(&self, instance_id: &str) -> Result<u64> {
        let row = self
            .tx
            .query_one(
                &self
                    .stmt(
                        "UPDATE instances SET version = version + 1, updated_at = $2 WHERE id = $1 \
                 RETURNING version",
                    )
                    .await?,
                &[&instance_id, &self.now_ms()],
            )
            .await?;
        to_u64(col(&row, 0)?, "version")
    }

    async fn resource_status(
        &self,
        instance_id: &str,
        name: &str,
    ) -> Result<Option<ResourceStatus>> {
        let row = self
            .tx
            .query_opt(
                &self
                    .stmt("SELECT status FROM resources WHERE instance_id = $1 AND name = $2")
                    .await?,
                &[&instance_id, &name],
            )
            .await?;
        match row {
            Some(row) => Ok(Some(parse_status(
                ResourceStatus::parse,
                col(&row, 0)?,
                &format!("resource {name}"),
            )?)),
            None => Ok(None),
        }
    }

    async fn clear_lease(&self, instance_id: &str) -> Result<()> {
        self.tx
            .execute(
                &self
                    .stmt(
                        "UPDATE instances SET lease_owner = NULL, lease_token = NULL, \
                 lease_expires_at = NULL WHERE id = $1",
                    )
                    .await?,
                &[&instance_id],
            )
            .await?;
        Ok(())
    }

    /// Applies one change of a unit of work (the lease is already checked).
    async fn apply(&self, lease: &Lease, change: &Change) -> Result<()> {
        let inst = lease.instance_id.as_str();
        let now = self.now_ms();
        let tx = self.tx;
        match change {
            Change::ReleaseLease => self.clear_lease(inst).await?,
            Change::InstanceStatus(status) => {
                tx.execute(
                    "UPDATE instances SET status = $2 WHERE id = $1",
                    &[&inst, &status.as_str()],
                )
                .await?;
            }
            Change::InstanceEnvironment(environment) => {
                tx.execute(
                    "UPDATE instances SET environment = $2 WHERE id = $1",
                    &[&inst, &environment.to_string()],
                )
                .await?;
            }
            Change::IntendCreate { .. }
            | Change::ResourceCreated { .. }
            | Change::IntendUpdate { .. }
            | Change::ResourceUpdated { .. }
            | Change::IntendDestroy { .. }
            | Change::ResourceFailed { .. }
            | Change::ResourceRemoved { .. } => self.apply_resource(inst, change).await?,
            Change::PutLink {
                resource_a,
                resource_b,
                link_type,
                status,
                data,
            } => {
                for r in [resource_a, resource_b] {
                    if self.resource_status(inst, r).await?.is_none() {
                        return Err(StateError::not_found("resource", r));
                    }
                }
                tx.execute(
                    "INSERT INTO links (instance_id, resource_a, resource_b, link_type, status, \
                     data, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $7) \
                     ON CONFLICT (instance_id, resource_a, resource_b) DO UPDATE SET \
                     link_type = excluded.link_type, status = excluded.status, \
                     data = excluded.data, updated_at = excluded.updated_at",
                    &[
                        &inst,
                        resource_a,
                        resource_b,
                        link_type,
                        &status.as_str(),
                        &data.to_string(),
                        &now,
                    ],
                )
                .await?;
            }
            Change::RemoveLink {
                resource_a,
                resource_b,
            } => {
                let n = tx
                    .execute(
                        "DELETE FROM links WHERE instance_id = $1 AND resource_a = $2 \
                         AND resource_b = $3",
                        &[&inst, resource_a, resource_b],
                    )
                    .await?;
                if n == 0 {
                    return Err(StateError::not_found(
                        "link",
                        format!("{resource_a} -> {resource_b}"),
                    ));
                }
            }
            Change::PutChild {
                name,
                child_instance_id,
            } => {
                if child_instance_id == inst {
                    return Err(StateError::rejected(format!(
                        "instance `{inst}` cannot be its own child"
                    )));
                }
                let exists = tx
                    .query_opt(
                        "SELECT 1 FROM instances WHERE id = $1",
                        &[child_instance_id],
                    )
                    .await?
                    .is_some();
                if !exists {
                    return Err(StateError::not_found("instance", child_instance_id));
                }
                tx.execute(
                    "INSERT INTO children (instance_id, name, child_instance_id, created_at, \
                     updated_at) VALUES ($1, $2, $3, $4, $4) ON CONFLICT (instance_id, name) \
                     DO UPDATE SET child_instance_id = excluded.child_instance_id, \
                     updated_at = excluded.updated_at",
                    &[&inst, name, child_instance_id, &now],
                )
                .await?;
            }
            Change::RemoveChild { name } => {
                let n = tx
                    .execute(
                        "DELETE FROM children WHERE instance_id = $1 AND name = $2",
                        &[&inst, name],
                    )
                    .await?;
                if n == 0 {
                    return Err(StateError::not_found("child", name));
                }
            }
            Change::PutExport {
                name,
                export_type,
                value,
            } => {
                tx.execute(
                    "INSERT INTO exports (instance_id, name, type, value, updated_at) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (instance_id, name) DO UPDATE SET \
                     type = excluded.type, value = excluded.value, \
                     updated_at = excluded.updated_at",
                    &[&inst, name, export_type, &value.to_string(), &now],
                )
                .await?;
            }
            Change::RemoveExport { name } => {
                let n = tx
                    .execute(
                        "DELETE FROM exports WHERE instance_id = $1 AND name = $2",
                        &[&inst, name],
                    )
                    .await?;
                if n == 0 {
                    return Err(StateError::not_found("export", name));
                }
            }
            Change::ChangeSetStatus { id, status } => {
                let cs = get_change_set_head(tx, id).await?;
                if cs.instance_id != inst {
                    return Err(StateError::rejected(format!(
                        "change set `{id}` belongs to instance `{}`, not `{inst}`",
                        cs.instance_id
                    )));
                }
                change_set_transition(id, cs.status, *status)?;
                tx.execute(
                    "UPDATE change_sets SET status = $2, updated_at = $3 WHERE id = $1",
                    &[id, &status.as_str(), &now],
                )
                .await?;
            }
            Change::OperationStatus { id, status, error } => {
                let op = get_operation(tx, id).await?;
                if op.instance_id != inst {
                    return Err(StateError::rejected(format!(
                        "operation `{id}` belongs to instance `{}`, not `{inst}`",
                        op.instance_id
                    )));
                }
                operation_transition(id, op.status, *status)?;
                // Running records the lease it runs under: `mark_interrupted` compares it with
                // the instance's lease to tell a live operation from an abandoned one.
                let (lease_owner, lease_epoch) = if *status == OperationStatus::Running {
                    (Some(lease.owner.as_str()), Some(to_i64(lease.epoch)))
                } else {
                    (op.lease_owner.as_deref(), op.lease_epoch.map(to_i64))
                };
                let finished = status.is_terminal().then_some(now);
                tx.execute(
                    "UPDATE operations SET status = $2, error = $3, lease_owner = $4, \
                     lease_epoch = $5, updated_at = $6, finished_at = $7 WHERE id = $1",
                    &[
                        id,
                        &status.as_str(),
                        error,
                        &lease_owner,
                        &lease_epoch,
                        &now,
                        &finished,
                    ],
                )
                .await?;
            }
        }
        Ok(())
    }

    async fn apply_resource(&self, inst: &str, change: &Change) -> Result<()> {
        let now = self.now_ms();
        let tx = self.tx;
        let current = self.resource_status(inst, resource_name(change)).await?;
        let next = resource_transition(current, change)?;
        let status = next.map(|s| s.as_str());
        match change {
            Change::IntendCreate {
                name,
                resource_type,
                spec,
                depends_on,
                metadata,
                key,
            } => {
                let deps = Value::from(depends_on.clone()).to_string();
                let sql = if current.is_none() {
                    "INSERT INTO resources (instance_id, name, type, spec, status, created_at, \
                     updated_at, depends_on, metadata, call_key) \
                     VALUES ($1, $2, $3, $4, $5, $6, $6, $7, $8, $9)"
                } else {
                    "UPDATE resources SET type = $3, spec = $4, status = $5, \
                     failure_reason = NULL, updated_at = $6, depends_on = $7, metadata = $8, \
                     call_key = $9 WHERE instance_id = $1 AND name = $2"
                };
                tx.execute(
                    sql,
                    &[
                        &inst,
                        name,
                        resource_type,
                        &spec.to_string(),
                        &status,
                        &now,
                        &deps,
                        &metadata.to_string(),
                        key,
                    ],
                )
                .await?;
            }
            Change::ResourceCreated {
                name,
                external_id,
                state,
            } => {
                tx.execute(
                    "UPDATE resources SET status = $3, external_id = $4, state = $5, \
                     failure_reason = NULL, updated_at = $6 WHERE instance_id = $1 AND name = $2",
                    &[&inst, name, &status, external_id, &state.to_string(), &now],
                )
                .await?;
            }
            Change::IntendUpdate {
                name,
                spec,
                depends_on,
                metadata,
                key,
            } => {
                let deps = Value::from(depends_on.clone()).to_string();
                tx.execute(
                    "UPDATE resources SET status = $3, spec = $4, failure_reason = NULL, \
                     updated_at = $5, depends_on = $6, metadata = $7, call_key = $8 \
                     WHERE instance_id = $1 AND name = $2",
                    &[
                        &inst,
                        name,
                        &status,
                        &spec.to_string(),
                        &now,
                        &deps,
                        &metadata.to_string(),
                        key,
                    ],
                )
                .await?;
            }
            Change::ResourceUpdated {
                name,
                external_id,
                state,
            } => {
                tx.execute(
                    "UPDATE resources SET status = $3, external_id = COALESCE($4, external_id), \
                     state = $5, failure_reason = NULL, updated_at = $6 \
                     WHERE instance_id = $1 AND name = $2",
                    &[&inst, name, &status, external_id, &state.to_string(), &now],
                )
                .await?;
            }
            Change::IntendDestroy { name, key } => {
                tx.execute(
                    "UPDATE resources SET status = $3, failure_reason = NULL, updated_at = $4, \
                     call_key = $5 WHERE instance_id = $1 AND name = $2",
                    &[&inst, name, &status, &now, key],
                )
                .await?;
            }
            Change::ResourceFailed { name, reason } => {
                tx.execute(
                    "UPDATE resources SET status = $3, failure_reason = $4, updated_at = $5 \
                     WHERE instance_id = $1 AND name = $2",
                    &[&inst, name, &status, reason, &now],
                )
                .await?;
            }
            Change::ResourceRemoved { name } => {
                let link = tx
                    .query_opt(
                        "SELECT resource_a, resource_b FROM links WHERE instance_id = $1 \
                         AND (resource_a = $2 OR resource_b = $2) LIMIT 1",
                        &[&inst, name],
                    )
                    .await?;
                if let Some(row) = link {
                    let (a, b): (String, String) = (col(&row, 0)?, col(&row, 1)?);
                    return Err(StateError::Conflict(Conflict::InUse {
                        kind: "resource",
                        id: name.clone(),
                        by: format!("link {a} -> {b}"),
                    }));
                }
                tx.execute(
                    "DELETE FROM resources WHERE instance_id = $1 AND name = $2",
                    &[&inst, name],
                )
                .await?;
            }
            // `resource_transition` already refused anything else.
            other => {
                return Err(StateError::rejected(format!(
                    "not a resource change: {other:?}"
                )));
            }
        }
        Ok(())
    }
}

// ---- the trait --------------------------------------------------------------------------------

#[async_trait::async_trait]
impl StateStore for PostgresStore {
    async fn create_instance(&self, name: &str) -> Result<Instance> {
        non_empty("instance name", name)?;
        let name = name.to_owned();
        self.write(Box::new(move |w| {
            Box::pin(async move {
                let id = new_id("ins");
                // The unique name decides between concurrent creates; the loser sees no row.
                let inserted =
                    w.tx.query_opt(
                        &w.stmt(
                            "INSERT INTO instances (id, name, status, version, last_seq, \
                         pruned_through, lease_epoch, created_at, updated_at) \
                         VALUES ($1, $2, $3, 0, 0, 0, 0, $4, $4) \
                         ON CONFLICT (name) DO NOTHING RETURNING id",
                        )
                        .await?,
                        &[&id, &name, &InstanceStatus::New.as_str(), &w.now_ms()],
                    )
                    .await?;
                if inserted.is_none() {
                    return Err(StateError::Conflict(Conflict::NameTaken { name }));
                }
                w.append_events(
                    &id,
                    &[NewEvent::new("instance.created", json!({ "name": name }))],
                )
                .await?;
                get_instance(w.tx, &id).await
            })
        }))
        .await
    }

    async fn get_instance(&self, instance_id: &str) -> Result<Instance> {
        let id = instance_id.to_owned();
        self.read(Box::new(move |tx| {
            Box::pin(async move { get_instance(tx, &id).await })
        }))
        .await
    }

    async fn find_instance(&self, name: &str) -> Result<Option<Instance>> {
        let name = name.to_owned();
        self.read(Box::new(move |tx| {
            Box::pin(async move {
                let sql = format!("SELECT {INSTANCE_COLS} FROM instances WHERE name = $1");
                tx.query_opt(&sql, &[&name])
                    .await?
                    .map(|row| decode_instance(&row))
                    .transpose()
            })
        }))
        .await
    }

    async fn list_instances(&self) -> Result<Vec<Instance>> {
        self.read(Box::new(|tx| {
            Box::pin(async move {
                let sql = format!("SELECT {INSTANCE_COLS} FROM instances ORDER BY pos");
                tx.query(&sql, &[])
                    .await?
                    .iter()
                    .map(decode_instance)
                    .collect()
            })
        }))
        .await
    }

    async fn count_resources(&self, instance_id: &str) -> Result<u64> {
        let id = instance_id.to_owned();
        self.read(Box::new(move |tx| {
            Box::pin(async move {
                get_instance(tx, &id).await?;
                let row = tx
                    .query_one(
                        "SELECT COUNT(*) FROM resources WHERE instance_id = $1",
                        &[&id],
                    )
                    .await?;
                to_u64(col(&row, 0)?, "resource count")
            })
        }))
        .await
    }

    async fn get_resource(&self, instance_id: &str, name: &str) -> Result<Option<Resource>> {
        let (id, name) = (instance_id.to_owned(), name.to_owned());
        self.read(Box::new(move |tx| {
            Box::pin(async move {
                get_instance(tx, &id).await?;
                tx.query_opt(
                    &format!(
                        "SELECT {RESOURCE_COLS} FROM resources WHERE instance_id = $1 AND name = $2"
                    ),
                    &[&id, &name],
                )
                .await?
                .as_ref()
                .map(decode_resource)
                .transpose()
            })
        }))
        .await
    }

    async fn load_state(&self, instance_id: &str) -> Result<InstanceState> {
        let id = instance_id.to_owned();
        self.read(Box::new(move |tx| {
            Box::pin(async move {
                let instance = get_instance(tx, &id).await?;
                let resources = list(tx, RESOURCE_COLS, "resources", &id, decode_resource).await?;
                let links = list(tx, LINK_COLS, "links", &id, decode_link).await?;
                let children = list(tx, CHILD_COLS, "children", &id, decode_child).await?;
                let exports = list(tx, EXPORT_COLS, "exports", &id, decode_export).await?;
                Ok(InstanceState {
                    instance,
                    resources,
                    links,
                    children,
                    exports,
                })
            })
        }))
        .await
    }

    async fn acquire_lease(&self, instance_id: &str, owner: &str, ttl: Duration) -> Result<Lease> {
        non_empty("lease owner", owner)?;
        let (id, owner) = (instance_id.to_owned(), owner.to_owned());
        self.write(Box::new(move |w| {
            Box::pin(async move {
                let instance = lock_instance(w.tx, &id).await?;
                if let Some(holder) = instance.lease
                    && holder.expires_at > w.now
                {
                    return Err(StateError::Conflict(Conflict::LeaseHeld {
                        instance_id: id,
                        owner: holder.owner,
                        epoch: instance.lease_epoch,
                        expires_at: holder.expires_at,
                    }));
                }
                let lease = Lease {
                    instance_id: id,
                    owner,
                    token: new_id("lease"),
                    epoch: instance.lease_epoch + 1,
                    expires_at: w.now.plus(ttl),
                };
                w.tx.execute(&w.stmt("UPDATE instances SET lease_epoch = $2, lease_owner = $3, lease_token = $4, \
                     lease_expires_at = $5 WHERE id = $1").await?,
                    &[
                        &lease.instance_id,
                        &to_i64(lease.epoch),
                        &lease.owner,
                        &lease.token,
                        &lease.expires_at.as_millis(),
                    ],
                )
                .await?;
                Ok(lease)
            })
        }))
        .await
    }

    async fn heartbeat(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let mut lease = lease.clone();
        self.write(Box::new(move |w| {
            Box::pin(async move {
                w.fence(&lease).await?;
                lease.expires_at = w.now.plus(ttl);
                w.tx.execute(
                    &w.stmt("UPDATE instances SET lease_expires_at = $2 WHERE id = $1")
                        .await?,
                    &[&lease.instance_id, &lease.expires_at.as_millis()],
                )
                .await?;
                Ok(lease)
            })
        }))
        .await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<()> {
        let lease = lease.clone();
        self.write(Box::new(move |w| {
            Box::pin(async move {
                w.fence(&lease).await?;
                w.clear_lease(&lease.instance_id).await
            })
        }))
        .await
    }

    async fn commit(
        &self,
        lease: &Lease,
        changes: Vec<Change>,
        events: Vec<NewEvent>,
    ) -> Result<Committed> {
        let lease = lease.clone();
        self.write(Box::new(move |w| {
            Box::pin(async move {
                w.fence(&lease).await?;
                if let Some(i) = changes
                    .iter()
                    .position(|c| matches!(c, Change::ReleaseLease))
                    && i + 1 != changes.len()
                {
                    return Err(StateError::rejected(
                        "the lease can only be released by the last change of a unit",
                    ));
                }
                for change in &changes {
                    w.apply(&lease, change).await?;
                }
                let version = w.bump_version(&lease.instance_id).await?;
                let (first_seq, last_seq) = w.append_events(&lease.instance_id, &events).await?;
                Ok(Committed {
                    version,
                    first_seq,
                    last_seq,
                })
            })
        }))
        .await
    }

    async fn create_change_set(&self, new: NewChangeSet) -> Result<ChangeSet> {
        if let Some(key) = &new.request {
            non_empty("request id", &key.id)?;
        }
        self.write(Box::new(move |w| {
            Box::pin(async move {
                // Under the request's lock, so two concurrent retries of one request cannot
                // both record a change set.
                if let Some(key) = &new.request {
                    lock_request(w.tx, "change set", &key.id).await?;
                    if let Some(cs) = find_change_set(w.tx, &key.id).await? {
                        return same_request(cs, key);
                    }
                }
                let instance = lock_instance(w.tx, &new.instance_id).await?;
                if new.planned_version > instance.version {
                    return Err(StateError::rejected(format!(
                        "change set planned against version {} of instance `{}`, which is only \
                         at version {}",
                        new.planned_version, instance.id, instance.version
                    )));
                }
                let id = new_id("cs");
                w.tx.execute(
                    &w.stmt(
                        "INSERT INTO change_sets (id, instance_id, planned_version, digest, body, \
                     status, created_at, updated_at, request_id, request_digest) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8, $9)",
                    )
                    .await?,
                    &[
                        &id,
                        &new.instance_id,
                        &to_i64(new.planned_version),
                        &new.digest,
                        &new.body.to_string(),
                        &ChangeSetStatus::Planned.as_str(),
                        &w.now_ms(),
                        &new.request.as_ref().map(|k| k.id.as_str()),
                        &new.request.as_ref().map(|k| k.digest.as_str()),
                    ],
                )
                .await?;
                w.append_events(
                    &new.instance_id,
                    &[NewEvent::new(
                        "change_set.planned",
                        json!({ "changeSet": id, "plannedVersion": new.planned_version }),
                    )],
                )
                .await?;
                // Read back without the body, which is the one just written.
                Ok(ChangeSet {
                    body: new.body,
                    ..get_change_set_head(w.tx, &id).await?
                })
            })
        }))
        .await
    }

    async fn get_change_set(&self, change_set_id: &str) -> Result<ChangeSet> {
        let id = change_set_id.to_owned();
        self.read(Box::new(move |tx| {
            Box::pin(async move { get_change_set(tx, &id).await })
        }))
        .await
    }

    async fn get_change_set_head(&self, change_set_id: &str) -> Result<ChangeSet> {
        let id = change_set_id.to_owned();
        self.read(Box::new(move |tx| {
            Box::pin(async move { get_change_set_head(tx, &id).await })
        }))
        .await
    }

    async fn find_change_set(&self, request: &RequestKey) -> Result<Option<ChangeSet>> {
        let key = request.clone();
        self.read(Box::new(move |tx| {
            Box::pin(async move {
                find_change_set(tx, &key.id)
                    .await?
                    .map(|cs| same_request(cs, &key))
                    .transpose()
            })
        }))
        .await
    }

    async fn list_change_sets(&self, instance_id: &str) -> Result<Vec<ChangeSet>> {
        let id = instance_id.to_owned();
        self.read(Box::new(move |tx| {
            Box::pin(async move {
                get_instance(tx, &id).await?;
                list(tx, CHANGE_SET_COLS, "change_sets", &id, decode_change_set).await
            })
        }))
        .await
    }

    async fn begin_execution(&self, change_set_id: &str, lease: &Lease) -> Result<Committed> {
        let (id, lease) = (change_set_id.to_owned(), lease.clone());
        // The inner result is the answer; a `Stale` answer still commits (marking the change
        // set superseded), so it travels as `Ok(Err(..))` through the transaction.
        self.write(Box::new(move |w| {
            Box::pin(async move {
                let instance = w.fence(&lease).await?;
                let cs = get_change_set_head(w.tx, &id).await?;
                if cs.instance_id != lease.instance_id {
                    return Err(StateError::rejected(format!(
                        "change set `{id}` belongs to instance `{}`, not `{}`",
                        cs.instance_id, lease.instance_id
                    )));
                }
                let stale = StateError::Stale {
                    change_set_id: id.clone(),
                    planned_version: cs.planned_version,
                    current_version: instance.version,
                };
                match cs.status {
                    ChangeSetStatus::Planned => {}
                    ChangeSetStatus::Superseded => return Ok(Err(stale)),
                    status => {
                        return Ok(Err(StateError::AlreadyExecuted {
                            change_set_id: id,
                            status,
                        }));
                    }
                }
                let now = w.now_ms();
                let set_status =
                    "UPDATE change_sets SET status = $2, updated_at = $3 WHERE id = $1";
                if cs.planned_version != instance.version {
                    w.tx.execute(
                        set_status,
                        &[&id, &ChangeSetStatus::Superseded.as_str(), &now],
                    )
                    .await?;
                    w.append_events(
                        &cs.instance_id,
                        &[NewEvent::new(
                            "change_set.superseded",
                            json!({ "changeSet": id, "currentVersion": instance.version }),
                        )],
                    )
                    .await?;
                    return Ok(Err(stale));
                }
                w.tx.execute(
                    set_status,
                    &[&id, &ChangeSetStatus::Executing.as_str(), &now],
                )
                .await?;
                // Every other plan of this instance read the version this execution is about
                // to change: they are stale from now on. Listed in planning order, as SQLite.
                let superseded: Vec<String> =
                    w.tx.query(
                        &w.stmt(
                            "WITH s AS (UPDATE change_sets SET status = $3, updated_at = $4 \
                         WHERE instance_id = $1 AND status = $2 AND id != $5 RETURNING id, pos) \
                         SELECT id FROM s ORDER BY pos",
                        )
                        .await?,
                        &[
                            &cs.instance_id,
                            &ChangeSetStatus::Planned.as_str(),
                            &ChangeSetStatus::Superseded.as_str(),
                            &now,
                            &id,
                        ],
                    )
                    .await?
                    .iter()
                    .map(|row| col(row, 0))
                    .collect::<Result<_>>()?;
                let version = w.bump_version(&cs.instance_id).await?;
                let (first_seq, last_seq) = w
                    .append_events(
                        &cs.instance_id,
                        &[NewEvent::new(
                            "change_set.executing",
                            json!({ "changeSet": id, "superseded": superseded }),
                        )],
                    )
                    .await?;
                Ok(Ok(Committed {
                    version,
                    first_seq,
                    last_seq,
                }))
            })
        }))
        .await?
    }

    async fn create_operation(&self, new: NewOperation) -> Result<Accepted> {
        non_empty("request id", &new.request_id)?;
        non_empty("operation owner", &new.owner)?;
        self.write(Box::new(move |w| {
            Box::pin(async move {
                // Under the request's lock, so two concurrent retries of one request cannot
                // both create an operation.
                lock_request(w.tx, "operation", &new.request_id).await?;
                if let Some(op) = find_operation(w.tx, &new.request_id).await? {
                    if op.request_digest != new.request_digest {
                        return Err(StateError::RequestIdReused {
                            request_id: new.request_id,
                        });
                    }
                    return Ok(Accepted {
                        operation: op,
                        created: false,
                    });
                }
                lock_instance(w.tx, &new.instance_id).await?;
                if let Some(cs_id) = &new.change_set_id {
                    let cs = get_change_set_head(w.tx, cs_id).await?;
                    if cs.instance_id != new.instance_id {
                        return Err(StateError::rejected(format!(
                            "change set `{cs_id}` belongs to instance `{}`, not `{}`",
                            cs.instance_id, new.instance_id
                        )));
                    }
                }
                let id = new_id("op");
                w.tx.execute(&w.stmt("INSERT INTO operations (id, instance_id, kind, request_id, request_digest, \
                     change_set_id, owner, status, created_at, updated_at, events_after) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, \
                     COALESCE((SELECT last_seq FROM instances WHERE id = $2), 0))").await?,
                    &[
                        &id,
                        &new.instance_id,
                        &new.kind.as_str(),
                        &new.request_id,
                        &new.request_digest,
                        &new.change_set_id,
                        &new.owner,
                        &OperationStatus::Pending.as_str(),
                        &w.now_ms(),
                    ],
                )
                .await?;
                w.append_events(
                    &new.instance_id,
                    &[NewEvent::new(
                        "operation.accepted",
                        json!({ "operation": id, "kind": new.kind.as_str(),
                                "requestId": new.request_id }),
                    )],
                )
                .await?;
                Ok(Accepted {
                    operation: get_operation(w.tx, &id).await?,
                    created: true,
                })
            })
        }))
        .await
    }

    async fn get_operation(&self, operation_id: &str) -> Result<Operation> {
        let id = operation_id.to_owned();
        self.read(Box::new(move |tx| {
            Box::pin(async move { get_operation(tx, &id).await })
        }))
        .await
    }

    async fn find_operation(&self, request_id: &str) -> Result<Option<Operation>> {
        let id = request_id.to_owned();
        self.read(Box::new(move |tx| {
            Box::pin(async move { find_operation(tx, &id).await })
        }))
        .await
    }

    async fn request_cancel(&self, operation_id: &str) -> Result<bool> {
        let id = operation_id.to_owned();
        let open = self
            .write(Box::new(move |w| {
                Box::pin(async move {
                    get_operation(w.tx, &id).await?;
                    let n =
                        w.tx.execute(
                            &w.stmt(
                                "UPDATE operations SET cancel_requested = TRUE \
                             WHERE id = $1 AND status IN ($2, $3)",
                            )
                            .await?,
                            &[
                                &id,
                                &OperationStatus::Pending.as_str(),
                                &OperationStatus::Running.as_str(),
                            ],
                        )
                        .await?;
                    if n > 0 {
                        // Reaches the replica running it (this one included) at commit.
                        let payload = listen::Message::Cancel { operation_id: &id }.encode();
                        w.tx.execute(
                            &w.stmt("SELECT pg_notify($1, $2)").await?,
                            &[&w.channel, &payload],
                        )
                        .await?;
                    }
                    Ok(n > 0)
                })
            }))
            .await?;
        if open {
            // Not waiting for the notification's round trip through the server.
            self.inner.notifier.cancel(operation_id);
        }
        Ok(open)
    }

    async fn cancel_requested(&self, operation_id: &str) -> Result<bool> {
        let id = operation_id.to_owned();
        self.read(Box::new(move |tx| {
            Box::pin(async move {
                get_operation(tx, &id).await?;
                Ok(tx
                    .query_one(
                        "SELECT cancel_requested FROM operations WHERE id = $1",
                        &[&id],
                    )
                    .await?
                    .try_get(0)?)
            })
        }))
        .await
    }

    fn cancel_requests(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.inner.notifier.cancel_requests()
    }

    fn shares_assets(&self) -> bool {
        true
    }

    async fn put_asset(&self, key: &str, content: Vec<u8>) -> Result<()> {
        non_empty("asset key", key)?;
        let key = key.to_owned();
        self.write(Box::new(move |w| {
            Box::pin(async move {
                // The key is a digest of the content: a row already there holds the same.
                w.tx.execute(
                    &w.stmt(
                        "INSERT INTO assets (key, content, created_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (key) DO NOTHING",
                    )
                    .await?,
                    &[&key, &content, &w.now_ms()],
                )
                .await?;
                Ok(())
            })
        }))
        .await
    }

    async fn get_asset(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let key = key.to_owned();
        self.read(Box::new(move |tx| {
            Box::pin(async move {
                Ok(tx
                    .query_opt("SELECT content FROM assets WHERE key = $1", &[&key])
                    .await?
                    .map(|row| row.try_get::<_, Vec<u8>>(0))
                    .transpose()?)
            })
        }))
        .await
    }

    async fn list_operations(&self, instance_id: &str) -> Result<Vec<Operation>> {
        let id = instance_id.to_owned();
        self.read(Box::new(move |tx| {
            Box::pin(async move {
                get_instance(tx, &id).await?;
                list(tx, OPERATION_COLS, "operations", &id, decode_operation).await
            })
        }))
        .await
    }

    async fn mark_interrupted(&self, scope: InterruptScope) -> Result<Vec<Operation>> {
        self.write(Box::new(move |w| {
            Box::pin(async move {
                let now = w.now;
                let pending = OperationStatus::Pending.as_str();
                let running = OperationStatus::Running.as_str();
                let owner = match &scope {
                    InterruptScope::Owner(o) | InterruptScope::ShutDown(o) => Some(o.as_str()),
                    InterruptScope::Expired => None,
                };
                if owner.is_none() {
                    // Replicas run this every few seconds: when no running operation's lease
                    // lapsed (the usual case), finish without locking any instance.
                    let lapsed =
                        w.tx.query_opt(&w.stmt("SELECT 1 FROM operations o JOIN instances i ON i.id = o.instance_id \
                             WHERE o.status = $1 AND NOT COALESCE(i.lease_owner IS NOT NULL \
                             AND i.lease_expires_at > $2 AND i.lease_epoch = o.lease_epoch, \
                             FALSE) LIMIT 1").await?,
                            &[&running, &now.as_millis()],
                        )
                        .await?;
                    if lapsed.is_none() {
                        return Ok(Vec::new());
                    }
                }
                // Every instance this may write, locked up front in id order (see the module
                // docs); the open operations are read after, under those locks.
                w.tx.query(&w.stmt("SELECT id FROM instances WHERE id IN (SELECT instance_id FROM operations \
                     WHERE status IN ($1, $2)) OR ($3::TEXT IS NOT NULL AND lease_owner = $3) \
                     ORDER BY id FOR NO KEY UPDATE").await?,
                    &[&pending, &running, &owner],
                )
                .await?;
                let sql = format!(
                    "SELECT {OPERATION_COLS} FROM operations WHERE status IN ($1, $2) ORDER BY pos"
                );
                let open: Vec<Operation> =
                    w.tx.query(&sql, &[&pending, &running])
                        .await?
                        .iter()
                        .map(decode_operation)
                        .collect::<Result<_>>()?;

                let mut interrupted = Vec::new();
                let mut revoke = Vec::new();
                for op in open {
                    let reason = match &scope {
                        InterruptScope::Owner(owner)
                            if op.owner == *owner || op.lease_owner.as_ref() == Some(owner) =>
                        {
                            format!("engine `{owner}` restarted while the operation was unfinished")
                        }
                        InterruptScope::ShutDown(owner)
                            if op.owner == *owner || op.lease_owner.as_ref() == Some(owner) =>
                        {
                            format!(
                                "engine `{owner}` shut down before the operation finished (its \
                                 drain timeout ran out)"
                            )
                        }
                        InterruptScope::Owner(_) | InterruptScope::ShutDown(_) => continue,
                        InterruptScope::Expired => {
                            // Pending operations have no lease yet: a live engine may be about
                            // to start them. Only its own restart (`Owner`) recovers those.
                            if op.status != OperationStatus::Running {
                                continue;
                            }
                            let instance = get_instance(w.tx, &op.instance_id).await?;
                            let live = instance.lease.as_ref().is_some_and(|l| l.expires_at > now)
                                && Some(instance.lease_epoch) == op.lease_epoch;
                            if live {
                                continue;
                            }
                            if instance.lease.is_some()
                                && Some(instance.lease_epoch) == op.lease_epoch
                            {
                                // Expired but never taken over: revoke, so the paused engine
                                // that held it is fenced if it wakes up.
                                revoke.push(op.instance_id.clone());
                            }
                            "the operation's lease expired".to_owned()
                        }
                    };
                    w.tx.execute(&w.stmt("UPDATE operations SET status = $2, error = $3, updated_at = $4, \
                         finished_at = $4 WHERE id = $1").await?,
                        &[
                            &op.id,
                            &OperationStatus::Interrupted.as_str(),
                            &reason,
                            &now.as_millis(),
                        ],
                    )
                    .await?;
                    if let Some(cs) = &op.change_set_id {
                        w.tx.execute(&w.stmt("UPDATE change_sets SET status = $3, updated_at = $4 \
                             WHERE id = $1 AND status = $2").await?,
                            &[
                                cs,
                                &ChangeSetStatus::Executing.as_str(),
                                &ChangeSetStatus::Failed.as_str(),
                                &now.as_millis(),
                            ],
                        )
                        .await?;
                    }
                    w.append_events(
                        &op.instance_id,
                        &[NewEvent::new(
                            "operation.interrupted",
                            json!({ "operation": op.id, "reason": reason }),
                        )],
                    )
                    .await?;
                    interrupted.push(op.id);
                }

                for id in revoke {
                    w.clear_lease(&id).await?;
                }
                if let Some(owner) = owner {
                    // A restarted (or stopping) engine holds nothing: every lease it had is dead.
                    w.tx.execute(&w.stmt("UPDATE instances SET lease_owner = NULL, lease_token = NULL, \
                         lease_expires_at = NULL WHERE lease_owner = $1").await?,
                        &[&owner],
                    )
                    .await?;
                }
                let mut ops = Vec::with_capacity(interrupted.len());
                for id in &interrupted {
                    ops.push(get_operation(w.tx, id).await?);
                }
                Ok(ops)
            })
        }))
        .await
    }

    async fn events_since(
        &self,
        instance_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<Event>> {
        let id = instance_id.to_owned();
        self.read(Box::new(move |tx| {
            Box::pin(async move {
                let instance = get_instance(tx, &id).await?;
                if after_seq < instance.pruned_through {
                    return Err(StateError::EventsPruned {
                        instance_id: id,
                        after_seq,
                        pruned_through: instance.pruned_through,
                    });
                }
                tx.query(
                    "SELECT instance_id, seq, kind, payload, at FROM events \
                     WHERE instance_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                    &[
                        &id,
                        &to_i64(after_seq),
                        &i64::try_from(limit).unwrap_or(i64::MAX),
                    ],
                )
                .await?
                .iter()
                .map(decode_event)
                .collect()
            })
        }))
        .await
    }

    fn subscribe(&self, instance_id: &str) -> EventSubscription {
        self.inner.notifier.subscribe(instance_id)
    }

    async fn backup(&self) -> Result<StateBackup> {
        Err(StateError::Unsupported(format!(
            "the state is in PostgreSQL ({}): back it up with pg_dump, not the engine",
            self.inner.pool.target()
        )))
    }

    async fn prune(&self, policy: &RetentionPolicy) -> Result<PruneReport> {
        let policy = policy.clone();
        self.write(Box::new(move |w| {
            Box::pin(async move {
                let events_cutoff = w.now.minus(policy.events_older_than).as_millis();
                let mut report = PruneReport::default();
                // One replica at a time: another one pruning now does the work for both.
                let ours: bool =
                    w.tx.query_one(
                        &w.stmt(
                            "SELECT pg_try_advisory_xact_lock(\
                         hashtext('trellis-state retention ' || current_schema()))",
                        )
                        .await?,
                        &[],
                    )
                    .await?
                    .try_get(0)?;
                if !ours {
                    report.skipped = true;
                    return Ok(report);
                }
                // Locked in id order (see the module docs): the floor below is read from
                // `last_seq`, which a concurrent commit must not move meanwhile.
                let instances =
                    w.tx.query(
                        &w.stmt(
                            "SELECT id, last_seq, pruned_through FROM instances ORDER BY id \
                         FOR NO KEY UPDATE",
                        )
                        .await?,
                        &[],
                    )
                    .await?;
                for row in &instances {
                    let id: &str = col(row, 0)?;
                    let last_seq: i64 = col(row, 1)?;
                    let pruned_through: i64 = col(row, 2)?;
                    // The newest `keep_last_events` stay whatever their age.
                    let keep_floor = last_seq.saturating_sub(to_i64(policy.keep_last_events));
                    // Remove a prefix of the sequence, never a hole: up to the newest
                    // old-enough event below the floor.
                    let cut: Option<i64> = col(
                        &w.tx
                            .query_one(
                                &w.stmt(
                                    "SELECT MAX(seq) FROM events WHERE instance_id = $1 \
                                 AND at < $2 AND seq <= $3",
                                )
                                .await?,
                                &[&id, &events_cutoff, &keep_floor],
                            )
                            .await?,
                        0,
                    )?;
                    let Some(cut) = cut.filter(|cut| *cut > pruned_through) else {
                        continue;
                    };
                    let n =
                        w.tx.execute(
                            &w.stmt("DELETE FROM events WHERE instance_id = $1 AND seq <= $2")
                                .await?,
                            &[&id, &cut],
                        )
                        .await?;
                    w.tx.execute(
                        &w.stmt("UPDATE instances SET pruned_through = $2 WHERE id = $1")
                            .await?,
                        &[&id, &cut],
                    )
                    .await?;
                    report.events_deleted += n;
                }
                // Executing change sets belong to a running (or interrupted-but-unrecovered)
                // operation; everything else old is history.
                report.change_sets_deleted =
                    w.tx.execute(
                        &w.stmt("DELETE FROM change_sets WHERE created_at < $1 AND status != $2")
                            .await?,
                        &[
                            &w.now.minus(policy.change_sets_older_than).as_millis(),
                            &ChangeSetStatus::Executing.as_str(),
                        ],
                    )
                    .await?;
                Ok(report)
            })
        }))
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://app:s3cr3t@db:5432/trellis?sslmode=disable"),
            "postgres://app:***@db:5432/trellis?sslmode=disable"
        );
        assert_eq!(
            redact_url("postgresql://app@db/trellis"),
            "postgresql://app@db/trellis"
        );
        assert_eq!(
            redact_url("postgres://db/trellis?user=app&password=s3cr3t"),
            "postgres://db/trellis?user=app&password=***"
        );
        assert_eq!(
            redact_url("postgres://db/trellis?password=s3cr3t"),
            "postgres://db/trellis?password=***"
        );
        assert_eq!(
            redact_url("host=db user=app password=s3cr3t dbname=trellis"),
            "host=db user=app password=*** dbname=trellis"
        );
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("test_1"), "\"test_1\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}

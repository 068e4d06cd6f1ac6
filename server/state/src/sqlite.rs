//! [`SqliteStore`]: the embedded state store, `<data dir>/state.db`.
//!
//! - Durability: WAL journal with `synchronous=FULL`, so a commit that returned survives a
//!   crash or power loss; foreign keys on; a busy timeout instead of instant `SQLITE_BUSY`.
//! - One engine per data directory: the `lock` module locks the directory for the store's life.
//! - A data directory that had state keeps it: `marker` refuses to open a missing, emptied or
//!   replaced `state.db`, or one that lost commits (its WAL), instead of starting empty.
//! - Concurrency: one writer connection behind a mutex (SQLite has one writer anyway; the mutex
//!   turns lock contention into a queue) and a small pool of read connections, which WAL lets
//!   read while the writer writes. Every write is a `BEGIN IMMEDIATE` transaction, so the
//!   checks a unit of work makes (fencing, transitions, versions) and its writes are serialized
//!   with every other write: that is what makes sequence numbers gap-free.
//! - Blocking calls run on tokio's blocking pool (`spawn_blocking`), never on async workers.
//!   A call whose future is dropped still finishes its transaction (committed or not).

mod backup;
mod checkpoint;
mod lock;
mod marker;
mod schema;
mod tail;

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use trellis_ids::new_id;

use rusqlite::{
    Connection, ErrorCode, OptionalExtension, Row, Transaction, TransactionBehavior, params,
};
use serde_json::{Value, json};

use super::StateStore;
use super::clock::{Clock, SystemClock};
use super::error::{Conflict, Result, StateError};
use super::model::*;
use super::notify::{EventSubscription, Notifier};

pub use backup::StateBackup;
pub use lock::LOCK_FILE;
pub use marker::MARKER_FILE;
pub use schema::SCHEMA_VERSION;

/// The database file inside the data directory.
pub const DB_FILE: &str = "state.db";

#[derive(Clone)]
pub struct SqliteOptions {
    /// The time source for timestamps, lease expiry and retention.
    pub clock: Arc<dyn Clock>,
    /// How long a statement waits for a lock held by another connection.
    pub busy_timeout: Duration,
    /// Read connections kept open between calls (more are opened under load).
    pub idle_readers: usize,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            clock: Arc::new(SystemClock),
            busy_timeout: Duration::from_secs(5),
            idle_readers: 4,
        }
    }
}

impl std::fmt::Debug for SqliteOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteOptions")
            .field("busy_timeout", &self.busy_timeout)
            .field("idle_readers", &self.idle_readers)
            .finish_non_exhaustive()
    }
}

/// The SQLite state store. Cheap to clone (shared handle); the data directory stays locked
/// until the last clone is dropped.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

// Field order is drop order: connections close (checkpointing the WAL) before the lock goes.
struct Inner {
    writer: Mutex<Connection>,
    /// Units of work waiting for the writer (see `write`).
    queue: Mutex<Vec<Job>>,
    /// A drain of `queue` is scheduled or running.
    drain_scheduled: AtomicBool,
    readers: Mutex<Vec<Connection>>,
    /// Held for its drop: checkpoints run on its thread, not in the writer's commits.
    _checkpointer: checkpoint::Checkpointer,
    notifier: Notifier,
    /// The newest committed events of recently written instances (see `tail`).
    tail: tail::EventTail,
    options: SqliteOptions,
    db_path: PathBuf,
    marker: marker::Marker,
    lock: lock::DataDirLock,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("db_path", &self.inner.db_path)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the store in `data_dir` with the system clock. Blocking: call
    /// it at startup or from `spawn_blocking`.
    pub fn open(data_dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(data_dir, SqliteOptions::default())
    }

    pub fn open_with(data_dir: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        let dir = data_dir.as_ref();
        std::fs::create_dir_all(dir)
            .map_err(|e| StateError::Io(format!("{}: {e}", dir.display())))?;
        // The lock comes first: nothing touches state.db unless this engine owns the directory.
        let lock = lock::DataDirLock::acquire(dir)?;
        backup::remove_leftovers(dir)?;
        let db_path = dir.join(DB_FILE);
        let marker_path = dir.join(MARKER_FILE);
        let recorded = marker::read(&marker_path)?;
        if let Some(recorded) = &recorded {
            check_db_file(&db_path, &marker_path, recorded)?;
        }
        // Resource state can hold secrets: create the file owner-only (SQLite gives its -wal and
        // -shm files the same mode).
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&db_path)
            .map_err(|e| StateError::Io(format!("{}: {e}", db_path.display())))?;

        let mut writer = open_connection(&db_path, options.busy_timeout)?;
        let mode: String =
            writer.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StateError::Db(format!(
                "{}: cannot enable WAL (journal_mode is {mode})",
                db_path.display()
            )));
        }
        writer.pragma_update(None, "synchronous", "FULL")?;
        writer.pragma_update(None, "foreign_keys", true)?;
        // Savepoints of a shared batch journal the pages they change; in memory, not in a
        // temporary file.
        writer.pragma_update(None, "temp_store", "MEMORY")?;
        if let Some(recorded) = &recorded {
            let has_schema: bool = writer.query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'schema_migrations')",
                [],
                |row| row.get(0),
            )?;
            if !has_schema {
                return Err(lost_state(
                    &db_path,
                    &marker_path,
                    recorded,
                    "has no Trellis schema (it is not the database this directory had)",
                ));
            }
        }
        schema::migrate(&mut writer, options.clock.now())?;
        let (store_id, commits): (String, i64) = writer.query_row(
            "SELECT store_id, commits FROM store_meta WHERE id = 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?;
        let commits = to_u64(commits, "store_meta.commits")?;
        match &recorded {
            Some(r) if r.store_id != store_id => {
                return Err(lost_state(
                    &db_path,
                    &marker_path,
                    r,
                    &format!(
                        "belongs to another store (id {store_id}, the marker says {})",
                        r.store_id
                    ),
                ));
            }
            Some(r) if commits < r.commits => {
                return Err(lost_state(
                    &db_path,
                    &marker_path,
                    r,
                    &format!(
                        "has {commits} commits, fewer than the {} this directory had: its WAL \
                         (state.db-wal) was lost or an older copy of state.db was put in place",
                        r.commits
                    ),
                ));
            }
            Some(_) => {}
            None => {
                tracing::info!(marker = %marker_path.display(), store = %store_id, commits, "state marker written")
            }
        }
        let marker = marker::Marker::write(&marker_path, &store_id, commits)?;
        let checkpointer =
            checkpoint::Checkpointer::start(&mut writer, &db_path, options.busy_timeout)?;

        Ok(SqliteStore {
            inner: Arc::new(Inner {
                writer: Mutex::new(writer),
                queue: Mutex::new(Vec::new()),
                drain_scheduled: AtomicBool::new(false),
                readers: Mutex::new(Vec::new()),
                _checkpointer: checkpointer,
                notifier: Notifier::default(),
                tail: tail::EventTail::default(),
                options,
                db_path,
                marker,
                lock,
            }),
        })
    }

    pub fn db_path(&self) -> &Path {
        &self.inner.db_path
    }

    pub fn lock_path(&self) -> &Path {
        self.inner.lock.path()
    }

    /// Runs `f` as one unit of work on the writer and returns once it is durable; then wakes the
    /// watchers of every instance that got events.
    ///
    /// Group commit: units queued while the writer is busy run together in one `BEGIN
    /// IMMEDIATE` transaction, each inside its own savepoint (a unit that fails is rolled back
    /// alone and reports its error), and share one `COMMIT`, so one fsync covers many units.
    /// Units still run one after another in queue order, so every check a unit makes (fencing,
    /// transitions, versions, sequence numbers) sees the units before it, exactly as with a
    /// transaction each. A unit's result is delivered only after the shared commit succeeded.
    async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Tx<'_>) -> Result<T> + Send + 'static,
    {
        let (send, recv) = tokio::sync::oneshot::channel::<Result<T>>();
        let job: Job = Box::new(move |w: &mut Tx<'_>| {
            let result = f(w);
            let ok = result.is_ok();
            let deliver: Deliver = Box::new(move |committed: Result<()>| {
                let _ = send.send(committed.and(result));
            });
            (ok, deliver)
        });
        self.inner
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(job);
        if !self.inner.drain_scheduled.swap(true, Ordering::SeqCst) {
            let inner = self.inner.clone();
            tokio::task::spawn_blocking(move || drain(inner));
        }
        recv.await
            .map_err(|_| StateError::Db("state writer stopped".into()))?
    }

    /// Runs `f` in one read transaction (a consistent snapshot) on a pooled read connection.
    async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction<'_>, Timestamp) -> Result<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        blocking(move || {
            let pooled = inner
                .readers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            let mut conn = match pooled {
                Some(conn) => conn,
                None => {
                    let conn = open_connection(&inner.db_path, inner.options.busy_timeout)?;
                    conn.pragma_update(None, "query_only", true)?;
                    conn
                }
            };
            let result = (|| {
                let tx = conn.transaction()?;
                let out = f(&tx, inner.options.clock.now())?;
                tx.commit()?;
                Ok(out)
            })();
            let mut pool = inner.readers.lock().unwrap_or_else(PoisonError::into_inner);
            if pool.len() < inner.options.idle_readers {
                pool.push(conn);
            }
            result
        })
        .await
    }
}

/// A queued unit of work: runs on the writer's transaction and returns whether it succeeded and
/// how to deliver its result once the batch's commit is known.
type Job = Box<dyn FnOnce(&mut Tx<'_>) -> (bool, Deliver) + Send>;
type Deliver = Box<dyn FnOnce(Result<()>) + Send>;

/// Runs queued units in batches until the queue is empty (see `SqliteStore::write`). The last
/// batch's results are delivered after this task let go of the store: a caller that drops the
/// store as soon as its write returns finds the data directory's lock released.
fn drain(inner: Arc<Inner>) {
    let last = {
        let mut conn = inner.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let mut pending: Vec<Deliver> = Vec::new();
        let mut pending_result: Result<()> = Ok(());
        loop {
            let batch = {
                let mut q = inner.queue.lock().unwrap_or_else(PoisonError::into_inner);
                if q.is_empty() {
                    // Cleared under the queue lock: a unit pushed after this sees `false` and
                    // schedules a new drain; one pushed before is in the queue we just saw.
                    inner.drain_scheduled.store(false, Ordering::SeqCst);
                    break (pending, pending_result);
                }
                std::mem::take(&mut *q)
            };
            for d in pending.drain(..) {
                d(pending_result.clone());
            }
            let started = std::time::Instant::now();
            let (delivers, appended, committed) = run_batch(&mut conn, &inner, batch);
            crate::metrics::commit_took(started.elapsed());
            if committed.is_ok() {
                for (instance_id, last_seq, events) in appended {
                    crate::metrics::events_written(events.len());
                    // Before the notification: a watcher it wakes finds them in memory.
                    inner.tail.extend(&instance_id, events);
                    inner.notifier.notify(&instance_id, last_seq);
                }
            }
            pending = delivers;
            pending_result = committed;
        }
    };
    drop(inner);
    let (delivers, committed) = last;
    for d in delivers {
        d(committed.clone());
    }
}

/// What a batch delivers, what it appended (instance, last sequence number, events) and
/// whether it committed.
type BatchOutcome = (Vec<Deliver>, Vec<(String, u64, Vec<Event>)>, Result<()>);

fn run_batch(conn: &mut Connection, inner: &Inner, batch: Vec<Job>) -> BatchOutcome {
    let mut delivers = Vec::with_capacity(batch.len());
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            // Nothing ran; dropping the units tells their callers the writer failed.
            tracing::error!(error = %e, "state store: cannot begin a write transaction");
            drop(batch);
            return (Vec::new(), Vec::new(), Err(StateError::from(e)));
        }
    };
    let mut w = Tx {
        tx: &tx,
        now: inner.options.clock.now(),
        appended: Vec::new(),
    };
    // A unit alone in its batch (a scheduler turn usually is) needs no savepoint: if it fails,
    // the transaction is rolled back instead. That spares the statement journal a copy of
    // every page the unit changes.
    let alone = batch.len() == 1;
    for job in batch {
        let mark = w.appended.len();
        // Cached statements: a batch opens and releases thousands of savepoints, and
        // `execute_batch` would parse each one again.
        if !alone
            && let Err(e) =
                w.tx.prepare_cached("SAVEPOINT unit")
                    .and_then(|mut st| st.execute([]))
        {
            tracing::error!(error = %e, "state store: cannot open a savepoint");
            drop(job);
            continue;
        }
        // A panicking unit (a bug) must not take the writer down with it: it is rolled back
        // and its caller sees the writer error.
        let (ok, deliver) =
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut w))) {
                Ok(r) => r,
                Err(_) => (false, Box::new(|_: Result<()>| {}) as Deliver),
            };
        delivers.push(deliver);
        if alone && !ok {
            // Nothing to commit; the unit's own error is what its caller gets.
            drop(w);
            return match tx.rollback() {
                Ok(()) => (delivers, Vec::new(), Ok(())),
                Err(e) => (delivers, Vec::new(), Err(StateError::from(e))),
            };
        }
        let closed = if alone {
            Ok(())
        } else if ok {
            w.tx.prepare_cached("RELEASE unit")
                .and_then(|mut st| st.execute([]).map(drop))
        } else {
            // The unit's writes go; the batch goes on.
            w.appended.truncate(mark);
            w.tx.execute_batch("ROLLBACK TO unit; RELEASE unit")
        };
        if let Err(e) = closed {
            drop(w);
            let _ = tx.rollback();
            return (delivers, Vec::new(), Err(StateError::from(e)));
        }
    }
    let appended = std::mem::take(&mut w.appended);
    drop(w);
    // Counted in the same transaction, recorded in the marker once durable (see `marker`).
    let commits = match tx
        .prepare_cached(
            "UPDATE store_meta SET commits = commits + 1 WHERE id = 1 RETURNING commits",
        )
        .and_then(|mut st| st.query_row([], |row| row.get::<_, i64>(0)))
    {
        Ok(n) => n,
        Err(e) => {
            let _ = tx.rollback();
            return (delivers, Vec::new(), Err(StateError::from(e)));
        }
    };
    match tx.commit() {
        Ok(()) => {
            inner.marker.record(u64::try_from(commits).unwrap_or(0));
            (delivers, appended, Ok(()))
        }
        Err(e) => (delivers, Vec::new(), Err(StateError::from(e))),
    }
}

/// With a marker (the directory had state), `state.db` must be there and not empty.
fn check_db_file(db_path: &Path, marker_path: &Path, recorded: &marker::Recorded) -> Result<()> {
    match std::fs::metadata(db_path) {
        Ok(meta) if meta.len() > 0 => Ok(()),
        Ok(_) => Err(lost_state(db_path, marker_path, recorded, "is empty")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(lost_state(db_path, marker_path, recorded, "is missing"))
        }
        Err(e) => Err(StateError::Io(format!("{}: {e}", db_path.display()))),
    }
}

/// The refusal to start on a data directory whose state is gone: what is wrong and what to do.
fn lost_state(
    db_path: &Path,
    marker_path: &Path,
    recorded: &marker::Recorded,
    what: &str,
) -> StateError {
    StateError::Corrupt(format!(
        "{} {what}, but this data directory had state ({} records store {} with {} commits); \
         the engine does not start with less state than it had. Put the latest state.db (and \
         state.db-wal, if there was one) back; or, to accept an older backup, this state.db as \
         it is, or no state at all, remove {1} and start again",
        db_path.display(),
        marker_path.display(),
        recorded.store_id,
        recorded.commits,
    ))
}

fn open_connection(path: &Path, busy_timeout: Duration) -> Result<Connection> {
    // Never create: `open_with` creates state.db (owner-only); a connection opened later, when
    // the file was deleted under the engine, must fail rather than start an empty database.
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
        | rusqlite::OpenFlags::SQLITE_OPEN_URI
        | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(busy_timeout)?;
    Ok(conn)
}

async fn blocking<T, F>(f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StateError::Db(format!("state task failed: {e}")))?
}

impl From<rusqlite::Error> for StateError {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::Error as E;
        match &e {
            E::SqliteFailure(f, _)
                if matches!(f.code, ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) =>
            {
                StateError::Corrupt(e.to_string())
            }
            // A stored value of the wrong type or range: bad data, not a bad query.
            E::FromSqlConversionFailure(..)
            | E::IntegralValueOutOfRange(..)
            | E::Utf8Error(..)
            | E::InvalidColumnType(..) => StateError::Corrupt(e.to_string()),
            _ => StateError::Db(e.to_string()),
        }
    }
}

// ---- conversions ------------------------------------------------------------------------------

fn json_text(v: &Value) -> String {
    v.to_string()
}

fn parse_json(text: &str, what: impl FnOnce() -> String) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| StateError::Corrupt(format!("{}: {e}", what())))
}

fn ts(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}

const INSTANCE_COLS: &str = "id, name, status, version, last_seq, pruned_through, lease_epoch, \
                             lease_owner, lease_expires_at, created_at, updated_at, environment";

fn decode_instance(row: &Row<'_>) -> Result<Instance> {
    let id: String = row.get(0)?;
    let what = format!("instance {id}");
    let status = parse_status(InstanceStatus::parse, &row.get::<_, String>(2)?, &what)?;
    let lease = match (
        row.get::<_, Option<String>>(7)?,
        row.get::<_, Option<i64>>(8)?,
    ) {
        (Some(owner), Some(expires)) => Some(LeaseHolder {
            owner,
            expires_at: ts(expires),
        }),
        _ => None,
    };
    Ok(Instance {
        name: row.get(1)?,
        status,
        version: to_u64(row.get(3)?, &what)?,
        last_seq: to_u64(row.get(4)?, &what)?,
        pruned_through: to_u64(row.get(5)?, &what)?,
        lease_epoch: to_u64(row.get(6)?, &what)?,
        lease,
        created_at: ts(row.get(9)?),
        updated_at: ts(row.get(10)?),
        environment: parse_json(&row.get::<_, String>(11)?, || what.clone())?,
        id,
    })
}

const RESOURCE_COLS: &str = "instance_id, name, type, spec, state, status, external_id, \
                             failure_reason, created_at, updated_at, depends_on, metadata, call_key";

/// A TEXT column read in place, without a copy.
fn text<'r>(row: &'r Row<'_>, i: usize) -> Result<Option<&'r str>> {
    use rusqlite::types::ValueRef;
    match row.get_ref(i)? {
        ValueRef::Null => Ok(None),
        ValueRef::Text(t) => std::str::from_utf8(t)
            .map(Some)
            .map_err(|e| StateError::Corrupt(format!("column {i}: {e}"))),
        other => Err(StateError::Corrupt(format!(
            "column {i}: expected text, found {}",
            other.data_type()
        ))),
    }
}

fn required_text<'r>(row: &'r Row<'_>, i: usize) -> Result<&'r str> {
    text(row, i)?.ok_or_else(|| StateError::Corrupt(format!("column {i}: NULL")))
}

/// A guarded step (`Tx::apply_guarded`) the transition table allowed but the statement did not
/// apply: the two disagree, a bug in the store, reported rather than applied a second way.
fn unguarded(name: &str) -> StateError {
    StateError::Db(format!(
        "resource {name}: its status allows the change, but the store did not apply it"
    ))
}

fn decode_resource(row: &Row<'_>) -> Result<Resource> {
    RawResource::read(row)?.decode()
}

/// A resource row with its JSON columns still text: read while the statement steps, parsed
/// after (by several threads for a large instance, see `load_state`).
struct RawResource {
    instance_id: String,
    name: String,
    resource_type: String,
    spec: String,
    state: Option<String>,
    status: ResourceStatus,
    external_id: Option<String>,
    failure_reason: Option<String>,
    created_at: i64,
    updated_at: i64,
    depends_on: String,
    metadata: String,
    call_key: Option<String>,
}

impl RawResource {
    fn read(row: &Row<'_>) -> Result<RawResource> {
        let instance_id: String = row.get(0)?;
        let name: String = row.get(1)?;
        let status = parse_status(
            ResourceStatus::parse,
            required_text(row, 5)?,
            &format!("resource {name} of instance {instance_id}"),
        )?;
        Ok(RawResource {
            resource_type: row.get(2)?,
            spec: row.get(3)?,
            state: row.get(4)?,
            status,
            external_id: row.get(6)?,
            failure_reason: row.get(7)?,
            created_at: row.get(8)?,
            updated_at: row.get(9)?,
            depends_on: row.get(10)?,
            metadata: row.get(11)?,
            call_key: row.get(12)?,
            instance_id,
            name,
        })
    }

    fn decode(self) -> Result<Resource> {
        let what = |column: &str| {
            format!(
                "resource {} of instance {} {column}",
                self.name, self.instance_id
            )
        };
        let spec = parse_json(&self.spec, || what("spec"))?;
        let state = match &self.state {
            Some(text) => Some(parse_json(text, || what("state"))?),
            None => None,
        };
        // Straight into names, not through a JSON tree.
        let depends_on = serde_json::from_str(&self.depends_on)
            .map_err(|e| StateError::Corrupt(format!("{}: {e}", what("depends_on"))))?;
        let metadata = parse_json(&self.metadata, || what("metadata"))?;
        Ok(Resource {
            depends_on,
            metadata,
            spec,
            state,
            resource_type: self.resource_type,
            status: self.status,
            external_id: self.external_id,
            failure_reason: self.failure_reason,
            call_key: self.call_key,
            created_at: ts(self.created_at),
            updated_at: ts(self.updated_at),
            instance_id: self.instance_id,
            name: self.name,
        })
    }
}

/// Parses `raw` in order, on two threads when there are enough rows for a thread to pay off
/// (loading a 10,000-resource instance: 21 -> 17.5 ms, `benches/load_state.rs`).
fn decode_resources(raw: Vec<RawResource>) -> Result<Vec<Resource>> {
    const PARALLEL_FROM: usize = 2_000;
    fn decode_all(raw: Vec<RawResource>) -> Result<Vec<Resource>> {
        raw.into_iter().map(RawResource::decode).collect()
    }
    if raw.len() < PARALLEL_FROM {
        return decode_all(raw);
    }
    let mut first = raw;
    let second = first.split_off(first.len() / 2);
    let (first, second) = std::thread::scope(|s| {
        let other = s.spawn(move || decode_all(second));
        let first = decode_all(first);
        // A panic in the other half is a bug: pass it on rather than turn it into an error.
        (
            first,
            other
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p)),
        )
    });
    let mut all = first?;
    all.extend(second?);
    Ok(all)
}

fn decode_link(row: &Row<'_>) -> Result<Link> {
    let instance_id: String = row.get(0)?;
    let (a, b): (String, String) = (row.get(1)?, row.get(2)?);
    let what = format!("link {a} -> {b} of instance {instance_id}");
    Ok(Link {
        link_type: row.get(3)?,
        status: parse_status(LinkStatus::parse, &row.get::<_, String>(4)?, &what)?,
        data: parse_json(&row.get::<_, String>(5)?, || format!("{what} data"))?,
        created_at: ts(row.get(6)?),
        updated_at: ts(row.get(7)?),
        instance_id,
        resource_a: a,
        resource_b: b,
    })
}

fn decode_child(row: &Row<'_>) -> Result<Child> {
    Ok(Child {
        instance_id: row.get(0)?,
        name: row.get(1)?,
        child_instance_id: row.get(2)?,
        created_at: ts(row.get(3)?),
        updated_at: ts(row.get(4)?),
    })
}

fn decode_export(row: &Row<'_>) -> Result<Export> {
    let instance_id: String = row.get(0)?;
    let name: String = row.get(1)?;
    let value = parse_json(&row.get::<_, String>(3)?, || {
        format!("export {name} of instance {instance_id}")
    })?;
    Ok(Export {
        export_type: row.get(2)?,
        value,
        updated_at: ts(row.get(4)?),
        instance_id,
        name,
    })
}

const CHANGE_SET_COLS: &str = "id, instance_id, planned_version, digest, body, status, \
     created_at, updated_at, request_id, request_digest";
/// The same columns with the body left out: a body is the whole plan (megabytes for a large
/// blueprint), and most readers need only the status, digest or version.
const CHANGE_SET_HEAD_COLS: &str = "id, instance_id, planned_version, digest, NULL, status, \
     created_at, updated_at, request_id, request_digest";

fn decode_change_set(row: &Row<'_>) -> Result<ChangeSet> {
    let id: String = row.get(0)?;
    let what = format!("change set {id}");
    Ok(ChangeSet {
        instance_id: row.get(1)?,
        planned_version: to_u64(row.get(2)?, &what)?,
        digest: row.get(3)?,
        body: match row.get::<_, Option<String>>(4)? {
            Some(text) => parse_json(&text, || format!("{what} body"))?,
            None => Value::Null,
        },
        status: parse_status(ChangeSetStatus::parse, &row.get::<_, String>(5)?, &what)?,
        created_at: ts(row.get(6)?),
        updated_at: ts(row.get(7)?),
        request: match (row.get(8)?, row.get(9)?) {
            (Some(id), Some(digest)) => Some(RequestKey { id, digest }),
            _ => None,
        },
        id,
    })
}

const OPERATION_COLS: &str = "id, instance_id, kind, request_id, request_digest, change_set_id, \
                              owner, status, lease_owner, lease_epoch, error, created_at, \
                              updated_at, finished_at, events_after";

fn decode_operation(row: &Row<'_>) -> Result<Operation> {
    let id: String = row.get(0)?;
    let what = format!("operation {id}");
    let kind = row.get::<_, String>(2)?;
    let kind = OperationKind::parse(&kind)
        .ok_or_else(|| StateError::Corrupt(format!("{what}: unknown kind {kind:?}")))?;
    Ok(Operation {
        instance_id: row.get(1)?,
        kind,
        request_id: row.get(3)?,
        request_digest: row.get(4)?,
        change_set_id: row.get(5)?,
        owner: row.get(6)?,
        status: parse_status(OperationStatus::parse, &row.get::<_, String>(7)?, &what)?,
        lease_owner: row.get(8)?,
        lease_epoch: row
            .get::<_, Option<i64>>(9)?
            .map(|e| to_u64(e, &what))
            .transpose()?,
        error: row.get(10)?,
        created_at: ts(row.get(11)?),
        updated_at: ts(row.get(12)?),
        finished_at: row.get::<_, Option<i64>>(13)?.map(ts),
        events_after: to_u64(row.get(14)?, &what)?,
        id,
    })
}

fn decode_event(row: &Row<'_>) -> Result<Event> {
    let instance_id: String = row.get(0)?;
    let seq = to_u64(row.get(1)?, "event seq")?;
    let payload = parse_json(&row.get::<_, String>(3)?, || {
        format!("event {seq} of instance {instance_id}")
    })?;
    Ok(Event {
        kind: row.get(2)?,
        payload,
        at: ts(row.get(4)?),
        instance_id,
        seq,
    })
}

// ---- queries shared by reads and writes -------------------------------------------------------

fn get_instance(tx: &Transaction<'_>, id: &str) -> Result<Instance> {
    tx.prepare_cached(&format!(
        "SELECT {INSTANCE_COLS} FROM instances WHERE id = ?1"
    ))?
    .query_and_then([id], decode_instance)?
    .next()
    .unwrap_or_else(|| Err(StateError::not_found("instance", id)))
}

fn get_change_set(tx: &Transaction<'_>, id: &str) -> Result<ChangeSet> {
    tx.prepare_cached(&format!(
        "SELECT {CHANGE_SET_COLS} FROM change_sets WHERE id = ?1"
    ))?
    .query_and_then([id], decode_change_set)?
    .next()
    .unwrap_or_else(|| Err(StateError::not_found("change set", id)))
}

/// A change set without its body (`Value::Null`).
fn find_change_set(tx: &Transaction<'_>, request_id: &str) -> Result<Option<ChangeSet>> {
    tx.prepare_cached(&format!(
        "SELECT {CHANGE_SET_COLS} FROM change_sets WHERE request_id = ?1"
    ))?
    .query_and_then([request_id], decode_change_set)?
    .next()
    .transpose()
}

/// The change set recorded for `key`'s request id, if it was recorded for the same request.
fn same_request(cs: ChangeSet, key: &RequestKey) -> Result<ChangeSet> {
    match &cs.request {
        Some(k) if k.digest == key.digest => Ok(cs),
        _ => Err(StateError::RequestIdReused {
            request_id: key.id.clone(),
        }),
    }
}

fn get_change_set_head(tx: &Transaction<'_>, id: &str) -> Result<ChangeSet> {
    tx.prepare_cached(&format!(
        "SELECT {CHANGE_SET_HEAD_COLS} FROM change_sets WHERE id = ?1"
    ))?
    .query_and_then([id], decode_change_set)?
    .next()
    .unwrap_or_else(|| Err(StateError::not_found("change set", id)))
}

/// One engine uses a SQLite store, and keeps local assets in its data directory.
fn not_shared() -> StateError {
    StateError::Unsupported(
        "the SQLite store does not keep local assets: its engine keeps them in its data directory"
            .into(),
    )
}

fn get_operation(tx: &Transaction<'_>, id: &str) -> Result<Operation> {
    tx.prepare_cached(&format!(
        "SELECT {OPERATION_COLS} FROM operations WHERE id = ?1"
    ))?
    .query_and_then([id], decode_operation)?
    .next()
    .unwrap_or_else(|| Err(StateError::not_found("operation", id)))
}

fn find_operation(tx: &Transaction<'_>, request_id: &str) -> Result<Option<Operation>> {
    tx.prepare_cached(&format!(
        "SELECT {OPERATION_COLS} FROM operations WHERE request_id = ?1"
    ))?
    .query_and_then([request_id], decode_operation)?
    .next()
    .transpose()
}

fn list<T>(
    tx: &Transaction<'_>,
    sql: &str,
    arg: &str,
    decode: fn(&Row<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    tx.prepare_cached(sql)?
        .query_and_then([arg], decode)?
        .collect()
}

// ---- the write side ---------------------------------------------------------------------------

/// One write transaction: its time, and the instances that got events (to notify after commit).
struct Tx<'a> {
    tx: &'a Transaction<'a>,
    now: Timestamp,
    /// Per append: the instance, its new last sequence number and the events.
    appended: Vec<(String, u64, Vec<Event>)>,
}

impl Tx<'_> {
    /// Rejects a lease that is not the instance's current one.
    fn fence(&self, lease: &Lease) -> Result<()> {
        let row: Option<(Option<String>, i64)> = self
            .tx
            .prepare_cached("SELECT lease_token, lease_epoch FROM instances WHERE id = ?1")?
            .query_row([&lease.instance_id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let Some((token, epoch)) = row else {
            return Err(StateError::not_found("instance", &lease.instance_id));
        };
        let epoch = to_u64(epoch, "lease epoch")?;
        if epoch != lease.epoch || token.as_deref() != Some(lease.token.as_str()) {
            return Err(StateError::Fenced {
                instance_id: lease.instance_id.clone(),
                epoch: lease.epoch,
                current_epoch: epoch,
            });
        }
        Ok(())
    }

    /// Appends events with the next sequence numbers. Returns `(first, last)`.
    fn append_events(&mut self, instance_id: &str, events: Vec<NewEvent>) -> Result<(u64, u64)> {
        let last: i64 = self
            .tx
            .prepare_cached("SELECT last_seq FROM instances WHERE id = ?1")?
            .query_row([instance_id], |r| r.get(0))
            .optional()?
            .ok_or_else(|| StateError::not_found("instance", instance_id))?;
        let last = to_u64(last, "last_seq")?;
        if events.is_empty() {
            return Ok((last + 1, last));
        }
        let mut insert = self.tx.prepare_cached(
            "INSERT INTO events (instance_id, seq, kind, payload, at) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        let new_last = last + events.len() as u64;
        let mut written = Vec::with_capacity(events.len());
        // Moved into what the tail and the watchers get, not copied.
        for (seq, e) in (last + 1..).zip(events) {
            insert.execute(params![
                instance_id,
                to_i64(seq),
                e.kind,
                json_text(&e.payload),
                self.now.as_millis()
            ])?;
            written.push(Event {
                instance_id: instance_id.to_owned(),
                seq,
                kind: e.kind,
                payload: e.payload,
                at: self.now,
            });
        }
        self.tx
            .prepare_cached("UPDATE instances SET last_seq = ?2 WHERE id = ?1")?
            .execute(params![instance_id, to_i64(new_last)])?;
        self.appended
            .push((instance_id.to_owned(), new_last, written));
        Ok((last + 1, new_last))
    }

    fn bump_version(&self, instance_id: &str) -> Result<u64> {
        let v: i64 = self
            .tx
            .prepare_cached(
                "UPDATE instances SET version = version + 1, updated_at = ?2 WHERE id = ?1 \
                 RETURNING version",
            )?
            .query_row(params![instance_id, self.now.as_millis()], |r| r.get(0))?;
        to_u64(v, "version")
    }

    fn resource_status(&self, instance_id: &str, name: &str) -> Result<Option<ResourceStatus>> {
        let status: Option<String> = self
            .tx
            .prepare_cached("SELECT status FROM resources WHERE instance_id = ?1 AND name = ?2")?
            .query_row([instance_id, name], |r| r.get(0))
            .optional()?;
        status
            .map(|s| parse_status(ResourceStatus::parse, &s, &format!("resource {name}")))
            .transpose()
    }

    fn exists(&self, sql: &str, args: &[&str]) -> Result<bool> {
        Ok(self
            .tx
            .prepare_cached(sql)?
            .query_row(rusqlite::params_from_iter(args), |_| Ok(()))
            .optional()?
            .is_some())
    }

    /// Applies one change of a unit of work (the lease is already checked).
    fn apply(&self, lease: &Lease, change: &Change) -> Result<()> {
        let inst = lease.instance_id.as_str();
        let now = self.now.as_millis();
        let tx = self.tx;
        match change {
            Change::ReleaseLease => {
                tx.prepare_cached(
                    "UPDATE instances SET lease_owner = NULL, lease_token = NULL, \
                     lease_expires_at = NULL WHERE id = ?1",
                )?
                .execute([inst])?;
            }
            Change::InstanceStatus(status) => {
                tx.prepare_cached("UPDATE instances SET status = ?2 WHERE id = ?1")?
                    .execute(params![inst, status.as_str()])?;
            }
            Change::InstanceEnvironment(environment) => {
                tx.prepare_cached("UPDATE instances SET environment = ?2 WHERE id = ?1")?
                    .execute(params![inst, environment.to_string()])?;
            }
            Change::IntendCreate { .. }
            | Change::ResourceCreated { .. }
            | Change::IntendUpdate { .. }
            | Change::ResourceUpdated { .. }
            | Change::IntendDestroy { .. }
            | Change::ResourceFailed { .. }
            | Change::ResourceRemoved { .. } => self.apply_resource(inst, change)?,
            Change::PutLink {
                resource_a,
                resource_b,
                link_type,
                status,
                data,
            } => {
                for r in [resource_a, resource_b] {
                    if self.resource_status(inst, r)?.is_none() {
                        return Err(StateError::not_found("resource", r));
                    }
                }
                tx.prepare_cached(
                    "INSERT INTO links (instance_id, resource_a, resource_b, link_type, status, \
                     data, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7) \
                     ON CONFLICT (instance_id, resource_a, resource_b) DO UPDATE SET \
                     link_type = excluded.link_type, status = excluded.status, \
                     data = excluded.data, updated_at = excluded.updated_at",
                )?
                .execute(params![
                    inst,
                    resource_a,
                    resource_b,
                    link_type,
                    status.as_str(),
                    json_text(data),
                    now
                ])?;
            }
            Change::RemoveLink {
                resource_a,
                resource_b,
            } => {
                let n = tx
                    .prepare_cached(
                        "DELETE FROM links WHERE instance_id = ?1 AND resource_a = ?2 \
                         AND resource_b = ?3",
                    )?
                    .execute([inst, resource_a, resource_b])?;
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
                if !self.exists(
                    "SELECT 1 FROM instances WHERE id = ?1",
                    &[child_instance_id],
                )? {
                    return Err(StateError::not_found("instance", child_instance_id));
                }
                tx.prepare_cached(
                    "INSERT INTO children (instance_id, name, child_instance_id, created_at, \
                     updated_at) VALUES (?1, ?2, ?3, ?4, ?4) ON CONFLICT (instance_id, name) \
                     DO UPDATE SET child_instance_id = excluded.child_instance_id, \
                     updated_at = excluded.updated_at",
                )?
                .execute(params![inst, name, child_instance_id, now])?;
            }
            Change::RemoveChild { name } => {
                let n = tx
                    .prepare_cached("DELETE FROM children WHERE instance_id = ?1 AND name = ?2")?
                    .execute([inst, name])?;
                if n == 0 {
                    return Err(StateError::not_found("child", name));
                }
            }
            Change::PutExport {
                name,
                export_type,
                value,
            } => {
                tx.prepare_cached(
                    "INSERT INTO exports (instance_id, name, type, value, updated_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (instance_id, name) DO UPDATE SET \
                     type = excluded.type, value = excluded.value, \
                     updated_at = excluded.updated_at",
                )?
                .execute(params![
                    inst,
                    name,
                    export_type,
                    json_text(value),
                    now
                ])?;
            }
            Change::RemoveExport { name } => {
                let n = tx
                    .prepare_cached("DELETE FROM exports WHERE instance_id = ?1 AND name = ?2")?
                    .execute([inst, name])?;
                if n == 0 {
                    return Err(StateError::not_found("export", name));
                }
            }
            Change::ChangeSetStatus { id, status } => {
                let cs = get_change_set_head(tx, id)?;
                if cs.instance_id != inst {
                    return Err(StateError::rejected(format!(
                        "change set `{id}` belongs to instance `{}`, not `{inst}`",
                        cs.instance_id
                    )));
                }
                change_set_transition(id, cs.status, *status)?;
                tx.prepare_cached(
                    "UPDATE change_sets SET status = ?2, updated_at = ?3 WHERE id = ?1",
                )?
                .execute(params![id, status.as_str(), now])?;
            }
            Change::OperationStatus { id, status, error } => {
                let op = get_operation(tx, id)?;
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
                tx.prepare_cached(
                    "UPDATE operations SET status = ?2, error = ?3, lease_owner = ?4, \
                     lease_epoch = ?5, updated_at = ?6, finished_at = ?7 WHERE id = ?1",
                )?
                .execute(params![
                    id,
                    status.as_str(),
                    error,
                    lease_owner,
                    lease_epoch,
                    now,
                    finished
                ])?;
            }
        }
        Ok(())
    }

    fn apply_resource(&self, inst: &str, change: &Change) -> Result<()> {
        if self.apply_guarded(inst, change)? {
            return Ok(());
        }
        let now = self.now.as_millis();
        let tx = self.tx;
        let current = self.resource_status(inst, resource_name(change))?;
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
                let deps = json_text(&Value::from(depends_on.clone()));
                if current.is_none() {
                    tx.prepare_cached(
                        "INSERT INTO resources (instance_id, name, type, spec, status, \
                         created_at, updated_at, depends_on, metadata, call_key) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7, ?8, ?9)",
                    )?
                    .execute(params![
                        inst,
                        name,
                        resource_type,
                        json_text(spec),
                        status,
                        now,
                        deps,
                        json_text(metadata),
                        key
                    ])?;
                } else {
                    tx.prepare_cached(
                        "UPDATE resources SET type = ?3, spec = ?4, status = ?5, \
                         failure_reason = NULL, updated_at = ?6, depends_on = ?7, metadata = ?8, \
                         call_key = ?9 WHERE instance_id = ?1 AND name = ?2",
                    )?
                    .execute(params![
                        inst,
                        name,
                        resource_type,
                        json_text(spec),
                        status,
                        now,
                        deps,
                        json_text(metadata),
                        key
                    ])?;
                }
            }
            Change::IntendUpdate {
                name,
                spec,
                depends_on,
                metadata,
                key,
            } => {
                let deps = json_text(&Value::from(depends_on.clone()));
                tx.prepare_cached(
                    "UPDATE resources SET status = ?3, spec = ?4, failure_reason = NULL, \
                     updated_at = ?5, depends_on = ?6, metadata = ?7, call_key = ?8 \
                     WHERE instance_id = ?1 AND name = ?2",
                )?
                .execute(params![
                    inst,
                    name,
                    status,
                    json_text(spec),
                    now,
                    deps,
                    json_text(metadata),
                    key
                ])?;
            }
            Change::ResourceFailed { name, reason } => {
                tx.prepare_cached(
                    "UPDATE resources SET status = ?3, failure_reason = ?4, updated_at = ?5 \
                     WHERE instance_id = ?1 AND name = ?2",
                )?
                .execute(params![inst, name, status, reason, now])?;
            }
            // `apply_guarded` applies these when their status allows them; they reach here
            // only to be refused, by the transition table above or by a link in the way.
            Change::ResourceRemoved { name } => {
                if let Some((a, b)) = self.link_of(inst, name)? {
                    return Err(StateError::Conflict(Conflict::InUse {
                        kind: "resource",
                        id: name.clone(),
                        by: format!("link {a} -> {b}"),
                    }));
                }
                return Err(unguarded(name));
            }
            Change::IntendDestroy { name, .. }
            | Change::ResourceCreated { name, .. }
            | Change::ResourceUpdated { name, .. } => return Err(unguarded(name)),
            // `resource_transition` already refused anything else.
            other => {
                return Err(StateError::rejected(format!(
                    "not a resource change: {other:?}"
                )));
            }
        }
        Ok(())
    }

    /// The usual steps of a resource's life (a destroy's intent and removal, a create's or
    /// update's outcome), each in one statement that checks the status `resource_transition`
    /// requires in its `WHERE` clause instead of reading it first: a destroyed resource costs
    /// the writer two statements fewer. `false`: nothing was changed (another change, a status
    /// the step is not allowed from, a link in the way), and [`Tx::apply_resource`] goes the
    /// general way, which reads the status and names the refusal.
    fn apply_guarded(&self, inst: &str, change: &Change) -> Result<bool> {
        use ResourceStatus as S;
        let now = self.now.as_millis();
        let changed = match change {
            Change::IntendDestroy { name, key } => self
                .tx
                .prepare_cached(
                    "UPDATE resources SET status = ?3, failure_reason = NULL, updated_at = ?4, \
                     call_key = ?5 WHERE instance_id = ?1 AND name = ?2",
                )?
                .execute(params![inst, name, S::DestroyRequested.as_str(), now, key])?,
            Change::ResourceCreated {
                name,
                external_id,
                state,
            } => self.record_outcome(
                inst,
                name,
                Some(external_id),
                state,
                (S::CreateRequested, S::Created),
            )?,
            // An update's outcome may keep the external id (`None`).
            Change::ResourceUpdated {
                name,
                external_id,
                state,
            } => self.record_outcome(
                inst,
                name,
                external_id.as_ref(),
                state,
                (S::UpdateRequested, S::Updated),
            )?,
            Change::ResourceRemoved { name } => {
                if self.link_of(inst, name)?.is_some() {
                    return Ok(false);
                }
                self.tx
                    .prepare_cached(
                        "DELETE FROM resources WHERE instance_id = ?1 AND name = ?2 \
                         AND status IN (?3, ?4)",
                    )?
                    .execute(params![
                        inst,
                        name,
                        S::DestroyRequested.as_str(),
                        S::CreateFailed.as_str()
                    ])?
            }
            _ => 0,
        };
        Ok(changed == 1)
    }

    /// A create's or update's outcome, if the resource's status is `from`: the rows changed.
    fn record_outcome(
        &self,
        inst: &str,
        name: &str,
        external_id: Option<&String>,
        state: &Value,
        (from, to): (ResourceStatus, ResourceStatus),
    ) -> Result<usize> {
        Ok(self
            .tx
            .prepare_cached(
                "UPDATE resources SET status = ?3, external_id = COALESCE(?4, external_id), \
                 state = ?5, failure_reason = NULL, updated_at = ?6 \
                 WHERE instance_id = ?1 AND name = ?2 AND status = ?7",
            )?
            .execute(params![
                inst,
                name,
                to.as_str(),
                external_id,
                json_text(state),
                self.now.as_millis(),
                from.as_str()
            ])?)
    }

    /// A link that names resource `name` (either end), if any.
    fn link_of(&self, inst: &str, name: &str) -> Result<Option<(String, String)>> {
        Ok(self
            .tx
            .prepare_cached(
                "SELECT resource_a, resource_b FROM links WHERE instance_id = ?1 \
                 AND (resource_a = ?2 OR resource_b = ?2) LIMIT 1",
            )?
            .query_row([inst, name], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?)
    }
}

// ---- the trait --------------------------------------------------------------------------------

#[async_trait::async_trait]
impl StateStore for SqliteStore {
    async fn create_instance(&self, name: &str) -> Result<Instance> {
        non_empty("instance name", name)?;
        let name = name.to_owned();
        self.write(move |w| {
            if w.exists("SELECT 1 FROM instances WHERE name = ?1", &[&name])? {
                return Err(StateError::Conflict(Conflict::NameTaken { name }));
            }
            let id = new_id("ins");
            w.tx.prepare_cached(
                "INSERT INTO instances (id, name, status, version, last_seq, pruned_through, \
                 lease_epoch, created_at, updated_at) VALUES (?1, ?2, ?3, 0, 0, 0, 0, ?4, ?4)",
            )?
            .execute(params![
                id,
                name,
                InstanceStatus::New.as_str(),
                w.now.as_millis()
            ])?;
            w.append_events(
                &id,
                vec![NewEvent::new("instance.created", json!({ "name": name }))],
            )?;
            get_instance(w.tx, &id)
        })
        .await
    }

    async fn get_instance(&self, instance_id: &str) -> Result<Instance> {
        let id = instance_id.to_owned();
        self.read(move |tx, _| get_instance(tx, &id)).await
    }

    async fn find_instance(&self, name: &str) -> Result<Option<Instance>> {
        let name = name.to_owned();
        self.read(move |tx, _| {
            tx.prepare_cached(&format!(
                "SELECT {INSTANCE_COLS} FROM instances WHERE name = ?1"
            ))?
            .query_and_then([&name], decode_instance)?
            .next()
            .transpose()
        })
        .await
    }

    async fn list_instances(&self) -> Result<Vec<Instance>> {
        self.read(|tx, _| {
            tx.prepare_cached(&format!(
                "SELECT {INSTANCE_COLS} FROM instances ORDER BY rowid"
            ))?
            .query_and_then([], decode_instance)?
            .collect()
        })
        .await
    }

    async fn count_resources(&self, instance_id: &str) -> Result<u64> {
        let id = instance_id.to_owned();
        self.read(move |tx, _| {
            get_instance(tx, &id)?;
            let n: i64 = tx
                .prepare_cached("SELECT COUNT(*) FROM resources WHERE instance_id = ?1")?
                .query_row([&id], |r| r.get(0))?;
            to_u64(n, "resource count")
        })
        .await
    }

    async fn get_resource(&self, instance_id: &str, name: &str) -> Result<Option<Resource>> {
        let (id, name) = (instance_id.to_owned(), name.to_owned());
        self.read(move |tx, _| {
            get_instance(tx, &id)?;
            tx.prepare_cached(&format!(
                "SELECT {RESOURCE_COLS} FROM resources WHERE instance_id = ?1 AND name = ?2"
            ))?
            .query_and_then(rusqlite::params![id, name], decode_resource)?
            .next()
            .transpose()
        })
        .await
    }

    async fn load_state(&self, instance_id: &str) -> Result<InstanceState> {
        let id = instance_id.to_owned();
        self.read(move |tx, _| {
            let instance = get_instance(tx, &id)?;
            // Sorted here rather than by SQLite: its sorter copied every row, state and all
            // (a fifth of loading a 10,000-resource instance). The rows are counted first and
            // sorted by position, so no resource is moved more than twice.
            let count: i64 = tx
                .prepare_cached("SELECT count(*) FROM resources WHERE instance_id = ?1")?
                .query_row([&id], |r| r.get(0))?;
            let count = usize::try_from(count).unwrap_or(0);
            let mut rowids: Vec<(i64, usize)> = Vec::with_capacity(count);
            let mut loaded: Vec<Option<RawResource>> = Vec::with_capacity(count);
            let mut rows = tx.prepare_cached(&format!(
                "SELECT {RESOURCE_COLS}, rowid FROM resources WHERE instance_id = ?1"
            ))?;
            let mut rows = rows.query([&id])?;
            while let Some(row) = rows.next()? {
                rowids.push((row.get(13)?, loaded.len()));
                loaded.push(Some(RawResource::read(row)?));
            }
            rowids.sort_unstable();
            let resources = decode_resources(
                rowids
                    .into_iter()
                    .filter_map(|(_, k)| loaded[k].take())
                    .collect(),
            )?;
            let links = list(
                tx,
                "SELECT instance_id, resource_a, resource_b, link_type, status, data, \
                 created_at, updated_at FROM links WHERE instance_id = ?1 ORDER BY rowid",
                &id,
                decode_link,
            )?;
            let children = list(
                tx,
                "SELECT instance_id, name, child_instance_id, created_at, updated_at \
                 FROM children WHERE instance_id = ?1 ORDER BY rowid",
                &id,
                decode_child,
            )?;
            let exports = list(
                tx,
                "SELECT instance_id, name, type, value, updated_at FROM exports \
                 WHERE instance_id = ?1 ORDER BY rowid",
                &id,
                decode_export,
            )?;
            Ok(InstanceState {
                instance,
                resources,
                links,
                children,
                exports,
            })
        })
        .await
    }

    async fn acquire_lease(&self, instance_id: &str, owner: &str, ttl: Duration) -> Result<Lease> {
        non_empty("lease owner", owner)?;
        let (id, owner) = (instance_id.to_owned(), owner.to_owned());
        self.write(move |w| {
            let instance = get_instance(w.tx, &id)?;
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
            w.tx.prepare_cached(
                "UPDATE instances SET lease_epoch = ?2, lease_owner = ?3, lease_token = ?4, \
                 lease_expires_at = ?5 WHERE id = ?1",
            )?
            .execute(params![
                lease.instance_id,
                to_i64(lease.epoch),
                lease.owner,
                lease.token,
                lease.expires_at.as_millis()
            ])?;
            Ok(lease)
        })
        .await
    }

    async fn heartbeat(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let mut lease = lease.clone();
        self.write(move |w| {
            w.fence(&lease)?;
            lease.expires_at = w.now.plus(ttl);
            w.tx.prepare_cached("UPDATE instances SET lease_expires_at = ?2 WHERE id = ?1")?
                .execute(params![lease.instance_id, lease.expires_at.as_millis()])?;
            Ok(lease)
        })
        .await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<()> {
        let lease = lease.clone();
        self.write(move |w| {
            w.fence(&lease)?;
            w.tx.prepare_cached(
                "UPDATE instances SET lease_owner = NULL, lease_token = NULL, \
                 lease_expires_at = NULL WHERE id = ?1",
            )?
            .execute([&lease.instance_id])?;
            Ok(())
        })
        .await
    }

    async fn commit(
        &self,
        lease: &Lease,
        changes: Vec<Change>,
        events: Vec<NewEvent>,
    ) -> Result<Committed> {
        let lease = lease.clone();
        self.write(move |w| {
            w.fence(&lease)?;
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
                w.apply(&lease, change)?;
            }
            let version = w.bump_version(&lease.instance_id)?;
            let (first_seq, last_seq) = w.append_events(&lease.instance_id, events)?;
            Ok(Committed {
                version,
                first_seq,
                last_seq,
            })
        })
        .await
    }

    async fn create_change_set(&self, new: NewChangeSet) -> Result<ChangeSet> {
        if let Some(key) = &new.request {
            non_empty("request id", &key.id)?;
        }
        self.write(move |w| {
            // Checked inside the write transaction, so two concurrent retries of one request
            // cannot both record a change set.
            if let Some(key) = &new.request
                && let Some(cs) = find_change_set(w.tx, &key.id)?
            {
                return same_request(cs, key);
            }
            let instance = get_instance(w.tx, &new.instance_id)?;
            if new.planned_version > instance.version {
                return Err(StateError::rejected(format!(
                    "change set planned against version {} of instance `{}`, which is only at \
                     version {}",
                    new.planned_version, instance.id, instance.version
                )));
            }
            let id = new_id("cs");
            w.tx.prepare_cached(
                "INSERT INTO change_sets (id, instance_id, planned_version, digest, body, \
                 status, created_at, updated_at, request_id, request_digest) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8, ?9)",
            )?
            .execute(params![
                id,
                new.instance_id,
                to_i64(new.planned_version),
                new.digest,
                json_text(&new.body),
                ChangeSetStatus::Planned.as_str(),
                w.now.as_millis(),
                new.request.as_ref().map(|k| &k.id),
                new.request.as_ref().map(|k| &k.digest),
            ])?;
            w.append_events(
                &new.instance_id,
                vec![NewEvent::new(
                    "change_set.planned",
                    json!({ "changeSet": id, "plannedVersion": new.planned_version }),
                )],
            )?;
            // Read back without the body, which is the one just written.
            Ok(ChangeSet {
                body: new.body,
                ..get_change_set_head(w.tx, &id)?
            })
        })
        .await
    }

    async fn get_change_set(&self, change_set_id: &str) -> Result<ChangeSet> {
        let id = change_set_id.to_owned();
        self.read(move |tx, _| get_change_set(tx, &id)).await
    }

    async fn get_change_set_head(&self, change_set_id: &str) -> Result<ChangeSet> {
        let id = change_set_id.to_owned();
        self.read(move |tx, _| get_change_set_head(tx, &id)).await
    }

    async fn find_change_set(&self, request: &RequestKey) -> Result<Option<ChangeSet>> {
        let key = request.clone();
        self.read(move |tx, _| {
            find_change_set(tx, &key.id)?
                .map(|cs| same_request(cs, &key))
                .transpose()
        })
        .await
    }

    async fn list_change_sets(&self, instance_id: &str) -> Result<Vec<ChangeSet>> {
        let id = instance_id.to_owned();
        self.read(move |tx, _| {
            get_instance(tx, &id)?;
            list(
                tx,
                &format!(
                    "SELECT {CHANGE_SET_COLS} FROM change_sets WHERE instance_id = ?1 \
                     ORDER BY rowid"
                ),
                &id,
                decode_change_set,
            )
        })
        .await
    }

    async fn begin_execution(&self, change_set_id: &str, lease: &Lease) -> Result<Committed> {
        let (id, lease) = (change_set_id.to_owned(), lease.clone());
        // The inner result is the answer; a `Stale` answer still commits (marking the change
        // set superseded), so it travels as `Ok(Err(..))` through the transaction.
        self.write(move |w| -> Result<Result<Committed>> {
            w.fence(&lease)?;
            let cs = get_change_set_head(w.tx, &id)?;
            if cs.instance_id != lease.instance_id {
                return Err(StateError::rejected(format!(
                    "change set `{id}` belongs to instance `{}`, not `{}`",
                    cs.instance_id, lease.instance_id
                )));
            }
            let instance = get_instance(w.tx, &cs.instance_id)?;
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
            let now = w.now.as_millis();
            let tx = w.tx;
            let set_status = tx.prepare_cached(
                "UPDATE change_sets SET status = ?2, updated_at = ?3 WHERE id = ?1",
            );
            if cs.planned_version != instance.version {
                set_status?.execute(params![id, ChangeSetStatus::Superseded.as_str(), now])?;
                w.append_events(
                    &cs.instance_id,
                    vec![NewEvent::new(
                        "change_set.superseded",
                        json!({ "changeSet": id, "currentVersion": instance.version }),
                    )],
                )?;
                return Ok(Err(stale));
            }
            set_status?.execute(params![id, ChangeSetStatus::Executing.as_str(), now])?;
            // Every other plan of this instance read the version this execution is about to
            // change: they are stale from now on.
            let superseded: Vec<String> = tx
                .prepare_cached(
                    "UPDATE change_sets SET status = ?3, updated_at = ?4 \
                     WHERE instance_id = ?1 AND status = ?2 AND id != ?5 RETURNING id",
                )?
                .query_map(
                    params![
                        cs.instance_id,
                        ChangeSetStatus::Planned.as_str(),
                        ChangeSetStatus::Superseded.as_str(),
                        now,
                        id
                    ],
                    |r| r.get(0),
                )?
                .collect::<rusqlite::Result<_>>()?;
            let version = w.bump_version(&cs.instance_id)?;
            let (first_seq, last_seq) = w.append_events(
                &cs.instance_id,
                vec![NewEvent::new(
                    "change_set.executing",
                    json!({ "changeSet": id, "superseded": superseded }),
                )],
            )?;
            Ok(Ok(Committed {
                version,
                first_seq,
                last_seq,
            }))
        })
        .await?
    }

    async fn create_operation(&self, new: NewOperation) -> Result<Accepted> {
        non_empty("request id", &new.request_id)?;
        non_empty("operation owner", &new.owner)?;
        self.write(move |w| {
            // Checked inside the write transaction, so two concurrent retries of one request
            // cannot both create an operation.
            if let Some(op) = find_operation(w.tx, &new.request_id)? {
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
            get_instance(w.tx, &new.instance_id)?;
            if let Some(cs_id) = &new.change_set_id {
                let cs = get_change_set_head(w.tx, cs_id)?;
                if cs.instance_id != new.instance_id {
                    return Err(StateError::rejected(format!(
                        "change set `{cs_id}` belongs to instance `{}`, not `{}`",
                        cs.instance_id, new.instance_id
                    )));
                }
            }
            let id = new_id("op");
            w.tx.prepare_cached(
                "INSERT INTO operations (id, instance_id, kind, request_id, request_digest, \
                 change_set_id, owner, status, created_at, updated_at, events_after) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, \
                 COALESCE((SELECT last_seq FROM instances WHERE id = ?2), 0))",
            )?
            .execute(params![
                id,
                new.instance_id,
                new.kind.as_str(),
                new.request_id,
                new.request_digest,
                new.change_set_id,
                new.owner,
                OperationStatus::Pending.as_str(),
                w.now.as_millis()
            ])?;
            w.append_events(
                &new.instance_id,
                vec![NewEvent::new(
                    "operation.accepted",
                    json!({ "operation": id, "kind": new.kind.as_str(),
                            "requestId": new.request_id }),
                )],
            )?;
            Ok(Accepted {
                operation: get_operation(w.tx, &id)?,
                created: true,
            })
        })
        .await
    }

    async fn get_operation(&self, operation_id: &str) -> Result<Operation> {
        let id = operation_id.to_owned();
        self.read(move |tx, _| get_operation(tx, &id)).await
    }

    async fn find_operation(&self, request_id: &str) -> Result<Option<Operation>> {
        let id = request_id.to_owned();
        self.read(move |tx, _| find_operation(tx, &id)).await
    }

    async fn request_cancel(&self, operation_id: &str) -> Result<bool> {
        let id = operation_id.to_owned();
        let open = self
            .write(move |w| {
                get_operation(w.tx, &id)?;
                let n = w.tx.execute(
                    "UPDATE operations SET cancel_requested = 1 WHERE id = ?1 AND status IN (?2, ?3)",
                    rusqlite::params![
                        id,
                        OperationStatus::Pending.as_str(),
                        OperationStatus::Running.as_str()
                    ],
                )?;
                Ok(n > 0)
            })
            .await?;
        if open {
            self.inner.notifier.cancel(operation_id);
        }
        Ok(open)
    }

    async fn cancel_requested(&self, operation_id: &str) -> Result<bool> {
        let id = operation_id.to_owned();
        self.read(move |tx, _| {
            get_operation(tx, &id)?;
            let n: i64 = tx.query_row(
                "SELECT cancel_requested FROM operations WHERE id = ?1",
                [&id],
                |r| r.get(0),
            )?;
            Ok(n != 0)
        })
        .await
    }

    fn cancel_requests(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.inner.notifier.cancel_requests()
    }

    async fn put_asset(&self, _key: &str, _content: Vec<u8>) -> Result<()> {
        Err(not_shared())
    }

    async fn get_asset(&self, _key: &str) -> Result<Option<Vec<u8>>> {
        Err(not_shared())
    }

    async fn list_operations(&self, instance_id: &str) -> Result<Vec<Operation>> {
        let id = instance_id.to_owned();
        self.read(move |tx, _| {
            get_instance(tx, &id)?;
            list(
                tx,
                &format!(
                    "SELECT {OPERATION_COLS} FROM operations WHERE instance_id = ?1 \
                     ORDER BY rowid"
                ),
                &id,
                decode_operation,
            )
        })
        .await
    }

    async fn mark_interrupted(&self, scope: InterruptScope) -> Result<Vec<Operation>> {
        self.write(move |w| {
            let now = w.now;
            let open: Vec<Operation> =
                w.tx.prepare_cached(&format!(
                    "SELECT {OPERATION_COLS} FROM operations WHERE status IN (?1, ?2) \
                     ORDER BY rowid"
                ))?
                .query_and_then(
                    [
                        OperationStatus::Pending.as_str(),
                        OperationStatus::Running.as_str(),
                    ],
                    decode_operation,
                )?
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
                            "engine `{owner}` shut down before the operation finished (its drain \
                             timeout ran out)"
                        )
                    }
                    InterruptScope::Owner(_) | InterruptScope::ShutDown(_) => continue,
                    InterruptScope::Expired => {
                        // Pending operations have no lease yet: a live engine may be about to
                        // start them. Only its own restart (`Owner`) recovers those.
                        if op.status != OperationStatus::Running {
                            continue;
                        }
                        let instance = get_instance(w.tx, &op.instance_id)?;
                        let live = instance.lease.as_ref().is_some_and(|l| l.expires_at > now)
                            && Some(instance.lease_epoch) == op.lease_epoch;
                        if live {
                            continue;
                        }
                        if instance.lease.is_some() && Some(instance.lease_epoch) == op.lease_epoch
                        {
                            // Expired but never taken over: revoke, so the paused engine that
                            // held it is fenced if it wakes up.
                            revoke.push(op.instance_id.clone());
                        }
                        "the operation's lease expired".to_owned()
                    }
                };
                w.tx.prepare_cached(
                    "UPDATE operations SET status = ?2, error = ?3, updated_at = ?4, \
                     finished_at = ?4 WHERE id = ?1",
                )?
                .execute(params![
                    op.id,
                    OperationStatus::Interrupted.as_str(),
                    reason,
                    now.as_millis()
                ])?;
                if let Some(cs) = &op.change_set_id {
                    w.tx.prepare_cached(
                        "UPDATE change_sets SET status = ?3, updated_at = ?4 \
                         WHERE id = ?1 AND status = ?2",
                    )?
                    .execute(params![
                        cs,
                        ChangeSetStatus::Executing.as_str(),
                        ChangeSetStatus::Failed.as_str(),
                        now.as_millis()
                    ])?;
                }
                w.append_events(
                    &op.instance_id,
                    vec![NewEvent::new(
                        "operation.interrupted",
                        json!({ "operation": op.id, "reason": reason }),
                    )],
                )?;
                interrupted.push(op.id);
            }

            let mut clear = w.tx.prepare_cached(
                "UPDATE instances SET lease_owner = NULL, lease_token = NULL, \
                 lease_expires_at = NULL WHERE id = ?1",
            )?;
            for id in revoke {
                clear.execute([id])?;
            }
            if let InterruptScope::Owner(owner) | InterruptScope::ShutDown(owner) = &scope {
                // A restarted (or stopping) engine holds nothing: every lease it had is dead.
                w.tx.prepare_cached(
                    "UPDATE instances SET lease_owner = NULL, lease_token = NULL, \
                     lease_expires_at = NULL WHERE lease_owner = ?1",
                )?
                .execute([owner])?;
            }
            interrupted
                .iter()
                .map(|id| get_operation(w.tx, id))
                .collect()
        })
        .await
    }

    async fn events_since(
        &self,
        instance_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<Event>> {
        if let Some(events) = self.inner.tail.since(instance_id, after_seq, limit) {
            return Ok(events);
        }
        let id = instance_id.to_owned();
        self.read(move |tx, _| {
            let instance = get_instance(tx, &id)?;
            if after_seq < instance.pruned_through {
                return Err(StateError::EventsPruned {
                    instance_id: id,
                    after_seq,
                    pruned_through: instance.pruned_through,
                });
            }
            tx.prepare_cached(
                "SELECT instance_id, seq, kind, payload, at FROM events \
                 WHERE instance_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
            )?
            .query_and_then(
                params![
                    id,
                    to_i64(after_seq),
                    i64::try_from(limit).unwrap_or(i64::MAX)
                ],
                decode_event,
            )?
            .collect()
        })
        .await
    }

    fn subscribe(&self, instance_id: &str) -> EventSubscription {
        self.inner.notifier.subscribe(instance_id)
    }

    async fn backup(&self) -> Result<StateBackup> {
        let inner = self.inner.clone();
        blocking(move || backup::copy(&inner)).await
    }

    async fn prune(&self, policy: &RetentionPolicy) -> Result<PruneReport> {
        let policy = policy.clone();
        let inner = self.inner.clone();
        self.write(move |w| {
            let events_cutoff = w.now.minus(policy.events_older_than).as_millis();
            let mut report = PruneReport::default();
            let instances: Vec<(String, i64, i64)> =
                w.tx.prepare_cached("SELECT id, last_seq, pruned_through FROM instances")?
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect::<rusqlite::Result<_>>()?;
            for (id, last_seq, pruned_through) in instances {
                // The newest `keep_last_events` stay whatever their age.
                let keep_floor = last_seq.saturating_sub(to_i64(policy.keep_last_events));
                // Remove a prefix of the sequence, never a hole: up to the newest old-enough
                // event below the floor (if the clock stepped back, a slightly newer event below
                // it goes too, which is the price of never punching holes in a stream).
                let cut: Option<i64> =
                    w.tx.prepare_cached(
                        "SELECT MAX(seq) FROM events WHERE instance_id = ?1 AND at < ?2 \
                         AND seq <= ?3",
                    )?
                    .query_row(params![id, events_cutoff, keep_floor], |r| r.get(0))?;
                let Some(cut) = cut.filter(|cut| *cut > pruned_through) else {
                    continue;
                };
                let n =
                    w.tx.prepare_cached("DELETE FROM events WHERE instance_id = ?1 AND seq <= ?2")?
                        .execute(params![id, cut])?;
                w.tx.prepare_cached("UPDATE instances SET pruned_through = ?2 WHERE id = ?1")?
                    .execute(params![id, cut])?;
                // What memory holds may reach below the cut: the database answers instead.
                inner.tail.forget(&id);
                report.events_deleted += n as u64;
            }
            // Executing change sets belong to a running (or interrupted-but-unrecovered)
            // operation; everything else old is history.
            let n = w
                .tx
                .prepare_cached("DELETE FROM change_sets WHERE created_at < ?1 AND status != ?2")?
                .execute(params![
                    w.now.minus(policy.change_sets_older_than).as_millis(),
                    ChangeSetStatus::Executing.as_str()
                ])?;
            report.change_sets_deleted = n as u64;
            Ok(report)
        })
        .await
    }
}

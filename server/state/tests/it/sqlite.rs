//! The state layer on SQLite: the whole store-agnostic conformance suite
//! (`trellis_state::conformance`) against `SqliteStore` on a temp dir, then what only the
//! embedded store has: the data-dir lock, migrations, durability across reopen and SIGKILL,
//! and corrupt rows reported as errors.
//!
//! Some tests start this very test binary again as a helper process (`helper_process`, selected
//! by `TRELLIS_STATE_HELPER`), so a real, separate process holds the lock or gets killed.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::json;
use trellis_state::conformance::Harness;
use trellis_state::sqlite::SCHEMA_VERSION;
use trellis_state::*;

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("trellis-state-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `store` with an instance `app` and its lease, held by `engine-1`.
async fn leased(store: SqliteStore) -> (SqliteStore, Instance, Lease) {
    let inst = store.create_instance("app").await.unwrap();
    let lease = store
        .acquire_lease(&inst.id, "engine-1", Duration::from_secs(60))
        .await
        .unwrap();
    (store, inst, lease)
}

fn open_with_clock(dir: &Path, clock: Arc<ManualClock>) -> SqliteStore {
    let options = SqliteOptions {
        clock,
        ..SqliteOptions::default()
    };
    reopen_with(dir, options)
}

/// Opens the store in `dir`, which this process may have closed a moment ago. The lock is an
/// `flock` on open file descriptions: a child process another test is spawning holds copies of
/// every descriptor from its fork until its exec closes them (close-on-exec), so a lock this
/// process just released can still be held for that instant. It is waited out, within a bound
/// that only stops a hang. (The engine never reopens a store in-process.)
fn reopen_with(dir: &Path, options: SqliteOptions) -> SqliteStore {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match SqliteStore::open_with(dir, options.clone()) {
            Err(StateError::DataDirLocked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            r => return r.expect("open store"),
        }
    }
}

fn reopen(dir: &Path) -> SqliteStore {
    reopen_with(dir, SqliteOptions::default())
}

async fn harness() -> Harness {
    let dir = TempDir::new("conformance");
    let clock = Arc::new(ManualClock::default());
    let store = open_with_clock(dir.path(), clock.clone());
    Harness {
        store: Arc::new(store),
        clock,
        guard: Some(Box::new(dir)),
    }
}

trellis_state::state_conformance_tests!(harness);

// ---- helper processes -------------------------------------------------------------------------

const HELPER_ENV: &str = "TRELLIS_STATE_HELPER";
const HELPER_DIR_ENV: &str = "TRELLIS_STATE_HELPER_DIR";
const HELPER_ROUND_ENV: &str = "TRELLIS_STATE_HELPER_ROUND";

/// Not a test on its own: the entry point of the helper process the tests below spawn. Does
/// nothing unless `TRELLIS_STATE_HELPER` says which helper to be.
#[test]
fn helper_process() {
    let Ok(mode) = std::env::var(HELPER_ENV) else {
        return;
    };
    let dir = PathBuf::from(std::env::var(HELPER_DIR_ENV).unwrap());
    match mode.as_str() {
        "hold-lock" => {
            let _store = SqliteStore::open(&dir).unwrap();
            println!("READY");
            // Hold the store until the parent closes stdin or kills us.
            let _ = std::io::stdin().read_line(&mut String::new());
        }
        "crash-writer" => {
            let round: usize = std::env::var(HELPER_ROUND_ENV).unwrap().parse().unwrap();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(crash_writer(&dir, round));
        }
        other => panic!("unknown helper {other}"),
    }
}

/// Writes intents and completions as fast as it can, reporting each committed one on stdout,
/// until it is killed.
async fn crash_writer(dir: &Path, round: usize) {
    let store = SqliteStore::open(dir).unwrap();
    let inst = store
        .create_instance(&format!("crash-{round}"))
        .await
        .unwrap();
    let lease = store
        .acquire_lease(&inst.id, "crasher", Duration::from_secs(3600))
        .await
        .unwrap();
    println!("READY");
    // Bounded, so a helper whose parent vanished without killing it still ends.
    for i in 0..20_000u64 {
        let name = format!("r{i}");
        let c = store
            .record_intent(&lease, &name, "test/thing", json!({ "i": i }))
            .await
            .unwrap();
        println!("INTENT {i} {}", c.last_seq);
        let events = (0..created_events(i))
            .map(|k| NewEvent::new("created", json!({ "i": i, "k": k })))
            .collect();
        let changes = vec![
            Change::ResourceCreated {
                name,
                external_id: format!("ext-{i}"),
                state: json!({ "i": i }),
            },
            Change::PutExport {
                name: "last".into(),
                export_type: "integer".into(),
                value: json!(i),
            },
        ];
        let c = store.commit(&lease, changes, events).await.unwrap();
        println!("CREATED {i} {}", c.last_seq);
    }
}

/// Events the crash writer appends when it completes resource `i` (1 to 3).
fn created_events(i: u64) -> u64 {
    1 + i % 3
}

/// A helper process: this test binary in a helper mode. Its stdout lines arrive through a
/// reader thread, so a test waits for them with a bound instead of hanging on a silent child;
/// dropping it kills and reaps the child.
struct Helper {
    child: Child,
    lines: mpsc::Receiver<String>,
}

/// How long a test waits for a helper's next line before giving up: a guard against hangs,
/// far above what any machine needs, not a timing assertion.
const HELPER_PATIENCE: Duration = Duration::from_secs(120);

impl Helper {
    fn spawn(mode: &str, dir: &Path, round: usize) -> Helper {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "sqlite::helper_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HELPER_ENV, mode)
            .env(HELPER_DIR_ENV, dir)
            .env(HELPER_ROUND_ENV, round.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn helper");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Helper { child, lines }
    }

    /// The next stdout line; `None` once the child's stdout is closed.
    fn next_line(&mut self) -> Option<String> {
        match self.lines.recv_timeout(HELPER_PATIENCE) {
            Ok(line) => Some(line),
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("helper silent for {HELPER_PATIENCE:?}: {}", self.stderr())
            }
        }
    }

    /// Waits for the helper's READY line (libtest may print it after its own `test ... `).
    fn wait_ready(&mut self) {
        while let Some(line) = self.next_line() {
            if line.ends_with("READY") {
                return;
            }
        }
        panic!("helper ended before READY: {}", self.stderr());
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its stderr (call once it is dead, or it blocks until it is).
    fn stderr(&mut self) -> String {
        self.kill();
        let mut text = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut err, &mut text);
        }
        text
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---- the data-directory lock ------------------------------------------------------------------

#[test]
fn second_open_fails_while_the_data_dir_is_locked() {
    let dir = TempDir::new("lock");
    let store = SqliteStore::open(dir.path()).unwrap();
    let lock_file = dir.path().join("engine.lock");
    assert_eq!(store.lock_path(), lock_file);
    assert_eq!(
        std::fs::read_to_string(&lock_file).unwrap().trim(),
        std::process::id().to_string()
    );
    let err = SqliteStore::open(dir.path()).expect_err("a second open must fail");
    let StateError::DataDirLocked { lock_file: f, pid } = &err else {
        panic!("expected DataDirLocked, got {err:?}");
    };
    assert_eq!(f, &lock_file);
    assert_eq!(*pid, Some(std::process::id()));
    let msg = err.to_string();
    assert!(msg.contains(&lock_file.display().to_string()), "{msg}");
    assert!(msg.contains(&std::process::id().to_string()), "{msg}");
    // The failed open did not disturb the holder's pid.
    assert_eq!(
        std::fs::read_to_string(&lock_file).unwrap().trim(),
        std::process::id().to_string()
    );
    // A clone shares the lock; only dropping the last handle releases it.
    let clone = store.clone();
    drop(store);
    assert!(matches!(
        SqliteStore::open(dir.path()),
        Err(StateError::DataDirLocked { .. })
    ));
    drop(clone);
    let reopened = reopen(dir.path());
    drop(reopened);
}

#[test]
fn a_lock_held_by_another_process_blocks_until_it_dies() {
    let dir = TempDir::new("lock-child");
    let mut helper = Helper::spawn("hold-lock", dir.path(), 0);
    helper.wait_ready();
    match SqliteStore::open(dir.path()) {
        Err(StateError::DataDirLocked { pid, lock_file }) => {
            assert_eq!(pid, Some(helper.child.id()));
            assert_eq!(lock_file, dir.path().join("engine.lock"));
        }
        other => panic!("expected DataDirLocked, got {other:?}"),
    }
    // SIGKILL: no destructor runs, the kernel releases the lock with the process.
    helper.kill();
    reopen(dir.path());
}

// ---- schema and durability --------------------------------------------------------------------

#[test]
fn migrations_are_idempotent_and_a_newer_schema_is_refused() {
    let dir = TempDir::new("migrations");
    for _ in 0..3 {
        drop(reopen(dir.path()));
    }
    let db = dir.path().join("state.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let versions: Vec<i64> = conn
        .prepare("SELECT version FROM schema_migrations ORDER BY version")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");

    conn.execute(
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, 'future', 0)",
        [SCHEMA_VERSION + 1],
    )
    .unwrap();
    drop(conn);
    match SqliteStore::open(dir.path()) {
        Err(StateError::Db(msg)) => assert!(msg.contains("newer"), "{msg}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn files_are_private() {
    let dir = TempDir::new("modes");
    let store = SqliteStore::open(dir.path()).unwrap();
    for file in ["state.db", "engine.lock"] {
        let mode = std::fs::metadata(dir.path().join(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{file} is readable by others: {mode:o}");
    }
    assert_eq!(store.db_path(), dir.path().join("state.db"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_reopen() {
    let dir = TempDir::new("reopen");
    let clock = Arc::new(ManualClock::default());
    let (store, inst, lease) = leased(open_with_clock(dir.path(), clock.clone())).await;
    store
        .record_intent(&lease, "db", "test/db", json!({ "size": 1 }))
        .await
        .unwrap();
    store
        .complete_create(&lease, "db", "db-1", json!({ "host": "h" }))
        .await
        .unwrap();
    store
        .commit(
            &lease,
            vec![Change::PutExport {
                name: "host".into(),
                export_type: "string".into(),
                value: json!("h"),
            }],
            vec![NewEvent::new("note", json!({ "unicode": "é✓" }))],
        )
        .await
        .unwrap();
    let cs = store
        .create_change_set(NewChangeSet {
            instance_id: inst.id.clone(),
            planned_version: 3,
            digest: "d".into(),
            body: json!({ "plan": [1, 2.5, null, { "nested": true }] }),
            request: Some(RequestKey {
                id: "plan-1".into(),
                digest: "r".into(),
            }),
        })
        .await
        .unwrap();
    let op = store
        .create_operation(NewOperation {
            instance_id: inst.id.clone(),
            kind: OperationKind::Reconcile,
            request_id: "req".into(),
            request_digest: "rd".into(),
            change_set_id: Some(cs.id.clone()),
            owner: "engine-1".into(),
        })
        .await
        .unwrap()
        .operation;
    let before = store.load_state(&inst.id).await.unwrap();
    let events = store.events_since(&inst.id, 0, 100).await.unwrap();
    drop(store);

    let store = open_with_clock(dir.path(), clock);
    assert_eq!(store.load_state(&inst.id).await.unwrap(), before);
    assert_eq!(store.events_since(&inst.id, 0, 100).await.unwrap(), events);
    assert_eq!(store.get_change_set(&cs.id).await.unwrap(), cs);
    assert_eq!(store.get_operation(&op.id).await.unwrap(), op);
    assert_eq!(store.list_instances().await.unwrap(), vec![before.instance]);
    // The lease is state too: still current after the restart, until recovery revokes it.
    store.commit(&lease, vec![], vec![]).await.unwrap();
    store
        .mark_interrupted(InterruptScope::Owner("engine-1".into()))
        .await
        .unwrap();
    assert!(matches!(
        store.commit(&lease, vec![], vec![]).await,
        Err(StateError::Fenced { .. })
    ));
}

/// Recent events are served from memory (`sqlite/tail.rs`): every read must be what the
/// database gives after a restart, at every offset, across pruning and a store reopened with
/// events it never held in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_read_while_running_are_the_recorded_ones() {
    const READS: [(u64, usize); 6] = [
        (0, 1000),
        (0, 5),
        (13, 7),
        (79, 1000),
        (80, 1000),
        (500, 10),
    ];
    let dir = TempDir::new("tail");
    let clock = Arc::new(ManualClock::default());
    let (store, inst, lease) = leased(open_with_clock(dir.path(), clock.clone())).await;
    let payloads = [
        json!({ "z": 1, "a": [1.5, -0.0, 1e300, null], "u": "é✓\u{0}" }),
        json!({ "big": u64::MAX, "neg": i64::MIN, "nested": { "b": true, "a": {} } }),
        json!("just text"),
    ];
    let mut written = 0;
    for round in 0..40u64 {
        let events: Vec<NewEvent> = (0..=round % 3)
            .map(|i| NewEvent::new(format!("k{i}"), payloads[(round + i) as usize % 3].clone()))
            .collect();
        written += events.len();
        store.commit(&lease, vec![], events).await.unwrap();
        clock.advance(Duration::from_millis(7));
    }
    // With the instance's own first event: 80.
    assert_eq!(written, 79);
    let reads = |store: SqliteStore, after_at_least: u64| {
        let id = inst.id.clone();
        async move {
            let mut out = Vec::new();
            for (after, limit) in READS {
                out.push(
                    store
                        .events_since(&id, after.max(after_at_least), limit)
                        .await
                        .unwrap(),
                );
            }
            out
        }
    };
    let all = reads(store.clone(), 0).await;
    assert_eq!(all[0].len(), 80);
    assert_eq!(all[3].len(), 1);
    // Pruning the oldest while memory holds them: a read below the cut is refused, as the
    // database refuses it.
    let report = store
        .prune(&RetentionPolicy {
            events_older_than: Duration::ZERO,
            keep_last_events: 60,
            change_sets_older_than: Duration::from_secs(3600),
        })
        .await
        .unwrap();
    assert_eq!(report.events_deleted, 20);
    assert!(matches!(
        store.events_since(&inst.id, 13, 10).await,
        Err(StateError::EventsPruned { .. })
    ));
    let live = reads(store.clone(), 20).await;
    drop(store);

    let store = open_with_clock(dir.path(), clock);
    let recorded = reads(store.clone(), 20).await;
    assert_eq!(recorded, live);
    assert_eq!(recorded[0][..], all[0][20..]);
    // Written after the reopen: memory holds only that one; older reads come from the database.
    store
        .commit(&lease, vec![], vec![NewEvent::new("later", json!(1))])
        .await
        .unwrap();
    let now = reads(store.clone(), 20).await;
    assert_eq!(now[0].len(), 61);
    assert_eq!(now[0][..60], recorded[0][..]);
    assert_eq!(now[4], now[0][60..]);
}

/// What the store's checkpoint thread logs (`trellis_state` debug events from any thread are
/// captured process-wide, with the thread's name, once per test binary).
fn checkpoint_log() -> Arc<std::sync::Mutex<Vec<u8>>> {
    use std::sync::{Mutex, OnceLock};
    #[derive(Clone)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink(log.clone());
        tracing_subscriber::fmt()
            .with_env_filter("trellis_state=debug")
            .with_thread_names(true)
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .init();
        log
    })
    .clone()
}

/// WAL checkpoints run on the store's own thread: SQLite's automatic one ran inside the commit
/// that took the WAL past 1,000 pages, and every unit queued behind that commit waited for the
/// copy. The WAL stays bounded all the same: 30 MB written through it, never more than the
/// writer's own limit (4,000 pages) and a commit in it. Checkpoints are timed for /metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_run_off_the_writer_and_keep_the_wal_bounded() {
    let log = checkpoint_log();
    let dir = TempDir::new("checkpoint");
    let (store, inst, lease) = leased(SqliteStore::open(dir.path()).unwrap()).await;
    let wal = dir.path().join("state.db-wal");
    let page: u64 = 4096;
    let mut largest = 0;
    let filler: String = (0..8_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    for round in 0..150 {
        let changes = (0..25)
            .map(|k| Change::IntendCreate {
                name: format!("r{round}-{k}"),
                resource_type: "test/thing".into(),
                spec: json!({ "filler": filler, "round": round }),
                depends_on: vec![],
                metadata: json!(null),
                key: format!("key-{round}-{k}"),
            })
            .collect();
        store.commit(&lease, changes, vec![]).await.unwrap();
        largest = largest.max(std::fs::metadata(&wal).unwrap().len());
    }
    assert!(
        largest <= (4_000 + 200) * (page + 24),
        "the WAL grew to {largest} bytes"
    );
    assert_eq!(store.count_resources(&inst.id).await.unwrap(), 3_750);
    let ours = dir.path().join("state.db").display().to_string();
    let done_by_thread = |log: &[u8]| {
        String::from_utf8_lossy(log).lines().any(|l| {
            l.contains("sqlite-checkpoint") && l.contains("WAL checkpoint") && l.contains(&ours)
        })
    };
    // The last nudge may still be being served; the first ones long were.
    for _ in 0..100 {
        if done_by_thread(&log.lock().unwrap()) {
            // And they are timed for /metrics.
            let mut registry = prometheus_client::registry::Registry::default();
            trellis_state::metrics::register(&mut registry);
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            let count = text
                .lines()
                .find_map(|l| l.strip_prefix("trellis_state_checkpoint_duration_seconds_count "))
                .and_then(|n| n.trim().parse::<u64>().ok());
            assert!(count.is_some_and(|n| n >= 1), "{text}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "no checkpoint of {ours} by the checkpoint thread:\n{}",
        String::from_utf8_lossy(&log.lock().unwrap())
    );
}

/// `load_state` reads resources unsorted and sorts them by rowid itself: they come back whole
/// and in the order they were recorded, not in name (index) order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_instance_loads_in_recorded_order() {
    let dir = TempDir::new("large");
    let (store, inst, lease) = leased(SqliteStore::open(dir.path()).unwrap()).await;
    let names: Vec<String> = (0..9_001).rev().map(|i| format!("r{i:05}")).collect();
    let mut changes = Vec::new();
    for (i, name) in names.iter().enumerate() {
        changes.push(Change::IntendCreate {
            name: name.clone(),
            resource_type: "test/thing".into(),
            spec: json!({ "i": i, "tags": { "n": name } }),
            depends_on: names.get(i.wrapping_sub(1)).cloned().into_iter().collect(),
            metadata: json!({ "labels": { "k": "v" } }),
            key: format!("key-{i}"),
        });
        if i % 3 != 0 {
            changes.push(Change::ResourceCreated {
                name: name.clone(),
                external_id: format!("ext-{i}"),
                state: json!({ "id": i }),
            });
        }
    }
    store.commit(&lease, changes, vec![]).await.unwrap();
    let state = store.load_state(&inst.id).await.unwrap();
    let loaded: Vec<&str> = state.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(loaded, names);
    for i in [0, 1, 2, 4_500, 9_000] {
        let r = &state.resources[i];
        assert_eq!(
            Some(r),
            store
                .get_resource(&inst.id, &names[i])
                .await
                .unwrap()
                .as_ref()
        );
        assert_eq!(r.spec["i"], json!(i));
        assert_eq!(r.depends_on.len(), usize::from(i > 0));
        assert_eq!(r.state.is_some(), i % 3 != 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rows_are_corrupt_errors_not_panics() {
    let dir = TempDir::new("corrupt");
    let (store, inst, lease) = leased(SqliteStore::open(dir.path()).unwrap()).await;
    store
        .record_intent(&lease, "db", "test/db", json!({}))
        .await
        .unwrap();
    let cs = store
        .create_change_set(NewChangeSet {
            instance_id: inst.id.clone(),
            planned_version: 0,
            digest: "d".into(),
            body: json!({}),
            request: None,
        })
        .await
        .unwrap();
    drop(store);

    let db = dir.path().join("state.db");
    let damage = |sql: &str| {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(sql).unwrap();
    };
    let damaged = || reopen(dir.path());
    fn corrupt<T: std::fmt::Debug>(r: Result<T>, needle: &str) {
        match r {
            Err(StateError::Corrupt(msg)) => assert!(msg.contains(needle), "{msg}"),
            other => panic!("expected Corrupt mentioning {needle:?}, got {other:?}"),
        }
    }

    damage("UPDATE resources SET status = 'exploded'");
    corrupt(damaged().load_state(&inst.id).await, "exploded");
    damage("UPDATE resources SET status = 'created', spec = '{not json'");
    corrupt(damaged().load_state(&inst.id).await, "spec");
    damage("UPDATE events SET payload = 'nope' WHERE seq = 2");
    corrupt(damaged().events_since(&inst.id, 0, 10).await, "event 2");
    damage("UPDATE change_sets SET body = '['");
    corrupt(damaged().get_change_set(&cs.id).await, "body");
    damage("UPDATE instances SET version = -1");
    corrupt(damaged().get_instance(&inst.id).await, "negative");
    corrupt(damaged().list_instances().await, "negative");
    damage("UPDATE instances SET version = 1, lease_epoch = -5");
    // Even the fencing check reports it rather than trusting it.
    corrupt(damaged().commit(&lease, vec![], vec![]).await, "negative");
}

/// A writer killed with SIGKILL at an arbitrary point: on reopen, everything it reported as
/// committed is there, nothing half-written is, and the event sequence has no gap. Three
/// rounds on the same directory, so recovery also survives repeated crashes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_mid_write_loses_nothing_committed() {
    let dir = TempDir::new("crash");
    for round in 0..3usize {
        let mut helper = Helper::spawn("crash-writer", dir.path(), round);
        helper.wait_ready();
        let mut intents = Vec::new(); // (i, last_seq) as reported
        let mut created = Vec::new();
        let mut parse = |line: &str| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if let [tag, i, seq] = parts[..]
                && let (Ok(i), Ok(seq)) = (i.parse::<u64>(), seq.parse::<u64>())
            {
                match tag {
                    "INTENT" => intents.push((i, seq)),
                    "CREATED" => created.push((i, seq)),
                    _ => {}
                }
            }
        };
        // Kill at a different point each round (the child keeps writing while we read).
        let target = 15 + 10 * round;
        let mut seen_created = 0;
        while seen_created < target {
            let Some(line) = helper.next_line() else {
                panic!("helper stopped early: {}", helper.stderr());
            };
            seen_created += usize::from(line.starts_with("CREATED "));
            parse(&line);
        }
        helper.kill();
        // The pipe still holds what the child printed before it died: every commit it
        // reported, so at most the one in flight at the kill is unreported.
        while let Some(line) = helper.next_line() {
            parse(&line);
        }
        assert!(created.len() >= target);

        let store = reopen(dir.path());
        let inst = store
            .find_instance(&format!("crash-{round}"))
            .await
            .unwrap()
            .expect("instance committed before READY");
        let st = store.load_state(&inst.id).await.unwrap();
        let events = store.events_since(&inst.id, 0, usize::MAX).await.unwrap();

        // No gap, nothing reported missing.
        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=inst.last_seq).collect::<Vec<_>>());
        let reported = intents
            .iter()
            .chain(&created)
            .map(|(_, s)| *s)
            .max()
            .unwrap();
        assert!(inst.last_seq >= reported, "{} < {reported}", inst.last_seq);

        // Every reported intent and creation is there.
        let resource = |i: u64| st.resource(&format!("r{i}"));
        for (i, _) in &intents {
            let r = resource(*i).unwrap_or_else(|| panic!("intent r{i} lost"));
            assert!(matches!(
                r.status,
                ResourceStatus::CreateRequested | ResourceStatus::Created
            ));
        }
        for (i, _) in &created {
            let r = resource(*i).unwrap_or_else(|| panic!("creation of r{i} lost"));
            assert_eq!(r.status, ResourceStatus::Created);
            assert_eq!(r.external_id.as_deref(), Some(format!("ext-{i}").as_str()));
        }
        // At most one unit went unreported (committed just before the kill), and only the last
        // resource can still be an unresolved intent.
        let n = st.resources.len() as u64;
        let last_intent = intents.last().map_or(0, |(i, _)| *i);
        assert!(
            n == last_intent + 1 || n == last_intent + 2,
            "{n} resources"
        );
        for (k, r) in st.resources.iter().enumerate() {
            assert_eq!(r.name, format!("r{k}"));
            if (k as u64) + 1 < n {
                assert_eq!(r.status, ResourceStatus::Created, "{}", r.name);
            }
        }

        // Rows, version and events moved together: each intent is one commit with one event,
        // each creation one commit with its events and the `last` export.
        let done: Vec<u64> = st
            .resources
            .iter()
            .enumerate()
            .filter(|(_, r)| r.status == ResourceStatus::Created)
            .map(|(k, _)| k as u64)
            .collect();
        assert_eq!(inst.version, n + done.len() as u64);
        let expected_events = 1 + n + done.iter().map(|i| created_events(*i)).sum::<u64>();
        assert_eq!(inst.last_seq, expected_events);
        assert_eq!(
            st.export("last").map(|e| e.value.clone()),
            done.last().map(|i| json!(i))
        );
        drop(store);

        let conn = rusqlite::Connection::open(dir.path().join("state.db")).unwrap();
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
    }
}

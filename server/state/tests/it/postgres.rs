//! The state layer on PostgreSQL: the whole store-agnostic conformance suite
//! (`trellis_state::conformance`) against `PostgresStore`, each case in a schema of its own
//! (created by the store, dropped when the case ends), then what only this store has:
//! migrations racing at startup.
//!
//! The server is `TRELLIS_TEST_POSTGRES` (default `postgres://root@127.0.0.1:5432/test`). Without
//! one the cases say "skipped" and pass, unless `TRELLIS_REQUIRE_POSTGRES=1` (CI), which makes
//! them fail instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use trellis_state::conformance::Harness;
use trellis_state::postgres::{SCHEMA_VERSION, redact_url};
use trellis_state::*;

const DEFAULT_URL: &str = "postgres://root@127.0.0.1:5432/test";

fn url() -> String {
    std::env::var("TRELLIS_TEST_POSTGRES").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A connection for the test's own statements, or `None` (after saying why) when there is no
/// server and none is required.
async fn admin() -> Option<tokio_postgres::Client> {
    let url = url();
    let config: tokio_postgres::Config = url.parse().expect("TRELLIS_TEST_POSTGRES is not a URL");
    let connected = tokio::time::timeout(
        Duration::from_secs(10),
        config.connect(tokio_postgres::NoTls),
    )
    .await
    .map_err(|_| "timed out".to_owned())
    .and_then(|r| r.map_err(|e| e.to_string()));
    match connected {
        Ok((client, connection)) => {
            tokio::spawn(connection);
            Some(client)
        }
        Err(e) => {
            let shown = redact_url(&url);
            if std::env::var("TRELLIS_REQUIRE_POSTGRES").as_deref() == Ok("1") {
                panic!(
                    "no PostgreSQL at {shown} ({e}), and TRELLIS_REQUIRE_POSTGRES=1: start one \
                     or point TRELLIS_TEST_POSTGRES at one"
                );
            }
            println!("skipped: no PostgreSQL at {shown} ({e})");
            None
        }
    }
}

/// A schema name no other test (or test run) uses.
fn fresh_schema() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "test_{}_{}_{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Drops its schema (and everything in it) when the case ends, pass or fail.
struct Schema(String);

impl Drop for Schema {
    fn drop(&mut self) {
        let (url, name) = (url(), self.0.clone());
        // Drop runs inside the test's runtime, which cannot be blocked on: a thread with a
        // runtime of its own does the statement.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                    .await
                    .map_err(|e| e.to_string())
            })
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("could not drop test schema {}: {e}", self.0);
        }
    }
}

fn options(schema: &str, clock: Arc<ManualClock>) -> PostgresOptions {
    PostgresOptions {
        clock,
        schema: Some(schema.to_owned()),
        // Two test threads, each case a store of its own: well under the server's limit.
        max_connections: 4,
        ..PostgresOptions::default()
    }
}

async fn harness() -> Option<Harness> {
    admin().await?;
    let schema = Schema(fresh_schema());
    let clock = Arc::new(ManualClock::default());
    let store = PostgresStore::connect(&url(), options(&schema.0, clock.clone()))
        .await
        .expect("open the PostgreSQL store");
    Some(Harness {
        store: Arc::new(store),
        clock,
        guard: Some(Box::new(schema)),
    })
}

/// One test per conformance case, like `state_conformance_tests!`, but each may be skipped
/// when there is no server.
macro_rules! postgres_conformance_tests {
    ($($case:ident,)*) => {
        #[test]
        fn conformance_covers_every_case() {
            let listed: &[&str] = &[$(stringify!($case),)*];
            assert_eq!(listed, trellis_state::conformance::CASES);
        }
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some(harness) = harness().await else { return };
                trellis_state::conformance::$case(&harness).await;
            }
        )*
    };
}

postgres_conformance_tests!(
    instances_crud,
    deployed_state_crud,
    unit_of_work_is_atomic,
    sequences_gap_free_under_concurrent_writers,
    resume_from_every_sequence,
    waiting_for_events,
    leases_and_fencing,
    intents_before_create,
    change_set_staleness_and_double_execution,
    request_id_idempotency,
    change_set_request_ids,
    interrupted_operations,
    cancel_requests,
    local_assets,
    retention,
    retention_runs_by_itself,
);

/// Replicas starting together: every one migrates or finds the schema migrated, none fails,
/// and each migration is applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_starts_migrate_once() {
    let Some(admin) = admin().await else { return };
    let schema = Schema(fresh_schema());
    let clock = Arc::new(ManualClock::default());
    let mut starts = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let options = options(&schema.0, clock.clone());
        starts.spawn(async move { PostgresStore::connect(&url(), options).await });
    }
    let mut stores = Vec::new();
    while let Some(started) = starts.join_next().await {
        stores.push(started.unwrap().expect("a replica failed to start"));
    }
    let rows = admin
        .query(
            &format!(
                "SELECT version FROM \"{}\".schema_migrations ORDER BY version",
                schema.0
            ),
            &[],
        )
        .await
        .unwrap();
    let versions: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    // Every replica sees what another wrote.
    let created = stores[0].create_instance("app").await.unwrap();
    let seen = stores[5].find_instance("app").await.unwrap();
    assert_eq!(seen, Some(created));
}

/// A schema written by a newer engine is refused with a message, not misread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_schema_is_refused() {
    let Some(admin) = admin().await else { return };
    let schema = Schema(fresh_schema());
    let clock = Arc::new(ManualClock::default());
    drop(
        PostgresStore::connect(&url(), options(&schema.0, clock.clone()))
            .await
            .unwrap(),
    );
    admin
        .execute(
            &format!(
                "INSERT INTO \"{}\".schema_migrations (version, name, applied_at) \
                 VALUES ($1, 'future', 0)",
                schema.0
            ),
            &[&(SCHEMA_VERSION + 1)],
        )
        .await
        .unwrap();
    let err = PostgresStore::connect(&url(), options(&schema.0, clock))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("newer than this engine supports"),
        "{err}"
    );
}

/// The backup RPC's store call says what to use instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_points_at_pg_dump() {
    let Some(h) = harness().await else { return };
    let err = h.store.backup().await.unwrap_err();
    assert!(matches!(err, StateError::Unsupported(_)), "{err:?}");
    assert!(err.to_string().contains("pg_dump"), "{err}");
}

/// A password never shows in the store's messages; where it connects does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_message_has_no_password() {
    let url = "postgres://app:hunter2@127.0.0.1:1/nothing";
    let options = PostgresOptions {
        connect_timeout: Duration::from_secs(2),
        ..PostgresOptions::default()
    };
    let err = PostgresStore::connect(url, options).await.unwrap_err();
    let message = err.to_string();
    assert!(!message.contains("hunter2"), "{message}");
    assert!(message.contains("127.0.0.1:1"), "{message}");
}

/// A statement that waits past `statement_timeout` (here: for a row another session holds)
/// fails the call instead of hanging it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_fails_a_stuck_call() {
    let Some(mut admin) = admin().await else {
        return;
    };
    let schema = Schema(fresh_schema());
    let options = PostgresOptions {
        statement_timeout: Duration::from_millis(300),
        ..options(&schema.0, Arc::new(ManualClock::default()))
    };
    let store = PostgresStore::connect(&url(), options).await.unwrap();
    let app = store.create_instance("app").await.unwrap();
    let tx = admin.transaction().await.unwrap();
    tx.execute(
        &format!(
            "SELECT 1 FROM \"{}\".instances WHERE id = $1 FOR UPDATE",
            schema.0
        ),
        &[&app.id],
    )
    .await
    .unwrap();
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        store.acquire_lease(&app.id, "engine-1", Duration::from_secs(30)),
    )
    .await
    .expect("the call hung")
    .unwrap_err();
    assert!(err.to_string().contains("statement_timeout"), "{err}");
    tx.rollback().await.unwrap();
    store
        .acquire_lease(&app.id, "engine-1", Duration::from_secs(30))
        .await
        .unwrap();
}

/// Two stores on one fresh schema, standing for two replicas (`None`: no server).
async fn two_replicas() -> Option<(Schema, PostgresStore, PostgresStore)> {
    admin().await?;
    let schema = Schema(fresh_schema());
    let clock = Arc::new(ManualClock::default());
    let a = PostgresStore::connect(&url(), options(&schema.0, clock.clone()))
        .await
        .unwrap();
    let b = PostgresStore::connect(&url(), options(&schema.0, clock))
        .await
        .unwrap();
    Some((schema, a, b))
}

/// Two stores on one schema stand for two replicas: a commit through one wakes a watcher of
/// the other (LISTEN/NOTIFY), and the watcher reads every event, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_wake_watchers_of_another_replica() {
    let Some((_schema, a, b)) = two_replicas().await else {
        return;
    };
    let instance = a.create_instance("app").await.unwrap();
    let after = instance.last_seq;
    // B waits for events past the creation; only A writes.
    let waiting = {
        let (b, id) = (b.clone(), instance.id.clone());
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while seen.len() < 3 {
                let from = seen.last().copied().unwrap_or(after);
                for e in b.wait_events(&id, from, 100).await.unwrap() {
                    seen.push(e.seq);
                }
            }
            seen
        })
    };
    let lease = a
        .acquire_lease(&instance.id, "replica-a", Duration::from_secs(30))
        .await
        .unwrap();
    for n in 0..3 {
        a.commit(
            &lease,
            vec![],
            vec![NewEvent::new("test.step", serde_json::json!({ "n": n }))],
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("replica B's watcher was woken by replica A's commits")
        .unwrap();
    assert_eq!(seen, vec![after + 1, after + 2, after + 3]);
}

/// A cancel requested through one replica is announced to the other, which runs the operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_requests_reach_another_replica() {
    let Some((_schema, a, b)) = two_replicas().await else {
        return;
    };
    let instance = a.create_instance("app").await.unwrap();
    let op = a
        .create_operation(NewOperation {
            instance_id: instance.id.clone(),
            kind: OperationKind::Deploy,
            request_id: "r1".into(),
            request_digest: "d".into(),
            change_set_id: None,
            owner: "replica-a".into(),
        })
        .await
        .unwrap()
        .operation;
    let mut on_a = a.cancel_requests();
    assert!(b.request_cancel(&op.id).await.unwrap());
    let heard = tokio::time::timeout(Duration::from_secs(10), on_a.recv())
        .await
        .expect("replica A heard replica B's cancel request")
        .unwrap();
    assert_eq!(heard, op.id);
    assert!(a.cancel_requested(&op.id).await.unwrap());
}

/// Retention runs on one replica at a time: while another holds the retention lock, a prune
/// does nothing and says so; afterwards it prunes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_runs_on_one_replica_at_a_time() {
    let Some(mut admin) = admin().await else {
        return;
    };
    let schema = Schema(fresh_schema());
    let clock = Arc::new(ManualClock::default());
    let store = PostgresStore::connect(&url(), options(&schema.0, clock.clone()))
        .await
        .unwrap();
    let instance = store.create_instance("app").await.unwrap();
    let lease = store
        .acquire_lease(&instance.id, "replica-a", Duration::from_secs(30))
        .await
        .unwrap();
    for n in 0..5 {
        store
            .commit(
                &lease,
                vec![],
                vec![NewEvent::new("test.step", serde_json::json!({ "n": n }))],
            )
            .await
            .unwrap();
    }
    clock.advance(Duration::from_secs(3600));
    let policy = RetentionPolicy {
        events_older_than: Duration::from_secs(60),
        keep_last_events: 1,
        change_sets_older_than: Duration::from_secs(60),
    };
    // "Another replica" pruning: the same lock, held by the admin session's transaction.
    let other = admin.transaction().await.unwrap();
    other
        .execute(
            &format!(
                "SELECT pg_advisory_xact_lock(hashtext('trellis-state retention ' || '{}'))",
                schema.0
            ),
            &[],
        )
        .await
        .unwrap();
    let report = store.prune(&policy).await.unwrap();
    assert!(report.skipped, "{report:?}");
    assert_eq!(report.events_deleted, 0);
    other.rollback().await.unwrap();
    let report = store.prune(&policy).await.unwrap();
    assert!(!report.skipped, "{report:?}");
    assert!(report.events_deleted > 0, "{report:?}");
}

/// The skew check compares the server's clock with the store's: near zero for the system
/// clock on this machine, the manual clock's offset for a clock set far away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_skew_is_measured_against_the_server() {
    let Some(_admin) = admin().await else { return };
    let schema = Schema(fresh_schema());
    let system = PostgresStore::connect(
        &url(),
        PostgresOptions {
            clock: Arc::new(SystemClock),
            ..options(&schema.0, Arc::new(ManualClock::default()))
        },
    )
    .await
    .unwrap();
    let skew = system.clock_skew().await.unwrap();
    assert!(skew.abs() < 5_000, "{skew} ms on one machine");
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(0)));
    let behind = PostgresStore::connect(&url(), options(&schema.0, clock))
        .await
        .unwrap();
    let skew = behind.clock_skew().await.unwrap();
    assert!(
        skew > 1_000_000_000_000,
        "{skew} ms against a clock at 1970"
    );
}

/// A URL that requires TLS is refused with a message saying so (and no password), not with a
/// handshake error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_requiring_tls_is_refused_clearly() {
    let url = "postgres://app:hunter2@127.0.0.1:5432/test?sslmode=require";
    let err = PostgresStore::connect(url, PostgresOptions::default())
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("sslmode=require"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
}

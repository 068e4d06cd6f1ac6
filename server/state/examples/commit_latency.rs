//! Commit latency of a state store: the unit of work a deploy writes per resource (one
//! `IntendCreate` and its `resource.create_requested` event, through `record_intent`).
//!
//! - sequential: one instance, one lease, N commits one after another (each awaited), after a
//!   short warm-up; p50/p90/p99/mean of each commit's latency;
//! - concurrent: W writers, each on an instance of its own with its own lease, N commits in all
//!   (N / W each); throughput (commits/s over the wall time) and per-commit latency.
//!
//! ```sh
//! cargo run --release -p trellis-state --example commit_latency -- --state sqlite
//! cargo run --release -p trellis-state --example commit_latency -- \
//!     --state postgres://root@127.0.0.1:5432/test [--n 2000] [--writers 8] [--runs 3]
//! ```
//!
//! SQLite: a fresh data directory under the system temp directory, removed afterwards.
//! PostgreSQL: a fresh schema `trellis_bench_<random>` (the store creates and migrates it),
//! dropped afterwards (`DROP SCHEMA ... CASCADE`). Each run (`--runs`) gets a fresh store.
//! bench/commit_latency.sh runs both stores.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use trellis_state::{Lease, PostgresOptions, PostgresStore, SqliteStore, StateStore};

const TTL: Duration = Duration::from_secs(600);
const WARMUP: usize = 100;

struct Args {
    state: String,
    n: usize,
    writers: usize,
    runs: usize,
}

fn args() -> Args {
    let mut a = Args {
        state: "sqlite".into(),
        n: 2000,
        writers: 8,
        runs: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--state" => a.state = value(),
            "--n" => a.n = value().parse().expect("--n N"),
            "--writers" => a.writers = value().parse().expect("--writers W"),
            "--runs" => a.runs = value().parse().expect("--runs R"),
            other => panic!(
                "unknown argument {other}; usage: commit_latency --state sqlite|postgres://... \
                 [--n 2000] [--writers 8] [--runs 1]"
            ),
        }
    }
    a
}

fn suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{}_{:x}", std::process::id(), nanos & 0xff_ffff_ffff)
}

/// A store for one run, and how to get rid of it.
enum Fresh {
    Sqlite(std::path::PathBuf),
    Postgres { url: String, schema: String },
}

async fn open(state: &str) -> (Arc<dyn StateStore>, Fresh) {
    if state == "sqlite" {
        let dir = std::env::temp_dir().join(format!("trellis-commit-latency-{}", suffix()));
        let d = dir.clone();
        let store = tokio::task::spawn_blocking(move || SqliteStore::open(&d))
            .await
            .unwrap()
            .expect("open SQLite store");
        (Arc::new(store), Fresh::Sqlite(dir))
    } else {
        let schema = format!("trellis_bench_{}", suffix());
        let options = PostgresOptions {
            schema: Some(schema.clone()),
            ..PostgresOptions::default()
        };
        let store = PostgresStore::connect(state, options)
            .await
            .expect("connect to PostgreSQL");
        (
            Arc::new(store),
            Fresh::Postgres {
                url: state.to_owned(),
                schema,
            },
        )
    }
}

async fn dispose(fresh: Fresh) {
    match fresh {
        Fresh::Sqlite(dir) => {
            let _ = std::fs::remove_dir_all(dir);
        }
        Fresh::Postgres { url, schema } => {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect to drop the schema");
            let task = tokio::spawn(conn);
            client
                .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
                .await
                .expect("drop schema");
            drop(client);
            let _ = task.await;
        }
    }
}

fn spec(i: usize) -> serde_json::Value {
    // About what bench/deploy.py's sim resources carry.
    json!({ "latencyMs": 0, "payload": format!("sim-{i:08}-0123456789abcdef") })
}

/// An instance of its own and its lease: what each writer commits under.
async fn instance(store: &Arc<dyn StateStore>, name: &str) -> Lease {
    let instance = store.create_instance(name).await.expect("create instance");
    store
        .acquire_lease(&instance.id, "bench", TTL)
        .await
        .expect("acquire lease")
}

/// `n` commits under `lease`, one after another; each commit's latency.
async fn writer(store: Arc<dyn StateStore>, lease: Lease, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        store
            .record_intent(&lease, &format!("r{i}"), "sim/resource", spec(i))
            .await
            .expect("record intent");
        out.push(t.elapsed());
    }
    out
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn summary(mut v: Vec<Duration>) -> String {
    v.sort();
    let q = |p: f64| us(v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]);
    let mean = v.iter().map(|d| us(*d)).sum::<f64>() / v.len() as f64;
    format!(
        "p50 {:.0} µs, p90 {:.0} µs, p99 {:.0} µs, mean {:.0} µs",
        q(0.50),
        q(0.90),
        q(0.99),
        mean
    )
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let a = args();
    let shown = trellis_state::postgres::redact_url(&a.state);
    for run in 1..=a.runs {
        let (store, fresh) = open(&a.state).await;

        // Warm-up: connections opened, statements and pages cached.
        let lease = instance(&store, "warmup").await;
        writer(store.clone(), lease, WARMUP).await;

        let lease = instance(&store, "sequential").await;
        let seq = writer(store.clone(), lease, a.n).await;
        let seq_total: Duration = seq.iter().sum();
        println!(
            "{shown} run {run} sequential: {} commits, {:.0} commits/s, {}",
            a.n,
            a.n as f64 / seq_total.as_secs_f64(),
            summary(seq)
        );

        let per = a.n.div_ceil(a.writers);
        let mut leases = Vec::new();
        for w in 0..a.writers {
            leases.push(instance(&store, &format!("writer{w}")).await);
        }
        let t = Instant::now();
        let tasks: Vec<_> = leases
            .into_iter()
            .map(|lease| tokio::spawn(writer(store.clone(), lease, per)))
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.expect("writer task"));
        }
        let wall = t.elapsed();
        println!(
            "{shown} run {run} concurrent: {} writers x {per} commits, {:.2} s, {:.0} commits/s, {}",
            a.writers,
            wall.as_secs_f64(),
            all.len() as f64 / wall.as_secs_f64(),
            summary(all)
        );
        drop(store);
        dispose(fresh).await;
    }
}

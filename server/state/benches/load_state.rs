//! `load_state` of a 10,000-resource instance on SQLite: the fixed cost at the start of every
//! destroy and reconcile (not run by `cargo test`; figures go to BENCHMARKS.md).
//!
//! ```sh
//! cargo bench -p trellis-state --bench load_state            # 30 loads: min and median
//! BENCH_LOADS=3 valgrind --tool=callgrind target/release/deps/load_state-<hash>
//! ```
//! Rows are shaped like the ones `bench/deploy.py` leaves: `sim/resource`s with a small spec
//! and state, one dependency, empty labels and annotations, and a recorded call key.

use std::time::{Duration, Instant};

use serde_json::json;
use trellis_state::{Change, SqliteStore, StateStore};

// As in the engine's binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RESOURCES: usize = 10_000;
const LAYERS: usize = 10;

fn main() {
    let loads: usize = std::env::var("BENCH_LOADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let dir = std::env::temp_dir().join(format!("trellis-load-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = SqliteStore::open(&dir).expect("open");
        let inst = store.create_instance("bench").await.expect("instance");
        let lease = store
            .acquire_lease(&inst.id, "bench", Duration::from_secs(600))
            .await
            .expect("lease");
        let width = RESOURCES / LAYERS;
        let mut changes = Vec::with_capacity(2 * RESOURCES);
        for k in 0..LAYERS {
            for j in 0..width {
                let name = format!("l{k}_{j}");
                let (spec, state, depends_on) = if k == 0 {
                    (
                        json!({ "latencyMs": 200 }),
                        json!({ "id": format!("sim-{k:08x}{j:08x}") }),
                        vec![],
                    )
                } else {
                    let payload = format!("sim-{:08x}{j:08x}", k - 1);
                    (
                        json!({ "latencyMs": 200, "payload": payload }),
                        json!({ "id": format!("sim-{k:08x}{j:08x}"), "payload": payload }),
                        vec![format!("l{}_{j}", k - 1)],
                    )
                };
                changes.push(Change::IntendCreate {
                    name: name.clone(),
                    resource_type: "sim/resource".into(),
                    spec,
                    depends_on,
                    metadata: json!({ "labels": {}, "annotations": {} }),
                    key: format!("op_01a224b1dcf1c6f8b8746e8af50c1569:{name}:create"),
                });
                changes.push(Change::ResourceCreated {
                    external_id: format!("sim-{k:08x}{j:08x}"),
                    state,
                    name,
                });
            }
        }
        store.commit(&lease, changes, vec![]).await.expect("commit");
        let mut times = Vec::with_capacity(loads);
        for _ in 0..loads {
            let t = Instant::now();
            let state = store.load_state(&inst.id).await.expect("load");
            times.push(t.elapsed());
            assert_eq!(state.resources.len(), RESOURCES);
        }
        times.sort();
        println!(
            "load_state of {RESOURCES} resources, {loads} loads: min {:.1} ms, median {:.1} ms",
            ms(times[0]),
            ms(times[times.len() / 2])
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

//! Launch/shutdown cycles leave nothing behind: no child processes (no
//! zombies), no sockets, no socket directories, no file descriptors.
//!
//! Its own test binary, so no other test's plugins are children of this
//! process while it counts. TRELLIS_PLUGIN_CYCLES sets the number of cycles
//! (default 1000).

use std::time::Instant;

use crate::plugins_common::*;
use trellis_host::PluginHost;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launch_shutdown_cycles_leave_nothing_behind() {
    let cycles: usize = std::env::var("TRELLIS_PLUGIN_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let root = TempDir::new("cycles");
    let dir = sim_dir(&root);
    let run = root.join("run");
    let me = std::process::id();

    // Warm up (the runtime's own threads and descriptors), then measure.
    let host = PluginHost::new(config(&root, &dir));
    host.provider("sim")
        .expect("sim")
        .start()
        .await
        .expect("start");
    host.shutdown().await;
    let fds_before = open_fds();

    let started = Instant::now();
    let mut pids = Vec::with_capacity(cycles);
    for i in 0..cycles {
        let host = PluginHost::new(config(&root, &dir));
        let pid = host
            .provider("sim")
            .expect("sim")
            .start()
            .await
            .unwrap_or_else(|e| panic!("cycle {i}: {e}"));
        pids.push(pid);
        host.shutdown().await;
        let left = children_of(me);
        assert!(left.is_empty(), "cycle {i}: children left: {left:?}");
        let files = entries(&run);
        assert!(
            files.is_empty(),
            "cycle {i}: left in the runtime dir: {files:?}"
        );
    }
    let elapsed = started.elapsed();
    eprintln!(
        "{cycles} launch/shutdown cycles in {:.2}s ({:.2} ms per cycle)",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e3 / cycles.max(1) as f64
    );
    assert_eq!(pids.len(), cycles);
    let fds_after = open_fds();
    assert!(
        fds_after <= fds_before + 4,
        "file descriptors grew from {fds_before} to {fds_after}"
    );
}

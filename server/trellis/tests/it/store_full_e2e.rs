//! End to end: the state store's disk fills up while an operation runs. The operation must
//! still end (clients see it end, with the reason), the engine must say so in its log, and the
//! ending must be recorded once space is freed. The data directory is a real tmpfs of a few
//! MiB in the engine's own mount namespace, filled by writing a file into it.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::engine_common::{Engine, all_output, cli_in_background, private_tmpfs_available, write};
use crate::plugins_common::TempDir;

const SLOW: &str = "version: 2023-04-20\nresources:\n  a:\n    type: sim/resource\n    spec:\n      latencyMs: 3000\n  b:\n    type: sim/resource\n    spec:\n      payload: ${resources.a.state.id}\n";

/// Writes into `dir` until the file system is full; the file's path.
fn fill(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    loop {
        if let Err(e) = f.write_all(&chunk) {
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
            return path;
        }
    }
}

/// Polls `check` every 100 ms; `false` when `limit` (a hang bound) passed first.
fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn an_operation_whose_end_the_full_store_refuses_still_ends_and_is_recorded_later() {
    if !private_tmpfs_available() {
        eprintln!("SKIPPED: this machine does not allow a private tmpfs mount (unshare -m)");
        return;
    }
    let root = TempDir::new("e2e-store-full");
    let engine = Engine::builder(root.path())
        .data_on_tmpfs(16 * 1024 * 1024)
        .capture_stderr()
        .start();
    write(&root.join("slow.yaml"), SLOW);
    let deploy = cli_in_background(
        &engine,
        &["deploy", "slow.yaml", "--instance", "u"],
        "u",
        "resource.create_requested",
    );
    // `a`'s call is in flight (3 s): the disk fills before its outcome is written.
    let filler = fill(&engine.data_seen_by_engine());

    // The client sees the operation end, with the reason (the bound is a generous hang bound:
    // before, the operation stayed RUNNING and its watchers waited forever).
    let mut deploy = deploy;
    let ended = eventually(Duration::from_secs(120), || {
        deploy.try_wait().unwrap().is_some()
    });
    if !ended {
        let _ = deploy.kill();
        let _ = deploy.wait();
        panic!("the deploy's client never saw the operation end");
    }
    let out = deploy.wait_with_output().unwrap();
    let all = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("\"FAILED\""), "{all}");
    assert!(all.contains("not recorded yet"), "{all}");

    // Space is freed: the engine records the ending on its own.
    std::fs::remove_file(&filler).unwrap();
    assert!(
        eventually(Duration::from_secs(120), || {
            engine
                .events("u")
                .iter()
                .any(|(kind, p)| kind == "operation.finished" && p["status"] == "failed")
        }),
        "the ending was never recorded: {:?}",
        engine.events("u")
    );
    let inst = engine.instance("u");
    assert_eq!(inst["status"], "DEPLOY_FAILED", "{inst}");
    // `a`'s create happened but its outcome was never written: it stays an intent for
    // reconcile, which settles it now that the store accepts writes.
    assert_eq!(inst["resources"]["a"]["status"], "CREATING", "{inst}");
    let (code, out) = engine.json(&["reconcile", "--instance", "u", "--mode", "reapply"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(engine.instance("u")["resources"]["a"]["status"], "CREATED");
    // The operator is told, in the engine's log.
    let (_, logs) = engine.stop();
    assert!(
        logs.contains("refused to record the end of the operation"),
        "{logs}"
    );
    assert!(logs.contains("full"), "{logs}");
}

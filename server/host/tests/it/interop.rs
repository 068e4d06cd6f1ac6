//! The host drives a plugin written in another language: the Python
//! `pyecho` provider in tests/interop/python (grpcio, stubs generated from
//! our .proto). Skipped, with a note, when python3 cannot import grpc.

use std::path::Path;
use std::process::Command;

use crate::plugins_common::*;
use trellis_host::{CallOptions, PluginHost, values};

fn python_grpc_available() -> bool {
    Command::new("python3")
        .args(["-c", "import grpc, grpc_tools, grpc_health"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_drives_the_python_provider() {
    if !python_grpc_available() {
        eprintln!(
            "skipped: python3 with grpcio is not installed (tests/interop/python/requirements.txt)"
        );
        return;
    }
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/python/bin");
    let root = TempDir::new("interop");
    let mut cfg = config(&root, &bin);
    cfg.launch_timeout = std::time::Duration::from_secs(60);
    let host = PluginHost::new(cfg);
    let m = host.manifest("pyecho").await.expect("manifest from Python");
    assert!(m.functions.iter().any(|f| f.name == "upper"));
    let py = host.provider("pyecho").expect("discovered");
    let v = py
        .call_function(
            "upper",
            vec![values::string("from rust")],
            &CallOptions::default(),
        )
        .await
        .expect("upper");
    assert_eq!(v, values::string("FROM RUST"));
    let pid = py.pid().expect("running");
    host.shutdown().await;
    assert!(has_exited(pid));
    assert!(entries(&root.join("run")).is_empty());
}

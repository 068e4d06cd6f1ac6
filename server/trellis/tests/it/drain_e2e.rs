//! End to end: SIGTERM drains (docs/serve.md, "Stopping"). An operation that can finish within
//! the drain time finishes; one that cannot is stopped at a safe point, marked interrupted, and
//! the client is told the engine shut down.

use std::time::Duration;

use crate::engine_common::{Engine, all_output, cli_in_background, write};
use crate::plugins_common::TempDir;

/// Three sim resources in a chain, each call taking `latency` ms.
fn chain(latency: u64) -> String {
    format!(
        "version: 2023-04-20\nresources:\n  a:\n    type: sim/resource\n    spec:\n      latencyMs: {latency}\n  b:\n    type: sim/resource\n    spec:\n      latencyMs: {latency}\n      payload: ${{resources.a.state.id}}\n  c:\n    type: sim/resource\n    spec:\n      latencyMs: {latency}\n      payload: ${{resources.b.state.id}}\n"
    )
}

/// `trellis deploy chain.yaml` in the background, once its first call is in flight.
fn deploy_in_background(engine: &Engine) -> std::process::Child {
    cli_in_background(
        engine,
        &["deploy", "chain.yaml", "--instance", "d"],
        "d",
        "resource.create_requested",
    )
}

#[test]
fn sigterm_lets_an_operation_that_fits_the_drain_time_finish() {
    let root = TempDir::new("e2e-drain-finish");
    // The default drain timeout (30 s) against a 3 s deploy.
    let mut engine = Engine::start(root.path());
    write(&root.join("chain.yaml"), &chain(1000));
    let deploy = deploy_in_background(&engine);
    // The drain (30 s) plus the plugins' stop, with room for a loaded machine.
    assert_eq!(engine.terminate_within(Duration::from_secs(120)), Some(0));
    let out = deploy.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("\"SUCCEEDED\""), "{text}");
    let engine = Engine::start(root.path());
    let inst = engine.instance("d");
    assert_eq!(inst["status"], "DEPLOYED", "{inst}");
    assert_eq!(inst["resources"].as_object().unwrap().len(), 3, "{inst}");
}

#[test]
fn a_drain_that_runs_out_interrupts_and_says_the_engine_shut_down() {
    let root = TempDir::new("e2e-drain-out");
    let mut engine = Engine::builder(root.path())
        .args(&["--drain-timeout", "1s"])
        .start();
    write(&root.join("chain.yaml"), &chain(3000));
    let deploy = deploy_in_background(&engine);
    assert_eq!(engine.terminate_within(Duration::from_secs(120)), Some(0));
    let out = deploy.wait_with_output().unwrap();
    let all = all_output(&out);
    assert_ne!(out.status.code(), Some(0), "{all}");
    // The call in flight came back and was recorded (a safe point); the rest never started.
    let engine = Engine::start(root.path());
    let inst = engine.instance("d");
    assert_eq!(inst["status"], "INTERRUPTED", "{inst}");
    assert_eq!(inst["resources"]["a"]["status"], "CREATED", "{inst}");
    assert!(inst["resources"].get("c").is_none(), "{inst}");
    // The client says what happened.
    assert!(all.contains("shut down"), "{all}");
    assert!(!all.contains("restarted"), "{all}");
}

//! `--wait` end to end: deploys of one instance that wait for each other's turn instead of
//! failing, in order, visible in `trellis instance`; without `--wait` the old refusal; a wait
//! whose deadline passes says how long it waited.

use std::process::{Command, Output, Stdio};
use std::time::Instant;

use crate::engine_common::{Engine, all_output, cli_in_background, write};
use crate::plugins_common::TempDir;
use serde_json::Value;

/// The first deploy: one resource whose create takes a while.
const SLOW: &str = "version: 2023-04-20\nresources:\n  r:\n    type: sim/resource\n    spec:\n      latencyMs: 8000\n      payload: first\n";
/// The second: the same resource, changed.
const NEXT: &str = "version: 2023-04-20\nresources:\n  r:\n    type: sim/resource\n    spec:\n      latencyMs: 0\n      payload: second\n";

fn json_of(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or("")).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}); exit {:?}\n{}",
            out.status.code(),
            all_output(out)
        )
    })
}

/// The operation ids in the order of their `operation.started` and `operation.finished`
/// events on `instance`.
fn operation_events(engine: &Engine, instance: &str) -> Vec<(String, String)> {
    let out = engine.cli(&["events", "--instance", instance, "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["kind"] == "operation.started" || v["kind"] == "operation.finished")
        .map(|v| {
            (
                v["kind"].as_str().unwrap().to_owned(),
                v["operationId"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn deploys_with_wait_run_one_after_the_other() {
    let root = TempDir::new("wait-two");
    write(&root.join("slow.yaml"), SLOW);
    write(&root.join("next.yaml"), NEXT);
    let engine = Engine::start(root.path());

    // The first deploy holds the instance while its provider call runs.
    let first = cli_in_background(
        &engine,
        &[
            "deploy",
            "slow.yaml",
            "--instance",
            "w",
            "--wait",
            "--request-id",
            "req-first",
        ],
        "w",
        "resource.create_requested",
    );
    // The second waits for it.
    let second = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["deploy", "next.yaml", "--instance", "w", "--wait=1h"])
        .args(["--request-id", "req-second", "--format", "json"])
        .args(["--engine", &engine.addr])
        .current_dir(&engine.cwd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    // `trellis instance` lists it while it waits (JSON and text).
    let limit = Instant::now() + std::time::Duration::from_secs(60);
    let queued = loop {
        let inst = engine.instance("w");
        let queued = inst["queued"].as_array().cloned().unwrap_or_default();
        if !queued.is_empty() {
            break queued;
        }
        assert!(
            Instant::now() < limit,
            "the second deploy never showed as queued: {inst}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(queued.len(), 1, "{queued:?}");
    assert_eq!(queued[0]["kind"], "DEPLOY");
    assert_eq!(queued[0]["requestId"], "req-second");
    assert!(queued[0]["changeSetId"].as_str().is_some(), "{queued:?}");
    let text = all_output(&engine.cli(&["instance", "w"]));
    assert!(
        text.contains("Waiting for their turn") && text.contains("req-second"),
        "{text}"
    );

    // Without --wait: refused at once, as before.
    let (code, v) = engine.json(&["deploy", "next.yaml", "--instance", "w"]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["error"]["code"], "ABORTED", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("another operation"),
        "{v}"
    );

    // A short deadline that passes (behind the first and the second): refused, saying how
    // long it waited; it leaves the queue.
    let (code, v) = engine.json(&["destroy", "--instance", "w", "--wait=1s"]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["error"]["code"], "ABORTED", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    // The engine waited what the CLI had left of the second after planning.
    assert!(
        message.contains("(waited 0.") || message.contains("(waited 1."),
        "{message}"
    );

    let first = first.wait_with_output().unwrap();
    let second = second.wait_with_output().unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", all_output(&first));
    assert_eq!(second.status.code(), Some(0), "{}", all_output(&second));
    let first_op = json_of(&first)["operation"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let second_json = json_of(&second);
    let second_op = second_json["operation"]["id"].as_str().unwrap().to_owned();
    assert_eq!(second_json["operation"]["status"], "SUCCEEDED");
    // Its first plan went stale while it waited: planned again, against the state the first
    // deploy left.
    assert!(
        all_output(&second).contains("planning next.yaml again"),
        "{}",
        all_output(&second)
    );

    // One after the other: the second started after the first finished.
    let order = operation_events(&engine, "w");
    let pos = |kind: &str, op: &str| {
        order
            .iter()
            .position(|(k, o)| k == kind && o == op)
            .unwrap_or_else(|| panic!("no {kind} of {op} in {order:?}"))
    };
    assert!(pos("operation.started", &first_op) < pos("operation.finished", &first_op));
    assert!(
        pos("operation.finished", &first_op) < pos("operation.started", &second_op),
        "{order:?}"
    );
    assert!(pos("operation.started", &second_op) < pos("operation.finished", &second_op));

    // The second deploy's change is what the instance has, and nobody waits any more.
    let inst = engine.instance("w");
    assert_eq!(
        inst["resources"]["r"]["spec"]["payload"], "second",
        "{inst}"
    );
    assert_eq!(inst["queued"], serde_json::json!([]), "{inst}");
}

/// A waiting request runs `args` (`--format json`) in the background.
fn spawn_cli(engine: &Engine, args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(args)
        .args(["--format", "json", "--engine", &engine.addr])
        .current_dir(&engine.cwd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Polls `trellis instance` until its queue's request ids are `want`.
fn await_queue(engine: &Engine, instance: &str, want: &[&str]) {
    let limit = Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let inst = engine.instance(instance);
        let ids: Vec<&str> = inst["queued"]
            .as_array()
            .map(|q| q.iter().filter_map(|e| e["requestId"].as_str()).collect())
            .unwrap_or_default();
        if ids == want {
            return;
        }
        assert!(
            Instant::now() < limit,
            "the queue never became {want:?}: {inst}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_waiter_whose_client_goes_leaves_the_queue_and_a_drain_ends_the_wait() {
    let root = TempDir::new("wait-leave");
    // Held for a minute: the test ends it by draining the engine.
    write(
        &root.join("held.yaml"),
        &SLOW.replace("latencyMs: 8000", "latencyMs: 60000"),
    );
    let mut engine = Engine::builder(root.path())
        .args(&["--drain-timeout", "1s"])
        .start();
    let mut held = cli_in_background(
        &engine,
        &["deploy", "held.yaml", "--instance", "h"],
        "h",
        "resource.create_requested",
    );

    // Two waiters, in order; the first one's client goes away: it leaves, the other stays.
    let mut gone = spawn_cli(
        &engine,
        &[
            "destroy",
            "--instance",
            "h",
            "--wait",
            "--request-id",
            "req-gone",
        ],
    );
    await_queue(&engine, "h", &["req-gone"]);
    let stays = spawn_cli(
        &engine,
        &[
            "destroy",
            "--instance",
            "h",
            "--wait",
            "--request-id",
            "req-stays",
        ],
    );
    await_queue(&engine, "h", &["req-gone", "req-stays"]);
    gone.kill().unwrap();
    gone.wait().unwrap();
    await_queue(&engine, "h", &["req-stays"]);

    // The engine drains: the waiting request is answered without starting anything.
    assert!(engine.terminate().is_some(), "the engine did not stop");
    let out = stays.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", all_output(&out));
    let v = json_of(&out);
    assert_eq!(v["error"]["code"], "UNREACHABLE", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("shutting down") && message.contains("did not start"),
        "{message}"
    );
    let _ = held.kill();
    let _ = held.wait();

    // Neither destroy ran: the only operation recorded is the held deploy.
    let restarted = Engine::builder(root.path()).start();
    let started: Vec<Value> = restarted
        .events("h")
        .into_iter()
        .filter(|(kind, _)| kind == "operation.started")
        .map(|(_, payload)| payload)
        .collect();
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0]["kind"], "deploy", "{started:?}");
}

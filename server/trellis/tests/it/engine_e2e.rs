//! End to end: the real `trellis serve` binary with the real `local` and `sim` plugins, driven
//! by the real CLI (and, for watch resumption, a raw gRPC client).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::engine_common::{
    Engine, actions, assert_interrupted, env_keys, link_actions, planned_new, stderr, write,
};
use crate::plugins_common::TempDir;
use serde_json::Value;

const APP_V1: &str = r#"
version: 2023-04-20
variables:
  greeting:
    type: string
    default: hello
resources:
  dir:
    type: local/directory
    spec:
      path: out
  config:
    type: local/file
    spec:
      path: ${resources.dir.spec.path}/config.txt
      content: "${variables.greeting}, world"
  notes:
    type: local/file
    spec:
      path: ${resources.dir.spec.path}/notes.txt
      content: first
exports:
  configPath:
    type: string
    field: resources.config.spec.path
"#;

/// v2: config's content changes (update), notes moves (recreate), extra is new.
const APP_V2: &str = r#"
version: 2023-04-20
variables:
  greeting:
    type: string
    default: hello
resources:
  dir:
    type: local/directory
    spec:
      path: out
  config:
    type: local/file
    spec:
      path: ${resources.dir.spec.path}/config.txt
      content: "${variables.greeting}, trellis"
  notes:
    type: local/file
    spec:
      path: ${resources.dir.spec.path}/notes-v2.txt
      content: first
  extra:
    type: local/file
    spec:
      path: ${resources.dir.spec.path}/extra.txt
      content: new
exports:
  configPath:
    type: string
    field: resources.config.spec.path
"#;

#[test]
fn deploy_change_and_destroy_local_resources() {
    let root = TempDir::new("e2e-local");
    let engine = Engine::start(root.path());
    write(&root.join("app.yaml"), APP_V1);

    // First plan: everything is new.
    let (code, plan) = engine.json(&["plan", "app.yaml", "--instance", "app"]);
    assert_eq!(code, 0, "{plan}");
    assert_eq!(
        actions(&plan["changeSet"]["resources"]),
        [
            ("dir".into(), "CREATE".into()),
            ("config".into(), "CREATE".into()),
            ("notes".into(), "CREATE".into())
        ]
    );

    let (code, out) = engine.json(&["deploy", "app.yaml", "--instance", "app"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["operation"]["status"], "SUCCEEDED", "{out}");
    assert_eq!(
        std::fs::read_to_string(root.join("out/config.txt")).unwrap(),
        "hello, world"
    );
    let inst = engine.instance("app");
    assert_eq!(inst["status"], "DEPLOYED", "{inst}");
    assert_eq!(inst["resources"]["config"]["status"], "CREATED");
    assert_eq!(inst["resources"]["config"]["type"], "local/file");
    assert_eq!(
        inst["resources"]["config"]["spec"]["content"],
        "hello, world"
    );
    assert_eq!(inst["exports"]["configPath"], "out/config.txt", "{inst}");

    // Planning the same blueprint again changes nothing.
    let (_, again) = engine.json(&["plan", "app.yaml", "--instance", "app"]);
    assert!(
        actions(&again["changeSet"]["resources"])
            .iter()
            .all(|(_, a)| a == "NO_CHANGE"),
        "{again}"
    );

    // The change: exact field diffs.
    write(&root.join("app.yaml"), APP_V2);
    let (code, plan) = engine.json(&["plan", "app.yaml", "--instance", "app"]);
    assert_eq!(code, 0, "{plan}");
    let resources = plan["changeSet"]["resources"].as_array().unwrap();
    let by_name = |n: &str| resources.iter().find(|r| r["name"] == n).unwrap().clone();
    assert_eq!(by_name("dir")["action"], "NO_CHANGE");
    let config = by_name("config");
    assert_eq!(config["action"], "UPDATE");
    assert_eq!(
        config["fields"],
        serde_json::json!([{
            "path": "spec.content",
            "previous": "hello, world",
            "new": "hello, trellis",
            "mustRecreate": false
        }]),
        "{config}"
    );
    let notes = by_name("notes");
    assert_eq!(notes["action"], "RECREATE", "{notes}");
    assert_eq!(notes["fields"][0]["path"], "spec.path");
    assert_eq!(notes["fields"][0]["mustRecreate"], true);
    assert_eq!(by_name("extra")["action"], "CREATE");

    let id = plan["changeSet"]["id"].as_str().unwrap().to_owned();
    let (code, out) = engine.json(&["deploy", "--change-set", &id]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        std::fs::read_to_string(root.join("out/config.txt")).unwrap(),
        "hello, trellis"
    );
    assert!(!root.join("out/notes.txt").exists());
    assert!(root.join("out/notes-v2.txt").exists());
    assert!(root.join("out/extra.txt").exists());
    assert_eq!(engine.instance("app")["status"], "UPDATED");

    // The executed change set cannot run again.
    let out = engine.cli(&["deploy", "--change-set", &id]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));

    // A hand edit is drift (exit 3), named with the field.
    write(&root.join("out/config.txt"), "edited by hand");
    let (code, drift) = engine.json(&["drift", "--instance", "app"]);
    assert_eq!(code, 3, "{drift}");
    assert_eq!(drift["drifted"], true);
    let drifted: Vec<&str> = drift["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(drifted, ["config"], "{drift}");
    assert_eq!(drift["resources"][0]["fields"][0]["path"], "spec.content");
    // Re-applying the recorded spec repairs it; then no drift.
    let (code, out) = engine.json(&["reconcile", "--instance", "app", "--mode", "reapply"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        std::fs::read_to_string(root.join("out/config.txt")).unwrap(),
        "hello, trellis"
    );
    let (code, drift) = engine.json(&["drift", "--instance", "app"]);
    assert_eq!(code, 0, "{drift}");
    // Or accept the hand edit as the new state.
    write(&root.join("out/config.txt"), "edited by hand");
    let (code, out) = engine.json(&["reconcile", "--instance", "app", "--mode", "accept"]);
    assert_eq!(code, 0, "{out}");
    let inst = engine.instance("app");
    assert_eq!(
        inst["resources"]["config"]["spec"]["content"],
        "edited by hand"
    );
    let (code, drift) = engine.json(&["drift", "--instance", "app"]);
    assert_eq!(code, 0, "{drift}");

    // Destroy leaves nothing on disk (the accepted content is what trellis now owns).
    let (code, out) = engine.json(&["destroy", "--instance", "app"]);
    assert_eq!(code, 0, "{out}");
    assert!(!root.join("out").exists(), "out/ still exists");
    // The destroy's watch started at its own events, after the instance's long history, and
    // missed none of them.
    let id = out["operation"]["id"].as_str().unwrap();
    let history = engine.events("app");
    let mine = history.iter().filter(|(_, p)| p["operation"] == id).count();
    assert!(
        mine >= 4 && history.len() > 2 * mine,
        "{mine} of {}",
        history.len()
    );
    assert_eq!(out["events"], mine, "{out}");
    let inst = engine.instance("app");
    assert_eq!(inst["status"], "DESTROYED");
    assert_eq!(inst["resources"], serde_json::json!({}));
}

fn sim_blueprint(fail: bool) -> String {
    let mut s = String::from("version: 2023-04-20\nresources:\n");
    for name in ["a", "b", "c"] {
        s.push_str(&format!(
            "  {name}:\n    type: sim/resource\n    spec:\n      latencyMs: 10\n      payload: v2-{name}\n"
        ));
    }
    if fail {
        s.push_str(
            "  broken:\n    type: sim/resource\n    dependsOn: [a]\n    spec:\n      failOn: create\n      failClass: badInput\n",
        );
    }
    s
}

#[test]
fn failed_deploy_with_rollback_restores_the_previous_state() {
    let root = TempDir::new("e2e-rollback");
    let engine = Engine::start(root.path());
    let v1 = "version: 2023-04-20\nresources:\n  a:\n    type: sim/resource\n    spec:\n      payload: v1-a\n";
    write(&root.join("sim.yaml"), v1);
    let (code, out) = engine.json(&["deploy", "sim.yaml", "--instance", "s"]);
    assert_eq!(code, 0, "{out}");
    let before = engine.instance("s");

    // v2 updates a, creates b and c, and one resource fails.
    write(&root.join("sim.yaml"), &sim_blueprint(true));
    let (code, out) = engine.json(&[
        "deploy",
        "sim.yaml",
        "--instance",
        "s",
        "--rollback-on-failure",
    ]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(out["operation"]["status"], "FAILED", "{out}");
    let after = engine.instance("s");
    assert_eq!(after["status"], "ROLLBACK_COMPLETE", "{after}");
    // Only a is left, with its v1 spec.
    let names: Vec<&String> = after["resources"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["a"], "{after}");
    assert_eq!(
        after["resources"]["a"]["spec"],
        before["resources"]["a"]["spec"]
    );
    assert_eq!(after["resources"]["a"]["spec"]["payload"], "v1-a");
}

#[test]
fn two_clients_executing_at_once_run_exactly_one_operation() {
    let root = TempDir::new("e2e-race");
    let engine = Engine::start(root.path());
    let bp = "version: 2023-04-20\nresources:\n  slow:\n    type: sim/resource\n    spec:\n      latencyMs: 300\n";
    write(&root.join("race.yaml"), bp);
    let (_, p1) = engine.json(&["plan", "race.yaml", "--instance", "r"]);
    let (_, p2) = engine.json(&["plan", "race.yaml", "--instance", "r"]);
    let ids = [
        p1["changeSet"]["id"].as_str().unwrap().to_owned(),
        p2["changeSet"]["id"].as_str().unwrap().to_owned(),
    ];
    // Both change sets were planned against the same version; both clients start at once.
    let handles: Vec<_> = ids
        .iter()
        .map(|id| {
            let args = vec![
                "deploy".to_owned(),
                "--change-set".to_owned(),
                id.clone(),
                "--engine".to_owned(),
                engine.addr.clone(),
                "--format".to_owned(),
                "json".to_owned(),
            ];
            let dir = engine.cwd.clone();
            std::thread::spawn(move || {
                Command::new(env!("CARGO_BIN_EXE_trellis"))
                    .args(&args)
                    .current_dir(dir)
                    .output()
                    .unwrap()
            })
        })
        .collect();
    let outs: Vec<Output> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = outs.iter().filter(|o| o.status.code() == Some(0)).count();
    assert_eq!(ok, 1, "{:?}", outs.iter().map(stderr).collect::<Vec<_>>());
    // The loser was refused, not run.
    let out = engine.cli(&["events", "--instance", "r", "--format", "json"]);
    let started = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("\"operation.started\""))
        .count();
    assert_eq!(started, 1);
}

/// `n` independent sim resources, each `latency` ms.
fn many_sims(n: usize, latency: u64) -> String {
    let mut s = String::from("version: 2023-04-20\nresources:\n");
    for i in 0..n {
        s.push_str(&format!(
            "  r{i}:\n    type: sim/resource\n    spec:\n      latencyMs: {latency}\n"
        ));
    }
    s
}

/// What [`killed_mid_deploy`] leaves: the restarted engine, and the names the plugin's journal
/// shows created before the kill.
struct Killed {
    engine: Engine,
    journal: std::path::PathBuf,
    made: Vec<String>,
    /// How many resources state showed CREATING (a create in flight) after the restart.
    creating: usize,
    /// Keep it bound (`_root`, not `..`) while the engine works in it.
    _root: TempDir,
}

/// The names a sim journal shows created, in order.
fn journaled(journal: &Path) -> Vec<String> {
    std::fs::read_to_string(journal)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("created "))
        // `created <name> <key>`
        .filter_map(|rest| rest.split(' ').next().map(str::to_owned))
        .collect()
}

/// A 200-resource sim deploy whose engine is killed (SIGKILL) part way, then restarted: checks
/// that nothing the plugin created is missing from state, that the instance and the operation
/// are INTERRUPTED, and that drift names the calls left in flight.
fn killed_mid_deploy(tag: &str) -> Killed {
    let root = TempDir::new(tag);
    let journal = root.join("journal.txt");
    // Plugins inherit the engine's environment.
    let mut engine = Engine::builder(root.path())
        .args(&["--max-parallel", "8"])
        .env("TRELLIS_SIM_JOURNAL", &journal)
        .start();
    // 250 ms per create, 8 at a time: after the 40th is journaled, about 5 s of creates remain
    // for the kill to land in, even on a loaded machine.
    write(&root.join("many.yaml"), &many_sims(200, 250));
    let (code, plan) = engine.json(&["plan", "many.yaml", "--instance", "big"]);
    assert_eq!(code, 0, "{plan}");
    let id = plan["changeSet"]["id"].as_str().unwrap().to_owned();
    let deploy = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["deploy", "--change-set", &id, "--engine", &engine.addr])
        .current_dir(root.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill the engine once the plugin has created some, but not all, resources.
    let created = journaled;
    let deadline = Instant::now() + Duration::from_secs(60);
    while created(&journal).len() < 40 {
        assert!(Instant::now() < deadline, "the deploy made no progress");
        std::thread::sleep(Duration::from_millis(10));
    }
    engine.kill9();
    // The client would wait for the engine to come back; it is not what this test is about.
    let mut deploy = deploy;
    let _ = deploy.kill();
    let _ = deploy.wait();
    // Let plugins (killed with their parent) finish dying before reading the journal.
    std::thread::sleep(Duration::from_millis(500));
    let made = created(&journal);
    assert!(made.len() < 200, "the deploy finished before the kill");

    let engine = Engine::builder(root.path())
        .args(&["--max-parallel", "8"])
        .env("TRELLIS_SIM_JOURNAL", &journal)
        .start();
    let op = engine
        .events("big")
        .iter()
        .find(|(kind, p)| kind == "operation.started" && p["kind"] == "deploy")
        .and_then(|(_, p)| p["operation"].as_str().map(str::to_owned))
        .expect("the deploy started");
    let (inst, creating) = assert_interrupted(&engine, &op, "big");
    let resources = inst["resources"].as_object().unwrap();
    for name in &made {
        assert!(
            resources.contains_key(name),
            "{name} was created by the plugin but is not in state"
        );
    }
    Killed {
        engine,
        journal,
        made,
        creating,
        _root: root,
    }
}

#[test]
fn engine_killed_mid_deploy_loses_nothing_and_reconcile_reapply_recovers() {
    let Killed { engine, _root, .. } = killed_mid_deploy("e2e-kill");
    // Reconcile settles every recorded resource; a new deploy finishes the rest.
    let (code, out) = engine.json(&["reconcile", "--instance", "big", "--mode", "reapply"]);
    assert_eq!(code, 0, "{out}");
    let inst = engine.instance("big");
    assert!(
        inst["resources"]
            .as_object()
            .unwrap()
            .values()
            .all(|r| r["status"] == "CREATED"),
        "{inst}"
    );
    let (code, out) = engine.json(&["deploy", "many.yaml", "--instance", "big"]);
    assert_eq!(code, 0, "{out}");
    let inst = engine.instance("big");
    assert_eq!(inst["resources"].as_object().unwrap().len(), 200);
    assert_eq!(inst["status"], "UPDATED", "{inst}");
}

/// Accept records what the provider says exists and creates nothing: every resource the
/// plugin created is kept, every create that never happened is forgotten.
#[test]
fn engine_killed_mid_deploy_and_reconcile_accept_records_what_exists() {
    let Killed {
        engine,
        journal,
        made,
        creating,
        _root,
    } = killed_mid_deploy("e2e-kill-accept");
    // The kill lands mid-turn: creates were in flight (the scheduler records the next intents
    // with each batch of outcomes), so accept has unfinished creates to settle.
    assert!(creating > 0, "no create was in flight at the kill");
    let (code, out) = engine.json(&["reconcile", "--instance", "big", "--mode", "accept"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(journaled(&journal), made, "accept created something");
    let inst = engine.instance("big");
    let resources = inst["resources"].as_object().unwrap();
    let mut kept: Vec<&String> = resources.keys().collect();
    kept.sort();
    let mut expected: Vec<&String> = made.iter().collect();
    expected.sort();
    assert_eq!(kept, expected, "{inst}");
    assert!(
        resources.values().all(|r| r["status"] == "CREATED"),
        "{inst}"
    );
    // Adopted resources carry the provider's id, as created ones do.
    assert!(
        resources.values().all(|r| r["externalId"]
            .as_str()
            .is_some_and(|id| id.starts_with("sim-"))
            && r["externalId"] == r["state"]["id"]),
        "{inst}"
    );
    let (code, drift) = engine.json(&["drift", "--instance", "big"]);
    assert_eq!(code, 0, "{drift}");
    // The next deploy creates exactly the rest.
    let (code, out) = engine.json(&["deploy", "many.yaml", "--instance", "big"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(journaled(&journal).len(), 200);
    assert_eq!(
        engine.instance("big")["resources"]
            .as_object()
            .unwrap()
            .len(),
        200
    );
}

#[test]
fn sigterm_drains_and_exits_zero() {
    let root = TempDir::new("e2e-term");
    let mut engine = Engine::start(root.path());
    write(&root.join("one.yaml"), &many_sims(2, 0));
    let (code, out) = engine.json(&["deploy", "one.yaml", "--instance", "t"]);
    assert_eq!(code, 0, "{out}");
    // Health is served for the engine service and overall.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = engine.addr.clone();
    let statuses = rt.block_on(async move {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        let mut out = Vec::new();
        for service in ["", "trellis.engine.v1.Engine"] {
            let r = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap()
                .into_inner();
            out.push(r.status);
        }
        out
    });
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    assert_eq!(statuses, [serving, serving]);
    assert_eq!(engine.terminate(), Some(0));
    // The data directory is free again: a new engine opens it and sees the instance.
    let engine = Engine::start(root.path());
    assert_eq!(engine.instance("t")["status"], "DEPLOYED");
}

mod watch {
    use super::*;
    use trellis_proto::engine::v1 as api;
    use trellis_proto::engine::v1::engine_client::EngineClient;

    async fn client(addr: &str) -> EngineClient<tonic::transport::Channel> {
        match trellis::cli::client::connect(addr).await {
            Ok(c) => c,
            Err(_) => panic!("cannot connect to {addr}"),
        }
    }

    /// Watches an operation, dropping the stream after a pseudo-random number of events and
    /// resuming from the last sequence number seen, until the terminal event.
    async fn choppy_watch(addr: &str, op: &str, mut seed: u64) -> Vec<(u64, String)> {
        let mut seen: Vec<(u64, String)> = Vec::new();
        let mut after = 0;
        loop {
            let mut c = client(addr).await;
            let mut stream = c
                .watch_operation(api::WatchOperationRequest {
                    operation_id: op.to_owned(),
                    after_seq: after,
                })
                .await
                .unwrap()
                .into_inner();
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let take = 1 + (seed >> 33) % 4;
            let mut got = 0;
            let mut ended = true;
            while let Some(item) = stream.message().await.unwrap() {
                if let Some(api::watch_response::Item::Event(e)) = item.item {
                    after = e.seq;
                    let done = e.kind == "operation.finished";
                    seen.push((e.seq, e.kind));
                    if done {
                        return seen;
                    }
                    got += 1;
                    if got == take {
                        ended = false;
                        break;
                    }
                }
            }
            // Dropping the stream here is the disconnect.
            assert!(!ended, "the stream ended without the terminal event");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resumed_watcher_gets_the_exact_event_log() {
        let root = TempDir::new("e2e-watch");
        let engine = tokio::task::spawn_blocking({
            let p = root.path().to_path_buf();
            move || Engine::builder(&p).args(&["--max-parallel", "4"]).start()
        })
        .await
        .unwrap();
        let mut c = client(&engine.addr).await;
        let plan = |content: String| api::CreateChangeSetRequest {
            request_id: "watch-plan-1".into(),
            instance: "w".into(),
            source: Some(api::BlueprintSource {
                source: Some(api::blueprint_source::Source::Inline(
                    api::InlineBlueprint {
                        file_name: "w.yaml".into(),
                        content: content.into_bytes(),
                        children: vec![],
                        assets: vec![],
                    },
                )),
            }),
            variables: vec![],
            environment: None,
        };
        let cs = c
            .create_change_set(plan(many_sims(24, 15)))
            .await
            .unwrap()
            .into_inner();
        // A retried plan is the same change set; the id for another blueprint is refused.
        let again = c
            .create_change_set(plan(many_sims(24, 15)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (again.id.as_str(), again.digest),
            (cs.id.as_str(), cs.digest.clone())
        );
        let reused = c
            .create_change_set(plan(many_sims(24, 14)))
            .await
            .unwrap_err();
        assert_eq!(reused.code(), tonic::Code::AlreadyExists);
        let listed = c
            .list_change_sets(api::ListChangeSetsRequest {
                instance: "w".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(listed.change_sets.len(), 1);
        let op = c
            .execute_change_set(api::ExecuteChangeSetRequest {
                request_id: "watch-test-1".into(),
                change_set_id: cs.id.clone(),
                rollback_on_failure: false,
                wait: None,
            })
            .await
            .unwrap()
            .into_inner();
        // The same request again is the same operation, not a second one.
        let again = c
            .execute_change_set(api::ExecuteChangeSetRequest {
                request_id: "watch-test-1".into(),
                change_set_id: cs.id.clone(),
                rollback_on_failure: false,
                wait: None,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(again.id, op.id);
        // The same id for another request is refused.
        let reused = c
            .destroy(api::DestroyRequest {
                request_id: "watch-test-1".into(),
                instance: "w".into(),
                wait: None,
            })
            .await
            .unwrap_err();
        assert_eq!(reused.code(), tonic::Code::AlreadyExists);

        let watchers: Vec<_> = (0..3u64)
            .map(|seed| {
                let addr = engine.addr.clone();
                let id = op.id.clone();
                tokio::spawn(async move { choppy_watch(&addr, &id, seed * 7919 + 1).await })
            })
            .collect();
        let mut logs = Vec::new();
        for w in watchers {
            logs.push(w.await.unwrap());
        }
        // The reference: the instance's whole log, filtered to the operation.
        let mut stream = c
            .watch_instance(api::WatchInstanceRequest {
                instance: "w".into(),
                after_seq: 0,
                follow: false,
            })
            .await
            .unwrap()
            .into_inner();
        let mut reference = Vec::new();
        while let Some(item) = stream.message().await.unwrap() {
            if let Some(api::watch_response::Item::Event(e)) = item.item
                && e.operation_id == op.id
            {
                reference.push((e.seq, e.kind));
            }
        }
        assert!(reference.len() > 24 * 2, "{reference:?}");
        assert_eq!(reference.last().unwrap().1, "operation.finished");
        for log in logs {
            assert_eq!(log, reference);
        }
    }
}

const LINKED: &str = r#"
version: 2023-04-20
resources:
  appDir:
    type: local/directory
    metadata:
      labels:
        app: demo
    spec:
      path: site
  config:
    type: local/file
    metadata:
      labels:
        app: LABEL
    spec:
      path: ${resources.appDir.spec.path}/config.txt
      content: hello
  apiKey:
    type: local/randomSecret
    metadata:
      labels:
        app: demo
    spec:
      length: 24
  env:
    type: local/envFile
    linkSelector:
      byLabel:
        app: demo
    spec:
      path: ${resources.appDir.spec.path}/app.env
"#;

/// The keys of the linked env file, sorted.
fn env_lines(root: &TempDir) -> Vec<String> {
    let mut keys = env_keys(&root.join("site/app.env"));
    keys.sort();
    keys
}

#[test]
fn links_select_by_label_and_follow_label_changes() {
    let root = TempDir::new("e2e-links");
    let engine = Engine::start(root.path());
    write(&root.join("linked.yaml"), &LINKED.replace("LABEL", "demo"));
    let (code, plan) = engine.json(&["plan", "linked.yaml", "--instance", "l"]);
    assert_eq!(code, 0, "{plan}");
    let links = link_actions(&plan);
    assert!(
        links.contains(&("env->config".into(), "CREATE".into()))
            && links.contains(&("env->appDir".into(), "CREATE".into()))
            && links.contains(&("env->apiKey".into(), "CREATE".into())),
        "{plan}"
    );
    let (code, out) = engine.json(&["deploy", "linked.yaml", "--instance", "l"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        env_lines(&root),
        ["DIR_APP_DIR", "FILE_CONFIG", "SECRET_API_KEY"]
    );
    let text = std::fs::read_to_string(root.join("site/app.env")).unwrap();
    assert!(text.contains("config.txt"), "{text}");
    let inst = engine.instance("l");
    assert_eq!(inst["links"].as_array().unwrap().len(), 3, "{inst}");
    // The secret is in the file, never in what the engine shows.
    let secret_line = text
        .lines()
        .find(|l| l.starts_with("SECRET_API_KEY="))
        .unwrap();
    let secret = secret_line
        .trim_start_matches("SECRET_API_KEY=")
        .trim_matches('"');
    assert!(secret.len() >= 24, "{secret_line}");
    assert!(!inst.to_string().contains(secret), "secret leaked: {inst}");

    // config no longer carries the label: exactly its link goes, and its line with it.
    write(&root.join("linked.yaml"), &LINKED.replace("LABEL", "other"));
    let (code, plan) = engine.json(&["plan", "linked.yaml", "--instance", "l"]);
    assert_eq!(code, 0, "{plan}");
    let removed: Vec<&Value> = plan["changeSet"]["links"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["action"] == "DELETE")
        .collect();
    assert_eq!(removed.len(), 1, "{plan}");
    assert_eq!(removed[0]["resourceB"], "config");
    let (code, out) = engine.json(&["deploy", "linked.yaml", "--instance", "l"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(env_lines(&root), ["DIR_APP_DIR", "SECRET_API_KEY"]);
    assert_eq!(engine.instance("l")["links"].as_array().unwrap().len(), 2);

    // Destroy removes the links first, then everything else.
    let (code, out) = engine.json(&["destroy", "--instance", "l"]);
    assert_eq!(code, 0, "{out}");
    assert!(!root.join("site").exists());
}

/// A blueprint whose `local/file` data source has one filter, and a resource that copies the
/// matched file's content.
fn datasource_blueprint(field: &str, operator: &str, search: &str) -> String {
    format!(
        r#"
version: 2023-04-20
variables:
  wanted:
    type: string
    default: db.env
datasources:
  picked:
    type: local/file
    filter:
      field: {field}
      operator: "{operator}"
      search: {search}
    exports:
      content:
        type: string
      file:
        type: string
        aliasFor: path
resources:
  copy:
    type: local/file
    spec:
      path: copy.txt
      content: ${{datasources.picked.content}}
exports:
  source:
    type: string
    field: datasources.picked.file
"#
    )
}

#[test]
fn data_sources_are_fetched_at_plan_time_with_the_spec_operators() {
    let root = TempDir::new("e2e-ds");
    // The provider lists the engine's working directory: only these files are in it (sorted by
    // path, the provider's order: conf/app.env, conf/db.env, notes.txt).
    let site = root.join("site");
    std::fs::create_dir_all(site.join("conf")).unwrap();
    write(&site.join("conf/app.env"), "APP=1\n");
    write(&site.join("conf/db.env"), "DB=2\n");
    write(&site.join("notes.txt"), "notes\n");
    let engine = Engine::builder(root.path()).cwd(&site).start();
    let bp = root.join("ds.yaml");
    let bp_arg = bp.to_str().unwrap();
    // (field, operator, search) and the file the first match must be.
    let cases = [
        ("name", "=", "${variables.wanted}", "conf/db.env"),
        ("name", "!=", "app.env", "conf/db.env"),
        ("path", "starts with", "conf/d", "conf/db.env"),
        ("path", "not starts with", "conf/", "notes.txt"),
        ("name", "ends with", ".txt", "notes.txt"),
        ("name", "not ends with", ".env", "notes.txt"),
        ("name", "contains", "db", "conf/db.env"),
        ("path", "not contains", "app", "conf/db.env"),
        ("name", "in", "[notes.txt, nope]", "notes.txt"),
        ("name", "not in", "[app.env, db.env]", "notes.txt"),
    ];
    for (i, (field, op, search, expected)) in cases.iter().enumerate() {
        write(&bp, &datasource_blueprint(field, op, search));
        let (code, plan) = engine.json(&["plan", bp_arg, "--instance", &format!("ds{i}")]);
        assert_eq!(code, 0, "{field} {op} {search}: {plan}");
        let want = std::fs::read_to_string(site.join(expected)).unwrap();
        assert_eq!(
            planned_new(&plan, 0, "spec.content"),
            Some(Value::from(want)),
            "{field} {op} {search}: {plan}"
        );
    }
    // Deployed: the copy holds the matched file's content and the export names it.
    write(
        &bp,
        &datasource_blueprint("name", "=", "${variables.wanted}"),
    );
    let (code, out) = engine.json(&["deploy", bp_arg, "--instance", "deployed"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        std::fs::read_to_string(site.join("copy.txt")).unwrap(),
        "DB=2\n"
    );
    assert_eq!(
        engine.instance("deployed")["exports"]["source"],
        "conf/db.env"
    );

    // An operator the field's type does not take is an error naming both; so is no match.
    for (field, op, search, code) in [
        ("size", "starts with", "1", "T1003"),
        ("name", "=", "missing.txt", "T1002"),
    ] {
        write(&bp, &datasource_blueprint(field, op, search));
        let out = engine.cli(&["plan", bp_arg, "--instance", "bad"]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let text = format!("{}{}", stderr(&out), String::from_utf8_lossy(&out.stdout));
        assert!(text.contains(code), "{field} {op}: {text}");
    }
}

#[test]
fn cancel_stops_an_operation_at_a_safe_point() {
    let root = TempDir::new("e2e-cancel");
    let engine = Engine::start(root.path());
    let bp = "version: 2023-04-20\nresources:\n  first:\n    type: sim/resource\n    spec:\n      latencyMs: 5000\n  second:\n    type: sim/resource\n    dependsOn: [first]\n    spec:\n      latencyMs: 10\n";
    write(&root.join("c.yaml"), bp);
    let args: Vec<String> = [
        "deploy",
        "c.yaml",
        "--instance",
        "c",
        "--engine",
        &engine.addr,
        "--format",
        "json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let dir = engine.cwd.clone();
    let deploy = std::thread::spawn(move || {
        Command::new(env!("CARGO_BIN_EXE_trellis"))
            .args(&args)
            .current_dir(dir)
            .output()
            .unwrap()
    });
    // Wait until `first` is in flight, then cancel its operation (its 5 s leave a loaded
    // machine time to get the cancel in before `second` could start).
    let deadline = Instant::now() + Duration::from_secs(30);
    let op = loop {
        assert!(Instant::now() < deadline, "the deploy did not start");
        let out = engine.cli(&["events", "--instance", "c", "--format", "json"]);
        let found = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["kind"] == "resource.create_requested")
            .and_then(|e| e["operationId"].as_str().map(str::to_owned));
        if let Some(op) = found {
            break op;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = engine.cli(&["cancel", &op]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = deploy.join().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["operation"]["status"], "CANCELLED", "{doc}");
    // The call in flight finished and is recorded; nothing new started after the cancel.
    let inst = engine.instance("c");
    assert_eq!(inst["resources"]["first"]["status"], "CREATED", "{inst}");
    assert!(inst["resources"].get("second").is_none(), "{inst}");
    assert_eq!(inst["status"], "DEPLOY_FAILED");
}

#[test]
fn included_children_deploy_in_order_and_feed_each_other() {
    let root = TempDir::new("e2e-children");
    let engine = Engine::start(root.path());
    std::fs::create_dir_all(root.join("parts")).unwrap();
    // `store` makes a directory and exports its path; `app` writes a file into the directory
    // it is given and exports the file's path; the parent reads app's export.
    write(
        &root.join("parts/store.yaml"),
        r#"
version: 2023-04-20
variables:
  dir:
    type: string
resources:
  data:
    type: local/directory
    spec:
      path: ${variables.dir}
exports:
  path:
    type: string
    field: resources.data.spec.path
"#,
    );
    write(
        &root.join("parts/app.yaml"),
        r#"
version: 2023-04-20
variables:
  dataDir:
    type: string
resources:
  config:
    type: local/file
    spec:
      path: ${variables.dataDir}/app.conf
      content: stored in ${variables.dataDir}
exports:
  configPath:
    type: string
    field: resources.config.spec.path
"#,
    );
    write(
        &root.join("main.yaml"),
        r#"
version: 2023-04-20
include:
  app:
    path: ./parts/app.yaml
    variables:
      dataDir: ${children.store.path}
  store:
    path: parts/store.yaml
    variables:
      dir: shared
resources:
  pointer:
    type: local/file
    spec:
      path: pointer.txt
      content: ${children.app.configPath}
exports:
  config:
    type: string
    field: children.app.configPath
"#,
    );
    let (code, out) = engine.json(&["deploy", "main.yaml", "--instance", "main"]);
    assert_eq!(code, 0, "{out}");
    // store ran before app (app's file lives in store's directory), the parent after both.
    assert_eq!(
        std::fs::read_to_string(root.join("shared/app.conf")).unwrap(),
        "stored in shared"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("pointer.txt")).unwrap(),
        "shared/app.conf"
    );
    let main = engine.instance("main");
    assert_eq!(main["exports"]["config"], "shared/app.conf", "{main}");
    assert_eq!(main["children"].as_array().unwrap().len(), 2, "{main}");
    // The children are instances of their own.
    assert_eq!(engine.instance("main/store")["status"], "DEPLOYED");
    assert_eq!(
        engine.instance("main/app")["exports"]["configPath"],
        "shared/app.conf"
    );

    // Destroy: the parent's resources, then the children.
    let (code, out) = engine.json(&["destroy", "--instance", "main"]);
    assert_eq!(code, 0, "{out}");
    assert!(!root.join("pointer.txt").exists());
    assert!(!root.join("shared").exists());
    assert_eq!(engine.instance("main/app")["status"], "DESTROYED");

    // An include cycle is an error naming the chain, not a hang.
    write(
        &root.join("loop-a.yaml"),
        "version: 2023-04-20\ninclude:\n  b:\n    path: loop-b.yaml\nresources:\n  own:\n    type: sim/resource\n    spec:\n      latencyMs: 0\n",
    );
    write(
        &root.join("loop-b.yaml"),
        "version: 2023-04-20\ninclude:\n  a:\n    path: loop-a.yaml\nresources:\n  own:\n    type: sim/resource\n    spec:\n      latencyMs: 0\n",
    );
    let (code, out) = engine.json(&["deploy", "loop-a.yaml", "--instance", "loop"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.to_string().contains("include cycle"), "{out}");
}

#[test]
fn includes_relative_to_the_working_directory_need_an_allowed_root() {
    let root = TempDir::new("e2e-cwd");
    std::fs::create_dir_all(root.join("core_infra")).unwrap();
    std::fs::create_dir_all(root.join("app_infra")).unwrap();
    write(
        &root.join("core_infra/child-blueprint.yaml"),
        "version: 2023-04-20\nresources:\n  data:\n    type: local/directory\n    spec:\n      path: core-data\nexports:\n  dir:\n    type: string\n    field: resources.data.spec.path\n",
    );
    // The specification's working-directory example, with a resource of its own (`resources` is
    // required).
    write(
        &root.join("app_infra/main-blueprint.yaml"),
        "version: 2023-04-20\ninclude:\n  child:\n    path: ${cwd()}/core_infra/child-blueprint.yaml\nresources:\n  own:\n    type: sim/resource\n    spec:\n      latencyMs: 0\nexports:\n  dir:\n    type: string\n    field: children.child.dir\n",
    );
    let engine = Engine::builder(root.path()).allow_path(root.path()).start();
    let (code, out) = engine.json(&[
        "deploy",
        "app_infra/main-blueprint.yaml",
        "--instance",
        "cwd",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(root.join("core-data").is_dir());
    assert_eq!(engine.instance("cwd")["exports"]["dir"], "core-data");

    // Without the root allowed, the engine refuses to read its own disk.
    let other = TempDir::new("e2e-cwd-denied");
    std::fs::create_dir_all(other.join("core_infra")).unwrap();
    std::fs::create_dir_all(other.join("app_infra")).unwrap();
    for f in [
        "core_infra/child-blueprint.yaml",
        "app_infra/main-blueprint.yaml",
    ] {
        std::fs::copy(root.join(f), other.join(f)).unwrap();
    }
    let engine = Engine::start(other.path());
    let (code, out) = engine.json(&[
        "deploy",
        "app_infra/main-blueprint.yaml",
        "--instance",
        "cwd",
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(out.to_string().contains("--allow-path"), "{out}");
}

/// A provider's progress messages reach the user: a create that runs for seconds records
/// `resource.progress` events (sampled once a second, before its `resource.created`), which
/// `trellis deploy` prints with the other events and `trellis events` lists; a quick create
/// records none.
#[test]
fn apply_progress_is_shown_and_sampled() {
    let root = TempDir::new("e2e-progress");
    let engine = Engine::start(root.path());
    write(
        &root.join("slow.yaml"),
        "version: 2023-04-20\nresources:\n  slow:\n    type: sim/resource\n    spec:\n      latencyMs: 2500\n  quick:\n    type: sim/resource\n    spec:\n      latencyMs: 10\n",
    );
    let out = engine.cli(&["deploy", "slow.yaml", "--instance", "p"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let shown = String::from_utf8_lossy(&out.stderr);
    assert!(
        shown.contains("resource.progress  slow  (sim/resource): create slow: waiting 2500 ms"),
        "{shown}"
    );
    // Lines are held back while events keep coming, and none is lost or repeated.
    let line = |text: &str| shown.lines().filter(|l| *l == text).count();
    for name in ["slow", "quick"] {
        assert_eq!(
            line(&format!("resource.created  {name}  (sim/resource)")),
            1,
            "{shown}"
        );
    }
    assert_eq!(line("operation.finished  SUCCEEDED"), 1, "{shown}");
    let events = engine.events("p");
    let kinds: Vec<(&str, &str)> = events
        .iter()
        .filter(|(_, p)| p["resource"].is_string())
        .map(|(k, p)| (k.as_str(), p["resource"].as_str().unwrap()))
        .collect();
    let progress = kinds
        .iter()
        .filter(|(k, _)| *k == "resource.progress")
        .count();
    // The message does not change, so one sample records it; a second would repeat it.
    assert_eq!(progress, 1, "{kinds:?}");
    let at = |kind: &str, name: &str| kinds.iter().position(|e| *e == (kind, name)).unwrap();
    assert!(at("resource.progress", "slow") < at("resource.created", "slow"));
    assert!(
        !kinds.contains(&("resource.progress", "quick")),
        "{kinds:?}"
    );
}

/// `PlanResource` is called for a provider that declares it (sim does), and the plan shows
/// what it answered: the state values it knows before deploy (`state.*`, planned by the
/// provider), its warning at the field it names, and a field it says cannot change in place,
/// which turns an update into a recreate that the deploy carries out.
#[test]
fn the_providers_plan_is_in_the_plan() {
    let root = TempDir::new("e2e-provider-plan");
    let journal = root.join("journal.txt");
    let engine = Engine::builder(root.path())
        .env("TRELLIS_SIM_JOURNAL", &journal)
        .start();
    let blueprint = |payload: &str| {
        format!(
            "version: 2023-04-20\nresources:\n  thing:\n    type: sim/resource\n    spec:\n      payload: {payload}\n      recreateOn: [payload]\n      planWarning: mind the payload\n  plain:\n    type: sim/resource\n    spec:\n      payload: {payload}\n"
        )
    };
    write(&root.join("p.yaml"), &blueprint("one"));
    let (code, plan) = engine.json(&["plan", "p.yaml", "--instance", "pp"]);
    assert_eq!(code, 0, "{plan}");
    let resources = plan["changeSet"]["resources"].as_array().unwrap();
    let fields = |name: &str| -> Vec<Value> {
        resources
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name}: {plan}"))["fields"]
            .as_array()
            .unwrap()
            .clone()
    };
    let id = fields("thing")
        .into_iter()
        .find(|f| f["path"] == "state.id")
        .unwrap_or_else(|| panic!("no planned state.id: {plan}"));
    assert_eq!(id["origin"], "provider", "{id}");
    assert!(
        id["new"].as_str().is_some_and(|v| v.starts_with("sim-")),
        "{id}"
    );
    let warning = plan["changeSet"]["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| {
            d["message"]
                .as_str()
                .unwrap_or_default()
                .contains("mind the payload")
        })
        .unwrap_or_else(|| panic!("no warning from the provider's plan: {plan}"));
    assert_eq!(warning["severity"], "warning", "{warning}");
    assert_eq!(warning["line"], 8, "{warning}");

    let (code, out) = engine.json(&["deploy", "p.yaml", "--instance", "pp"]);
    assert_eq!(code, 0, "{out}");
    let before = engine.instance("pp")["resources"]["thing"]["externalId"].clone();
    // The payload changes: the provider's plan replaces `thing`; `plain` updates in place.
    write(&root.join("p.yaml"), &blueprint("two"));
    let (code, plan) = engine.json(&["plan", "p.yaml", "--instance", "pp"]);
    assert_eq!(code, 0, "{plan}");
    let actions = crate::engine_common::actions(&plan["changeSet"]["resources"]);
    assert!(
        actions.contains(&("thing".to_owned(), "RECREATE".to_owned()))
            && actions.contains(&("plain".to_owned(), "UPDATE".to_owned())),
        "{actions:?}"
    );
    let thing = plan["changeSet"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "thing")
        .unwrap()
        .clone();
    assert!(
        thing["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("spec.payload"),
        "{thing}"
    );
    let id = plan["changeSet"]["id"].as_str().unwrap().to_owned();
    let (code, out) = engine.json(&["deploy", "--change-set", &id]);
    assert_eq!(code, 0, "{out}");
    let journaled = std::fs::read_to_string(&journal).unwrap();
    assert_eq!(
        journaled
            .lines()
            .filter(|l| l.starts_with("destroyed thing"))
            .count(),
        1,
        "{journaled}"
    );
    assert_eq!(
        engine.instance("pp")["resources"]["thing"]["externalId"],
        before,
        "sim ids come from the name"
    );
}

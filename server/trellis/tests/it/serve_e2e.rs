//! End to end: `trellis serve` as a daemon — stopping mid-deploy, serving on a Unix socket,
//! JSON logs without secrets, reflection, and identical requests arriving together.

use std::time::{Duration, Instant};

use crate::engine_common::{Engine, PATIENCE, client, runtime, write};
use crate::plugins_common::TempDir;
use serde_json::Value;
use trellis_proto::engine::v1 as api;

/// `n` independent sim resources named `r0`.., each taking `latency` ms per call.
pub(crate) fn sims(n: usize, latency: u64) -> String {
    let mut s = String::from("version: 2023-04-20\nresources:\n");
    for i in 0..n {
        s.push_str(&format!(
            "  r{i}:\n    type: sim/resource\n    spec:\n      latencyMs: {latency}\n"
        ));
    }
    s
}

/// Plans `file` for `instance` with the CLI; the change set's id.
pub(crate) fn plan(engine: &Engine, file: &str, instance: &str) -> String {
    let (code, plan) = engine.json(&["plan", file, "--instance", instance]);
    assert_eq!(code, 0, "{plan}");
    plan["changeSet"]["id"].as_str().unwrap().to_owned()
}

fn execute(rt: &tokio::runtime::Runtime, addr: &str, change_set: &str) -> api::Operation {
    rt.block_on(async {
        client(addr)
            .await
            .execute_change_set(api::ExecuteChangeSetRequest {
                request_id: format!("exec-{change_set}"),
                change_set_id: change_set.to_owned(),
                rollback_on_failure: false,
                wait: None,
            })
            .await
            .unwrap()
            .into_inner()
    })
}

/// Waits until a provider call of `instance` is in flight (its intent is recorded).
fn wait_for_create_requested(engine: &Engine, instance: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !engine
        .events(instance)
        .iter()
        .any(|(kind, _)| kind == "resource.create_requested")
    {
        assert!(Instant::now() < deadline, "the deploy did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// After a restart: the operation stopped by the shutdown is interrupted (the harness's
/// checks), and every recorded resource is a create that never finished.
fn assert_shutdown_interrupted(engine: &Engine, op: &str, instance: &str) {
    let (inst, _) = crate::engine_common::assert_interrupted(engine, op, instance);
    let resources = inst["resources"].as_object().unwrap();
    assert!(!resources.is_empty(), "{inst}");
    // The latency outlasts the test: no create can have finished.
    for (name, r) in resources {
        assert!(
            r["status"] == "CREATING" || r["status"] == "CREATE_FAILED",
            "{name}: {r}"
        );
    }
}

/// After an interrupted deploy, deploying the blueprint again (fast this time) settles
/// everything.
fn assert_deploy_recovers(engine: &Engine, instance: &str, n: usize) {
    write(&engine.cwd.join("fast.yaml"), &sims(n, 0));
    let (code, out) = engine.json(&["deploy", "fast.yaml", "--instance", instance]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["operation"]["status"], "SUCCEEDED", "{out}");
    let inst = engine.instance(instance);
    let resources = inst["resources"].as_object().unwrap();
    assert_eq!(resources.len(), n, "{inst}");
    assert!(
        resources.values().all(|r| r["status"] == "CREATED"),
        "{inst}"
    );
    assert_eq!(inst["status"], "UPDATED", "{inst}");
}

#[test]
fn sigterm_mid_deploy_with_a_short_drain_timeout_interrupts_and_recovers() {
    let root = TempDir::new("serve-drain");
    let args = ["--max-parallel", "2", "--drain-timeout", "1s"];
    let mut engine = Engine::builder(root.path()).args(&args).start();
    // Calls far longer than the drain timeout: the drain always reaches its deadline.
    write(&root.join("slow.yaml"), &sims(6, 600_000));
    let rt = runtime();
    let cs = plan(&engine, "slow.yaml", "d");
    let op = execute(&rt, &engine.addr, &cs);
    wait_for_create_requested(&engine, "d");

    assert_eq!(engine.terminate(), Some(0));

    let engine = Engine::builder(root.path()).args(&args).start();
    assert_shutdown_interrupted(&engine, &op.id, "d");
    // At most `--max-parallel` creates were started.
    assert!(engine.instance("d")["resources"].as_object().unwrap().len() <= 2);
    assert_deploy_recovers(&engine, "d", 6);
}

/// Process ids whose environment holds `marker` and whose command line names `program`.
fn processes_with(marker: &str, program: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let read = |f: &str| std::fs::read(entry.path().join(f)).unwrap_or_default();
        let environ = read("environ");
        let cmdline = String::from_utf8_lossy(&read("cmdline")).into_owned();
        if environ.split(|b| *b == 0).any(|v| v == marker.as_bytes()) && cmdline.contains(program) {
            found.push(pid);
        }
    }
    found
}

fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // `pid (comm) state ppid ...`; comm may hold spaces, so read after its `)`.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_draining_engine_refuses_new_mutations_and_still_answers_retries() {
    let root = TempDir::new("serve-refuse");
    // Plugins inherit the engine's environment: the marker finds this test's sim plugin.
    let marker = format!("TRELLIS_TEST_MARKER={}", root.path().display());
    let (key, value) = marker.split_once('=').unwrap();
    let args = ["--max-parallel", "1", "--drain-timeout", "10m"];
    let mut engine = Engine::builder(root.path())
        .args(&args)
        .env(key, value)
        .start();
    write(&root.join("slow.yaml"), &sims(2, 600_000));
    let rt = runtime();
    let cs = plan(&engine, "slow.yaml", "q");
    let op = execute(&rt, &engine.addr, &cs);
    wait_for_create_requested(&engine, "q");
    let sim = processes_with(&marker, "trellis-provider-sim");
    assert_eq!(sim.len(), 1, "{sim:?}");
    let engine_pid = parent_of(sim[0]);

    // Connected before the signal: the listener stays open while the engine drains.
    let addr = engine.addr.clone();
    let health = rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        tonic_health::pb::health_client::HealthClient::new(channel)
    });
    let mut api = rt.block_on(client(&addr));
    // SAFETY: signalling the engine this test started.
    assert_eq!(unsafe { libc::kill(engine_pid, libc::SIGTERM) }, 0);

    // The engine cannot finish draining: its only operation waits on a call that outlasts the
    // test, and the drain timeout is long. So what follows is observed while it drains.
    let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut h = health.clone();
        let status = rt
            .block_on(h.check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            }))
            .unwrap()
            .into_inner()
            .status;
        if status == not_serving {
            break;
        }
        assert!(Instant::now() < deadline, "health never went NOT_SERVING");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Health goes NOT_SERVING just before mutations are refused: until then a destroy meets
    // the deploy's lease (ABORTED) and starts nothing.
    let mut attempt = 0;
    let refused = loop {
        attempt += 1;
        let r = rt.block_on(api.destroy(api::DestroyRequest {
            request_id: format!("destroy-while-draining-{attempt}"),
            instance: "q".into(),
            wait: None,
        }));
        match r {
            Err(s) if s.code() == tonic::Code::Unavailable => break s,
            Err(s) if s.code() == tonic::Code::Aborted => {
                assert!(Instant::now() < deadline, "never refused: {s:?}");
                std::thread::sleep(Duration::from_millis(20));
            }
            other => panic!("a destroy while draining: {other:?}"),
        }
    };
    assert!(refused.message().contains("shutting down"), "{refused:?}");
    let reconcile = rt.block_on(api.reconcile(api::ReconcileRequest {
        request_id: "reconcile-while-draining".into(),
        instance: "q".into(),
        mode: api::ReconcileMode::Reapply as i32,
        resources: vec![],
    }));
    assert_eq!(
        reconcile.map(|_| ()).unwrap_err().code(),
        tonic::Code::Unavailable
    );
    // A retry of the running deploy is not a new mutation: it gets its operation.
    let again = rt
        .block_on(api.execute_change_set(api::ExecuteChangeSetRequest {
            request_id: format!("exec-{cs}"),
            change_set_id: cs.clone(),
            rollback_on_failure: false,
            wait: None,
        }))
        .unwrap()
        .into_inner();
    assert_eq!(again.id, op.id);
    drop((api, health));

    // The plugin's death ends the call in flight without an answer, so the operation ends on
    // its own within the drain time (failed), and the drain with it.
    // SAFETY: killing the sim plugin of the engine this test started.
    assert_eq!(unsafe { libc::kill(sim[0], libc::SIGKILL) }, 0);
    assert_eq!(engine.terminate(), Some(0));

    let engine = Engine::builder(root.path()).args(&args).start();
    let finished: Vec<Value> = engine
        .events("q")
        .into_iter()
        .filter(|(kind, p)| kind == "operation.finished" && p["operation"] == op.id.as_str())
        .map(|(_, p)| p)
        .collect();
    assert_eq!(finished.len(), 1, "{finished:?}");
    assert_eq!(finished[0]["status"], "failed", "{finished:?}");
    // The create that never answered stays an intent, for recovery to settle.
    let inst = engine.instance("q");
    assert_eq!(inst["status"], "DEPLOY_FAILED", "{inst}");
    assert_eq!(inst["resources"]["r0"]["status"], "CREATING", "{inst}");
    assert_deploy_recovers(&engine, "q", 2);
}

/// A CLI command with `--format json` that must exit with `code`; its JSON document.
fn expect_json(engine: &Engine, args: &[&str], code: i32) -> Value {
    let (got, v) = engine.json(args);
    assert_eq!(got, code, "{args:?}: {v}");
    v
}

#[test]
fn the_cli_deploys_and_destroys_through_a_unix_socket() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let root = TempDir::new("serve-unix");
    let socket = root.join("run/engine.sock");
    let listen = format!("unix:{}", socket.display());
    let engine = Engine::builder(root.path())
        .listen(&listen)
        .capture_stderr()
        .start();
    assert_eq!(engine.addr, listen);
    let meta = std::fs::metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    write(
        &root.join("app.yaml"),
        "version: 2023-04-20\nresources:\n  note:\n    type: local/file\n    spec:\n      path: note.txt\n      content: over a socket\n",
    );
    let out = expect_json(&engine, &["deploy", "app.yaml", "--instance", "u"], 0);
    assert_eq!(out["operation"]["status"], "SUCCEEDED", "{out}");
    assert_eq!(
        std::fs::read_to_string(root.join("note.txt")).unwrap(),
        "over a socket"
    );
    let inst = expect_json(&engine, &["instance", "u"], 0);
    assert_eq!(inst["status"], "DEPLOYED", "{inst}");
    assert_eq!(inst["resources"]["note"]["status"], "CREATED", "{inst}");

    let out = expect_json(&engine, &["destroy", "--instance", "u"], 0);
    assert_eq!(out["operation"]["status"], "SUCCEEDED", "{out}");
    assert!(!root.join("note.txt").exists());
    let inst = expect_json(&engine, &["instance", "u"], 0);
    assert_eq!(inst["status"], "DESTROYED", "{inst}");

    let (code, stderr) = engine.stop();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!socket.exists(), "the socket file is left behind");
}

#[test]
fn json_logs_are_one_object_per_line_and_never_hold_secrets() {
    let root = TempDir::new("serve-logs");
    // Unusual enough to appear nowhere by chance.
    let secret = "hunter2-Zq8vK1xW";
    let engine = Engine::builder(root.path())
        .args(&["--log-format", "json", "--log-level", "debug"])
        .capture_stderr()
        .start();
    write(
        &root.join("secret.yaml"),
        r#"version: 2023-04-20
variables:
  password:
    type: string
    secret: true
resources:
  db:
    type: sim/resource
    spec:
      payload: "${variables.password}"
  file:
    type: local/file
    spec:
      path: password.txt
      content: "${variables.password}"
  broken:
    type: sim/resource
    dependsOn: [db]
    spec:
      payload: "${variables.password}"
      failOn: create
      failClass: badInput
"#,
    );
    let var = format!("password={secret}");
    let args = [
        "deploy",
        "secret.yaml",
        "--instance",
        "s",
        "--var",
        &var,
        "--rollback-on-failure",
    ];
    let out = expect_json(&engine, &args, 1);
    assert_eq!(out["operation"]["status"], "FAILED", "{out}");
    let out = expect_json(&engine, &["instance", "s"], 0);
    assert!(!out.to_string().contains(secret), "{out}");
    // Deploy again without the failure, so the secret reaches a provider and stays in state.
    let text = std::fs::read_to_string(root.join("secret.yaml")).unwrap();
    let cut = text.find("  broken:").unwrap();
    write(&root.join("secret.yaml"), &text[..cut]);
    let out = expect_json(&engine, &args[..6], 0);
    assert_eq!(out["operation"]["status"], "SUCCEEDED", "{out}");
    assert_eq!(
        std::fs::read_to_string(root.join("password.txt")).unwrap(),
        secret
    );

    let (code, stderr) = engine.stop();
    assert_eq!(code, Some(0), "{stderr}");
    let mut messages = Vec::new();
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let level = v["level"].as_str().unwrap_or_else(|| panic!("{line}"));
        assert!(
            ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level),
            "{line}"
        );
        let message = v["fields"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no message: {line}"));
        messages.push(message.to_owned());
    }
    // The start and the stop were logged, so the lines above are the engine's own.
    assert!(messages.iter().any(|m| m == "engine started"), "{stderr}");
    assert!(messages.iter().any(|m| m == "engine stopped"), "{stderr}");
    assert!(!stderr.contains(secret), "the secret is in the logs");
}

#[test]
fn reflection_lists_the_engine_service() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let root = TempDir::new("serve-reflect");
    let engine = Engine::start(root.path());
    let addr = engine.addr.clone();
    let services = runtime().block_on(async move {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut answers = ServerReflectionClient::new(channel)
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .unwrap()
            .into_inner();
        let answer = answers.message().await.unwrap().expect("an answer");
        match answer.message_response {
            Some(MessageResponse::ListServicesResponse(list)) => {
                list.service.into_iter().map(|s| s.name).collect::<Vec<_>>()
            }
            other => panic!("{other:?}"),
        }
    });
    assert!(
        services.iter().any(|s| s == "trellis.engine.v1.Engine"),
        "{services:?}"
    );
}

#[test]
fn identical_requests_arriving_together_get_one_operation() {
    let root = TempDir::new("serve-retry");
    let engine = Engine::start(root.path());
    write(&root.join("r.yaml"), &sims(4, 20));
    let cs = plan(&engine, "r.yaml", "r");
    let rt = runtime();
    // Each on its own connection, all at once: none may be refused by the lease the first
    // takes, and only one operation may start.
    let addr = engine.addr.clone();
    let ids: Vec<String> = rt.block_on(async move {
        let calls = (0..16).map(|_| {
            let addr = addr.clone();
            let request = api::ExecuteChangeSetRequest {
                request_id: "deploy-once".into(),
                change_set_id: cs.clone(),
                rollback_on_failure: false,
                wait: None,
            };
            tokio::spawn(async move { client(&addr).await.execute_change_set(request).await })
        });
        let mut ids = Vec::new();
        for call in futures_util::future::join_all(calls).await {
            ids.push(call.unwrap().unwrap().into_inner().id);
        }
        ids
    });
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");

    // The same for destroy, after the deploy ended.
    let deadline = Instant::now() + PATIENCE;
    while !engine
        .events("r")
        .iter()
        .any(|(kind, _)| kind == "operation.finished")
    {
        assert!(Instant::now() < deadline, "the deploy did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
    let addr = engine.addr.clone();
    let ids: Vec<String> = rt.block_on(async move {
        let calls = (0..16).map(|_| {
            let addr = addr.clone();
            tokio::spawn(async move {
                client(&addr)
                    .await
                    .destroy(api::DestroyRequest {
                        request_id: "destroy-once".into(),
                        instance: "r".into(),
                        wait: None,
                    })
                    .await
            })
        });
        let mut ids = Vec::new();
        for call in futures_util::future::join_all(calls).await {
            ids.push(call.unwrap().unwrap().into_inner().id);
        }
        ids
    });
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");

    let started: Vec<Value> = engine
        .events("r")
        .into_iter()
        .filter(|(kind, _)| kind == "operation.started")
        .map(|(_, p)| p)
        .collect();
    assert_eq!(started.len(), 2, "{started:?}");
    assert_eq!(started[1]["operation"], ids[0].as_str());
}

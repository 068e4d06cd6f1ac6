//! The plugin host against the real `trellis-provider-sim` process: crashes
//! mid-call, restarts, retries, the Host service, manifests, shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::plugins_common::*;
use trellis_host::{
    CallOptions, HOST_TOKEN_METADATA, HostConfig, PluginError, PluginHost, PluginKind, values,
};
use trellis_proto::plugin::v1 as pb;
use trellis_proto::plugin::v1::host_client::HostClient;

/// Far past anything the tests wait for: only a hang reaches it.
const HANG: Duration = Duration::from_secs(120);

fn spec(fields: &[(&str, pb::Value)]) -> pb::Value {
    pb::Value {
        kind: Some(pb::value::Kind::Map(pb::MapValue {
            entries: fields
                .iter()
                .map(|(k, v)| pb::MapEntry {
                    key: (*k).to_owned(),
                    value: Some(v.clone()),
                })
                .collect(),
        })),
        sensitive: false,
    }
}

fn int(i: i64) -> pb::Value {
    pb::Value {
        kind: Some(pb::value::Kind::Int(i)),
        sensitive: false,
    }
}

fn apply_req(name: &str, spec: pb::Value) -> pb::ApplyResourceRequest {
    pb::ApplyResourceRequest {
        context: None,
        current: None,
        resource_type: "sim/resource".into(),
        resource_name: name.into(),
        desired_spec: Some(spec),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_call_fails_fast_and_the_next_call_restarts() {
    let root = TempDir::new("kill");
    let dir = sim_dir(&root);
    let host = PluginHost::new(config(&root, &dir));
    let sim = host.provider("sim").expect("sim discovered");

    let echoed = sim
        .call_function("echo", vec![values::string("one")], &CallOptions::default())
        .await
        .expect("first echo");
    assert_eq!(echoed, values::string("one"));
    let pid = sim.pid().expect("running");

    let in_flight = Arc::new(Notify::new());
    let slow = {
        let sim = sim.clone();
        let running = in_flight.clone();
        tokio::spawn(async move {
            sim.apply_resource(
                apply_req("slow", spec(&[("latencyMs", int(600_000))])),
                &CallOptions::default(),
                move |_| running.notify_one(),
            )
            .await
        })
    };
    // The sim reports progress as it starts waiting: the call is in flight.
    in_flight.notified().await;
    kill(pid, libc::SIGKILL);
    // A bound on a hang, not a measurement: the call would otherwise run
    // for its whole latency.
    let err = tokio::time::timeout(HANG, slow)
        .await
        .expect("the call outlived the plugin")
        .expect("join")
        .expect_err("the call must fail when the plugin dies");
    let msg = err.to_string();
    assert!(matches!(err, PluginError::Crashed { .. }), "{msg}");
    assert!(msg.contains("`sim`"), "{msg}");
    assert!(msg.contains("signal 9") && msg.contains("SIGKILL"), "{msg}");
    assert!(msg.contains(&pid.to_string()), "{msg}");
    assert!(has_exited(pid));

    // The host is fine; the next call starts a new process.
    let echoed = sim
        .call_function("echo", vec![values::string("two")], &CallOptions::default())
        .await
        .expect("echo after restart");
    assert_eq!(echoed, values::string("two"));
    let new_pid = sim.pid().expect("restarted");
    assert_ne!(new_pid, pid);
    let st = host.status();
    assert_eq!(st[0].crashes, 1);
    assert_eq!(st[0].launches, 2);

    host.shutdown().await;
    assert!(has_exited(new_pid));
    assert!(
        entries(&root.join("run")).is_empty(),
        "{:?}",
        entries(&root.join("run"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_exiting_mid_call_reports_its_exit_code_and_stderr() {
    let root = TempDir::new("crash");
    let dir = sim_dir(&root);
    let host = PluginHost::new(config(&root, &dir));
    let sim = host.provider("sim").expect("sim");
    let err = sim
        .apply_resource(
            apply_req("boom", spec(&[("crashOn", values::string("create"))])),
            &CallOptions::default(),
            |_| {},
        )
        .await
        .expect_err("crash");
    let msg = err.to_string();
    assert!(matches!(err, PluginError::Crashed { .. }), "{msg}");
    assert!(msg.contains("exit code 101"), "{msg}");
    assert!(msg.contains("crashOn=create"), "{msg}");
    // And it comes back.
    sim.call_function("echo", vec![values::string("x")], &CallOptions::default())
        .await
        .expect("restarted");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_errors_are_retried_per_the_manifest_policy() {
    let root = TempDir::new("retry");
    let dir = sim_dir(&root);
    let host = PluginHost::new(config(&root, &dir));
    let sim = host.provider("sim").expect("sim");
    let policy = sim
        .manifest()
        .await
        .expect("manifest")
        .retry_policy
        .unwrap_or_default();
    assert!(
        policy.max_attempts >= 3,
        "sim allows {} attempts",
        policy.max_attempts
    );

    // Fails twice (TRANSIENT), then succeeds: the same idempotency key
    // across attempts.
    let ok = sim
        .apply_resource(
            apply_req(
                "flaky",
                spec(&[("failOn", values::string("create")), ("failTimes", int(2))]),
            ),
            &CallOptions::default(),
            |_| {},
        )
        .await
        .expect("succeeds on the third attempt");
    assert!(ok.error.is_none());

    // Transient failures every time: the attempts run out; the last error,
    // with its class.
    let err = sim
        .apply_resource(
            apply_req("flakier", spec(&[("failOn", values::string("create"))])),
            &CallOptions::default(),
            |_| {},
        )
        .await
        .expect_err("exhausted");
    match &err {
        PluginError::Application(e) => {
            assert_eq!(e.class(), pb::ErrorClass::Transient);
            assert_eq!(e.attempts, policy.max_attempts);
        }
        other => panic!("expected an application error, got {other}"),
    }
    assert!(err.to_string().contains("TRANSIENT"), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("after {} attempts", policy.max_attempts)),
        "{err}"
    );

    // A non-transient error is not retried.
    let err = sim
        .apply_resource(
            apply_req(
                "bad",
                spec(&[
                    ("failOn", values::string("create")),
                    ("failTimes", int(1)),
                    ("failClass", values::string("badInput")),
                ]),
            ),
            &CallOptions::default(),
            |_| {},
        )
        .await
        .expect_err("failOn");
    match &err {
        PluginError::Application(e) => {
            assert_eq!(e.class(), pb::ErrorClass::BadInput);
            assert_eq!(e.attempts, 1);
        }
        other => panic!("expected an application error, got {other}"),
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_bound_calls() {
    let root = TempDir::new("deadline");
    let dir = sim_dir(&root);
    let host = PluginHost::new(config(&root, &dir));
    let sim = host.provider("sim").expect("sim");
    sim.start().await.expect("start");
    let opts = CallOptions {
        deadline: Some(Duration::from_millis(300)),
        ..CallOptions::default()
    };
    let call = sim.apply_resource(
        apply_req("slow", spec(&[("latencyMs", int(600_000))])),
        &opts,
        |_| {},
    );
    let err = tokio::time::timeout(HANG, call)
        .await
        .expect("the deadline did not end the call")
        .expect_err("deadline");
    // Either the engine's timer fired, or the plugin saw the deadline in
    // its CallContext and gave up first (sim answers TRANSIENT "cancelled";
    // no time is left to retry).
    let by_plugin = err.class() == Some(pb::ErrorClass::Transient);
    assert!(
        matches!(err, PluginError::DeadlineExceeded { .. }) || by_plugin,
        "{err}"
    );
    // The plugin is still healthy.
    sim.call_function("echo", vec![values::string("x")], &CallOptions::default())
        .await
        .expect("echo");
    host.shutdown().await;
}

async fn host_client(host: &PluginHost) -> HostClient<tonic::transport::Channel> {
    let socket = host.host_socket().await.expect("host socket");
    let channel = tonic::transport::Endpoint::from_static("http://host.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .expect("connect to the Host service");
    HostClient::new(channel)
}

fn with_token<T>(msg: T, token: Option<&str>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Some(t) = token {
        req.metadata_mut()
            .insert(HOST_TOKEN_METADATA, t.parse().expect("ascii token"));
    }
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_service_requires_a_valid_token() {
    let root = TempDir::new("hostsvc");
    let dir = sim_dir(&root);
    let host = PluginHost::new(config(&root, &dir));
    let mut client = host_client(&host).await;

    let lookup = || pb::LookupResourceRequest {
        instance_id: "i".into(),
        resource_name: "r".into(),
    };
    let err = client
        .lookup_resource(with_token(lookup(), None))
        .await
        .expect_err("no token");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let err = client
        .lookup_resource(with_token(lookup(), Some("0123456789abcdef")))
        .await
        .expect_err("wrong token");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let err = client
        .acquire_lock(with_token(pb::AcquireLockRequest::default(), Some("nope")))
        .await
        .expect_err("wrong token");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);

    let token = host.issue_host_token("test-a");
    let other = host.issue_host_token("test-b");
    // Past authentication; then refused, since this caller serves no call for instance `i`
    // (LookupResource reads only the instance a plugin's call is for).
    let err = client
        .lookup_resource(with_token(lookup(), Some(&token)))
        .await
        .expect_err("not serving a call for the instance");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");

    // Locks: exclusive, with a timeout, released only by the holder.
    let acquire = |t: &str, ms| {
        with_token(
            pb::AcquireLockRequest {
                instance_id: "i".into(),
                resource_name: "r".into(),
                timeout_ms: ms,
            },
            Some(t),
        )
    };
    let a = client
        .acquire_lock(acquire(&token, 0))
        .await
        .expect("acquire")
        .into_inner();
    assert!(a.acquired);
    let b = client
        .acquire_lock(acquire(&other, 100))
        .await
        .expect("acquire")
        .into_inner();
    assert!(!b.acquired, "held by a");
    let err = client
        .release_lock(with_token(
            pb::ReleaseLockRequest {
                lock_id: a.lock_id.clone(),
            },
            Some(&other),
        ))
        .await
        .expect_err("not the holder");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    client
        .release_lock(with_token(
            pb::ReleaseLockRequest { lock_id: a.lock_id },
            Some(&token),
        ))
        .await
        .expect("release");
    let b = client
        .acquire_lock(acquire(&other, 100))
        .await
        .expect("acquire")
        .into_inner();
    assert!(b.acquired);

    // CallFunction routes to the provider declaring the function (sim's
    // `echo`), and core functions run in the engine.
    let r = client
        .call_function(with_token(
            pb::HostCallFunctionRequest {
                name: "echo".into(),
                args: vec![values::string("via host")],
            },
            Some(&token),
        ))
        .await
        .expect("call")
        .into_inner();
    assert_eq!(r.result, Some(values::string("via host")), "{:?}", r.error);
    let r = client
        .call_function(with_token(
            pb::HostCallFunctionRequest {
                name: "to_upper".into(),
                args: vec![values::string("core")],
            },
            Some(&token),
        ))
        .await
        .expect("call")
        .into_inner();
    assert_eq!(r.result, Some(values::string("CORE")));
    let r = client
        .call_function(with_token(
            pb::HostCallFunctionRequest {
                name: "no_such_function".into(),
                args: vec![],
            },
            Some(&token),
        ))
        .await
        .expect("call")
        .into_inner();
    assert_eq!(
        r.error.map(|e| e.error_class),
        Some(pb::ErrorClass::NotFound as i32)
    );

    // A revoked token is refused.
    host.revoke_host_token(&token);
    let err = client
        .lookup_resource(with_token(lookup(), Some(&token)))
        .await
        .expect_err("revoked");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_are_cached_by_binary_hash() {
    let root = TempDir::new("manifest");
    let dir = sim_dir(&root);
    {
        let host = PluginHost::new(config(&root, &dir));
        let m = host.manifest("sim").await.expect("manifest");
        assert!(m.resource_types.iter().any(|r| r.r#type == "sim/resource"));
        assert!(m.functions.iter().any(|f| f.name == "echo"));
        assert_eq!(host.status()[0].launches, 1);
        host.shutdown().await;
    }
    // A new host (a new `trellis validate`) reads it from disk.
    let host = PluginHost::new(config(&root, &dir));
    let m = host.manifest("sim").await.expect("cached manifest");
    assert!(m.functions.iter().any(|f| f.name == "echo"));
    assert_eq!(host.status()[0].launches, 0, "served from the cache");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_mismatch_fails_the_handshake() {
    let root = TempDir::new("mismatch");
    let dir = root.join("plugins");
    std::fs::create_dir_all(&dir).expect("dir");
    std::os::unix::fs::symlink(sim_binary(), dir.join("trellis-provider-other")).expect("link");
    let host = PluginHost::new(config(&root, &dir));
    let err = host
        .provider("other")
        .expect("discovered")
        .start()
        .await
        .expect_err("mismatch");
    let msg = err.to_string();
    assert!(matches!(err, PluginError::Launch { .. }), "{msg}");
    assert!(msg.contains("`sim`") && msg.contains("`other`"), "{msg}");
    host.shutdown().await;
    assert!(entries(&root.join("run")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_host_kills_and_reaps_its_plugins() {
    let root = TempDir::new("drop");
    let dir = sim_dir(&root);
    let host = PluginHost::new(config(&root, &dir));
    let pid = host
        .provider("sim")
        .expect("sim")
        .start()
        .await
        .expect("start");
    assert!(!has_exited(pid));
    drop(host);
    // Reaped: the pid no longer exists (not even as a zombie).
    assert_eq!(proc_state(pid), None);
    assert!(
        entries(&root.join("run")).is_empty(),
        "{:?}",
        entries(&root.join("run"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_calls_share_one_launch() {
    let root = TempDir::new("share");
    let dir = sim_dir(&root);
    let host = PluginHost::new(config(&root, &dir));
    let sim = host.provider("sim").expect("sim");
    let calls = (0..20).map(|i| {
        let sim = sim.clone();
        async move {
            sim.call_function("echo", vec![int(i)], &CallOptions::default())
                .await
        }
    });
    let results = futures_util::future::join_all(calls).await;
    for (i, r) in results.into_iter().enumerate() {
        assert_eq!(r.expect("echo"), int(i as i64));
    }
    assert_eq!(host.status()[0].launches, 1);
    let _ = host.start(&[(PluginKind::Provider, "sim")]).await;
    assert_eq!(host.status()[0].launches, 1);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_plugin_fails_its_health_checks_and_is_replaced() {
    use trellis_host::HealthPolicy;
    let root = TempDir::new("health");
    let dir = sim_dir(&root);
    let mut cfg = config(&root, &dir);
    // Generous timeouts: a loaded machine must not fail a healthy plugin.
    cfg.health = Some(HealthPolicy {
        interval: Duration::from_millis(200),
        timeout: Duration::from_secs(2),
        max_failures: 2,
    });
    let host = PluginHost::new(cfg);
    let sim = host.provider("sim").expect("sim");
    let pid = sim.start().await.expect("start");
    // Healthy for a while.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(sim.pid(), Some(pid));
    // Freeze it: alive, but answering nothing.
    kill(pid, libc::SIGSTOP);
    let until = Instant::now() + Duration::from_secs(30);
    while proc_state(pid) != Some('T') && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(proc_state(pid), Some('T'), "stopped");
    let err = sim
        .call_function("echo", vec![values::string("x")], &CallOptions::default())
        .await
        .expect_err("the stuck plugin is killed under the call");
    let msg = err.to_string();
    assert!(matches!(err, PluginError::Crashed { .. }), "{msg}");
    assert!(msg.contains("health checks failed"), "{msg}");
    assert!(has_exited(pid));
    // The next call gets a fresh process.
    sim.call_function("echo", vec![values::string("y")], &CallOptions::default())
        .await
        .expect("restarted");
    assert_ne!(sim.pid(), Some(pid));
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_calls_in_flight_and_cleans_up() {
    let root = TempDir::new("shutdown");
    let dir = sim_dir(&root);
    // A grace far longer than the test: only a plugin that stops by itself
    // lets shutdown return before it, and then it exits 0, not by SIGKILL.
    let host = PluginHost::new(HostConfig {
        shutdown_grace: Duration::from_secs(600),
        ..config(&root, &dir)
    });
    let sim = host.provider("sim").expect("sim");
    let pid = sim.start().await.expect("start");
    let in_flight = Arc::new(Notify::new());
    let slow = {
        let sim = sim.clone();
        let running = in_flight.clone();
        tokio::spawn(async move {
            sim.apply_resource(
                apply_req("slow", spec(&[("latencyMs", int(600_000))])),
                &CallOptions::default(),
                move |_| running.notify_one(),
            )
            .await
        })
    };
    // The sim reports progress as it starts waiting: the call is in flight.
    in_flight.notified().await;
    host.shutdown().await;
    // Stdin closed and SIGTERM: the sim cancels its in-flight call and
    // exits on its own.
    let status = host.status();
    assert_eq!(
        status[0].last_exit.as_deref(),
        Some("exit code 0"),
        "{status:?}"
    );
    let err = slow
        .await
        .expect("join")
        .expect_err("ended by the shutdown");
    assert!(
        matches!(err, PluginError::ShutDown { .. }) || err.class().is_some(),
        "{err}"
    );
    assert_eq!(proc_state(pid), None, "reaped");
    assert!(
        entries(&root.join("run")).is_empty(),
        "{:?}",
        entries(&root.join("run"))
    );
    // Nothing starts after shutdown.
    let err = sim
        .call_function("echo", vec![values::string("x")], &CallOptions::default())
        .await
        .expect_err("shut down");
    assert!(matches!(err, PluginError::ShutDown { .. }), "{err}");
}

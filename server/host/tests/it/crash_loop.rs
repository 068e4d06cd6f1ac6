//! A provider in a crash loop (the real sim with `crashOn=create`: it starts, handshakes, and
//! dies under every create). Callers must fail fast with the plugin's name and last exit, never
//! queue behind ever longer restart backoffs and end with "deadline of 0.000s".

use std::time::Duration;

use crate::plugins_common::*;
use trellis_host::{
    BreakerPolicy, CallOptions, HostConfig, PluginError, PluginHost, ProviderClient, RestartPolicy,
    values,
};
use trellis_proto::plugin::v1 as pb;

fn crash_on_create() -> pb::ApplyResourceRequest {
    pb::ApplyResourceRequest {
        context: None,
        current: None,
        resource_type: "sim/resource".into(),
        resource_name: "boom".into(),
        desired_spec: Some(pb::Value {
            kind: Some(pb::value::Kind::Map(pb::MapValue {
                entries: vec![pb::MapEntry {
                    key: "crashOn".into(),
                    value: Some(values::string("create")),
                }],
            })),
            sensitive: false,
        }),
    }
}

/// Backoffs of 1 ms, 0.4 s, then 160 s: the third restart waits far longer than any test.
/// The breaker window is 1 ms, so failures spaced by the backoff never fill it, as with the
/// defaults once the backoff reaches tens of seconds against a 60 s window.
fn looping_config(root: &TempDir, dir: &std::path::Path, max_failures: usize) -> HostConfig {
    HostConfig {
        restart: RestartPolicy {
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_secs(3600),
            multiplier: 400.0,
            reset_after: Duration::from_secs(3600),
        },
        breaker: BreakerPolicy {
            max_failures,
            window: Duration::from_millis(1),
            cooldown: Duration::from_secs(3600),
        },
        ..config(root, dir)
    }
}

async fn crash(sim: &ProviderClient) {
    let err = sim
        .apply_resource(crash_on_create(), &CallOptions::default(), |_| {})
        .await
        .expect_err("crashOn=create");
    assert!(matches!(err, PluginError::Crashed { .. }), "{err}");
}

fn assert_names_the_plugin_and_its_last_exit(msg: &str) {
    assert!(msg.contains("plugin `sim`"), "{msg}");
    assert!(msg.contains("exit code 101"), "{msg}");
    assert!(msg.contains("crashOn=create"), "{msg}");
    assert!(!msg.contains("deadline of"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_in_a_row_open_the_breaker_even_when_the_backoff_outgrows_its_window() {
    let root = TempDir::new("loop-breaker");
    let dir = sim_dir(&root);
    let host = PluginHost::new(looping_config(&root, &dir, 3));
    let sim = host.provider("sim").expect("sim");
    for _ in 0..3 {
        crash(&sim).await;
    }
    // The next caller, whatever its call and deadline, is told at once why the plugin is off.
    for opts in [
        CallOptions::default(),
        CallOptions {
            deadline: Some(Duration::from_secs(5)),
            ..CallOptions::default()
        },
    ] {
        let err = sim
            .call_function("echo", vec![values::string("x")], &opts)
            .await
            .expect_err("breaker open");
        let msg = err.to_string();
        assert!(matches!(err, PluginError::CircuitOpen { .. }), "{msg}");
        assert!(msg.contains("circuit breaker open"), "{msg}");
        assert!(msg.contains("3 failures in a row"), "{msg}");
        assert_names_the_plugin_and_its_last_exit(&msg);
    }
    assert!(host.status()[0].breaker_open);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_behind_a_backoff_longer_than_their_deadline_fail_at_once() {
    let root = TempDir::new("loop-backoff");
    let dir = sim_dir(&root);
    // A breaker that does not open here: the third restart is scheduled 160 s out.
    let host = PluginHost::new(looping_config(&root, &dir, 100));
    let sim = host.provider("sim").expect("sim");
    for _ in 0..3 {
        crash(&sim).await;
    }
    // A caller with a long deadline waits out the backoff (holding the launch)...
    let waiting = {
        let sim = sim.clone();
        tokio::spawn(async move {
            sim.apply_resource(crash_on_create(), &CallOptions::default(), |_| {})
                .await
        })
    };
    // ...give it the launch first (ordering only: the assertion holds either way)...
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ...and one whose deadline comes first is told so now, with the plugin's last exit,
    // instead of queueing until its deadline and reporting a deadline of 0 s.
    let err = sim
        .call_function(
            "echo",
            vec![values::string("x")],
            &CallOptions {
                deadline: Some(Duration::from_secs(5)),
                ..CallOptions::default()
            },
        )
        .await
        .expect_err("restarting");
    let msg = err.to_string();
    assert!(matches!(err, PluginError::Restarting { .. }), "{msg}");
    assert!(msg.contains("restarting after a failure"), "{msg}");
    assert_names_the_plugin_and_its_last_exit(&msg);
    waiting.abort();
    host.shutdown().await;
}

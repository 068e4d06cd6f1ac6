//! The plugin host against misbehaving plugins (small shell scripts):
//! launch timeouts, early exits, bad handshake lines, the circuit breaker,
//! parallel launches, discovery rules.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::plugins_common::*;
use trellis_host::{
    BreakerPolicy, HostConfig, PluginError, PluginHost, PluginKind, RestartPolicy, discover,
};

fn fixture_config(root: &TempDir, dir: &Path, launch_timeout: Duration) -> HostConfig {
    HostConfig {
        launch_timeout,
        ..config(root, dir)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_never_handshakes_fails_at_the_timeout_with_its_stderr() {
    let root = TempDir::new("hang");
    let dir = root.join("plugins");
    let sleeper = root.join("sleeper.pid");
    script(
        &dir,
        "trellis-provider-hang",
        &format!(
            "echo 'hang: starting up' >&2\n\
             echo 'a banner on stdout'\n\
             echo 'hang: waiting for a database that never comes' >&2\n\
             sleep 60 &\n\
             echo $! > {}\n\
             wait",
            sleeper.display()
        ),
    );
    let host = PluginHost::new(fixture_config(&root, &dir, Duration::from_secs(1)));
    let started = Instant::now();
    let err = host
        .provider("hang")
        .expect("discovered")
        .start()
        .await
        .expect_err("no handshake");
    let elapsed = started.elapsed();
    let msg = err.to_string();
    assert!(matches!(err, PluginError::Launch { .. }), "{msg}");
    // The timeout, not a pipe closing early, ended the wait.
    assert!(elapsed >= Duration::from_secs(1), "{elapsed:?}");
    assert!(msg.contains("plugin `hang`"), "{msg}");
    assert!(msg.contains("no handshake within 1.0s"), "{msg}");
    assert!(msg.contains("hang: starting up"), "{msg}");
    assert!(msg.contains("never comes"), "{msg}");
    // The script's own child (its process group) is gone too.
    let pid: u32 = std::fs::read_to_string(&sleeper)
        .expect("sleeper pid")
        .trim()
        .parse()
        .expect("pid");
    let until = Instant::now() + Duration::from_secs(30);
    while !has_exited(pid) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(has_exited(pid), "the plugin's child {pid} survived");
    host.shutdown().await;
    assert!(
        entries(&root.join("run")).is_empty(),
        "{:?}",
        entries(&root.join("run"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_exiting_before_the_handshake_fails_at_once() {
    let root = TempDir::new("early");
    let dir = root.join("plugins");
    script(
        &dir,
        "trellis-provider-early",
        "echo 'early: missing configuration file /etc/early.conf' >&2\nexit 7",
    );
    let host = PluginHost::new(fixture_config(&root, &dir, Duration::from_secs(600)));
    let err = host
        .provider("early")
        .expect("discovered")
        .start()
        .await
        .expect_err("exits");
    let msg = err.to_string();
    // The exit ended the wait, not the (far longer) launch timeout.
    assert!(!msg.contains("no handshake"), "{msg}");
    assert!(msg.contains("exit code 7"), "{msg}");
    assert!(msg.contains("/etc/early.conf"), "{msg}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_handshake_lines_are_refused() {
    let root = TempDir::new("badline");
    let dir = root.join("plugins");
    script(
        &dir,
        "trellis-provider-v9",
        "echo banner\necho 'TRELLIS_PLUGIN|9|unix|'\"$TRELLIS_PLUGIN_SOCKET_DIR\"/p.sock\nsleep 60",
    );
    script(
        &dir,
        "trellis-provider-outside",
        "echo 'TRELLIS_PLUGIN|1|unix|/tmp/elsewhere.sock'\nsleep 60",
    );
    script(
        &dir,
        "trellis-provider-tcp",
        "echo 'TRELLIS_PLUGIN|1|tcp|127.0.0.1:1'\nsleep 60",
    );
    script(
        &dir,
        "trellis-provider-deaf",
        // Announces a socket nobody listens on.
        "echo \"TRELLIS_PLUGIN|1|unix|$TRELLIS_PLUGIN_SOCKET_DIR/p.sock\"\nsleep 60",
    );
    // A refusal must not wait for the launch timeout, which is longer than
    // the test.
    let host = PluginHost::new(fixture_config(&root, &dir, Duration::from_secs(600)));
    let cases = [
        ("v9", "protocol version `9`"),
        ("outside", "not inside the socket directory"),
        ("tcp", "only `unix`"),
        ("deaf", "cannot connect"),
    ];
    for (name, expected) in cases {
        let err = host
            .provider(name)
            .expect("discovered")
            .start()
            .await
            .expect_err("refused");
        let msg = err.to_string();
        assert!(msg.contains(expected), "{name}: {msg}");
        assert!(!msg.contains("no handshake"), "{name}: {msg}");
    }
    host.shutdown().await;
    assert!(
        entries(&root.join("run")).is_empty(),
        "{:?}",
        entries(&root.join("run"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failures_open_the_circuit_breaker() {
    let root = TempDir::new("breaker");
    let dir = root.join("plugins");
    let counter = root.join("starts");
    script(
        &dir,
        "trellis-provider-crashy",
        &format!(
            "echo start >> {}\necho 'crashy: segfault in init' >&2\nexit 139",
            counter.display()
        ),
    );
    let config = HostConfig {
        restart: RestartPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(40),
            multiplier: 2.0,
            reset_after: Duration::from_secs(60),
        },
        breaker: BreakerPolicy {
            max_failures: 3,
            window: Duration::from_secs(60),
            // Long enough that no stall of the machine ends it before the
            // open breaker is checked.
            cooldown: Duration::from_secs(3),
        },
        ..fixture_config(&root, &dir, Duration::from_secs(5))
    };
    let host = PluginHost::new(config);
    let crashy = host.provider("crashy").expect("discovered");
    for _ in 0..3 {
        let err = crashy.start().await.expect_err("crashes");
        assert!(matches!(err, PluginError::Launch { .. }), "{err}");
    }
    let err = crashy.start().await.expect_err("breaker open");
    let msg = err.to_string();
    assert!(matches!(err, PluginError::CircuitOpen { .. }), "{msg}");
    assert!(msg.contains("circuit breaker open"), "{msg}");
    assert!(msg.contains("exit code 139"), "{msg}");
    assert!(host.status()[0].breaker_open);
    let starts = || {
        std::fs::read_to_string(&counter)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    assert_eq!(starts(), 3, "no start while the breaker is open");

    // After the cooldown one start is tried (half-open); it fails, so the
    // breaker opens again at once.
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let err = crashy.start().await.expect_err("half-open attempt fails");
    assert!(matches!(err, PluginError::Launch { .. }), "{err}");
    assert_eq!(starts(), 4);
    let err = crashy.start().await.expect_err("open again");
    assert!(matches!(err, PluginError::CircuitOpen { .. }), "{err}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_launch_in_parallel() {
    let root = TempDir::new("parallel");
    let dir = root.join("plugins");
    let started = root.join("started");
    // Each plugin fails (exit 3) only once all three are running at the
    // same time; launched one after another, the first would wait for the
    // others until its launch timeout.
    for name in [
        "trellis-provider-slowa",
        "trellis-provider-slowb",
        "trellis-transformer-slowc",
    ] {
        script(
            &dir,
            name,
            &format!(
                "echo {name} >> {log}
                 while [ \"$(wc -l < {log})\" -lt 3 ]; do sleep 0.05; done
                 echo 'all three are up' >&2
exit 3",
                log = started.display()
            ),
        );
    }
    let host = PluginHost::new(fixture_config(&root, &dir, Duration::from_secs(600)));
    let results = host
        .start(&[
            (PluginKind::Provider, "slowa"),
            (PluginKind::Provider, "slowb"),
            (PluginKind::Transformer, "slowc"),
        ])
        .await;
    assert_eq!(results.len(), 3);
    for r in &results {
        let msg = r.as_ref().expect_err("exit 3").to_string();
        assert!(msg.contains("exit code 3"), "{msg}");
    }
    host.shutdown().await;
}

#[test]
fn discovery_order_and_what_is_ignored() {
    let root = TempDir::new("discover");
    let first = root.join("first");
    let second = root.join("second");
    script(&first, "trellis-provider-x", "exit 0");
    script(&second, "trellis-provider-x", "exit 0");
    script(&second, "trellis-transformer-t", "exit 0");
    script(&first, "trellis-provider-x.d", "exit 0");
    script(&first, "unrelated-tool", "exit 0");
    std::fs::write(first.join("trellis-provider-plain"), "not executable").expect("write");
    std::fs::create_dir_all(first.join("trellis-provider-dir")).expect("mkdir");
    let found = discover(&[first.clone(), second.clone(), root.join("missing")]);
    let names: Vec<(PluginKind, &str, &Path)> = found
        .iter()
        .map(|p| (p.kind, p.name.as_str(), p.path.parent().expect("parent")))
        .collect();
    assert_eq!(
        names,
        vec![
            (PluginKind::Provider, "x", first.as_path()),
            (PluginKind::Transformer, "t", second.as_path()),
        ]
    );
    // The host reports what it cannot find, naming the directories.
    let host = PluginHost::new(HostConfig {
        plugin_dirs: vec![first.clone()],
        search_exe_dir: false,
        ..HostConfig::default()
    });
    let err = host.provider("nope").err().expect("not found");
    assert!(err.to_string().contains("trellis-provider-nope"), "{err}");
    assert!(
        err.to_string().contains(&first.display().to_string()),
        "{err}"
    );
}

//! `trellis serve --metrics-listen`: a real engine's `/metrics` counts what a deploy did (its
//! operation, its provider calls, its RPCs), read over plain HTTP/1.1 as Prometheus would.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::engine_common::{Engine, write};
use crate::plugins_common::TempDir;

const SIM: &str = "version: 2023-04-20\nresources:\n  a:\n    type: sim/resource\n    spec:\n      latencyMs: 0\n";

/// `GET path` on the metrics address: the status line and the body.
fn get(addr: &str, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to the metrics address");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP response: {response}"));
    let status = head.lines().next().unwrap_or_default().to_owned();
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    (status, body.to_owned())
}

/// The metrics text.
fn scrape(addr: &str) -> String {
    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    body
}

/// The value of the sample `name` whose labels include every `labels` pair, summed over the
/// samples that match (0 when none does: the series does not exist yet).
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
            (n == name).then_some((rest.trim_end_matches('}'), v))
        })
        .filter(|(set, _)| {
            labels.iter().all(|(k, v)| {
                set.split(',')
                    .any(|pair| pair == format!("{k}=\"{v}\"").as_str())
            })
        })
        .map(|(_, v)| v.parse::<f64>().expect("a number"))
        .sum()
}

/// Scrapes until `ok` holds of the metrics (the server counts a stream when the client's
/// close reaches it), for at most 20 s; the last scrape.
fn scrape_until(addr: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = scrape(addr);
        if ok(&text) || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

const ENGINE: &str = "/trellis.engine.v1.Engine/";

#[test]
fn metrics_count_a_deploys_operation_and_provider_calls() {
    let root = TempDir::new("metrics-e2e");
    write(&root.join("sim.yaml"), SIM);
    let engine = Engine::builder(root.path())
        .args(&["--metrics-listen", "127.0.0.1:0"])
        .start();
    let addr = engine
        .metrics
        .clone()
        .expect("the engine printed its metrics address");
    let deploys = |t: &str| {
        value(
            t,
            "trellis_operations_total",
            &[("kind", "deploy"), ("outcome", "succeeded")],
        )
    };
    let applies = |t: &str| {
        value(
            t,
            "trellis_plugin_calls_total",
            &[
                ("plugin", "sim"),
                ("type", "sim/resource"),
                ("call", "ApplyResource"),
                ("outcome", "ok"),
            ],
        )
    };
    let executes = |t: &str| {
        value(
            t,
            "trellis_rpcs_total",
            &[
                ("method", &format!("{ENGINE}ExecuteChangeSet")),
                ("code", "OK"),
            ],
        )
    };
    let watches = |t: &str| {
        value(
            t,
            "trellis_rpcs_total",
            &[("method", &format!("{ENGINE}WatchOperation"))],
        )
    };

    let before = scrape(&addr);
    assert!(before.ends_with("# EOF\n"), "{before}");
    // A family shows once it has a series; the gauge always has one.
    assert!(
        before.contains("# TYPE trellis_watch_streams_open gauge"),
        "{before}"
    );
    assert_eq!(deploys(&before), 0.0);
    assert_eq!(applies(&before), 0.0);
    let events_before = value(&before, "trellis_events_written_total", &[]);

    let (code, out) = engine.json(&["deploy", "sim.yaml", "--instance", "m1"]);
    assert_eq!(code, 0, "{out}");
    let after = scrape_until(&addr, |t| watches(t) >= 1.0);
    assert_eq!(deploys(&after), 1.0, "{after}");
    assert_eq!(
        value(
            &after,
            "trellis_operation_duration_seconds_count",
            &[("kind", "deploy"), ("outcome", "succeeded")]
        ),
        1.0,
        "{after}"
    );
    assert_eq!(applies(&after), 1.0, "{after}");
    assert!(
        value(
            &after,
            "trellis_plugin_call_duration_seconds_bucket",
            &[
                ("plugin", "sim"),
                ("type", "sim/resource"),
                ("call", "ApplyResource"),
                ("le", "+Inf")
            ]
        ) == 1.0,
        "{after}"
    );
    assert!(
        value(
            &after,
            "trellis_plugin_calls_total",
            &[
                ("plugin", "sim"),
                ("call", "ValidateResource"),
                ("outcome", "ok")
            ]
        ) >= 1.0,
        "{after}"
    );
    assert_eq!(
        value(&after, "trellis_plugin_starts_total", &[("plugin", "sim")]),
        1.0,
        "{after}"
    );
    assert_eq!(executes(&after), 1.0, "{after}");
    assert_eq!(watches(&after), 1.0, "{after}");
    assert!(
        value(&after, "trellis_events_written_total", &[]) > events_before,
        "{after}"
    );
    assert!(
        value(&after, "trellis_state_commit_duration_seconds_count", &[]) >= 1.0,
        "{after}"
    );

    // An error answered in the headers (trailers-only) is counted with its code.
    let out = engine.cli(&["instance", "nope"]);
    assert!(!out.status.success());
    let after_error = scrape(&addr);
    assert_eq!(
        value(
            &after_error,
            "trellis_rpcs_total",
            &[
                ("method", &format!("{ENGINE}GetInstance")),
                ("code", "NOT_FOUND")
            ]
        ),
        1.0,
        "{after_error}"
    );

    // A second deploy counts again.
    let (code, out) = engine.json(&["deploy", "sim.yaml", "--instance", "m2"]);
    assert_eq!(code, 0, "{out}");
    let second = scrape_until(&addr, |t| watches(t) >= 2.0);
    assert_eq!(deploys(&second), 2.0, "{second}");
    assert_eq!(applies(&second), 2.0, "{second}");
    assert_eq!(executes(&second), 2.0, "{second}");
    assert_eq!(watches(&second), 2.0, "{second}");
    // Every watch has ended.
    let idle = scrape_until(&addr, |t| {
        value(t, "trellis_watch_streams_open", &[]) == 0.0
    });
    assert!(idle.contains("\ntrellis_watch_streams_open 0\n"), "{idle}");
    // No label carries an instance name.
    assert!(!second.contains("m1") && !second.contains("m2"), "{second}");

    let (status, _) = get(&addr, "/other");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
}

#[test]
fn metrics_listen_needs_host_and_port() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["serve", "--metrics-listen", "unix:/tmp/metrics.sock"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--metrics-listen (or TRELLIS_METRICS_LISTEN)") && err.contains("HOST:PORT"),
        "{err}"
    );
}

/// Destroys that start together go to their provider as one DestroyResources call (the sim
/// declares the capability, as every plugin built on the Rust SDK does): each item with its
/// own idempotency key, each outcome on its own (a transient failure retried alone, as a
/// DestroyResource; a refusal failing only its resource).
#[test]
fn destroys_started_together_go_to_their_provider_in_one_call() {
    let root = TempDir::new("metrics-batch");
    let journal = root.join("journal.txt");
    let mut blueprint = String::from("version: 2023-04-20\nresources:\n");
    for name in ["a", "b", "c"] {
        blueprint += &format!("  {name}:\n    type: sim/resource\n    spec:\n      latencyMs: 0\n");
    }
    blueprint +=
        "  flaky:\n    type: sim/resource\n    spec:\n      failOn: destroy\n      failTimes: 1\n";
    blueprint += "  stuck:\n    type: sim/resource\n    spec:\n      failOn: destroy\n      failClass: conflict\n";
    write(&root.join("five.yaml"), &blueprint);
    let engine = Engine::builder(root.path())
        .args(&["--metrics-listen", "127.0.0.1:0"])
        .env("TRELLIS_SIM_JOURNAL", &journal)
        .start();
    let addr = engine.metrics.clone().expect("metrics address");
    let (code, out) = engine.json(&["deploy", "five.yaml", "--instance", "five"]);
    assert_eq!(code, 0, "{out}");

    let (code, out) = engine.json(&["destroy", "--instance", "five"]);
    assert_ne!(code, 0, "stuck cannot be destroyed: {out}");
    let calls = |t: &str, call: &str| {
        value(
            t,
            "trellis_plugin_calls_total",
            &[("plugin", "sim"), ("call", call), ("outcome", "ok")],
        )
    };
    let text = scrape(&addr);
    assert_eq!(calls(&text, "DestroyResources"), 1.0, "{text}");
    // flaky's second attempt, on its own.
    assert_eq!(calls(&text, "DestroyResource"), 1.0, "{text}");

    let inst = engine.instance("five");
    let left: Vec<&String> = inst["resources"].as_object().unwrap().keys().collect();
    assert_eq!(left, ["stuck"], "{inst}");
    // Every destroy the plugin did carried the key of its own resource.
    let log = std::fs::read_to_string(&journal).unwrap();
    let mut destroyed: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("destroyed "))
        .map(|rest| {
            let (name, key) = rest.split_once(' ').expect("a key");
            assert!(key.ends_with(&format!(":{name}:destroy")), "{rest}");
            name
        })
        .collect();
    destroyed.sort_unstable();
    assert_eq!(destroyed, ["a", "b", "c", "flaky"], "{log}");
}

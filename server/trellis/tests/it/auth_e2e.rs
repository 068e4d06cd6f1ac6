//! Authentication and authorization end to end (docs/auth.md): a real `trellis serve` with an
//! `[auth]` tokens file, tokens made by `trellis token create`, and the real CLI sending them
//! from TRELLIS_TOKEN or --token-file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::engine_common::{Engine, write};
use crate::plugins_common::TempDir;
use serde_json::Value;

const SIM: &str = "version: 2023-04-20\nresources:\n  a:\n    type: sim/resource\n    spec:\n      latencyMs: 0\n";

/// `trellis token create`: the token it printed.
pub(crate) fn create_token(
    tokens_file: &Path,
    name: &str,
    role: &str,
    instances: Option<&str>,
) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trellis"));
    c.args(["token", "create", "--name", name, "--role", role])
        .arg("--tokens-file")
        .arg(tokens_file);
    if let Some(glob) = instances {
        c.args(["--instances", glob]);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(token.starts_with("trellis_"), "{token}");
    token
}

/// An engine whose config names `tokens.toml` under `root`, with logs at info kept.
fn start_with_auth(root: &Path) -> (Engine, PathBuf) {
    let tokens = root.join("tokens.toml");
    write(
        &root.join("trellis.toml"),
        "[auth]\ntokens_file = \"tokens.toml\"\n",
    );
    write(&root.join("sim.yaml"), SIM);
    let engine = Engine::builder(root)
        .args(&["--config", root.join("trellis.toml").to_str().unwrap()])
        .env("TRELLIS_LOG_LEVEL", "info")
        .capture_stderr()
        .start();
    (engine, tokens)
}

/// A client command as the holder of `token` (none: TRELLIS_TOKEN unset), `--format json`:
/// its exit code and its JSON.
pub(crate) fn as_token(engine: &Engine, token: Option<&str>, args: &[&str]) -> (i32, Value) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trellis"));
    c.args(args)
        .args(["--engine", &engine.addr, "--format", "json"])
        .current_dir(&engine.cwd)
        .env_remove("TRELLIS_TOKEN")
        .env_remove("TRELLIS_TOKEN_FILE");
    if let Some(t) = token {
        c.env("TRELLIS_TOKEN", t);
    }
    parse(c.output().unwrap())
}

fn parse(out: Output) -> (i32, Value) {
    let code = out.status.code().unwrap_or(-1);
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or("");
    let v = serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}); exit {code}\nstdout: {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, v)
}

pub(crate) fn error_of(v: &Value) -> (&str, &str) {
    (
        v["error"]["code"].as_str().unwrap_or_default(),
        v["error"]["message"].as_str().unwrap_or_default(),
    )
}

#[test]
fn no_token_or_a_wrong_token_is_unauthenticated_and_health_stays_open() {
    let root = TempDir::new("auth-unauth");
    let tokens = root.join("tokens.toml");
    let viewer = create_token(&tokens, "reader", "viewer", None);
    let (engine, _) = start_with_auth(root.path());

    let (code, v) = as_token(&engine, None, &["instances"]);
    assert_eq!(code, 2, "{v}");
    let (status, message) = error_of(&v);
    assert_eq!(status, "UNAUTHENTICATED", "{v}");
    assert!(message.contains("no token"), "{message}");

    let wrong = format!("trellis_{}", "0".repeat(64));
    let (code, v) = as_token(&engine, Some(&wrong), &["instances"]);
    assert_eq!((code, error_of(&v).0), (2, "UNAUTHENTICATED"), "{v}");
    // The token's hash is not the token.
    let hash = trellis_ids::sha256_hex(viewer.as_bytes());
    let (_, v) = as_token(&engine, Some(&hash), &["instances"]);
    assert_eq!(error_of(&v).0, "UNAUTHENTICATED", "{v}");

    let (code, v) = as_token(&engine, Some(&viewer), &["instances"]);
    assert_eq!(code, 0, "{v}");

    // From a file too (a trailing newline is fine).
    write(&root.join("my-token"), &format!("{viewer}\n"));
    let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["instances", "--engine", &engine.addr, "--format", "json"])
        .arg("--token-file")
        .arg(root.join("my-token"))
        .env_remove("TRELLIS_TOKEN")
        .output()
        .unwrap();
    assert_eq!(parse(out).0, 0);

    // Health needs no token.
    let addr = engine.addr.clone();
    let status = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            tonic_health::pb::health_client::HealthClient::new(channel)
                .check(tonic_health::pb::HealthCheckRequest {
                    service: "trellis.engine.v1.Engine".into(),
                })
                .await
                .unwrap()
                .into_inner()
                .status
        });
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    let (_, logs) = engine.stop();
    assert!(logs.contains("unauthenticated"), "{logs}");
    assert!(logs.contains("reader"), "decisions name the token: {logs}");
    assert!(
        !logs.contains(&viewer[8..]),
        "the token never reaches the logs"
    );
}

#[test]
fn roles_and_instance_patterns_are_enforced() {
    let root = TempDir::new("auth-roles");
    let tokens = root.join("tokens.toml");
    let viewer = create_token(&tokens, "watcher", "viewer", None);
    let planner = create_token(&tokens, "reviewer", "planner", None);
    let deployer = create_token(&tokens, "team-a-ci", "deployer", Some("team-a/*"));
    let admin = create_token(&tokens, "ops", "admin", None);
    // Only hashes are kept.
    let kept = std::fs::read_to_string(&tokens).unwrap();
    for t in [&viewer, &planner, &deployer, &admin] {
        assert!(!kept.contains(&t[8..]));
    }
    let (engine, _) = start_with_auth(root.path());

    // A viewer deploying: refused at the plan, naming the role.
    let (code, v) = as_token(
        &engine,
        Some(&viewer),
        &["deploy", "sim.yaml", "--instance", "team-a/web"],
    );
    let (status, message) = error_of(&v);
    assert_eq!((code, status), (2, "PERMISSION_DENIED"), "{v}");
    assert!(
        message.contains("watcher") && message.contains("viewer") && message.contains("planner"),
        "{message}"
    );

    // A planner plans, but cannot execute.
    let (code, v) = as_token(
        &engine,
        Some(&planner),
        &["plan", "sim.yaml", "--instance", "team-a/web"],
    );
    assert_eq!(code, 0, "{v}");
    let change_set = v["changeSet"]["id"].as_str().unwrap().to_owned();
    let (code, v) = as_token(
        &engine,
        Some(&planner),
        &["deploy", "--change-set", &change_set],
    );
    let (status, message) = error_of(&v);
    assert_eq!((code, status), (2, "PERMISSION_DENIED"), "{v}");
    assert!(message.contains("needs role deployer"), "{message}");

    // A deployer inside its pattern deploys; outside it, it is refused naming the pattern.
    let (code, v) = as_token(
        &engine,
        Some(&deployer),
        &["deploy", "--change-set", &change_set],
    );
    assert_eq!(code, 0, "{v}");
    let (code, v) = as_token(
        &engine,
        Some(&deployer),
        &["deploy", "sim.yaml", "--instance", "team-b/web"],
    );
    let (status, message) = error_of(&v);
    assert_eq!((code, status), (2, "PERMISSION_DENIED"), "{v}");
    assert!(
        message.contains("team-a/*")
            && message.contains("deployer")
            && message.contains("team-b/web"),
        "{message}"
    );
    // Nor may it read or destroy there.
    let (code, v) = as_token(
        &engine,
        Some(&admin),
        &["deploy", "sim.yaml", "--instance", "team-b/db"],
    );
    assert_eq!(code, 0, "{v}");
    for args in [
        &["instance", "team-b/db"][..],
        &["destroy", "--instance", "team-b/db"][..],
    ] {
        let (_, v) = as_token(&engine, Some(&deployer), args);
        assert_eq!(error_of(&v).0, "PERMISSION_DENIED", "{args:?}: {v}");
    }
    // Listings show only what the token may see.
    let names = |v: &Value| -> Vec<String> {
        v["instances"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|i| i["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, v) = as_token(&engine, Some(&deployer), &["instances"]);
    assert_eq!(names(&v), ["team-a/web"]);
    let (_, v) = as_token(&engine, Some(&viewer), &["instances"]);
    assert_eq!(names(&v).len(), 2, "{v}");

    // Secret values need admin.
    let (code, v) = as_token(&engine, Some(&viewer), &["instance", "team-a/web"]);
    assert_eq!(code, 0, "{v}");
    let (_, v) = as_token(
        &engine,
        Some(&deployer),
        &["instance", "team-a/web", "--reveal-secrets"],
    );
    let (status, message) = error_of(&v);
    assert_eq!(status, "PERMISSION_DENIED", "{v}");
    assert!(message.contains("needs role admin"), "{message}");
    let (code, v) = as_token(
        &engine,
        Some(&admin),
        &["instance", "team-a/web", "--reveal-secrets"],
    );
    assert_eq!(code, 0, "{v}");

    let (_, logs) = engine.stop();
    for needle in [
        "team-a-ci",
        "watcher",
        "reviewer",
        "ops",
        "denied",
        "allowed",
    ] {
        assert!(logs.contains(needle), "{needle} not in the logs:\n{logs}");
    }
    for t in [&viewer, &planner, &deployer, &admin] {
        assert!(!logs.contains(&t[8..]), "a token reached the logs");
    }
}

#[test]
fn sighup_loads_a_new_token_and_a_revocation() {
    let root = TempDir::new("auth-sighup");
    let tokens = root.join("tokens.toml");
    let first = create_token(&tokens, "first", "viewer", None);
    let (engine, _) = start_with_auth(root.path());
    let second = create_token(&tokens, "second", "viewer", None);
    let (_, v) = as_token(&engine, Some(&second), &["instances"]);
    assert_eq!(
        error_of(&v).0,
        "UNAUTHENTICATED",
        "not loaded before SIGHUP: {v}"
    );

    // SAFETY: signalling the engine process this test started.
    let hup = || unsafe {
        libc::kill(engine.pid() as i32, libc::SIGHUP);
    };
    hup();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, v) = as_token(&engine, Some(&second), &["instances"]);
        if code == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the new token never worked: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // Revoked by name: listed no more, and refused once the engine reloads.
    let token_cmd = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
            .arg("token")
            .args(args)
            .arg("--tokens-file")
            .arg(&tokens)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    token_cmd(&["revoke", "--name", "first"]);
    let listed: Value = serde_json::from_str(&token_cmd(&["list", "--format", "json"])).unwrap();
    let names: Vec<&str> = listed["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["second"], "{listed}");
    assert!(!token_cmd(&["list"]).contains(&trellis_ids::sha256_hex(second.as_bytes())));
    assert_eq!(
        as_token(&engine, Some(&first), &["instances"]).0,
        0,
        "before SIGHUP"
    );
    hup();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, v) = as_token(&engine, Some(&first), &["instances"]);
        if error_of(&v).0 == "UNAUTHENTICATED" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the revoked token still works: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(as_token(&engine, Some(&second), &["instances"]).0, 0);
    let (_, logs) = engine.stop();
    assert!(logs.contains("tokens reloaded"), "{logs}");
}

#[test]
fn a_non_loopback_listen_without_auth_refuses_to_start() {
    let root = TempDir::new("auth-refuse");
    let mut child = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["serve", "--listen", "0.0.0.0:0", "--no-bundled-plugins"])
        .arg("--data-dir")
        .arg(root.join("data"))
        .env_remove("TRELLIS_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("trellis serve kept running on 0.0.0.0 without [auth]");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0 without authentication"),
        "{stderr}"
    );
    assert!(stderr.contains("--insecure-no-auth"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listening"));
    assert!(!root.join("data").join("state.db").exists());
}

#[test]
fn insecure_no_auth_starts_with_a_warning() {
    let root = TempDir::new("auth-insecure");
    let engine = Engine::builder(root.path())
        .listen("0.0.0.0:0")
        .args(&["--insecure-no-auth"])
        .capture_stderr()
        .start();
    let port = engine.port().to_owned();
    let out = engine.cli_at(&format!("127.0.0.1:{port}"), &["instances"]);
    assert!(out.status.success(), "{out:?}");
    let (_, logs) = engine.stop();
    assert!(
        logs.contains("--insecure-no-auth") && logs.contains("WITHOUT authentication"),
        "{logs}"
    );
}

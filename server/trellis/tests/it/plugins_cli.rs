//! `trellis plugins` end to end: the real binary, the real sim provider.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::plugins_common::*;

fn trellis(root: &TempDir, plugin_dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trellis"));
    cmd.env("TRELLIS_PLUGIN_DIR", plugin_dir)
        .env("TRELLIS_NO_BUNDLED_PLUGINS", "1")
        .env("TRELLIS_DATA_DIR", root.join("data"))
        .env_remove("TRELLIS_LOG")
        .env_remove("RUST_LOG");
    cmd
}

/// A plugin directory whose `trellis-provider-sim` counts its launches in
/// `<root>/launches` and then runs the real sim.
fn counting_sim(root: &TempDir) -> std::path::PathBuf {
    let dir = root.join("plugins");
    script(
        &dir,
        "trellis-provider-sim",
        &format!(
            "echo launch >> {}\nexec {} \"$@\"",
            root.join("launches").display(),
            sim_binary().display()
        ),
    );
    dir
}

fn launches(root: &TempDir) -> usize {
    std::fs::read_to_string(root.join("launches"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn json_stdout(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "status {:?}, stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

#[test]
fn list_uses_the_manifest_cache() {
    let root = TempDir::new("clilist");
    let dir = counting_sim(&root);
    let list = || {
        trellis(&root, &dir)
            .args(["plugins", "list", "--format", "json"])
            .output()
            .expect("run trellis")
    };
    let first = json_stdout(&list());
    assert_eq!(launches(&root), 1);
    let p = &first["plugins"][0];
    assert_eq!(p["kind"], "provider");
    assert_eq!(p["name"], "sim");
    assert_eq!(p["launched"], true);
    assert!(p["resource_types"].as_u64() >= Some(1), "{p}");
    assert!(p["functions"].as_u64() >= Some(1), "{p}");
    assert!(
        p["path"]
            .as_str()
            .is_some_and(|s| s.ends_with("trellis-provider-sim"))
    );

    let second = json_stdout(&list());
    assert_eq!(
        launches(&root),
        1,
        "the second list must not start the plugin"
    );
    assert_eq!(second["plugins"][0]["launched"], false);
    assert_eq!(
        second["plugins"][0]["version"],
        first["plugins"][0]["version"]
    );

    // A changed binary is a different cache key.
    let path = dir.join("trellis-provider-sim");
    let mut text = std::fs::read_to_string(&path).expect("read");
    text.push_str("\n# changed\n");
    std::fs::write(&path, text).expect("write");
    json_stdout(&list());
    assert_eq!(launches(&root), 2);

    // Text output: a header and one row.
    let out = trellis(&root, &dir)
        .args(["plugins", "list"])
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("KIND"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("provider") && l.contains("sim")),
        "{text}"
    );
}

#[test]
fn call_prints_the_result_as_json_and_logs_name_the_plugin() {
    let root = TempDir::new("clicall");
    let dir = sim_dir(&root);
    let out = trellis(&root, &dir)
        .args([
            "plugins",
            "call",
            "sim",
            "echo",
            r#"[{"b":[1,2.5,true,null],"a":"x"}]"#,
        ])
        .env("TRELLIS_LOG", "info")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"{"b":[1,2.5,true,null],"a":"x"}"#
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("plugin=sim"), "{stderr}");

    let out = trellis(&root, &dir)
        .args(["plugins", "call", "nosuch", "echo"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("trellis-provider-nosuch"));

    let out = trellis(&root, &dir)
        .args(["plugins", "call", "sim", "echo", "[not json"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn plugins_exit_when_the_engine_is_killed() {
    let root = TempDir::new("clikill");
    let dir = sim_dir(&root);
    let mut engine = trellis(&root, &dir)
        .args([
            "plugins",
            "call",
            "sim",
            "echo",
            r#"["held"]"#,
            "--hold-ms",
            "60000",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start trellis");
    let mut line = String::new();
    BufReader::new(engine.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert_eq!(line.trim(), r#""held""#);
    // The plugin is the engine's only child.
    let plugins = children_of(engine.id());
    assert_eq!(plugins.len(), 1, "{plugins:?}");
    let plugin = plugins[0].0;
    assert!(!has_exited(plugin));

    kill(engine.id(), libc::SIGKILL);
    let _ = engine.wait();
    let killed = Instant::now();
    while !has_exited(plugin) && killed.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        has_exited(plugin),
        "plugin {plugin} still running 2s after the engine was killed"
    );
}

#[test]
fn the_parent_death_signal_kills_a_plugin_that_ignores_stdin() {
    // A plugin that never reads stdin and is still starting (no handshake):
    // only PR_SET_PDEATHSIG can end it when the engine dies.
    let root = TempDir::new("clipdeath");
    let dir = root.join("plugins");
    script(
        &dir,
        "trellis-provider-deaf",
        "echo started >&2\nexec sleep 60",
    );
    let mut engine = trellis(&root, &dir)
        .args(["plugins", "call", "deaf", "anything"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start trellis");
    let until = Instant::now() + Duration::from_secs(30);
    let plugin = loop {
        if let Some((pid, _)) = children_of(engine.id()).first() {
            break *pid;
        }
        assert!(Instant::now() < until, "the plugin never started");
        std::thread::sleep(Duration::from_millis(10));
    };
    kill(engine.id(), libc::SIGKILL);
    let _ = engine.wait();
    let killed = Instant::now();
    while !has_exited(plugin) && killed.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(has_exited(plugin), "plugin {plugin} outlived the engine");
}

/// `trellis plugins check` on a plugin's executable: the findings (JSON) and the exit code.
fn check(root: &TempDir, args: &[&str], env: &[(&str, &Path)]) -> (i32, serde_json::Value) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trellis"));
    cmd.args(["plugins", "check"])
        .args(args)
        .args(["--format", "json"])
        .current_dir(root.path())
        .env_remove("TRELLIS_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run trellis");
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), v)
}

/// The bundled providers and transformer pass the harness: sim and local with cases that run
/// resources through create, read, a repeated create, update, destroy and read.
#[test]
fn plugins_check_passes_the_bundled_plugins() {
    let root = TempDir::new("check-bundled");
    let write = |name: &str, text: &str| {
        let p = root.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let sim_cases = write(
        "sim.yaml",
        "- type: sim/resource\n  spec: {payload: {a: 1}}\n  update: {payload: {a: 2}}\n",
    );
    // Absolute paths: both types are importable, and the check imports what it created by its
    // id (the absolute path), which import reports in `path` as given.
    let at = |name: &str| root.join(name).to_str().unwrap().to_owned();
    let local_cases = write(
        "local.yaml",
        &format!(
            "- type: local/file\n  spec: {{path: {f}, content: \"hello\\n\", mode: \"0640\"}}\n  update: {{path: {f}, content: \"bye\\n\", mode: \"0600\"}}\n- type: local/directory\n  spec: {{path: {d}, mode: \"0750\"}}\n",
            f = at("checked.txt"),
            d = at("checked-dir"),
        ),
    );
    // sim remembers what exists only in its journal.
    let journal = root.join("journal.txt");
    let sim = sim_binary();
    let (code, v) = check(
        &root,
        &[
            sim.to_str().unwrap(),
            "--cases",
            sim_cases.to_str().unwrap(),
        ],
        &[("TRELLIS_SIM_JOURNAL", &journal)],
    );
    assert_eq!((code, &v["findings"]), (0, &serde_json::json!(0)), "{v}");
    assert_eq!(v["checks"].as_array().unwrap().len(), 5, "{v}");
    let local = workspace_binary(
        "trellis-provider-local",
        "trellis-provider-local",
        "TRELLIS_TEST_LOCAL",
    );
    let (code, v) = check(
        &root,
        &[
            local.to_str().unwrap(),
            "--cases",
            local_cases.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!((code, &v["findings"]), (0, &serde_json::json!(0)), "{v}");
    // The cases cleaned up after themselves.
    assert!(!root.join("checked.txt").exists() && !root.join("checked-dir").exists());
    let celerity = workspace_binary(
        "trellis-transformer-celerity",
        "trellis-transformer-celerity-2023-04-20",
        "TRELLIS_TEST_CELERITY",
    );
    let (code, v) = check(&root, &[celerity.to_str().unwrap()], &[]);
    assert_eq!((code, &v["findings"]), (0, &serde_json::json!(0)), "{v}");
}

/// A plugin that prints a handshake line but serves nothing is found out, with the step.
#[test]
fn plugins_check_reports_a_plugin_that_does_not_serve() {
    let root = TempDir::new("check-broken");
    let dir = root.join("plugins");
    let fake = script(
        &dir,
        "trellis-provider-fake",
        "echo \"TRELLIS_PLUGIN|1|unix|$TRELLIS_PLUGIN_SOCKET_DIR/fake.sock\"\nexec sleep 30",
    );
    let (code, v) = check(&root, &[fake.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "{v}");
    let first = &v["checks"][0];
    assert_eq!(first["check"], "launch and handshake", "{v}");
    assert!(
        first["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["rpc"] == "launch"),
        "{v}"
    );
    // A file that is not named as a plugin is refused before anything runs.
    let odd = script(&dir, "my-plugin", "exit 0");
    let (code, v) = check(&root, &[odd.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "{v}");
    assert!(
        v["checks"][0]["findings"][0]["message"]
            .as_str()
            .unwrap()
            .contains("trellis-provider-NAME")
    );
}

//! A client of the engine API in another language: tests/interop/python/engine_client.py
//! (grpcio, stubs generated from proto/) plans with an environment (a secret variable,
//! provider settings, an injector), deploys and reads the instance back from a real
//! `trellis serve`, and the provider it configures (the Python `pyecho` provider) acts on those
//! settings. Skipped, with a note, when python3 cannot import grpc.

use std::path::Path;
use std::process::Command;

use crate::engine_common::{Engine, all_output, write};
use crate::plugins_common::TempDir;

const SECRET: &str = "Py-interop-secret-4Kd9";

/// Whether python3 can import grpcio; says "skipped" when it cannot.
fn python_or_skip() -> bool {
    let available = python_grpc_available();
    if !available {
        eprintln!(
            "skipped: python3 with grpcio is not installed (tests/interop/python/requirements.txt)"
        );
    }
    available
}

fn python_grpc_available() -> bool {
    Command::new("python3")
        .args(["-c", "import grpc, grpc_tools, grpc_health"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn a_python_client_deploys_with_an_environment() {
    if !python_or_skip() {
        return;
    }
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/python");
    let dir = TempDir::new("py-client");
    let state_dir = dir.path().join("pyecho-state");
    std::fs::create_dir_all(&state_dir).unwrap();
    let engine = Engine::builder(dir.path())
        .args(&[
            Path::new("--plugin-dir").as_os_str(),
            python.join("bin").as_os_str(),
        ])
        .capture_stderr()
        .start();
    let out = Command::new("python3")
        .arg(python.join("engine_client.py"))
        .arg(&engine.addr)
        .arg(&state_dir)
        .arg(SECRET)
        .output()
        .expect("run python3");
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    // The provider received the environment's settings: it wrote its record where `stateDir`
    // said, with the injected `repeat`.
    let records: Vec<_> = std::fs::read_dir(&state_dir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    let record: serde_json::Value = serde_json::from_str(&records[0]).unwrap();
    assert_eq!(record["repeat"], 2, "{record}");
    assert_eq!(record["text"], SECRET);
    let (_, logs) = engine.stop();
    assert!(!logs.contains(SECRET), "a secret reached the engine's log");
}

/// A plugin written with stock grpcio reads, through the Host service's `LookupResource`, a
/// resource of the instance its call is for (what the engine recorded), finds nothing for a
/// name the instance lacks, and is refused another instance's resources.
#[test]
fn a_python_plugin_looks_up_resources_of_its_own_instance_only() {
    if !python_or_skip() {
        return;
    }
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/python");
    let dir = TempDir::new("py-lookup");
    let engine = Engine::builder(dir.path())
        .args(&[
            Path::new("--plugin-dir").as_os_str(),
            python.join("bin").as_os_str(),
        ])
        .start();
    let message = |name: &str, extra: &str| {
        format!("  {name}:\n    type: pyecho/message\n    spec:\n      text: {name}\n{extra}")
    };
    write(
        &dir.join("lookup.yaml"),
        &format!(
            "version: 2023-04-20\nresources:\n{}{}{}",
            message("first", ""),
            message("second", "      lookup: first\n    dependsOn: [first]\n"),
            message("third", "      lookup: nowhere\n"),
        ),
    );
    let (code, out) = engine.json(&["deploy", "lookup.yaml", "--instance", "lk"]);
    assert_eq!(code, 0, "{out}");
    let inst = engine.instance("lk");
    let first = &inst["resources"]["first"]["externalId"];
    assert!(first.as_str().is_some_and(|id| !id.is_empty()), "{inst}");
    assert_eq!(
        &inst["resources"]["second"]["state"]["lookedUp"], first,
        "{inst}"
    );
    assert_eq!(
        inst["resources"]["third"]["state"]["lookedUp"], "",
        "{inst}"
    );

    // Another instance's resources are not this call's to read.
    let other = inst["id"].as_str().unwrap();
    write(
        &dir.join("nosy.yaml"),
        &format!(
            "version: 2023-04-20\nresources:\n{}",
            message(
                "nosy",
                &format!("      lookup: first\n      lookupInstance: {other}\n")
            ),
        ),
    );
    let (code, out) = engine.json(&["deploy", "nosy.yaml", "--instance", "nosy"]);
    assert_ne!(code, 0, "{out}");
    let text = out.to_string();
    assert!(text.contains("PERMISSION_DENIED"), "{text}");
}

/// A plugin behind a launcher script (here pyecho, a Python file the launcher runs): its
/// manifest changes while the launcher does not, so the cache, keyed by the executable, keeps
/// the old one; `trellis plugins refresh` reads it again.
#[test]
fn plugins_refresh_reads_a_changed_manifest_behind_a_launcher() {
    if !python_or_skip() {
        return;
    }
    let python = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/interop/python")
        .canonicalize()
        .unwrap();
    let dir = TempDir::new("py-refresh");
    let script = dir.join("trellis_provider_pyecho.py");
    std::fs::copy(python.join("trellis_provider_pyecho.py"), &script).unwrap();
    let launcher = dir.join("bin/trellis-provider-pyecho");
    write(
        &launcher,
        &format!(
            "#!/usr/bin/env bash\nset -euo pipefail\nbash {py}/gen.sh --if-stale >&2\nexport PYTHONPATH={py}/_gen:{py}\nexec python3 -u {script} \"$@\"\n",
            py = python.display(),
            script = script.display()
        ),
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&launcher, std::fs::Permissions::from_mode(0o755)).unwrap();
    let plugins = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
            .arg("plugins")
            .args(args)
            .args(["--no-bundled-plugins", "--format", "json"])
            .arg("--plugin-dir")
            .arg(dir.join("bin"))
            .arg("--data-dir")
            .arg(dir.join("data"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        rows["plugins"][0]["version"].as_str().unwrap().to_owned()
    };
    assert_eq!(plugins(&["list"]), "0.1.0");
    let source = std::fs::read_to_string(&script).unwrap();
    std::fs::write(
        &script,
        source.replace("VERSION = \"0.1.0\"", "VERSION = \"0.2.0\""),
    )
    .unwrap();
    // The launcher did not change: the cached manifest stands...
    assert_eq!(plugins(&["list"]), "0.1.0");
    // ...until it is refreshed.
    assert_eq!(plugins(&["refresh", "pyecho"]), "0.2.0");
    assert_eq!(plugins(&["list"]), "0.2.0");
}

/// The Python provider passes `trellis plugins check` with a case that runs a message through
/// its life (its `stateDir` makes reads see what exists), and the harness catches the phantom
/// drift of a provider that reads back something else than it wrote, naming the field.
#[test]
fn plugins_check_passes_pyecho_and_catches_phantom_drift() {
    if !python_or_skip() {
        return;
    }
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/python");
    let dir = TempDir::new("py-check");
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let cases = |drift: bool| {
        let file = dir.join(&format!("cases-{drift}.yaml"));
        write(
            &file,
            &format!(
                "- type: pyecho/message\n  config: {{stateDir: {}, driftOnRead: {drift}}}\n  spec: {{text: hello, repeat: 2}}\n  update: {{text: bye, repeat: 3}}\n",
                state.display()
            ),
        );
        file
    };
    let run = |file: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
            .args(["plugins", "check", "--format", "json", "--cases"])
            .arg(file)
            .arg(python.join("bin/trellis-provider-pyecho"))
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", all_output(&out)));
        (out.status.code(), v)
    };
    let (code, v) = run(&cases(false));
    assert_eq!(
        (code, &v["findings"]),
        (Some(0), &serde_json::json!(0)),
        "{v}"
    );
    // kv, built on the Python SDK (sdk/python), passes too.
    let kv_cases = dir.join("kv.yaml");
    write(
        &kv_cases,
        &format!(
            "- type: kv/entry\n  config: {{dir: {}}}\n  spec: {{key: k1, value: one}}\n  update: {{key: k1, value: two}}\n",
            state.display()
        ),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["plugins", "check", "--cases"])
        .arg(&kv_cases)
        .arg(python.join("bin/trellis-provider-kv"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));

    let (code, v) = run(&cases(true));
    assert_eq!(code, Some(1), "{v}");
    let found: Vec<&serde_json::Value> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["findings"].as_array().unwrap())
        .collect();
    assert!(
        found
            .iter()
            .any(|f| f["rpc"] == "ReadResource" && f["field"] == "spec.text"),
        "{v}"
    );
}

/// The handshake tells a plugin what the engine does of the optional parts of the protocol
/// (`EngineCapabilities`): pyecho's `engine_capabilities` function returns what it received.
#[test]
fn the_handshake_carries_the_engines_capabilities() {
    if !python_or_skip() {
        return;
    }
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/python");
    let dir = TempDir::new("py-caps");
    let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["plugins", "call", "--no-bundled-plugins", "--plugin-dir"])
        .arg(python.join("bin"))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(["pyecho", "engine_capabilities", "[\",\"]"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "\"plan_resource,apply_progress,lookup_resource,host_locks,host_functions,cancel\""
    );
}

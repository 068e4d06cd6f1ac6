//! `trellis backup` end to end: an admin takes a copy of a running engine's state, a deployer
//! (or an admin limited to some instances) is refused, and an engine started on a data
//! directory holding the copy as `state.db` serves the same instances.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use crate::engine_common::{Engine, write};
use crate::plugins_common::TempDir;
use serde_json::Value;

const SIM: &str = "version: 2023-04-20\nresources:\n  a:\n    type: sim/resource\n    spec:\n      payload: one\n  b:\n    type: sim/resource\n    spec:\n      payload: ${resources.a.spec.payload}-two\nexports:\n  payload:\n    type: string\n    field: resources.b.spec.payload\n";

fn create_token(tokens_file: &Path, name: &str, role: &str, instances: Option<&str>) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trellis"));
    c.args(["token", "create", "--name", name, "--role", role])
        .arg("--tokens-file")
        .arg(tokens_file);
    if let Some(glob) = instances {
        c.args(["--instances", glob]);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// An engine under `root` with `[auth]` reading `root/tokens.toml`.
fn start_with_auth(root: &Path) -> Engine {
    write(
        &root.join("trellis.toml"),
        "[auth]\ntokens_file = \"tokens.toml\"\n",
    );
    write(&root.join("sim.yaml"), SIM);
    Engine::builder(root)
        .args(&["--config", root.join("trellis.toml").to_str().unwrap()])
        .start()
}

/// A client command as the holder of `token`, `--format json`: exit code and JSON.
fn as_token(engine: &Engine, token: &str, args: &[&str]) -> (i32, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(args)
        .args(["--engine", &engine.addr, "--format", "json"])
        .current_dir(&engine.cwd)
        .env_remove("TRELLIS_TOKEN_FILE")
        .env("TRELLIS_TOKEN", token)
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    let text = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(text.lines().last().unwrap_or("")).unwrap_or_else(|e| {
        panic!(
            "{args:?}: not JSON ({e}); exit {code}\nstdout: {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, v)
}

fn error_of(v: &Value) -> (&str, &str) {
    (
        v["error"]["code"].as_str().unwrap_or_default(),
        v["error"]["message"].as_str().unwrap_or_default(),
    )
}

/// Names in `dir` other than `keep`.
fn others_in(dir: &Path, keep: &[&str]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !keep.contains(&n.as_str()))
        .collect()
}

#[test]
fn an_admin_backup_restores_to_an_engine_serving_the_same_instances() {
    let root_a = TempDir::new("backup-a");
    let tokens = root_a.join("tokens.toml");
    let admin = create_token(&tokens, "ops", "admin", None);
    let deployer = create_token(&tokens, "ci", "deployer", None);
    let team_admin = create_token(&tokens, "team-a-ops", "admin", Some("team-a/*"));
    let a = start_with_auth(root_a.path());

    for instance in ["web", "team-a/api"] {
        let (code, v) = as_token(
            &a,
            &deployer,
            &["deploy", "sim.yaml", "--instance", instance],
        );
        assert_eq!(code, 0, "{v}");
    }

    // Out dir for the copies, so stray files would show.
    let out_dir = root_a.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let file = out_dir.join("state-backup.db");
    let file_arg = file.to_str().unwrap();

    // A deployer is refused by role, naming it; nothing is written.
    let (code, v) = as_token(&a, &deployer, &["backup", file_arg]);
    let (status, message) = error_of(&v);
    assert_eq!((code, status), (2, "PERMISSION_DENIED"), "{v}");
    assert!(
        message.contains("ci") && message.contains("deployer") && message.contains("admin"),
        "{message}"
    );
    assert!(
        others_in(&out_dir, &[]).is_empty(),
        "{:?}",
        others_in(&out_dir, &[])
    );

    // An admin of some instances only may not copy all of them.
    let (code, v) = as_token(&a, &team_admin, &["backup", file_arg]);
    let (status, message) = error_of(&v);
    assert_eq!((code, status), (2, "PERMISSION_DENIED"), "{v}");
    assert!(message.contains("team-a/*"), "{message}");
    assert!(others_in(&out_dir, &[]).is_empty());

    let (code, v) = as_token(&a, &admin, &["backup", file_arg]);
    assert_eq!(code, 0, "{v}");
    let bytes = std::fs::metadata(&file).unwrap().len();
    assert_eq!(v["backup"]["bytes"].as_u64(), Some(bytes), "{v}");
    assert_eq!(
        v["backup"]["sha256"].as_str(),
        Some(trellis_ids::hash_file(&file).unwrap().as_str())
    );
    // Owner-only (state holds secrets); no temporary file left here or in the data directory.
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
    assert!(others_in(&out_dir, &["state-backup.db"]).is_empty());
    assert!(
        !others_in(&a.data, &[]).iter().any(|n| n.contains("backup")),
        "{:?}",
        others_in(&a.data, &[])
    );

    // After the copy: what A does next is not in it.
    let (code, v) = as_token(
        &a,
        &deployer,
        &["deploy", "sim.yaml", "--instance", "later"],
    );
    assert_eq!(code, 0, "{v}");
    let web_a = as_token(&a, &admin, &["instance", "web"]).1;
    let api_a = as_token(&a, &admin, &["instance", "team-a/api"]).1;
    assert_eq!(
        web_a["resources"].as_object().map(|r| r.len()),
        Some(2),
        "{web_a}"
    );

    // Restore: a fresh data directory holding the copy as state.db (A keeps running: the copy
    // is independent of it).
    let root_b = TempDir::new("backup-b");
    std::fs::create_dir_all(root_b.join("data")).unwrap();
    std::fs::copy(&file, root_b.join("data/state.db")).unwrap();
    std::fs::copy(&tokens, root_b.join("tokens.toml")).unwrap();
    let b = start_with_auth(root_b.path());

    let (code, list) = as_token(&b, &admin, &["instances"]);
    assert_eq!(code, 0, "{list}");
    let mut names: Vec<&str> = list["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["team-a/api", "web"], "{list}");
    // The same instances: ids, versions, resources with their specs and states, exports.
    assert_eq!(as_token(&b, &admin, &["instance", "web"]).1, web_a);
    assert_eq!(as_token(&b, &admin, &["instance", "team-a/api"]).1, api_a);

    // And B carries on from there: the restored state is a working one.
    let (code, v) = as_token(&b, &deployer, &["destroy", "--instance", "web"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["operation"]["status"], "SUCCEEDED", "{v}");
}

//! `trellis backup` end to end: an admin takes a copy of a running engine's state, a deployer
//! (or an admin limited to some instances) is refused, and an engine started on a data
//! directory holding the copy as `state.db` serves the same instances.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::auth_e2e::{as_token, create_token, error_of};
use crate::engine_common::{Engine, write};
use crate::plugins_common::TempDir;

const SIM: &str = "version: 2023-04-20\nresources:\n  a:\n    type: sim/resource\n    spec:\n      payload: one\n  b:\n    type: sim/resource\n    spec:\n      payload: ${resources.a.spec.payload}-two\nexports:\n  payload:\n    type: string\n    field: resources.b.spec.payload\n";

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
            Some(&deployer),
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
    let (code, v) = as_token(&a, Some(&deployer), &["backup", file_arg]);
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
    let (code, v) = as_token(&a, Some(&team_admin), &["backup", file_arg]);
    let (status, message) = error_of(&v);
    assert_eq!((code, status), (2, "PERMISSION_DENIED"), "{v}");
    assert!(message.contains("team-a/*"), "{message}");
    assert!(others_in(&out_dir, &[]).is_empty());

    let (code, v) = as_token(&a, Some(&admin), &["backup", file_arg]);
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
        Some(&deployer),
        &["deploy", "sim.yaml", "--instance", "later"],
    );
    assert_eq!(code, 0, "{v}");
    let web_a = as_token(&a, Some(&admin), &["instance", "web"]).1;
    let api_a = as_token(&a, Some(&admin), &["instance", "team-a/api"]).1;
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

    let (code, list) = as_token(&b, Some(&admin), &["instances"]);
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
    assert_eq!(as_token(&b, Some(&admin), &["instance", "web"]).1, web_a);
    assert_eq!(
        as_token(&b, Some(&admin), &["instance", "team-a/api"]).1,
        api_a
    );

    // And B carries on from there: the restored state is a working one.
    let (code, v) = as_token(&b, Some(&deployer), &["destroy", "--instance", "web"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["operation"]["status"], "SUCCEEDED", "{v}");
}

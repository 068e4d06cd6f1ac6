//! End to end: the files of a data directory. An engine whose `state.db` is missing, emptied,
//! without its schema or without its WAL refuses to start (it would otherwise start empty
//! while the resources it deployed still exist), and deleting `engine.lock` does not let a
//! second engine share a running engine's directory.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::engine_common::{Engine, write};
use crate::plugins_common::TempDir;

/// `trellis serve` on `root`'s data directory, expected to refuse to start: its exit code and
/// stderr. Panics if it starts listening instead.
fn serve_refused(root: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["serve", "--listen", "127.0.0.1:0", "--no-bundled-plugins"])
        .arg("--plugin-dir")
        .arg(crate::engine_common::plugin_dir(root))
        .arg("--data-dir")
        .arg(root.join("data"))
        .env("TRELLIS_LOG_LEVEL", "warn")
        .env_remove("TRELLIS_LOG_FORMAT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trellis serve");
    let stderr = child.stderr.take().unwrap();
    let logs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut { stderr }, &mut s);
        s
    });
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap_or_default();
        if line.starts_with("trellis engine listening on ") {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the engine started: {line}\n{}", logs.join().unwrap());
        }
    }
    let status = child.wait().expect("wait for trellis serve");
    (status.code(), logs.join().unwrap())
}

fn deploy(engine: &Engine, file: &str, instance: &str) {
    let (code, out) = engine.json(&["deploy", file, "--instance", instance]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out["operation"]["status"], "SUCCEEDED", "{out}");
}

fn instance_names(engine: &Engine) -> Vec<String> {
    let (code, list) = engine.json(&["instances"]);
    assert_eq!(code, 0, "{list}");
    let items = list
        .as_array()
        .or_else(|| list["instances"].as_array())
        .cloned()
        .unwrap_or_default();
    items
        .iter()
        .filter_map(|i| i["name"].as_str().map(str::to_owned))
        .collect()
}

const APP: &str = "version: 2023-04-20\nresources:\n  note:\n    type: local/file\n    spec:\n      path: note.txt\n      content: kept\n";

fn remove(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

fn assert_refused(root: &Path, what: &str) {
    let (code, stderr) = serve_refused(root);
    assert_eq!(code, Some(1), "{stderr}");
    let db = root.join("data/state.db");
    let marker = root.join("data/state.marker");
    assert!(
        stderr.contains(&format!("{} {what}", db.display())),
        "{what}: {stderr}"
    );
    assert!(stderr.contains("this data directory had state"), "{stderr}");
    assert!(stderr.contains("Put the latest state.db"), "{stderr}");
    assert!(stderr.contains("to accept an older backup"), "{stderr}");
    assert!(
        stderr.contains(&format!("remove {}", marker.display())),
        "{stderr}"
    );
}

#[test]
fn a_data_directory_that_had_state_refuses_a_missing_or_emptied_database() {
    let root = TempDir::new("state-files");
    write(&root.join("app.yaml"), APP);
    let engine = Engine::start(root.path());
    deploy(&engine, "app.yaml", "app");
    let (code, _) = engine.stop();
    assert_eq!(code, Some(0));
    let data = root.join("data");
    let db = data.join("state.db");
    // Stopped cleanly: the WAL is checkpointed into state.db, which is a complete backup.
    let backup = root.join("state.db.backup");
    std::fs::copy(&db, &backup).unwrap();

    // Deleted: refused, and no empty database is created in its place.
    remove(&db);
    assert_refused(root.path(), "is missing");
    assert!(!db.exists(), "a new state.db was created");

    // Truncated to nothing.
    std::fs::write(&db, b"").unwrap();
    assert_refused(root.path(), "is empty");

    // A valid SQLite database without our schema.
    remove(&db);
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE unrelated (x INTEGER)")
        .unwrap();
    assert_refused(root.path(), "has no Trellis schema");

    // Restored from the backup: the engine starts with its state.
    std::fs::copy(&backup, &db).unwrap();
    let engine = Engine::start(root.path());
    assert_eq!(instance_names(&engine), ["app"]);
    assert_eq!(engine.instance("app")["status"], "DEPLOYED");
    let (code, _) = engine.stop();
    assert_eq!(code, Some(0));

    // Starting over on purpose: without the marker, an empty directory is a new store.
    remove(&db);
    remove(&data.join("state.marker"));
    let engine = Engine::start(root.path());
    assert_eq!(instance_names(&engine), Vec::<String>::new());
}

#[test]
fn a_lost_wal_is_refused() {
    let root = TempDir::new("state-wal");
    write(&root.join("app.yaml"), APP);
    write(
        &root.join("more.yaml"),
        "version: 2023-04-20\nresources:\n  r:\n    type: sim/resource\n    spec: {}\n",
    );
    let engine = Engine::start(root.path());
    deploy(&engine, "app.yaml", "app");
    let (code, _) = engine.stop();
    assert_eq!(code, Some(0));

    // The second run's commits are only in the WAL when the engine dies.
    let mut engine = Engine::start(root.path());
    deploy(&engine, "more.yaml", "more");
    engine.kill9();
    let data = root.join("data");
    assert!(data.join("state.db-wal").exists());
    remove(&data.join("state.db-wal"));
    remove(&data.join("state.db-shm"));
    let (code, stderr) = serve_refused(root.path());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("state.db-wal"), "{stderr}");
    assert!(stderr.contains("was lost"), "{stderr}");
    assert!(stderr.contains("this data directory had state"), "{stderr}");
}

#[test]
fn deleting_engine_lock_does_not_let_a_second_engine_in() {
    let root = TempDir::new("state-lock");
    let engine = Engine::start(root.path());
    let lock = root.join("data/engine.lock");
    assert!(lock.exists());
    remove(&lock);
    let (code, stderr) = serve_refused(root.path());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("the data directory is in use by another engine"),
        "{stderr}"
    );
    // The first engine still answers.
    let (code, v) = engine.json(&["instances"]);
    assert_eq!(code, 0, "{v}");
    // Nor does deleting the database let a second engine in.
    remove(&root.join("data/state.db"));
    let (code, stderr) = serve_refused(root.path());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("in use by another engine"), "{stderr}");
    // And the first engine does not quietly create an empty one in its place.
    let _ = engine.json(&["instances"]);
    assert!(!root.join("data/state.db").exists());
}

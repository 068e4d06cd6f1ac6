//! End to end: two real `trellis serve` replicas on one PostgreSQL database (docs/state.md,
//! "Replicas"). Each test gets a database of its own on `TRELLIS_TEST_POSTGRES` (default
//! `postgres://root@127.0.0.1:5432/test`), dropped at the end. Without a server the tests say
//! "skipped" and pass, unless `TRELLIS_REQUIRE_POSTGRES=1` (CI), which makes them fail.
//!
//! What they show: a deploy through A watched through B, gap-free and in order; a cancel
//! through B stopping an operation on A; A killed mid-deploy, B marking it interrupted and
//! finishing the work with every resource created exactly once (the sim journal); 50
//! concurrent executes of one change set spread over both, exactly one of which runs; A
//! paused past its lease, unable to write once it resumes; a drained A recording what it
//! stopped; and a plan whose local assets were sent to A executed through B.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use trellis_proto::engine::v1 as api;

use crate::aws_moto::{CREDENTIALS, boto, moto, unique};
use crate::engine_common::{Engine, all_output, cli_in_background, plugin_dir, write};
use crate::plugins_common::TempDir;
use crate::plugins_common::workspace_binary;
use crate::serve_e2e::{plan, sims};

const DEFAULT_URL: &str = "postgres://root@127.0.0.1:5432/test";
/// How long anything here may take on a loaded machine before it counts as hung.
const PATIENCE: Duration = Duration::from_secs(90);

fn admin_url() -> String {
    std::env::var("TRELLIS_TEST_POSTGRES").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Runs `sql` on the admin database.
fn admin(sql: &str) -> Result<(), String> {
    block_on(async {
        let (client, connection) = tokio::time::timeout(
            Duration::from_secs(10),
            tokio_postgres::connect(&admin_url(), tokio_postgres::NoTls),
        )
        .await
        .map_err(|_| "timed out".to_owned())?
        .map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        client.batch_execute(sql).await.map_err(|e| e.to_string())
    })
}

/// A database of its own for one test, dropped (with whatever is connected) at the end.
struct Database {
    name: String,
    url: String,
}

impl Database {
    /// `None` (after saying why) when there is no server and none is required.
    fn create(tag: &str) -> Option<Database> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "trellis_e2e_{tag}_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        if let Err(e) = admin(&format!("CREATE DATABASE \"{name}\"")) {
            if std::env::var("TRELLIS_REQUIRE_POSTGRES").as_deref() == Ok("1") {
                panic!("no PostgreSQL for the replica tests ({e}), and TRELLIS_REQUIRE_POSTGRES=1");
            }
            println!("skipped: no PostgreSQL ({e})");
            return None;
        }
        let admin = admin_url();
        let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
        let url = format!("{base}/{name}");
        Some(Database { name, url })
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        if let Err(e) = admin(&format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        )) {
            eprintln!("could not drop test database {}: {e}", self.name);
        }
    }
}

/// One replica: its own data directory under `root/<name>`, the shared database, and `cwd`
/// (where the blueprints are) shared by both.
fn replica(root: &Path, name: &str, db: &Database, extra: &[&str]) -> Engine {
    let mut args = vec!["--state", &db.url, "--replica-name", name];
    args.extend_from_slice(extra);
    Engine::builder(&root.join(name))
        .cwd(root)
        .args(&args)
        .env("TRELLIS_SIM_JOURNAL", root.join("journal.txt"))
        .start()
}

/// How many times the sim journal shows each resource created.
fn creates(root: &Path) -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(root.join("journal.txt")).unwrap_or_default();
    let mut counts = BTreeMap::new();
    for name in text
        .lines()
        .filter_map(|l| l.strip_prefix("created "))
        .filter_map(|rest| rest.split(' ').next())
    {
        *counts.entry(name.to_owned()).or_insert(0) += 1;
    }
    counts
}

/// The operations of `instance`, through `engine`'s API.
fn operations(engine: &Engine, instance: &str) -> Vec<api::Operation> {
    let addr = engine.addr.clone();
    let instance = instance.to_owned();
    block_on(async move {
        let mut client = trellis::cli::client::connect(&addr).await.unwrap();
        client
            .list_operations(api::ListOperationsRequest { instance })
            .await
            .unwrap()
            .into_inner()
            .operations
    })
}

/// Waits until `instance`'s events through `engine` include one of `kind`.
fn wait_for_event(engine: &Engine, instance: &str, kind: &str) {
    let limit = Instant::now() + PATIENCE;
    while !engine.events(instance).iter().any(|(k, _)| k == kind) {
        assert!(Instant::now() < limit, "no {kind} event on {instance}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn status_name(op: &api::Operation) -> &'static str {
    api::OperationStatus::try_from(op.status)
        .map(|s| s.as_str_name())
        .unwrap_or("?")
}

#[test]
fn a_deploy_through_a_is_watched_through_b_and_cancelled_through_b() {
    let Some(db) = Database::create("watch") else {
        return;
    };
    let root = TempDir::new("e2e-replicas-watch");
    let a = replica(root.path(), "a", &db, &["--max-parallel", "2"]);
    let b = replica(root.path(), "b", &db, &[]);

    // B follows the instance from its first event while A deploys.
    write(&root.join("ten.yaml"), &sims(10, 100));
    let change_set = plan(&a, "ten.yaml", "w");
    let mut follow = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["events", "--instance", "w", "--follow", "--format", "json"])
        .args(["--engine", &b.addr])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let seen = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for line in lines {
            let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
            let done = v["kind"] == "operation.finished";
            seen.push((
                v["seq"].as_u64().unwrap(),
                v["kind"].as_str().unwrap().to_owned(),
            ));
            if done {
                break;
            }
        }
        seen
    });
    let (code, out) = a.json(&["deploy", "--change-set", &change_set]);
    assert_eq!(code, 0, "{out}");
    let limit = Instant::now() + PATIENCE;
    while !seen.is_finished() {
        assert!(
            Instant::now() < limit,
            "B's watcher never saw the operation end"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = follow.kill();
    let _ = follow.wait();
    let seen = seen.join().unwrap();
    // Everything A recorded, in order, with no gap: what A itself lists.
    let recorded: Vec<String> = a.events("w").into_iter().map(|(kind, _)| kind).collect();
    let seqs: Vec<u64> = seen.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (1..=seen.len() as u64).collect::<Vec<_>>());
    let kinds: Vec<String> = seen.into_iter().map(|(_, kind)| kind).collect();
    assert_eq!(kinds, recorded[..kinds.len()]);
    assert_eq!(
        kinds.iter().filter(|k| *k == "resource.created").count(),
        10
    );

    // A long deploy on A, cancelled through B, stops long before it would have finished.
    write(&root.join("slow.yaml"), &sims(40, 1000));
    let deploy = cli_in_background(
        &a,
        &["deploy", "slow.yaml", "--instance", "c"],
        "c",
        "resource.create_requested",
    );
    let running = operations(&b, "c");
    assert_eq!(running.len(), 1);
    let op = running[0].id.clone();
    let out = b.cli(&["cancel", &op]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = deploy.wait_with_output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    let ended = operations(&a, "c");
    assert_eq!(
        status_name(&ended[0]),
        "OPERATION_STATUS_CANCELLED",
        "{ended:?}"
    );
    assert!(
        creates(root.path()).len() < 10 + 40,
        "the cancelled deploy ran to its end"
    );
}

#[test]
fn a_replica_killed_mid_deploy_is_taken_over_and_nothing_is_created_twice() {
    let Some(db) = Database::create("kill") else {
        return;
    };
    let root = TempDir::new("e2e-replicas-kill");
    let mut a = replica(
        root.path(),
        "a",
        &db,
        &["--lease-ttl", "2s", "--max-parallel", "4"],
    );
    let b = replica(root.path(), "b", &db, &["--lease-check-interval", "500ms"]);
    write(&root.join("many.yaml"), &sims(60, 250));
    let change_set = plan(&a, "many.yaml", "k");
    let deploy = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["deploy", "--change-set", &change_set, "--engine", &a.addr])
        .current_dir(root.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let limit = Instant::now() + PATIENCE;
    while creates(root.path()).len() < 10 {
        assert!(Instant::now() < limit, "the deploy made no progress");
        std::thread::sleep(Duration::from_millis(10));
    }
    a.kill9();
    let mut deploy = deploy;
    let _ = deploy.kill();
    let _ = deploy.wait();

    // B notices the lease lapse and marks the operation and the instance interrupted.
    wait_for_event(&b, "k", "instance.interrupted");
    let ops = operations(&b, "k");
    assert_eq!(
        status_name(&ops[0]),
        "OPERATION_STATUS_INTERRUPTED",
        "{ops:?}"
    );
    assert_eq!(b.instance("k")["status"], "INTERRUPTED");

    // Through B: reconcile settles the calls A left in flight, a deploy finishes the rest.
    let (code, out) = b.json(&["reconcile", "--instance", "k", "--mode", "reapply"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = b.json(&["deploy", "many.yaml", "--instance", "k"]);
    assert_eq!(code, 0, "{out}");
    let inst = b.instance("k");
    let resources = inst["resources"].as_object().unwrap();
    assert_eq!(resources.len(), 60, "{inst}");
    assert!(
        resources.values().all(|r| r["status"] != "CREATING"),
        "{inst}"
    );
    let made = creates(root.path());
    assert_eq!(made.len(), 60, "{made:?}");
    let twice: Vec<_> = made.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "created more than once: {twice:?}");
}

#[test]
fn fifty_concurrent_executes_over_both_replicas_run_once() {
    let Some(db) = Database::create("race") else {
        return;
    };
    let root = TempDir::new("e2e-replicas-race");
    let a = replica(root.path(), "a", &db, &[]);
    let b = replica(root.path(), "b", &db, &[]);
    write(&root.join("five.yaml"), &sims(5, 50));
    let change_set = plan(&b, "five.yaml", "r");
    let addrs = [a.addr.clone(), b.addr.clone()];
    let results = block_on(async move {
        let mut clients = Vec::new();
        for addr in &addrs {
            clients.push(trellis::cli::client::connect(addr).await.unwrap());
        }
        let mut calls = tokio::task::JoinSet::new();
        for n in 0..50 {
            let mut client = clients[n % 2].clone();
            let change_set_id = change_set.clone();
            calls.spawn(async move {
                client
                    .execute_change_set(api::ExecuteChangeSetRequest {
                        request_id: format!("race-{n}"),
                        change_set_id,
                        ..Default::default()
                    })
                    .await
                    .map(|r| r.into_inner().id)
                    .map_err(|s| s.code())
            });
        }
        calls.join_all().await
    });
    let started: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(started.len(), 1, "{results:?}");
    for refused in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(
            matches!(
                refused,
                tonic::Code::FailedPrecondition | tonic::Code::Aborted
            ),
            "{results:?}"
        );
    }
    // It runs to its end (watched through A whichever replica runs it).
    let limit = Instant::now() + PATIENCE;
    loop {
        let ops = operations(&a, "r");
        assert_eq!(ops.len(), 1, "{ops:?}");
        if status_name(&ops[0]) == "OPERATION_STATUS_SUCCEEDED" {
            break;
        }
        assert!(Instant::now() < limit, "{ops:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let made = creates(root.path());
    assert_eq!(made.len(), 5, "{made:?}");
    assert!(made.values().all(|n| *n == 1), "{made:?}");
}

#[test]
fn a_replica_paused_past_its_lease_cannot_write_when_it_resumes() {
    let Some(db) = Database::create("pause") else {
        return;
    };
    let root = TempDir::new("e2e-replicas-pause");
    let a = replica(
        root.path(),
        "a",
        &db,
        &["--lease-ttl", "2s", "--max-parallel", "1"],
    );
    let b = replica(root.path(), "b", &db, &["--lease-check-interval", "500ms"]);
    // Three creates of 3 s, one at a time: A is paused during the first.
    write(&root.join("three.yaml"), &sims(3, 3000));
    let deploy = cli_in_background(
        &a,
        &["deploy", "three.yaml", "--instance", "p"],
        "p",
        "resource.create_requested",
    );
    signal(&a, libc::SIGSTOP);
    wait_for_event(&b, "p", "instance.interrupted");
    let before = b.events("p");
    signal(&a, libc::SIGCONT);
    // A's call in flight comes back (3 s) and A tries to record it: fenced. Wait past it.
    let limit = Instant::now() + Duration::from_secs(8);
    while !creates(root.path()).contains_key("r0") {
        assert!(
            Instant::now() < limit,
            "the paused replica's call never came back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let after = b.events("p");
    assert_eq!(
        after, before,
        "the resumed replica wrote after its lease was taken over"
    );
    let ops = operations(&b, "p");
    assert_eq!(
        status_name(&ops[0]),
        "OPERATION_STATUS_INTERRUPTED",
        "{ops:?}"
    );
    let out = deploy.wait_with_output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    // What A's plugin made meanwhile is not lost: the intent is there for reconcile.
    let (code, out) = b.json(&["reconcile", "--instance", "p", "--mode", "reapply"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(b.instance("p")["resources"]["r0"]["status"], "CREATED");
    assert_eq!(creates(root.path()).get("r0"), Some(&1));
}

fn signal(engine: &Engine, sig: i32) {
    // SAFETY: signalling a child process the test owns and has not reaped.
    unsafe {
        libc::kill(engine.pid() as i32, sig);
    }
}

#[test]
fn a_drained_replica_records_what_it_stopped_and_another_takes_it_up() {
    let Some(db) = Database::create("drain") else {
        return;
    };
    let root = TempDir::new("e2e-replicas-drain");
    let mut a = replica(
        root.path(),
        "a",
        &db,
        &["--drain-timeout", "1s", "--max-parallel", "1"],
    );
    let b = replica(root.path(), "b", &db, &[]);
    write(&root.join("slow.yaml"), &sims(6, 1500));
    let deploy = cli_in_background(
        &a,
        &["deploy", "slow.yaml", "--instance", "d"],
        "d",
        "resource.create_requested",
    );
    assert_eq!(a.terminate_within(PATIENCE), Some(0));
    let out = deploy.wait_with_output().unwrap();
    assert!(
        all_output(&out).contains("shut down"),
        "{}",
        all_output(&out)
    );
    // Recorded by A before it exited, not left for B's lease check to find.
    let ops = operations(&b, "d");
    assert_eq!(
        status_name(&ops[0]),
        "OPERATION_STATUS_INTERRUPTED",
        "{ops:?}"
    );
    assert!(ops[0].error.contains("shut down"), "{ops:?}");
    assert_eq!(b.instance("d")["status"], "INTERRUPTED");
    let (code, out) = b.json(&["deploy", "slow.yaml", "--instance", "d"]);
    assert_eq!(code, 0, "{out}");
    let made = creates(root.path());
    assert_eq!(made.len(), 6, "{made:?}");
    assert!(made.values().all(|n| *n == 1), "{made:?}");
}

/// A replica with the `aws` plugin configured for moto.
fn aws_replica(root: &Path, name: &str, db: &Database, endpoint: &str) -> Engine {
    let home = root.join(name);
    let link = plugin_dir(&home).join("trellis-provider-aws");
    if !link.exists() {
        let aws = workspace_binary(
            "trellis-provider-aws",
            "trellis-provider-aws",
            "TRELLIS_TEST_AWS",
        );
        std::os::unix::fs::symlink(aws, link).unwrap();
    }
    let config = home.join("engine.toml");
    write(
        &config,
        &format!("[providers.aws]\nregion = \"us-east-1\"\nendpoint = \"{endpoint}\"\n"),
    );
    let mut b = Engine::builder(&home).cwd(root).args(&[
        "--config",
        config.to_str().unwrap(),
        "--state",
        &db.url,
        "--replica-name",
        name,
    ]);
    for (k, v) in CREDENTIALS {
        b = b.env(k, v);
    }
    b.start()
}

#[test]
fn local_assets_sent_to_one_replica_reach_the_other() {
    let Some(m) = moto() else { return };
    let Some(db) = Database::create("assets") else {
        return;
    };
    let root = TempDir::new("e2e-replicas-assets");
    let a = aws_replica(root.path(), "a", &db, &m.endpoint);
    let b = aws_replica(root.path(), "b", &db, &m.endpoint);
    let name = unique("replica-fn");
    write(
        &root.join("app/fn.yaml"),
        &format!(
            "version: 2023-04-20\nresources:\n  fn:\n    type: aws/lambda/function\n    spec:\n      \
             functionName: {name}\n      codeUri: code\n      handler: handler.handle\n      \
             runtime: python3.12\n"
        ),
    );
    write(
        &root.join("app/code/handler.py"),
        "def handle(event, context):\n    return 1\n",
    );
    // Planned through A, which receives the code; executed through B, which never saw it.
    let change_set = plan(&a, "app/fn.yaml", "assets");
    assert!(!b.data.join("assets").exists());
    let (code, out) = b.json(&["deploy", "--change-set", &change_set]);
    assert_eq!(code, 0, "{out}");
    let function = boto(
        m,
        "lambda",
        "get_function_configuration",
        serde_json::json!({ "FunctionName": name }),
    )
    .expect("the function exists");
    assert!(function["CodeSha256"].as_str().is_some(), "{function}");
    // B fetched its copy from the shared state.
    let kept: Vec<_> = std::fs::read_dir(b.data.join("assets")).unwrap().collect();
    assert_eq!(kept.len(), 1);
    let (code, out) = b.json(&["destroy", "--instance", "assets"]);
    assert_eq!(code, 0, "{out}");
}

//! End to end: a provider call that never answered (the plugin died after acting) stays an
//! intent until the provider has been asked, and whoever settles it asks with the same
//! idempotency key. The sim plugin's journal is its own record of what it did; with a journal
//! it honours idempotency keys as a provider with request tokens does (plugins/sim/README.md).

use std::path::Path;

use crate::engine_common::{Engine, write};
use crate::plugins_common::TempDir;

const CRASHING: &str = "version: 2023-04-20\nresources:\n  a:\n    type: sim/resource\n    spec:\n      payload: x\n      crashAfter: create\n";

/// `(name, key)` of every `<verb>` line (`created`, `destroyed`) of a sim journal.
fn journal(journal: &Path, verb: &str) -> Vec<(String, String)> {
    std::fs::read_to_string(journal)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut w = l.split(' ');
            (w.next()? == verb).then(|| {
                (
                    w.next().unwrap_or_default().to_owned(),
                    w.next().unwrap_or_default().to_owned(),
                )
            })
        })
        .collect()
}

fn creates(path: &Path) -> Vec<(String, String)> {
    journal(path, "created")
}

/// Deploys [`CRASHING`]: the sim creates `a`, journals it, and exits before answering.
fn deploy_unanswered(root: &Path) -> (Engine, std::path::PathBuf) {
    let journal = root.join("journal.txt");
    let engine = Engine::builder(root)
        .env("TRELLIS_SIM_JOURNAL", &journal)
        .start();
    write(&root.join("crash.yaml"), CRASHING);
    let (code, out) = engine.json(&["deploy", "crash.yaml", "--instance", "c"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(creates(&journal).len(), 1, "the sim did create `a`");

    // The create happened but was never answered: its intent stays, and drift says so.
    let inst = engine.instance("c");
    assert_eq!(inst["resources"]["a"]["status"], "CREATING", "{inst}");
    let (code, drift) = engine.json(&["drift", "--instance", "c"]);
    assert_eq!(code, 3, "{drift}");
    assert_eq!(drift["resources"][0]["name"], "a", "{drift}");
    assert_eq!(drift["resources"][0]["kind"], "UNRESOLVED", "{drift}");
    (engine, journal)
}

#[test]
fn reconcile_reapplies_an_unanswered_create_with_its_key() {
    let root = TempDir::new("e2e-unanswered-reapply");
    let (engine, journal) = deploy_unanswered(root.path());
    // Asked again with the same key, the sim finds the create it made (a new key would create
    // again, and crash again).
    let (code, out) = engine.json(&["reconcile", "--instance", "c", "--mode", "reapply"]);
    assert_eq!(code, 0, "{out}");
    let inst = engine.instance("c");
    assert_eq!(inst["resources"]["a"]["status"], "CREATED", "{inst}");
    assert_eq!(
        creates(&journal).len(),
        1,
        "created twice: {:?}",
        creates(&journal)
    );
    let (code, drift) = engine.json(&["drift", "--instance", "c"]);
    assert_eq!(code, 0, "{drift}");
}

#[test]
fn reconcile_accept_records_what_an_unanswered_create_made() {
    let root = TempDir::new("e2e-unanswered-accept");
    let (engine, journal) = deploy_unanswered(root.path());
    let (code, out) = engine.json(&["reconcile", "--instance", "c", "--mode", "accept"]);
    assert_eq!(code, 0, "{out}");
    // Not forgotten: the provider was asked and reported it.
    let inst = engine.instance("c");
    assert_eq!(inst["resources"]["a"]["status"], "CREATED", "{inst}");
    assert!(
        inst["resources"]["a"]["externalId"]
            .as_str()
            .is_some_and(|id| id.starts_with("sim-")),
        "{inst}"
    );
    assert_eq!(creates(&journal).len(), 1);
}

#[test]
fn the_next_deploy_asks_again_with_the_unanswered_key() {
    let root = TempDir::new("e2e-unanswered-redeploy");
    let (engine, journal) = deploy_unanswered(root.path());
    // The same blueprint deployed again: the create is asked with the key it was first sent
    // with, so the sim answers with what it made instead of creating (and crashing) again.
    let (code, out) = engine.json(&["deploy", "crash.yaml", "--instance", "c"]);
    assert_eq!(code, 0, "{out}");
    let made = creates(&journal);
    assert_eq!(made.len(), 1, "{made:?}");
    assert!(!made[0].1.is_empty(), "the create carried a key: {made:?}");
    let inst = engine.instance("c");
    assert_eq!(inst["resources"]["a"]["status"], "CREATED", "{inst}");
}

#[test]
fn destroying_an_unanswered_create_asks_the_provider_and_destroys_what_it_made() {
    let root = TempDir::new("e2e-unanswered-destroy");
    let (engine, journal) = deploy_unanswered(root.path());
    let (code, out) = engine.json(&["destroy", "--instance", "c"]);
    assert_eq!(code, 0, "{out}");
    // Not just the record: what the lost create made is gone too.
    let text = std::fs::read_to_string(&journal).unwrap();
    assert!(text.lines().any(|l| l.starts_with("destroyed a")), "{text}");
    let inst = engine.instance("c");
    assert!(inst["resources"].as_object().unwrap().is_empty(), "{inst}");
}

#[test]
fn an_unanswered_update_does_not_block_the_next_deploy() {
    let root = TempDir::new("e2e-unanswered-update");
    let engine = Engine::start(root.path());
    let spec = |extra: &str| {
        format!(
            "version: 2023-04-20\nresources:\n  a:\n    type: sim/resource\n    spec:\n      payload: {extra}\n"
        )
    };
    write(&root.join("u.yaml"), &spec("v1"));
    let (code, out) = engine.json(&["deploy", "u.yaml", "--instance", "u"]);
    assert_eq!(code, 0, "{out}");
    // The update happens, but the plugin exits before answering.
    write(&root.join("u.yaml"), &spec("v2\n      crashAfter: update"));
    let (code, out) = engine.json(&["deploy", "u.yaml", "--instance", "u"]);
    assert_eq!(code, 1, "{out}");
    let inst = engine.instance("u");
    assert_eq!(inst["resources"]["a"]["status"], "UPDATING", "{inst}");
    // The next deploy updates it again.
    write(&root.join("u.yaml"), &spec("v3"));
    let (code, out) = engine.json(&["deploy", "u.yaml", "--instance", "u"]);
    assert_eq!(code, 0, "{out}");
    let inst = engine.instance("u");
    assert_eq!(inst["resources"]["a"]["status"], "UPDATED", "{inst}");
    assert_eq!(inst["resources"]["a"]["spec"]["payload"], "v3", "{inst}");
}

fn destroys(path: &Path) -> Vec<(String, String)> {
    journal(path, "destroyed")
}

/// Destroys started together go to the sim as one DestroyResources call; the plugin dies in it
/// after answering two items and acting on the third: the two are recorded destroyed, the third
/// stays an intent, and the next destroy asks again with its key.
#[test]
fn a_destroy_batch_cut_short_keeps_what_was_answered_and_the_unanswered_intent() {
    let root = TempDir::new("e2e-unanswered-batch");
    let journal = root.join("journal.txt");
    let engine = Engine::builder(root.path())
        .env("TRELLIS_SIM_JOURNAL", &journal)
        .start();
    let sim = |name: &str, extra: &str| {
        format!("  {name}:\n    type: sim/resource\n    spec:\n      latencyMs: {extra}\n")
    };
    let blueprint = format!(
        "version: 2023-04-20\nresources:\n{}{}{}",
        sim("a", "0"),
        sim("b", "0"),
        // Long enough for a's and b's answers to be on their way first.
        sim("c", "500\n      crashAfter: destroy"),
    );
    write(&root.join("three.yaml"), &blueprint);
    let (code, out) = engine.json(&["deploy", "three.yaml", "--instance", "t"]);
    assert_eq!(code, 0, "{out}");

    let (code, out) = engine.json(&["destroy", "--instance", "t"]);
    assert_eq!(code, 1, "{out}");
    let mut done = destroys(&journal);
    done.sort();
    assert_eq!(
        done.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["a", "b", "c"],
        "{done:?}"
    );
    let inst = engine.instance("t");
    let left: Vec<&String> = inst["resources"].as_object().unwrap().keys().collect();
    assert_eq!(left, ["c"], "{inst}");
    assert_eq!(inst["resources"]["c"]["status"], "DESTROYING", "{inst}");

    // Asked again (the sim acts and dies again), with the key of the lost call.
    let (code, out) = engine.json(&["destroy", "--instance", "t"]);
    assert_eq!(code, 1, "{out}");
    let keys: Vec<String> = destroys(&journal)
        .into_iter()
        .filter(|(n, _)| n == "c")
        .map(|(_, k)| k)
        .collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(
        keys[0].ends_with(":c:destroy") && keys[0] == keys[1],
        "{keys:?}"
    );
}

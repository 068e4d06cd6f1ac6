//! End to end: the order in which a deploy destroys and creates, and what a rollback leaves in
//! state (docs/engine-api.md, "Order of changes"). Real `trellis serve`, real `local` and `sim`
//! plugins, real CLI.

use std::path::Path;

use crate::engine_common::{Engine, actions, write};
use crate::plugins_common::TempDir;

/// Files named after the elements of `list` (a JSON list), each holding `content` (`${elem}`
/// allowed).
fn files(list: &str, content: &str) -> String {
    format!(
        "version: 2023-04-20\nvariables:\n  names:\n    type: string\n    default: '{list}'\nresources:\n  files:\n    type: local/file\n    each: ${{jsondecode(variables.names)}}\n    spec:\n      path: out/${{elem}}.txt\n      content: \"{content}\"\n"
    )
}

/// Planning `file` for `instance` again changes nothing.
fn plans_no_change(engine: &Engine, file: &str, instance: &str) {
    let (code, plan) = engine.json(&["plan", file, "--instance", instance]);
    assert_eq!(code, 0, "{plan}");
    assert!(
        actions(&plan["changeSet"]["resources"])
            .iter()
            .all(|(_, a)| a == "NO_CHANGE"),
        "{plan}"
    );
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Removes the middle element of an `each` list and checks that one deploy leaves exactly the
/// files of the remaining elements.
fn remove_middle_element(content: &str) {
    let root = TempDir::new("e2e-each-middle");
    std::fs::create_dir_all(root.join("out")).unwrap();
    let engine = Engine::start(root.path());
    write(
        &root.join("files.yaml"),
        &files(r#"["a", "b", "c"]"#, content),
    );
    let (code, out) = engine.json(&["deploy", "files.yaml", "--instance", "f"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(listing(&root.join("out")), ["a.txt", "b.txt", "c.txt"]);

    write(&root.join("files.yaml"), &files(r#"["a", "c"]"#, content));
    let (code, out) = engine.json(&["deploy", "files.yaml", "--instance", "f"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(listing(&root.join("out")), ["a.txt", "c.txt"], "{out}");
    let c = std::fs::read_to_string(root.join("out/c.txt")).unwrap();
    assert_eq!(c, content.replace("${elem}", "c"));
    // State agrees with the disk: nothing left to change, nothing drifted.
    plans_no_change(&engine, "files.yaml", "f");
    let (code, drift) = engine.json(&["drift", "--instance", "f"]);
    assert_eq!(code, 0, "{drift}");
}

#[test]
fn removing_a_middle_each_element_with_equal_contents_keeps_the_last_file() {
    // The shifted element's new file has the same content as the file already there.
    remove_middle_element("same");
}

#[test]
fn removing_a_middle_each_element_with_differing_contents_keeps_the_last_file() {
    remove_middle_element("content of ${elem}");
}

const TREE: &str = r#"
version: 2023-04-20
variables:
  dir:
    type: string
resources:
  dir:
    type: local/directory
    spec:
      path: ${variables.dir}
  one:
    type: local/file
    spec:
      path: ${resources.dir.spec.path}/one.txt
      content: one
  two:
    type: local/file
    spec:
      path: ${resources.dir.spec.path}/two.txt
      content: two
"#;

#[test]
fn a_recreated_resource_is_destroyed_after_its_dependents() {
    let root = TempDir::new("e2e-recreate-order");
    let engine = Engine::start(root.path());
    write(&root.join("tree.yaml"), TREE);
    let deploy = |dir: &str| {
        engine.json(&[
            "deploy",
            "tree.yaml",
            "--instance",
            "t",
            "--var",
            &format!("dir={dir}"),
        ])
    };
    let (code, out) = deploy("old");
    assert_eq!(code, 0, "{out}");
    assert_eq!(listing(&root.join("old")), ["one.txt", "two.txt"]);

    // The directory moves: it and its files are recreated. The old directory goes only once
    // its files are gone, so nothing is left behind.
    let (code, out) = deploy("new");
    assert_eq!(code, 0, "{out}");
    assert!(
        !root.join("old").exists(),
        "the old directory was left behind: {:?}",
        listing(&root.join("old"))
    );
    assert_eq!(listing(&root.join("new")), ["one.txt", "two.txt"]);
    let order: Vec<String> = engine
        .events("t")
        .into_iter()
        .filter(|(kind, _)| kind == "resource.destroyed")
        .map(|(_, p)| p["resource"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(order.len(), 3, "{order:?}");
    assert_eq!(order[2], "dir", "dependents first: {order:?}");
}

const SIM_V1: &str = "version: 2023-04-20\nresources:\n  a:\n    type: sim/resource\n    spec:\n      payload: v1\n  b:\n    type: sim/resource\n    spec:\n      payload: v1\n";

/// `a` updated to `v2`, failing; `b` updated to `v2`.
const SIM_V2_FAILING: &str = "version: 2023-04-20\nresources:\n  a:\n    type: sim/resource\n    spec:\n      payload: v2\n      failOn: update\n  b:\n    type: sim/resource\n    spec:\n      payload: v2\n";

#[test]
fn after_a_rolled_back_update_state_holds_what_is_there() {
    let root = TempDir::new("e2e-rollback-update");
    let engine = Engine::start(root.path());
    write(&root.join("sim.yaml"), SIM_V1);
    let (code, out) = engine.json(&["deploy", "sim.yaml", "--instance", "s"]);
    assert_eq!(code, 0, "{out}");

    write(&root.join("sim.yaml"), SIM_V2_FAILING);
    let (code, out) = engine.json(&[
        "deploy",
        "sim.yaml",
        "--instance",
        "s",
        "--rollback-on-failure",
    ]);
    assert_eq!(code, 1, "{out}");
    let after = engine.instance("s");
    assert_eq!(after["status"], "ROLLBACK_COMPLETE", "{after}");
    for name in ["a", "b"] {
        let r = &after["resources"][name];
        assert_eq!(r["spec"]["payload"], "v1", "{name}: {after}");
        assert!(
            r["spec"].get("failOn").is_none(),
            "{name} keeps the failed spec: {after}"
        );
        let status = r["status"].as_str().unwrap();
        assert!(
            status == "CREATED" || status == "UPDATED",
            "{name} is {status}: {after}"
        );
    }
    // The blueprint as it was deployed before plans no change.
    write(&root.join("sim.yaml"), SIM_V1);
    plans_no_change(&engine, "sim.yaml", "s");
}

#[test]
fn a_rollback_puts_recreated_resources_back_as_they_were() {
    let root = TempDir::new("e2e-rollback-recreate");
    let engine = Engine::start(root.path());
    // TREE, and a sim resource after the files whose update fails when asked to.
    let failing = |fail: bool| {
        let knob = if fail {
            "\n      failOn: update\n      failClass: badInput"
        } else {
            ""
        };
        format!(
            "{TREE}  last:\n    type: sim/resource\n    spec:\n      payload: ${{resources.two.spec.path}}{knob}\n"
        )
    };
    write(&root.join("tree.yaml"), &failing(false));
    let deploy = |dir: &str, rollback: bool| {
        let var = format!("dir={dir}");
        let mut args = vec!["deploy", "tree.yaml", "--instance", "t", "--var", &var];
        if rollback {
            args.push("--rollback-on-failure");
        }
        engine.json(&args)
    };
    let (code, out) = deploy("old", false);
    assert_eq!(code, 0, "{out}");
    let before = engine.instance("t");

    // The directory moves (it and its files are recreated), then `last` fails: the rollback
    // destroys the new tree and creates the old one again.
    write(&root.join("tree.yaml"), &failing(true));
    let (code, out) = deploy("new", true);
    assert_eq!(code, 1, "{out}");
    let after = engine.instance("t");
    assert_eq!(after["status"], "ROLLBACK_COMPLETE", "{after}");
    assert!(
        !root.join("new").exists(),
        "{:?}",
        listing(&root.join("new"))
    );
    assert_eq!(listing(&root.join("old")), ["one.txt", "two.txt"]);
    for name in ["dir", "one", "two", "last"] {
        assert_eq!(
            after["resources"][name]["spec"], before["resources"][name]["spec"],
            "{name}: {after}"
        );
    }
}

#[test]
fn a_resource_whose_destroy_failed_is_updated_when_the_blueprint_wants_it_again() {
    let root = TempDir::new("e2e-destroy-failed-back");
    let engine = Engine::start(root.path());
    let v1 = "version: 2023-04-20\nresources:\n  a:\n    type: sim/resource\n    spec:\n      payload: x\n  b:\n    type: sim/resource\n    spec:\n      payload: y\n      failOn: destroy\n      failClass: badInput\n";
    let v2 = "version: 2023-04-20\nresources:\n  a:\n    type: sim/resource\n    spec:\n      payload: x\n";
    write(&root.join("bp.yaml"), v1);
    let (code, out) = engine.json(&["deploy", "bp.yaml", "--instance", "d"]);
    assert_eq!(code, 0, "{out}");
    // b is dropped, and its destroy fails.
    write(&root.join("bp.yaml"), v2);
    let (code, out) = engine.json(&["deploy", "bp.yaml", "--instance", "d"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        engine.instance("d")["resources"]["b"]["status"],
        "DESTROY_FAILED"
    );
    // The blueprint wants b again: it is updated to its spec, not refused.
    write(
        &root.join("bp.yaml"),
        &v1.replace("failOn: destroy", "failOn: create"),
    );
    let (code, out) = engine.json(&["deploy", "bp.yaml", "--instance", "d"]);
    assert_eq!(code, 0, "{out}");
    let inst = engine.instance("d");
    assert_eq!(inst["resources"]["b"]["status"], "UPDATED", "{inst}");
    assert_eq!(inst["resources"]["b"]["spec"]["failOn"], "create", "{inst}");
}

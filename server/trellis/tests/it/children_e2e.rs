//! End to end, child blueprints: the parent's change set carries each child's planned changes,
//! and a rollback undoes what the operation did to its children. The real `trellis serve` with
//! the real `local` and `sim` plugins, driven by the real CLI.

use crate::engine_common::{Engine, actions, pairs, read, write};
use crate::plugins_common::TempDir;
use serde_json::Value;

/// The child of a change set (JSON) named `name`.
fn child<'a>(cs: &'a Value, name: &str) -> &'a Value {
    cs["children"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no child `{name}` in {cs}"))
}

/// `a` makes a directory and a seed file; it exports the directory (known from the spec at
/// plan time) and the seed's digest (computed by the provider: known only after deploy).
const CHILD_A: &str = r#"
version: 2023-04-20
variables:
  dir:
    type: string
resources:
  data:
    type: local/directory
    spec:
      path: ${variables.dir}
  seed:
    type: local/file
    spec:
      path: ${resources.data.spec.path}/seed.txt
      content: seed
exports:
  dir:
    type: string
    field: resources.data.spec.path
  digest:
    type: string
    field: resources.seed.state.sha256
"#;

fn child_b(label: &str) -> String {
    format!(
        r#"
version: 2023-04-20
variables:
  dir:
    type: string
  digest:
    type: string
resources:
  copy:
    type: local/file
    spec:
      path: ${{variables.dir}}/b.txt
      content: "{label} ${{variables.digest}}"
exports:
  path:
    type: string
    field: resources.copy.spec.path
"#
    )
}

/// `b` reads both of `a`'s exports; the parent's own resource reads `b`'s.
const PARENT: &str = r#"
version: 2023-04-20
include:
  b:
    path: parts/b.yaml
    variables:
      dir: ${children.a.dir}
      digest: ${children.a.digest}
  a:
    path: parts/a.yaml
    variables:
      dir: shared
resources:
  pointer:
    type: local/file
    spec:
      path: pointer.txt
      content: ${children.b.path}
"#;

#[test]
fn the_parents_change_set_lists_each_childs_changes() {
    let root = TempDir::new("e2e-child-plan");
    let engine = Engine::start(root.path());
    std::fs::create_dir_all(root.join("parts")).unwrap();
    write(&root.join("parts/a.yaml"), CHILD_A);
    write(&root.join("parts/b.yaml"), &child_b("first"));
    write(&root.join("main.yaml"), PARENT);

    // First plan: both children are created, in deploy order (a feeds b).
    let (code, out) = engine.json(&["plan", "main.yaml", "--instance", "main"]);
    assert_eq!(code, 0, "{out}");
    let cs = &out["changeSet"];
    let names: Vec<&str> = cs["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"], "{cs}");
    let a = child(cs, "a");
    assert_eq!(a["instance"], "main/a");
    assert_eq!(a["action"], "CREATE");
    assert_eq!(a["plannedVersion"], 0);
    assert_eq!(
        actions(&a["resources"]),
        pairs(&[("data", "CREATE"), ("seed", "CREATE")])
    );
    assert_eq!(
        a["summary"],
        "2 to create, 0 to update, 0 to recreate, 0 to delete, 0 unchanged"
    );
    // dir is known from the spec; the digest only after deploy.
    let exports: Vec<(String, Value)> = a["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_owned(), e["new"].clone()))
        .collect();
    assert_eq!(
        exports,
        [
            ("dir".to_owned(), Value::from("shared")),
            ("digest".to_owned(), serde_json::json!({"unknown": true}))
        ],
        "{a}"
    );
    assert_eq!(a["unknownVariables"], serde_json::json!([]));
    assert_eq!(a["deferred"], Value::Null);
    assert_eq!(a["children"], serde_json::json!([]));
    // b's digest variable reads a's unknown export: known after deploy, and so is what reads
    // it; what reads a's known export is known.
    let b = child(cs, "b");
    assert_eq!(b["action"], "CREATE");
    assert_eq!(b["unknownVariables"], serde_json::json!(["digest"]));
    assert_eq!(actions(&b["resources"]), pairs(&[("copy", "CREATE")]));
    let fields = &b["resources"][0]["fields"];
    let field = |path: &str| {
        fields
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == path)
            .unwrap_or_else(|| panic!("no {path} in {fields}"))["new"]
            .clone()
    };
    assert_eq!(field("spec.path"), "shared/b.txt");
    assert_eq!(field("spec.content"), serde_json::json!({"unknown": true}));
    // The parent reads b's path, known at plan time.
    assert_eq!(actions(&cs["resources"]), pairs(&[("pointer", "CREATE")]));
    assert_eq!(
        cs["summary"],
        "1 to create, 0 to update, 0 to recreate, 0 to delete, 0 unchanged; children: 2 to \
         create, 0 to update, 0 to delete, 0 unchanged"
    );

    // The text form lists the children and their resources.
    let text = String::from_utf8_lossy(
        &engine
            .cli(&["plan", "main.yaml", "--instance", "main"])
            .stdout,
    )
    .into_owned();
    assert!(text.contains("\nChildren:\n"), "{text}");
    assert!(text.contains("  + a  (instance main/a)\n"), "{text}");
    assert!(
        text.contains("  + b  (instance main/b)  known after deploy: variables.digest\n"),
        "{text}"
    );
    assert!(text.contains("      + seed  (local/file)\n"), "{text}");
    assert!(
        text.contains("          spec.content: (known after deploy)\n"),
        "{text}"
    );
    assert!(
        text.contains("; children: 2 to create, 0 to update, 0 to delete, 0 unchanged.\n"),
        "{text}"
    );

    let (code, out) = engine.json(&["deploy", "main.yaml", "--instance", "main"]);
    assert_eq!(code, 0, "{out}");
    let digest = engine.instance("main/a")["exports"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(read(&root.join("shared/b.txt")), format!("first {digest}"));
    assert_eq!(read(&root.join("pointer.txt")), "shared/b.txt");

    // Nothing changed: nothing to do, the children's exports known from their state.
    let (code, out) = engine.json(&["plan", "main.yaml", "--instance", "main"]);
    assert_eq!(code, 0, "{out}");
    let cs = &out["changeSet"];
    assert_eq!(child(cs, "a")["action"], "NO_CHANGE", "{cs}");
    assert_eq!(child(cs, "b")["action"], "NO_CHANGE", "{cs}");
    assert_eq!(child(cs, "b")["unknownVariables"], serde_json::json!([]));
    assert_eq!(
        actions(&cs["resources"]),
        pairs(&[("pointer", "NO_CHANGE")])
    );

    // A change in b's file: only b is updated.
    write(&root.join("parts/b.yaml"), &child_b("second"));
    let (code, out) = engine.json(&["plan", "main.yaml", "--instance", "main"]);
    assert_eq!(code, 0, "{out}");
    let cs = &out["changeSet"];
    assert_eq!(child(cs, "a")["action"], "NO_CHANGE", "{cs}");
    let b = child(cs, "b");
    assert_eq!(b["action"], "UPDATE", "{cs}");
    assert_eq!(actions(&b["resources"]), pairs(&[("copy", "UPDATE")]));
    assert_eq!(
        b["resources"][0]["fields"],
        serde_json::json!([{"path": "spec.content", "previous": format!("first {digest}"),
                            "new": format!("second {digest}"), "mustRecreate": false}])
    );
    assert_eq!(
        actions(&cs["resources"]),
        pairs(&[("pointer", "NO_CHANGE")])
    );
    let change_set = cs["id"].as_str().unwrap().to_owned();

    // A child that changes after the plan makes the parent's change set stale.
    let (code, out) = engine.json(&[
        "deploy",
        "parts/b.yaml",
        "--instance",
        "main/b",
        "--var",
        "dir=shared",
        "--var",
        &format!("digest={digest}"),
    ]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = engine.json(&["deploy", "--change-set", &change_set]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.to_string()
            .contains("changed since the change set was planned"),
        "{out}"
    );

    // Planned again, it deploys.
    write(&root.join("parts/b.yaml"), &child_b("third"));
    let (code, out) = engine.json(&["deploy", "main.yaml", "--instance", "main"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(read(&root.join("shared/b.txt")), format!("third {digest}"));

    // A child no longer included is planned as deleted, with everything it has
    // (`resources` is required: the parent keeps one of its own).
    write(
        &root.join("main.yaml"),
        "version: 2023-04-20\ninclude:\n  a:\n    path: parts/a.yaml\n    variables:\n      dir: shared\nresources:\n  keep:\n    type: local/directory\n    spec:\n      path: kept\n",
    );
    let (code, out) = engine.json(&["plan", "main.yaml", "--instance", "main"]);
    assert_eq!(code, 0, "{out}");
    let cs = &out["changeSet"];
    let b = child(cs, "b");
    assert_eq!(b["action"], "DELETE", "{cs}");
    assert_eq!(actions(&b["resources"]), pairs(&[("copy", "DELETE")]));
    assert_eq!(
        actions(&cs["resources"]),
        pairs(&[("keep", "CREATE"), ("pointer", "DELETE")])
    );
}

fn store(content: &str) -> String {
    format!(
        r#"
version: 2023-04-20
resources:
  dir:
    type: local/directory
    spec:
      path: store
  file:
    type: local/file
    spec:
      path: ${{resources.dir.spec.path}}/data.txt
      content: {content}
exports:
  dir:
    type: string
    field: resources.dir.spec.path
"#
    )
}

const CACHE: &str = r#"
version: 2023-04-20
variables:
  dir:
    type: string
resources:
  file:
    type: local/file
    spec:
      path: ${variables.dir}/cache.txt
      content: cached
"#;

/// A sim resource; with `fail`, its create fails.
fn sim(fail: bool) -> String {
    let mut s = String::from("    type: sim/resource\n    spec:\n      payload: p\n");
    if fail {
        s.push_str("      failOn: create\n      failClass: badInput\n");
    }
    s
}

#[test]
fn a_rollback_undoes_what_the_operation_did_to_the_children() {
    let root = TempDir::new("e2e-child-rollback");
    let engine = Engine::start(root.path());
    std::fs::create_dir_all(root.join("parts")).unwrap();
    write(&root.join("parts/store.yaml"), &store("v1"));
    write(&root.join("parts/cache.yaml"), CACHE);
    write(
        &root.join("main.yaml"),
        &format!(
            "version: 2023-04-20\ninclude:\n  store:\n    path: parts/store.yaml\nresources:\n  ok:\n{}",
            sim(false)
        ),
    );
    let (code, out) = engine.json(&["deploy", "main.yaml", "--instance", "main"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(read(&root.join("store/data.txt")), "v1");

    // v2: store is updated, cache is new, then the parent's own new resource fails.
    write(&root.join("parts/store.yaml"), &store("v2"));
    let v2 = format!(
        "version: 2023-04-20\ninclude:\n  store:\n    path: parts/store.yaml\n  cache:\n    path: parts/cache.yaml\n    variables:\n      dir: ${{children.store.dir}}\nresources:\n  ok:\n{}  broken:\n{}",
        sim(false),
        sim(true)
    );
    write(&root.join("main.yaml"), &v2);
    let (code, out) = engine.json(&[
        "deploy",
        "main.yaml",
        "--instance",
        "main",
        "--rollback-on-failure",
    ]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(out["operation"]["status"], "FAILED", "{out}");
    let main = engine.instance("main");
    assert_eq!(main["status"], "ROLLBACK_COMPLETE", "{main}");
    // The child the operation created is gone; the one it updated is as it was.
    assert!(!root.join("store/cache.txt").exists());
    assert_eq!(engine.instance("main/cache")["status"], "DESTROYED");
    assert_eq!(read(&root.join("store/data.txt")), "v1");
    let store_state = engine.instance("main/store");
    assert_eq!(
        store_state["resources"]["file"]["spec"]["content"], "v1",
        "{store_state}"
    );
    let children: Vec<&str> = main["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(children, ["store"], "{main}");
    let rolled: Vec<(String, String)> = engine
        .events("main")
        .into_iter()
        .filter(|(kind, _)| kind == "child.rolled_back")
        .map(|(_, p)| {
            (
                p["child"].as_str().unwrap().to_owned(),
                p["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        rolled,
        pairs(&[("cache", "destroyed"), ("store", "restored")])
    );

    // A failing child rolls itself back, and the children deployed before it are undone.
    write(
        &root.join("parts/cache.yaml"),
        &format!("{CACHE}  broken:\n{}", sim(true)),
    );
    let v3 = format!(
        "version: 2023-04-20\ninclude:\n  store:\n    path: parts/store.yaml\n  cache:\n    path: parts/cache.yaml\n    variables:\n      dir: ${{children.store.dir}}\nresources:\n  ok:\n{}",
        sim(false)
    );
    write(&root.join("main.yaml"), &v3);
    let (code, out) = engine.json(&[
        "deploy",
        "main.yaml",
        "--instance",
        "main",
        "--rollback-on-failure",
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(out.to_string().contains("main/cache"), "{out}");
    assert_eq!(engine.instance("main")["status"], "ROLLBACK_COMPLETE");
    assert_eq!(engine.instance("main/cache")["status"], "ROLLBACK_COMPLETE");
    assert!(!root.join("store/cache.txt").exists());
    assert_eq!(read(&root.join("store/data.txt")), "v1");
    assert_eq!(
        engine.instance("main/store")["resources"]["file"]["spec"]["content"],
        "v1"
    );

    // Without rollback, the same failure leaves the children as deployed.
    let (code, out) = engine.json(&["deploy", "main.yaml", "--instance", "main"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(read(&root.join("store/data.txt")), "v2");
}

/// Issue 21, items 1 and 3: names with dots (a child, an `each` resource, a resource read
/// through the quoted accessor) plan and deploy; a child `string` variable given `42` is
/// refused at plan instead of being coerced.
#[test]
fn dotted_names_deploy_and_a_literal_of_the_wrong_type_is_refused() {
    let root = TempDir::new("e2e-child-dotted");
    let engine = Engine::start(root.path());
    std::fs::create_dir_all(root.join("parts")).unwrap();
    write(
        &root.join("parts/core.yaml"),
        r#"
version: 2023-04-20
variables:
  dir:
    type: string
resources:
  core.dir.v1:
    type: local/directory
    spec:
      path: ${variables.dir}
exports:
  dir:
    type: string
    field: resources["core.dir.v1"].spec.path
"#,
    );
    write(
        &root.join("main.yaml"),
        r#"
version: 2023-04-20
include:
  core-infrastructure.v1:
    path: parts/core.yaml
    variables:
      dir: dotted
resources:
  notes.v2:
    type: local/file
    each: ${list("a", "b")}
    spec:
      path: ${children["core-infrastructure.v1"].dir}/${elem}.txt
      content: ${elem}
  pointer.v1:
    type: local/file
    spec:
      path: pointer.txt
      content: ${resources["notes.v2"][1].spec.path}
"#,
    );
    let (code, out) = engine.json(&["plan", "main.yaml", "--instance", "dots"]);
    assert_eq!(code, 0, "{out}");
    let cs = &out["changeSet"];
    let core = child(cs, "core-infrastructure.v1");
    assert_eq!(core["instance"], "dots/core-infrastructure.v1");
    assert_eq!(
        actions(&core["resources"]),
        pairs(&[("core.dir.v1", "CREATE")])
    );
    let (code, out) = engine.json(&["deploy", "main.yaml", "--instance", "dots"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(read(&root.join("dotted/a.txt")), "a");
    assert_eq!(read(&root.join("dotted/b.txt")), "b");
    assert_eq!(read(&root.join("pointer.txt")), "dotted/b.txt");
    let instance = engine.instance("dots");
    for name in ["notes.v2_0", "notes.v2_1", "pointer.v1"] {
        assert_eq!(
            instance["resources"][name]["status"], "CREATED",
            "{name}: {instance}"
        );
    }

    // A string variable given a YAML integer: refused at the value, not coerced to "42".
    write(
        &root.join("typed.yaml"),
        "version: 2023-04-20\ninclude:\n  core:\n    path: parts/core.yaml\n    variables:\n      dir: 42\nresources:\n  keep:\n    type: local/directory\n    spec:\n      path: kept\n",
    );
    let (code, out) = engine.json(&["plan", "typed.yaml", "--instance", "typed"]);
    assert_eq!(code, 1, "{out}");
    let d = out["changeSet"]["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["code"] == "T0406")
        .unwrap_or_else(|| panic!("no T0406: {out}"));
    assert!(
        d["message"]
            .as_str()
            .unwrap_or_default()
            .contains("declares as string"),
        "{d}"
    );
    assert!(!root.join("42").exists());
}

/// Plans `main.yaml` as `instance`, which must fail: the diagnostic with `code`.
fn refused_plan(engine: &Engine, instance: &str, code: &str) -> Value {
    let (exit, out) = engine.json(&["plan", "main.yaml", "--instance", instance]);
    assert_eq!(exit, 1, "{out}");
    out["changeSet"]["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["code"] == code)
        .cloned()
        .unwrap_or_else(|| panic!("no {code}: {out}"))
}

/// Issue 21, item 3: a value of another type reaching a child through a substitution (an
/// integer variable's value given to a child's `string` variable) is refused at plan at the
/// substitution, as a literal is, instead of being coerced to "42".
#[test]
fn a_value_of_the_wrong_type_passed_through_a_variable_is_refused_at_plan() {
    let root = TempDir::new("e2e-child-typed-subst");
    let engine = Engine::start(root.path());
    std::fs::create_dir_all(root.join("parts")).unwrap();
    write(
        &root.join("parts/core.yaml"),
        "version: 2023-04-20\nvariables:\n  dir:\n    type: string\nresources:\n  dir:\n    type: local/directory\n    spec:\n      path: ${variables.dir}\n",
    );
    write(
        &root.join("main.yaml"),
        "version: 2023-04-20\nvariables:\n  size:\n    type: integer\n    default: 42\ninclude:\n  core:\n    path: parts/core.yaml\n    variables:\n      dir: ${variables.size}\nresources:\n  keep:\n    type: local/directory\n    spec:\n      path: kept\n",
    );
    let d = refused_plan(&engine, "typed", "T0406");
    assert_eq!(d["line"], 10, "{d}");
    let message = d["message"].as_str().unwrap_or_default();
    assert!(message.contains("passes an integer"), "{d}");
    assert!(message.contains("declares as string"), "{d}");
    assert!(!root.join("42").exists());
}

/// Issue 21, item 2: `resources` is required in every blueprint, an included child too; a child
/// with none is refused at plan, at the child's first line, before anything is created.
#[test]
fn a_child_without_resources_is_refused_at_plan() {
    let root = TempDir::new("e2e-child-no-resources");
    let engine = Engine::start(root.path());
    std::fs::create_dir_all(root.join("parts")).unwrap();
    write(
        &root.join("parts/core.yaml"),
        "version: 2023-04-20\nresources: {}\n",
    );
    write(
        &root.join("main.yaml"),
        "version: 2023-04-20\ninclude:\n  core:\n    path: parts/core.yaml\nresources:\n  keep:\n    type: local/directory\n    spec:\n      path: kept\n",
    );
    let d = refused_plan(&engine, "empty", "T0305");
    assert!(
        d["file"]
            .as_str()
            .unwrap_or_default()
            .ends_with("core.yaml"),
        "{d}"
    );
    assert_eq!(d["line"], 1, "{d}");
    assert!(!root.join("kept").exists());
}

/// A child blueprint's resources are planned by their provider too (`PlanResource`): the
/// child's plan shows the state sim knows before deploy and sim's warning.
#[test]
fn a_childs_resources_get_the_providers_plan() {
    let root = TempDir::new("e2e-child-provider-plan");
    let engine = Engine::start(root.path());
    write(
        &root.join("parts/sim.yaml"),
        "version: 2023-04-20\nresources:\n  inner:\n    type: sim/resource\n    spec:\n      payload: p\n      planWarning: mind the child\n",
    );
    write(
        &root.join("main.yaml"),
        "version: 2023-04-20\ninclude:\n  part:\n    path: parts/sim.yaml\nresources:\n  outer:\n    type: sim/resource\n    spec:\n      payload: q\n",
    );
    let (code, plan) = engine.json(&["plan", "main.yaml", "--instance", "pc"]);
    assert_eq!(code, 0, "{plan}");
    let part = child(&plan["changeSet"], "part");
    let inner = part["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "inner")
        .unwrap_or_else(|| panic!("{part}"));
    let planned: Vec<&Value> = inner["fields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["origin"] == "provider")
        .collect();
    assert!(planned.iter().any(|f| f["path"] == "state.id"), "{inner}");
    assert!(
        part.to_string().contains("mind the child"),
        "the child's plan lacks the provider's warning: {part}"
    );
}

//! End to end, link life cycle, with the real `trellis serve`, the real `local` plugin and the
//! real CLI:
//!
//! - a link annotation alone changes: the resource carrying it and the link are updated, and
//!   the provider rewrites what the link wrote;
//! - a hard link orders deploy (the priority resource first) and destroy (the reverse);
//! - destroying several resources linked to one env file at once (the per-resource link locks);
//! - a link whose application failed is applied again by the next deploy, even when neither end
//!   changes.
//!
//! Each test ends by destroying its instance and checking that only the harness's own
//! directories (`data`, `plugins`) are left in the engine's working directory.

use std::path::{Path, PathBuf};

use crate::engine_common::{Engine, env_entries, env_keys, link_actions, read, write};
use crate::plugins_common::TempDir;
use serde_json::Value;

/// An engine working in `root` (where `local` paths resolve) and a separate directory for the
/// blueprints, so that `root` holds only what the engine and its resources put there.
struct Setup {
    root: TempDir,
    blueprints: TempDir,
    engine: Engine,
}

impl Setup {
    fn new(tag: &str) -> Setup {
        let root = TempDir::new(tag);
        let blueprints = TempDir::new(&format!("{tag}-bp"));
        let engine = Engine::start(root.path());
        Setup {
            root,
            blueprints,
            engine,
        }
    }

    /// Writes `text` as the blueprint; its absolute path.
    fn blueprint(&self, text: &str) -> String {
        let path = self.blueprints.join("bp.yaml");
        write(&path, text);
        path.to_str().unwrap().to_owned()
    }

    fn plan(&self, text: &str, instance: &str) -> Value {
        let bp = self.blueprint(text);
        let (code, plan) = self.engine.json(&["plan", &bp, "--instance", instance]);
        assert_eq!(code, 0, "{plan}");
        plan
    }

    /// `trellis deploy`: its exit code and output.
    fn deploy(&self, text: &str, instance: &str) -> (i32, Value) {
        let bp = self.blueprint(text);
        self.engine.json(&["deploy", &bp, "--instance", instance])
    }

    /// Destroys the instance, which must succeed, and checks that nothing the resources made is
    /// left behind.
    fn destroy_leaves_nothing(&self, instance: &str) {
        let (code, out) = self.engine.json(&["destroy", "--instance", instance]);
        assert_eq!(code, 0, "{out}");
        assert_eq!(
            entries(self.root.path()),
            ["data", "plugins"],
            "left behind in {}",
            self.root.path().display()
        );
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p)
    }
}

/// The names in a directory, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The planned resource `name`.
fn planned<'a>(plan: &'a Value, name: &str) -> &'a Value {
    plan["changeSet"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("{name} not planned: {plan}"))
}

/// The position of the first event of `kind` about resource `resource`.
fn position(events: &[(String, Value)], kind: &str, resource: &str) -> usize {
    events
        .iter()
        .position(|(k, p)| k == kind && p["resource"] == resource)
        .unwrap_or_else(|| panic!("no {kind} of {resource} in {events:#?}"))
}

/// An env file linked to a file, which names its variable with the env file link's annotation.
const ANNOTATED: &str = r#"
version: 2023-04-20
resources:
  config:
    type: local/file
    metadata:
      labels:
        app: demo
      annotations:
        local.envFile.name: NAME
    spec:
      path: config.txt
      content: hello
  env:
    type: local/envFile
    linkSelector:
      byLabel:
        app: demo
    spec:
      path: app.env
      values:
        PORT: "8080"
"#;

#[test]
fn changing_only_a_link_annotation_updates_the_link() {
    let s = Setup::new("e2e-link-annotation");
    let (code, out) = s.deploy(&ANNOTATED.replace("NAME", "settings"), "ann");
    assert_eq!(code, 0, "{out}");
    let env = s.path("app.env");
    assert_eq!(env_keys(&env), ["FILE_SETTINGS", "PORT"]);
    let config_path = s.path("config.txt").canonicalize().unwrap();
    let config_path = config_path.to_str().unwrap();

    // Unchanged: nothing to do.
    let plan = s.plan(&ANNOTATED.replace("NAME", "settings"), "ann");
    assert_eq!(planned(&plan, "config")["action"], "NO_CHANGE", "{plan}");
    assert_eq!(
        link_actions(&plan),
        [("env->config".into(), "NO_CHANGE".into())]
    );

    // Only the annotation changes: the file is updated (to record it) and so is the link.
    let v2 = ANNOTATED.replace("NAME", "options");
    let plan = s.plan(&v2, "ann");
    let config = planned(&plan, "config");
    assert_eq!(config["action"], "UPDATE", "{plan}");
    let fields = config["fields"].as_array().unwrap();
    assert_eq!(fields.len(), 1, "{plan}");
    assert_eq!(
        fields[0]["path"], r#"metadata.annotations["local.envFile.name"]"#,
        "{plan}"
    );
    assert_eq!(fields[0]["previous"], "settings", "{plan}");
    assert_eq!(fields[0]["new"], "options", "{plan}");
    assert_eq!(planned(&plan, "env")["action"], "NO_CHANGE", "{plan}");
    assert_eq!(
        link_actions(&plan),
        [("env->config".into(), "UPDATE".into())]
    );

    // Deployed: the provider renamed the line it wrote; the file itself is as it was.
    let (code, out) = s.deploy(&v2, "ann");
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        env_entries(&env),
        [
            ("FILE_OPTIONS".to_owned(), config_path.to_owned()),
            ("PORT".to_owned(), "8080".to_owned()),
        ]
    );
    assert_eq!(read(&s.path("config.txt")), "hello");
    let inst = s.engine.instance("ann");
    assert_eq!(
        inst["links"][0]["data"]["variable"], "FILE_OPTIONS",
        "{inst}"
    );
    // Recorded: the next plan changes nothing.
    let plan = s.plan(&v2, "ann");
    assert_eq!(planned(&plan, "config")["action"], "NO_CHANGE", "{plan}");
    assert_eq!(
        link_actions(&plan),
        [("env->config".into(), "NO_CHANGE".into())]
    );

    s.destroy_leaves_nothing("ann");
}

/// A file linked to its directory (`local/file::local/directory`, hard, the directory first).
/// Nothing but the link orders them: the file's path does not reference the directory.
const HARD: &str = r#"
version: 2023-04-20
resources:
  notes:
    type: local/file
    linkSelector:
      byLabel:
        role: home
    spec:
      path: out/notes.txt
      content: notes
  dir:
    type: local/directory
    metadata:
      labels:
        role: home
    spec:
      path: out
"#;

#[test]
fn a_hard_link_orders_deploy_and_destroy() {
    let s = Setup::new("e2e-link-hard");
    let (code, out) = s.deploy(HARD, "hard");
    assert_eq!(code, 0, "{out}");
    assert_eq!(read(&s.path("out/notes.txt")), "notes");
    let events = s.engine.events("hard");
    // The directory is created before the file is asked for; the link once both exist.
    assert!(
        position(&events, "resource.created", "dir")
            < position(&events, "resource.create_requested", "notes"),
        "{events:#?}"
    );
    let linked = events
        .iter()
        .position(|(k, p)| k == "link.created" && p["resourceA"] == "notes")
        .unwrap_or_else(|| panic!("no link.created in {events:#?}"));
    assert!(
        position(&events, "resource.created", "notes") < linked,
        "{events:#?}"
    );
    let inst = s.engine.instance("hard");
    assert_eq!(
        inst["resources"]["notes"]["dependsOn"],
        serde_json::json!(["dir"])
    );

    // Destroy goes the other way: the link, then the file, then the directory.
    let before = events.len();
    s.destroy_leaves_nothing("hard");
    let events = s.engine.events("hard");
    let events = &events[before..];
    let unlinked = events
        .iter()
        .position(|(k, p)| k == "link.destroyed" && p["resourceA"] == "notes")
        .unwrap_or_else(|| panic!("no link.destroyed in {events:#?}"));
    assert!(
        unlinked < position(events, "resource.destroyed", "notes"),
        "{events:#?}"
    );
    assert!(
        position(events, "resource.destroyed", "notes")
            < position(events, "resource.destroy_requested", "dir"),
        "{events:#?}"
    );
}

/// Four files linked to one env file; nothing orders the files and the env file.
const FAN_IN: &str = r#"
version: 2023-04-20
resources:
  a:
    type: local/file
    metadata: {labels: {app: demo}}
    spec: {path: a.txt, content: a}
  b:
    type: local/file
    metadata: {labels: {app: demo}}
    spec: {path: b.txt, content: b}
  c:
    type: local/file
    metadata: {labels: {app: demo}}
    spec: {path: c.txt, content: c}
  d:
    type: local/file
    metadata: {labels: {app: demo}}
    spec: {path: d.txt, content: d}
  env:
    type: local/envFile
    linkSelector:
      byLabel:
        app: demo
    spec:
      path: app.env
"#;

#[test]
fn destroying_resources_linked_to_one_env_file_leaves_nothing() {
    let s = Setup::new("e2e-link-fanin");
    let (code, out) = s.deploy(FAN_IN, "fan");
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        env_keys(&s.path("app.env")),
        ["FILE_A", "FILE_B", "FILE_C", "FILE_D"]
    );
    let before = s.engine.events("fan").len();
    // Every resource is destroyed at once, each removing its links first.
    s.destroy_leaves_nothing("fan");
    let events = s.engine.events("fan");
    let events = &events[before..];
    assert!(
        !events
            .iter()
            .any(|(k, _)| k == "link.failed" || k == "resource.failed"),
        "{events:#?}"
    );
    // Each link removed exactly once.
    let mut unlinked: Vec<String> = events
        .iter()
        .filter(|(k, _)| k == "link.destroyed")
        .map(|(_, p)| p["resourceB"].as_str().unwrap().to_owned())
        .collect();
    unlinked.sort();
    assert_eq!(unlinked, ["a", "b", "c", "d"], "{events:#?}");
    assert!(
        s.engine.instance("fan")["links"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

/// An env file whose own `values` set the variable its link to `config` writes: the provider
/// rejects the link (`local.envfile-variable-taken`) until `FILE_CONFIG` goes from `values`.
const TAKEN: &str = r#"
version: 2023-04-20
resources:
  config:
    type: local/file
    metadata:
      labels:
        app: demo
    spec:
      path: config.txt
      content: hello
  env:
    type: local/envFile
    linkSelector:
      byLabel:
        app: demo
    spec:
      path: app.env
      values:
        PORT: "8080"
        VALUES
"#;

#[test]
fn a_failed_link_is_retried_by_the_next_deploy() {
    let s = Setup::new("e2e-link-retry");
    let broken = TAKEN.replace("VALUES", "FILE_CONFIG: mine");
    let (code, out) = s.deploy(&broken, "retry");
    assert_eq!(code, 1, "{out}");
    let inst = s.engine.instance("retry");
    assert_eq!(inst["links"][0]["status"], "CREATE_FAILED", "{inst}");
    assert_eq!(inst["resources"]["config"]["status"], "CREATED", "{inst}");
    assert_eq!(inst["resources"]["env"]["status"], "CREATED", "{inst}");
    let failed = |events: &[(String, Value)]| {
        events
            .iter()
            .filter(|(k, p)| k == "link.failed" && p["resourceB"] == "config")
            .count()
    };
    assert_eq!(failed(&s.engine.events("retry")), 1);

    // Neither end changes, yet the link is planned again: as a create, since it never was.
    let plan = s.plan(&broken, "retry");
    assert_eq!(planned(&plan, "config")["action"], "NO_CHANGE", "{plan}");
    assert_eq!(planned(&plan, "env")["action"], "NO_CHANGE", "{plan}");
    assert_eq!(
        link_actions(&plan),
        [("env->config".into(), "CREATE".into())]
    );
    // And deploying tries it again (the provider still rejects it).
    let (code, out) = s.deploy(&broken, "retry");
    assert_eq!(code, 1, "{out}");
    assert_eq!(failed(&s.engine.events("retry")), 2);

    // Fixed: the env file drops its own FILE_CONFIG and the link is created.
    let fixed = TAKEN.replace("VALUES", "");
    let plan = s.plan(&fixed, "retry");
    assert_eq!(
        link_actions(&plan),
        [("env->config".into(), "CREATE".into())]
    );
    let (code, out) = s.deploy(&fixed, "retry");
    assert_eq!(code, 0, "{out}");
    let config_path = s.path("config.txt").canonicalize().unwrap();
    assert_eq!(
        env_entries(&s.path("app.env")),
        [
            (
                "FILE_CONFIG".to_owned(),
                config_path.to_str().unwrap().to_owned()
            ),
            ("PORT".to_owned(), "8080".to_owned()),
        ]
    );
    let inst = s.engine.instance("retry");
    assert_eq!(inst["links"][0]["status"], "CREATED", "{inst}");
    let plan = s.plan(&fixed, "retry");
    assert_eq!(
        link_actions(&plan),
        [("env->config".into(), "NO_CHANGE".into())]
    );

    s.destroy_leaves_nothing("retry");
}

//! End to end with the real `trellis serve`, the real `local` plugin and the real CLI:
//!
//! - fields a link owns are not drift: an env file's lines written by its links are reported
//!   by the provider (`values`), yet `trellis drift` stays quiet about them, while a line added
//!   by hand or a changed static value is drift; reconcile leaves link-owned fields alone;
//! - the `local/file` data source's `json` mapping, filtered with `has key` / `not has key`;
//! - `${link(a, b)}` of a link created in the same deployment: the resource reading it is
//!   planned as known after deploy and deployed after the link.

use crate::engine_common::{Engine, env_keys, stderr, write};
use crate::plugins_common::TempDir;
use serde_json::{Value, json};

/// `trellis drift`: the exit code, and (resource, field path) of every drifted field.
fn drift(engine: &Engine, instance: &str) -> (i32, Vec<(String, String)>, Value) {
    let (code, v) = engine.json(&["drift", "--instance", instance]);
    let mut fields = Vec::new();
    for r in v["resources"].as_array().cloned().unwrap_or_default() {
        for f in r["fields"].as_array().cloned().unwrap_or_default() {
            fields.push((
                r["name"].as_str().unwrap_or_default().to_owned(),
                f["path"].as_str().unwrap_or_default().to_owned(),
            ));
        }
    }
    (code, fields, v)
}

/// An env file with a static value, linked to a file and a secret (two link-written lines).
const LINKED_ENV: &str = r#"
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
  apiKey:
    type: local/randomSecret
    metadata:
      labels:
        app: demo
    spec:
      length: 24
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
fn link_owned_env_file_lines_are_not_drift() {
    let root = TempDir::new("e2e-ldrift");
    let site = root.join("site");
    std::fs::create_dir_all(&site).unwrap();
    let engine = Engine::builder(root.path()).cwd(&site).start();
    write(&site.join("bp.yaml"), LINKED_ENV);
    let (code, out) = engine.json(&["deploy", "bp.yaml", "--instance", "app"]);
    assert_eq!(code, 0, "{out}");
    let env = site.join("app.env");
    let deployed = std::fs::read_to_string(&env).unwrap();
    let keys = env_keys(&env);
    assert_eq!(
        keys,
        ["FILE_CONFIG", "PORT", "SECRET_API_KEY"],
        "{deployed}"
    );

    // The provider reports all three lines; the two the links wrote are theirs: no drift.
    let (code, fields, v) = drift(&engine, "app");
    assert_eq!((code, fields), (0, vec![]), "{v}");
    assert_eq!(v["drifted"], false, "{v}");

    // What the engine shows of the links is their link data, nothing of the bookkeeping.
    let inst = engine.instance("app");
    let links = inst["links"].as_array().unwrap();
    assert_eq!(links.len(), 2, "{inst}");
    for l in links {
        assert!(!l["data"].to_string().contains("$owned"), "{l}");
        assert!(l["data"]["variable"].is_string(), "{l}");
    }

    // A line added by hand is drift, named by its field (and its value is not shown).
    write(&env, &format!("{deployed}EXTRA='by hand'\n"));
    let (code, fields, v) = drift(&engine, "app");
    assert_eq!(code, 3, "{v}");
    assert_eq!(fields, [("env".into(), "spec.values.EXTRA".into())], "{v}");
    assert!(!v.to_string().contains("by hand"), "{v}");

    // So is a changed static value, shown as it was and as it is.
    write(&env, &deployed.replace("PORT='8080'", "PORT='9090'"));
    let (code, fields, v) = drift(&engine, "app");
    assert_eq!(code, 3, "{v}");
    assert_eq!(fields, [("env".into(), "spec.values.PORT".into())], "{v}");
    let field = &v["resources"][0]["fields"][0];
    assert_eq!(
        (&field["previous"], &field["new"]),
        (&json!("8080"), &json!("9090"))
    );

    // Reapply puts the static value back and keeps the links' lines.
    let (code, out) = engine.json(&["reconcile", "--instance", "app", "--mode", "reapply"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(std::fs::read_to_string(&env).unwrap(), deployed);

    // Lines the links own, edited by hand, are not drift...
    let secret_line = deployed
        .lines()
        .find(|l| l.starts_with("SECRET_API_KEY="))
        .unwrap();
    let edited = deployed
        .replace(secret_line, "SECRET_API_KEY='rotated by hand'")
        .replace("config.txt'", "elsewhere.txt'");
    assert_ne!(edited, deployed);
    write(&env, &edited);
    let (code, fields, v) = drift(&engine, "app");
    assert_eq!((code, fields), (0, vec![]), "{v}");

    // ...and reconcile leaves them alone: nothing to accept, nothing recorded from them.
    let (code, out) = engine.json(&["reconcile", "--instance", "app", "--mode", "accept"]);
    assert_eq!(code, 0, "{out}");
    let inst = engine.instance("app");
    assert_eq!(
        inst["resources"]["env"]["spec"]["values"],
        json!({"PORT": "8080"}),
        "{inst}"
    );
    assert_eq!(std::fs::read_to_string(&env).unwrap(), edited);

    // The next deploy of the links (the env file changes) writes the lines again.
    write(
        &site.join("bp.yaml"),
        &LINKED_ENV.replace("PORT: \"8080\"", "PORT: \"8081\""),
    );
    let (code, out) = engine.json(&["deploy", "bp.yaml", "--instance", "app"]);
    assert_eq!(code, 0, "{out}");
    let text = std::fs::read_to_string(&env).unwrap();
    assert!(text.contains("PORT='8081'"), "{text}");
    assert!(text.contains(secret_line), "{text}");
    assert!(!text.contains("elsewhere.txt"), "{text}");
    let (code, fields, v) = drift(&engine, "app");
    assert_eq!((code, fields), (0, vec![]), "{v}");

    let (code, out) = engine.json(&["destroy", "--instance", "app"]);
    assert_eq!(code, 0, "{out}");
    assert!(!env.exists());
}

/// A blueprint whose `local/file` data source filters on the `json` mapping, and a resource
/// that copies the matched file to `out/deep/<copy>` (below what the data source lists).
fn json_filter_blueprint(field: &str, operator: &str, search: &str, copy: &str) -> String {
    format!(
        r#"
version: 2023-04-20
datasources:
  picked:
    type: local/file
    filter:
      field: {field}
      operator: "{operator}"
      search: {search}
    exports:
      content:
        type: string
      file:
        type: string
        aliasFor: path
resources:
  copy:
    type: local/file
    spec:
      path: out/deep/{copy}
      content: ${{datasources.picked.content}}
exports:
  source:
    type: string
    field: datasources.picked.file
"#
    )
}

#[test]
fn data_source_json_mappings_filter_with_has_key() {
    let root = TempDir::new("e2e-hask");
    // Listed in path order: 0-notes.txt (no `json`), a.json, b.json, list.json (an array: no
    // `json`).
    let site = root.join("site");
    std::fs::create_dir_all(site.join("out/deep")).unwrap();
    write(&site.join("0-notes.txt"), "notes\n");
    write(&site.join("a.json"), r#"{"name": "a"}"#);
    write(
        &site.join("b.json"),
        r#"{"name": "b", "owner": {"team": "core"}}"#,
    );
    write(&site.join("list.json"), r#"[{"owner": "x"}]"#);
    let engine = Engine::builder(root.path()).cwd(&site).start();
    let bp = root.join("ds.yaml");
    let bp_arg = bp.to_str().unwrap();

    for (i, (operator, search, expected)) in [
        ("has key", "owner", "b.json"),
        ("has key", "name", "a.json"),
        // Files without a JSON object have no `json`: a missing field matches no operator.
        ("not has key", "owner", "a.json"),
        ("not has key", "Owner", "a.json"),
    ]
    .into_iter()
    .enumerate()
    {
        let copy = format!("copy{i}.txt");
        write(&bp, &json_filter_blueprint("json", operator, search, &copy));
        let (code, out) = engine.json(&["deploy", bp_arg, "--instance", &format!("ds{i}")]);
        assert_eq!(code, 0, "json {operator} {search}: {out}");
        let inst = engine.instance(&format!("ds{i}"));
        assert_eq!(
            inst["exports"]["source"], expected,
            "json {operator} {search}: {inst}"
        );
        assert_eq!(
            std::fs::read_to_string(site.join("out/deep").join(&copy)).unwrap(),
            std::fs::read_to_string(site.join(expected)).unwrap(),
            "json {operator} {search}"
        );
    }

    // No file has the key: nothing matches.
    write(
        &bp,
        &json_filter_blueprint("json", "has key", "missing", "x"),
    );
    let out = engine.cli(&["plan", bp_arg, "--instance", "none"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = format!("{}{}", stderr(&out), String::from_utf8_lossy(&out.stdout));
    assert!(text.contains("T1002"), "{text}");

    // `has key` takes a mapping field and a string search; anything else is an error naming
    // both types.
    for (field, operator, search) in [
        ("name", "has key", "a"),
        ("size", "not has key", "a"),
        ("json", "has key", "[owner, name]"),
    ] {
        write(&bp, &json_filter_blueprint(field, operator, search, "x"));
        let out = engine.cli(&["plan", bp_arg, "--instance", "bad"]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let text = format!("{}{}", stderr(&out), String::from_utf8_lossy(&out.stdout));
        assert!(
            text.contains("T1003"),
            "{field} {operator} {search}: {text}"
        );
        assert!(
            text.contains(&format!("`{operator}`")),
            "{field} {operator} {search}: {text}"
        );
    }
}

#[test]
fn link_data_created_in_the_same_deployment_feeds_a_later_resource() {
    let root = TempDir::new("e2e-ldata");
    let site = root.join("site");
    std::fs::create_dir_all(&site).unwrap();
    let engine = Engine::builder(root.path()).cwd(&site).start();
    // `manifest` reads the data of the env file's link to `config`, which this deployment
    // creates: it can only be applied once both ends are deployed and the link is.
    let blueprint = format!(
        "{LINKED_ENV}{}",
        r#"  manifest:
    type: local/file
    spec:
      path: manifest.txt
      content: "${link(env, config).variable} in ${link(config, env).path}"
"#
    );
    write(&site.join("bp.yaml"), &blueprint);

    let (code, plan) = engine.json(&["plan", "bp.yaml", "--instance", "app"]);
    assert_eq!(code, 0, "{plan}");
    let manifest = plan["changeSet"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "manifest")
        .cloned()
        .unwrap();
    let content = manifest["fields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "spec.content")
        .cloned()
        .unwrap();
    assert_eq!(content["new"], json!({"unknown": true}), "{manifest}");

    let (code, out) = engine.json(&["deploy", "bp.yaml", "--instance", "app"]);
    assert_eq!(code, 0, "{out}");
    let inst = engine.instance("app");
    let link = inst["links"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["resourceB"] == "config")
        .cloned()
        .unwrap_or_else(|| panic!("no env -> config link: {inst}"));
    let expected = format!(
        "{} in {}",
        link["data"]["variable"].as_str().unwrap(),
        link["data"]["path"].as_str().unwrap()
    );
    assert!(expected.starts_with("FILE_CONFIG in "), "{link}");
    assert_eq!(
        std::fs::read_to_string(site.join("manifest.txt")).unwrap(),
        expected
    );
    assert_eq!(inst["resources"]["manifest"]["spec"]["content"], expected);

    // Planned again: the link data is recorded, so nothing is unknown and nothing changes.
    let (code, again) = engine.json(&["plan", "bp.yaml", "--instance", "app"]);
    assert_eq!(code, 0, "{again}");
    for r in again["changeSet"]["resources"].as_array().unwrap() {
        assert_eq!(r["action"], "NO_CHANGE", "{r}");
    }

    let (code, out) = engine.json(&["destroy", "--instance", "app"]);
    assert_eq!(code, 0, "{out}");
    assert!(!site.join("manifest.txt").exists());
    assert!(!site.join("app.env").exists());
}

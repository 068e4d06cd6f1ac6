//! End to end, the blueprint features between the documents and the deploy: exports read from
//! every kind of source and checked against their declared type, data sources that read each
//! other, conditions and `each` in a plan, and the include depth limit. The real
//! `trellis serve` with the real `local` plugin, driven by the real CLI.

use std::path::Path;

use crate::engine_common::{Engine, actions, pairs, planned_new, read, write};
use crate::plugins_common::TempDir;
use serde_json::json;

/// The files below `dir`, relative, sorted; the harness's own directories left out.
fn files_below(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != "data" && name != "plugins" {
            out.push(name);
        }
    }
    out.sort();
    out
}

const EXPORTS: &str = r#"
version: 2023-04-20
variables:
  env:
    type: string
    default: staging
values:
  greeting:
    type: string
    value: hello ${variables.env}
datasources:
  first:
    type: local/file
    filter:
      field: name
      operator: "="
      search: a.env
    exports:
      name:
        type: string
      content:
        type: string
      size:
        type: integer
  # Reads the data source above: fetched after it.
  other:
    type: local/file
    filter:
      field: name
      operator: "!="
      search: ${datasources.first.name}
    exports:
      name:
        type: string
resources:
  notes:
    type: local/file
    metadata:
      displayName: Release notes
      labels:
        app: demo
    spec:
      path: notes.txt
      content: ${values.greeting}
exports:
  fromVariable:
    type: string
    field: variables.env
  fromValue:
    type: string
    field: values.greeting
  fromMetadata:
    type: string
    field: resources.notes.metadata.displayName
  fromLabel:
    type: string
    field: resources.notes.metadata.labels.app
  fromSpec:
    type: string
    field: resources.notes.spec.path
  fromState:
    type: integer
    field: resources.notes.state.size
  fromDataSource:
    type: string
    field: datasources.first.content
  fromChainedDataSource:
    type: string
    field: datasources.other.name
"#;

#[test]
fn exports_come_from_every_source_with_their_declared_types() {
    let root = TempDir::new("feat-exports");
    // The local provider lists the engine's working directory: these two files, sorted.
    write(&root.join("a.env"), "A=1\n");
    write(&root.join("b.env"), "B=22\n");
    write(&root.join("bp.yaml"), EXPORTS);
    let before = files_below(root.path());
    let engine = Engine::start(root.path());

    let (code, out) = engine.json(&["deploy", "bp.yaml", "--instance", "x"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(read(&root.join("notes.txt")), "hello staging");
    let inst = engine.instance("x");
    assert_eq!(
        inst["exports"],
        json!({
            "fromVariable": "staging",
            "fromValue": "hello staging",
            "fromMetadata": "Release notes",
            "fromLabel": "demo",
            "fromSpec": "notes.txt",
            "fromState": 13,
            "fromDataSource": "A=1\n",
            "fromChainedDataSource": "b.env",
        }),
        "{inst}"
    );

    // A declared type the field does not have: the export names itself, both types, and
    // nothing is left half-deployed by it (the type is known before deploy).
    write(
        &root.join("bp.yaml"),
        &EXPORTS.replace(
            "  fromValue:\n    type: string",
            "  fromValue:\n    type: integer",
        ),
    );
    let (code, out) = engine.json(&["plan", "bp.yaml", "--instance", "x"]);
    assert_eq!(code, 1, "{out}");
    let text = out.to_string();
    assert!(
        text.contains("export `fromValue` declares type integer but `values.greeting` is a string"),
        "{text}"
    );
    assert!(text.contains("T0706"), "{text}");

    write(&root.join("bp.yaml"), EXPORTS);
    let (code, out) = engine.json(&["destroy", "--instance", "x"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(files_below(root.path()), before);
}

/// A resource's state read by an export is typed when it arrives: a mismatch found only after
/// deploy fails the operation with the export named, not silently.
#[test]
fn an_export_whose_value_arrives_with_the_wrong_type_fails_the_deploy() {
    let root = TempDir::new("feat-export-late");
    write(
        &root.join("bp.yaml"),
        "version: 2023-04-20\nresources:\n  notes:\n    type: local/file\n    spec:\n      \
         path: notes.txt\n      content: hi\nexports:\n  size:\n    type: string\n    \
         field: resources.notes.state.size\n",
    );
    let engine = Engine::start(root.path());
    let (code, out) = engine.json(&["deploy", "bp.yaml", "--instance", "x"]);
    assert_eq!(code, 1, "{out}");
    let text = out.to_string();
    assert!(
        text.contains("export `size` is declared string, but its field holds an integer"),
        "{text}"
    );
    let (code, out) = engine.json(&["destroy", "--instance", "x"]);
    assert_eq!(code, 0, "{out}");
    assert!(!root.join("notes.txt").exists());
}

const TEMPLATES: &str = r#"
version: 2023-04-20
variables:
  env:
    type: string
    default: staging
  names:
    type: string
    default: '["a", "b", "c"]'
resources:
  dir:
    type: local/directory
    spec:
      path: out
  files:
    type: local/file
    each: ${jsondecode(variables.names)}
    spec:
      path: ${resources.dir.spec.path}/${elem}-${i}.txt
      content: file ${elem}
  prodOnly:
    type: local/file
    condition: ${eq(variables.env, "production")}
    spec:
      path: ${resources.dir.spec.path}/prod.txt
      content: production only
"#;

#[test]
fn conditions_and_each_shape_the_plan() {
    let root = TempDir::new("feat-each");
    write(&root.join("bp.yaml"), TEMPLATES);
    let engine = Engine::start(root.path());

    let first = [
        "plan",
        "bp.yaml",
        "--instance",
        "t",
        "--request-id",
        "plan-t",
    ];
    let (code, plan) = engine.json(&first);
    assert_eq!(code, 0, "{plan}");
    // A retry with the request id is the same change set; the id with other variables is not
    // accepted.
    let (_, again) = engine.json(&first);
    assert_eq!(again["changeSet"]["id"], plan["changeSet"]["id"]);
    let mut other = first.to_vec();
    other.extend(["--var", "env=production"]);
    let out = engine.cli(&other);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("already used"), "{stderr}");
    // One resource per element; the false condition leaves `prodOnly` out.
    assert_eq!(
        actions(&plan["changeSet"]["resources"]),
        pairs(&[
            ("dir", "CREATE"),
            ("files_0", "CREATE"),
            ("files_1", "CREATE"),
            ("files_2", "CREATE")
        ])
    );
    let (code, out) = engine.json(&["deploy", "bp.yaml", "--instance", "t"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(read(&root.join("out/b-1.txt")), "file b");
    assert!(!root.join("out/prod.txt").exists());

    // One element fewer and the condition true: the last element goes, `prodOnly` comes.
    let (code, plan) = engine.json(&[
        "plan",
        "bp.yaml",
        "--instance",
        "t",
        "--var",
        "env=production",
        "--var",
        r#"names=["a", "b"]"#,
    ]);
    assert_eq!(code, 0, "{plan}");
    assert_eq!(
        actions(&plan["changeSet"]["resources"]),
        pairs(&[
            ("dir", "NO_CHANGE"),
            ("files_0", "NO_CHANGE"),
            ("files_1", "NO_CHANGE"),
            ("prodOnly", "CREATE"),
            ("files_2", "DELETE")
        ])
    );
    let id = plan["changeSet"]["id"].as_str().unwrap();
    let (code, out) = engine.json(&["deploy", "--change-set", id]);
    assert_eq!(code, 0, "{out}");
    assert!(!root.join("out/c-2.txt").exists());
    assert_eq!(read(&root.join("out/prod.txt")), "production only");

    let (code, out) = engine.json(&["destroy", "--instance", "t"]);
    assert_eq!(code, 0, "{out}");
    assert!(!root.join("out").exists());
}

#[test]
fn includes_nested_past_the_depth_limit_are_refused_with_the_chain() {
    let root = TempDir::new("feat-depth");
    // level0 includes level1 ... includes level10: eleven documents, ten levels of nesting.
    for n in 0..=10 {
        let text = if n < 10 {
            format!(
                "version: 2023-04-20\ninclude:\n  next:\n    path: level{}.yaml\nresources:\n  \
                 own:\n    type: sim/resource\n    spec:\n      latencyMs: 0\n",
                n + 1
            )
        } else {
            "version: 2023-04-20\nresources:\n  leaf:\n    type: local/directory\n    spec:\n      \
             path: leaf\n"
                .to_owned()
        };
        write(&root.join(&format!("level{n}.yaml")), &text);
    }
    let engine = Engine::start(root.path());
    let (code, out) = engine.json(&["plan", "level0.yaml", "--instance", "deep"]);
    assert_eq!(code, 1, "{out}");
    let text = out.to_string();
    assert!(text.contains("nest deeper than 8 levels"), "{text}");
    assert!(text.contains("level7.yaml -> level8.yaml"), "{text}");
    assert!(!root.join("leaf").exists());

    // Eight levels are fine.
    let (code, out) = engine.json(&["deploy", "level2.yaml", "--instance", "ok"]);
    assert_eq!(code, 0, "{out}");
    assert!(root.join("leaf").is_dir());
    let (code, out) = engine.json(&["destroy", "--instance", "ok"]);
    assert_eq!(code, 0, "{out}");
    assert!(!root.join("leaf").exists());
}

/// A value the provider reports as sensitive stays secret when another resource reads it,
/// through `.state` or through a computed `.spec` field: the reader's spec is stored marked,
/// and neither `trellis instance` nor a plan shows it.
#[test]
fn secrets_a_provider_reports_stay_secret_in_the_resources_that_read_them() {
    let root = TempDir::new("feat-secret-state");
    let blueprint = |greeting: &str| {
        format!(
            "version: 2023-04-20\nresources:\n  key:\n    type: local/randomSecret\n    spec:\n      \
             length: 24\n  copy:\n    type: local/file\n    spec:\n      path: copy.txt\n      \
             content: \"{greeting} ${{resources.key.state.value}}\"\n"
        )
    };
    write(&root.join("bp.yaml"), &blueprint("first"));
    let engine = Engine::start(root.path());
    let (code, out) = engine.json(&["deploy", "bp.yaml", "--instance", "s"]);
    assert_eq!(code, 0, "{out}");
    let written = read(&root.join("copy.txt"));
    let secret = written.trim_start_matches("first ").to_owned();
    assert_eq!(secret.len(), 24, "{written}");

    let inst = engine.instance("s");
    assert!(!inst.to_string().contains(&secret), "secret shown: {inst}");
    assert_eq!(
        inst["resources"]["copy"]["spec"]["content"],
        json!({"sensitive": true}),
        "{inst}"
    );

    // A change to the reader: the plan shows neither the old nor the new content.
    write(&root.join("bp.yaml"), &blueprint("second"));
    let (code, plan) = engine.json(&["plan", "bp.yaml", "--instance", "s"]);
    assert_eq!(code, 0, "{plan}");
    assert!(!plan.to_string().contains(&secret), "secret shown: {plan}");
    let text = engine.cli(&["plan", "bp.yaml", "--instance", "s"]);
    assert!(!String::from_utf8_lossy(&text.stdout).contains(&secret));

    let (code, out) = engine.json(&["destroy", "--instance", "s"]);
    assert_eq!(code, 0, "{out}");
}

/// A `local/file` data source filtered on the parsed JSON of the files (`json.<path>`): the
/// rows of the specification's operator tables for numbers, booleans, arrays and mappings
/// (the string rows are in `engine_e2e.rs`), and combinations the tables do not list, which
/// are errors.
#[test]
fn data_source_operators_over_numbers_booleans_arrays_and_mappings() {
    let root = TempDir::new("feat-ds-json");
    // The provider lists the engine's working directory: these two files, in this order.
    let site = root.join("site");
    write(
        &site.join("a.json"),
        r#"{"port": 80, "ratio": 1.0, "public": false, "tags": ["web", "prod"], "labels": {"env": "prod", "team": "core"}}"#,
    );
    write(
        &site.join("b.json"),
        r#"{"port": 443, "ratio": 0.5, "public": true, "tags": ["db"], "labels": {"env": "dev"}}"#,
    );
    let engine = Engine::builder(root.path()).cwd(&site).start();
    let bp = root.join("ds.yaml");
    let blueprint = |field: &str, operator: &str, search: &str| {
        format!(
            "version: 2023-04-20\ndatasources:\n  picked:\n    type: local/file\n    filter:\n      \
             field: {field}\n      operator: \"{operator}\"\n      search: {search}\n    exports:\n      \
             name:\n        type: string\nresources:\n  copy:\n    type: local/file\n    spec:\n      \
             path: copy.txt\n      content: ${{datasources.picked.name}}\n"
        )
    };
    let plan_of = |field: &str, operator: &str, search: &str| {
        write(&bp, &blueprint(field, operator, search));
        engine.json(&["plan", bp.to_str().unwrap(), "--instance", "ds"])
    };
    // (field, operator, search) and the file the first match must be.
    for (field, op, search, expected) in [
        ("json.port", "=", "443", "b.json"),
        ("json.ratio", "=", "1", "a.json"),
        ("json.public", "=", "true", "b.json"),
        ("json.public", "!=", "false", "b.json"),
        ("json.tags", "=", "[db]", "b.json"),
        ("json.tags", "!=", "[db]", "a.json"),
        ("json.port", "in", "[443, 8443]", "b.json"),
        ("json.port", "not in", "[80]", "b.json"),
        ("json.tags", "contains", "prod", "a.json"),
        ("json.tags", "not contains", "web", "b.json"),
        ("json.labels", "contains", "core", "a.json"),
        ("json.labels", "not contains", "core", "b.json"),
        ("json.labels", "has key", "team", "a.json"),
        ("json.labels", "not has key", "team", "b.json"),
    ] {
        let (code, plan) = plan_of(field, op, search);
        assert_eq!(code, 0, "{field} {op} {search}: {plan}");
        let content = planned_new(&plan, 0, "spec.content");
        assert_eq!(
            content,
            Some(json!(expected)),
            "{field} {op} {search}: {plan}"
        );
    }
    // Not in the tables: an error naming the filter, the types and what the operator takes.
    for (field, op, search, types) in [
        (
            "json.port",
            "=",
            "\"443\"",
            "the field `json.port` is integer and the search is string",
        ),
        (
            "json.tags",
            "in",
            "[db]",
            "the field `json.tags` is array[string]",
        ),
        (
            "json.port",
            "contains",
            "4",
            "the field `json.port` is integer",
        ),
        ("json.labels", "has key", "1", "the search is integer"),
        (
            "json.ratio",
            "starts with",
            "\"1\"",
            "the field `json.ratio` is float",
        ),
    ] {
        let (code, out) = plan_of(field, op, search);
        assert_eq!(code, 1, "{field} {op} {search}: {out}");
        let text = out.to_string();
        assert!(text.contains("T1003"), "{field} {op} {search}: {text}");
        assert!(text.contains(types), "{field} {op} {search}: {text}");
    }
}

/// A link annotation written with `${..}` whose type is known only once evaluated is checked
/// at plan time against the link type's definition, before anything is deployed.
#[test]
fn evaluated_link_annotations_are_checked_against_the_link_type() {
    let root = TempDir::new("feat-annotation");
    let blueprint = |name: &str| {
        format!(
            "version: 2023-04-20\nresources:\n  config:\n    type: local/file\n    metadata:\n      \
             labels:\n        app: demo\n      annotations:\n        local.envFile.name: {name}\n    \
             spec:\n      path: config.txt\n      content: hello\n  env:\n    type: local/envFile\n    \
             linkSelector:\n      byLabel:\n        app: demo\n    spec:\n      path: app.env\n"
        )
    };
    let engine = Engine::start(root.path());
    // `jsondecode` has no static type: only the evaluated value shows it is not a string.
    write(&root.join("bp.yaml"), &blueprint("'${jsondecode(\"3\")}'"));
    let (code, out) = engine.json(&["plan", "bp.yaml", "--instance", "a"]);
    assert_eq!(code, 1, "{out}");
    let text = out.to_string();
    assert!(
        text.contains(
            "annotation `local.envFile.name` of resource `config` must be a string, found an \
             integer"
        ),
        "{text}"
    );
    assert!(text.contains("bp.yaml:9"), "{text}");
    // Evaluated to a string: fine, and the link uses it.
    write(
        &root.join("bp.yaml"),
        &blueprint("'${jsondecode(\"\\\"settings\\\"\")}'"),
    );
    let (code, out) = engine.json(&["deploy", "bp.yaml", "--instance", "a"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        read(&root.join("app.env")).contains("SETTINGS"),
        "{}",
        read(&root.join("app.env"))
    );
    let (code, out) = engine.json(&["destroy", "--instance", "a"]);
    assert_eq!(code, 0, "{out}");
}

//! End-to-end tests of the `trellis` binary: exit codes, output shapes,
//! rendering. They run the real executable Cargo built for this test run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn trellis() -> Command {
    Command::new(env!("CARGO_BIN_EXE_trellis"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("trellis-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn the_eval_example_is_statically_valid() {
    let out = trellis()
        .args([
            "validate",
            "--skip-provider-checks",
            "examples/orders-api.yaml",
        ])
        .current_dir(repo())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains("ok: 1 file valid"));
}

/// With provider checks skipped, provider functions are unknown: a call to a function that is
/// not a core one is a warning (it may be a provider's). With the checks it is an error (the
/// conformance corpus, which validates with core functions only, holds those cases).
#[test]
fn unknown_functions_are_warnings_when_provider_checks_are_skipped() {
    let dir = temp_dir("unchecked-fn");
    let path = write(
        &dir,
        "bp.yaml",
        "version: 2023-04-20\nresources:\n  a:\n    type: x/y\n    spec:\n      n: ${sha256(\"x\")}\n",
    );
    let out = trellis()
        .args(["validate", "--skip-provider-checks", &path])
        .output()
        .unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("warning[T0510]"), "{text}");
    assert!(text.contains("may be a provider function"), "{text}");
    let out = trellis()
        .args([
            "validate",
            "--skip-provider-checks",
            "--format",
            "json",
            &path,
        ])
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains("\"severity\":\"warning\""),
        "{}",
        stdout(&out)
    );
}

#[test]
fn errors_exit_1_with_rustc_style_text() {
    let dir = temp_dir("text");
    let path = write(
        &dir,
        "bp.yaml",
        "version: 2023-04-20\nresources:\n  a:\n    type: x/y\n    spec:\n      n: ${variables.missing}\n",
    );
    let out = trellis()
        .args(["validate", "--skip-provider-checks", &path])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains("error[T0501]: unknown variable `missing`"),
        "{text}"
    );
    assert!(text.contains(&format!("--> {path}:6:22")), "{text}");
    assert!(text.contains("6 |       n: ${variables.missing}"), "{text}");
    let caret = format!("  | {}^^^^^^^\n", " ".repeat(21));
    assert!(text.contains(&caret), "{text}");
    assert!(
        text.contains("error: validation failed: 1 error, 0 warnings in 1 file"),
        "{text}"
    );
}

#[test]
fn json_output_has_the_documented_shape() {
    let dir = temp_dir("json");
    let path = write(
        &dir,
        "bp.json",
        "{\"version\": \"2023-04-20\", // comment\n \"resources\": {\"a\": {\"type\": \"x/y\", \"spec\": {\"n\": \"${values.nope}\"},},}}",
    );
    let out = trellis()
        .args([
            "validate",
            "--skip-provider-checks",
            "--format",
            "json",
            &path,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("one JSON object");
    assert_eq!(v["valid"], false);
    let d = &v["diagnostics"][0];
    assert_eq!(d["severity"], "error");
    assert_eq!(d["code"], "T0502");
    assert_eq!(d["file"], path.as_str());
    assert_eq!(
        (d["line"].as_u64(), d["column"].as_u64()),
        (Some(2), Some(61))
    );
    assert_eq!(
        (d["end_line"].as_u64(), d["end_column"].as_u64()),
        (Some(2), Some(65))
    );
    assert!(d["message"].as_str().unwrap().contains("nope"));
}

#[test]
fn several_files_are_reported_together() {
    let dir = temp_dir("multi");
    let good = write(
        &dir,
        "good.yaml",
        "version: 2023-04-20\nresources:\n  a:\n    type: x/y\n    spec: {}\n",
    );
    let bad = write(&dir, "bad.yaml", "version: 2023-01-01\n");
    let out = trellis()
        .args([
            "validate",
            "--skip-provider-checks",
            "--format",
            "json",
            &good,
            &bad,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let codes: Vec<&str> = v["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["code"].as_str().unwrap())
        .collect();
    // Sorted by position: "nothing to deploy" points at the start of the file.
    assert_eq!(codes, ["T0305", "T0304"]);
    assert!(
        v["diagnostics"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["file"] == bad.as_str())
    );
}

#[test]
fn unreadable_files_and_bad_flags_exit_2() {
    let out = trellis()
        .args(["validate", "--skip-provider-checks", "/nonexistent/bp.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/bp.yaml"));
    let out = trellis()
        .args([
            "validate",
            "--skip-provider-checks",
            "--format",
            "xml",
            "x.yaml",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = trellis()
        .args([
            "validate",
            "--skip-provider-checks",
            "--var",
            "novalue",
            "x.yaml",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = trellis()
        .args(["validate", "--skip-provider-checks", "/"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn oversize_input_is_refused_cleanly() {
    let dir = temp_dir("size");
    let path = write(
        &dir,
        "big.yaml",
        &format!("version: 2023-04-20\n# {}\n", "x".repeat(2000)),
    );
    let out = trellis()
        .args([
            "validate",
            "--max-input-size",
            "1000",
            "--format",
            "json",
            &path,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["diagnostics"][0]["code"], "T0101");
    let out = trellis()
        .args([
            "validate",
            "--skip-provider-checks",
            "--format",
            "json",
            &path,
        ])
        .env("TRELLIS_MAX_INPUT_SIZE", "100")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn secret_inputs_are_never_echoed() {
    let dir = temp_dir("secret");
    let path = write(
        &dir,
        "bp.yaml",
        "version: 2023-04-20\nvariables:\n  pin:\n    type: integer\n    secret: true\nresources:\n  a:\n    type: x/y\n    spec: {}\n",
    );
    let out = trellis()
        .args([
            "validate",
            "--skip-provider-checks",
            "--var",
            "pin=hunter2",
            &path,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(text.contains("T0406"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

#[test]
fn explain_describes_codes_and_the_docs_page_matches_the_registry() {
    let out = trellis().args(["explain", "T0501"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("unknown-variable"));
    let out = trellis().args(["explain", "T9999"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = trellis().args(["explain", "--all"]).output().unwrap();
    let page = std::fs::read_to_string(repo().join("docs/diagnostics.md")).unwrap();
    assert_eq!(
        stdout(&out),
        page,
        "docs/diagnostics.md is stale: regenerate it with `trellis explain --all > docs/diagnostics.md`"
    );
}

fn eval_json(args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let out = trellis()
        .arg("eval")
        .args(args)
        .args(["--format", "json"])
        .current_dir(repo())
        .output()
        .unwrap();
    let text = stdout(&out);
    let v = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
    (out.status.code(), v)
}

#[test]
fn eval_prints_the_documented_json_shapes() {
    let (code, v) = eval_json(&[
        "${map(split(variables.x, \",\"), to_upper)}",
        "--var",
        "x=a,b",
    ]);
    assert_eq!(
        (code, v),
        (Some(0), serde_json::json!({"value": ["A", "B"]}))
    );
    let bp = "examples/orders-api.yaml";
    let (code, v) = eval_json(&["--blueprint", bp, "${resources.ordersTable.state.arn}"]);
    assert_eq!((code, v), (Some(0), serde_json::json!({"unknown": true})));
    let (code, v) = eval_json(&["--blueprint", bp, "${variables.databasePassword}"]);
    assert_eq!((code, v), (Some(0), serde_json::json!({"sensitive": true})));
    let (code, v) = eval_json(&["${substr(\"abc\", \"1\")}"]);
    assert_eq!(code, Some(1));
    let d = &v["diagnostics"][0];
    assert_eq!(d["code"], "T0701");
    assert!(
        d["message"]
            .as_str()
            .unwrap()
            .contains("`substr` argument 2"),
        "{d}"
    );
    assert_eq!(
        (d["line"].as_u64(), d["column"].as_u64()),
        (Some(1), Some(17))
    );
    let (code, v) = eval_json(&["${datetime(\"rfc3339\")}", "--now", "1681985730"]);
    assert_eq!(
        (code, v),
        (
            Some(0),
            serde_json::json!({"value": "2023-04-20T10:15:30Z"})
        )
    );
}

#[test]
fn eval_expand_shows_each_conditions_and_masks_secrets() {
    let (code, v) = eval_json(&[
        "--blueprint",
        "examples/orders-api.yaml",
        "--expand",
        "--var",
        "environment=production",
    ]);
    assert_eq!(code, Some(0));
    let resources = v["resources"].as_array().unwrap();
    let names: Vec<&str> = resources
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "ordersTable",
            "buckets_0",
            "buckets_1",
            "debugBucket",
            "saveOrderFunction"
        ]
    );
    assert_eq!(
        resources[2]["spec"]["bucketName"],
        "orders-production-invoices-1"
    );
    assert_eq!(resources[2]["index"], 1);
    assert_eq!(resources[3]["exists"], false);
    let env = &resources[4]["spec"]["environment"]["variables"];
    assert_eq!(env["DATABASE_PASSWORD"], "(sensitive)");
    assert_eq!(env["FIRST_BUCKET"], "orders-production-orders-0");
    assert!(!v.to_string().contains("change-me"));
}

#[test]
fn eval_reports_missing_required_variables() {
    let dir = temp_dir("required");
    let path = write(
        &dir,
        "bp.yaml",
        "version: 2023-04-20\nvariables:\n  region:\n    type: string\nresources:\n  a:\n    type: x/y\n    spec:\n      r: ${variables.region}\n",
    );
    let (code, v) = eval_json(&["--blueprint", &path, "${1}"]);
    assert_eq!(code, Some(1));
    assert_eq!(v["diagnostics"][0]["code"], "T0707");
    assert_eq!(v["diagnostics"][0]["line"], 3);
    let (code, v) = eval_json(&[
        "--blueprint",
        &path,
        "${variables.region}",
        "--var",
        "region=eu",
    ]);
    assert_eq!((code, v), (Some(0), serde_json::json!({"value": "eu"})));
}

#[test]
fn eval_expand_masks_annotations_that_read_secrets() {
    let dir = temp_dir("annotation-secret");
    let path = write(
        &dir,
        "bp.yaml",
        "version: 2023-04-20\nvariables:\n  token:\n    type: string\n    secret: true\n    \
         default: hunter2-Zq8v\nresources:\n  a:\n    type: x/y\n    metadata:\n      \
         annotations:\n        x.auth: \"Bearer ${variables.token}\"\n        x.plain: open\n    \
         spec:\n      r: 1\n",
    );
    let (code, v) = eval_json(&["--blueprint", &path, "--expand"]);
    assert_eq!(code, Some(0), "{v}");
    let annotations = &v["resources"][0]["metadata"]["annotations"];
    assert_eq!(annotations["x.auth"], "(sensitive)", "{v}");
    assert_eq!(annotations["x.plain"], "open", "{v}");
    assert!(!v.to_string().contains("hunter2"), "{v}");
}

/// Issue 21, items 3 and 8: `trellis validate` checks what an include passes against the
/// local child file (read relative to the including file): a child `string` variable given
/// 42, literally or through an integer variable, is T0406 at the value, and a variable the
/// child requires but the include leaves out is T0707 at the include. A child file that
/// cannot be read is not checked (plan reports it). With and without provider checks.
#[test]
fn include_variables_are_checked_against_a_local_child_file() {
    let dir = temp_dir("include-vars");
    let sub = dir.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    write(
        &sub,
        "child.yaml",
        "version: 2023-04-20\nvariables:\n  name:\n    type: string\n  port:\n    type: integer\nresources:\n  t:\n    type: x/y\n    spec:\n      n: ${variables.name}\n",
    );
    let parent = write(
        &sub,
        "parent.yaml",
        "version: 2023-04-20
variables:
  port:
    type: integer
    default: 8080
include:
  core:
    path: ./child.yaml
    variables:
      name: 42
  viaVariable:
    path: ./child.yaml
    variables:
      name: ${variables.port}
      port: 1
  fine:
    path: child.yaml
    variables:
      name: orders
      port: ${variables.port}
  absent:
    path: ./absent.yaml
    variables:
      name: 42
resources:
  a:
    type: x/y
    spec:
      n: 1
",
    );
    let empty_plugins = dir.join("plugins");
    std::fs::create_dir_all(&empty_plugins).unwrap();
    let with_providers: Vec<String> = vec![
        "--no-bundled-plugins".into(),
        "--plugin-dir".into(),
        empty_plugins.to_string_lossy().into_owned(),
        "--data-dir".into(),
        dir.join("data").to_string_lossy().into_owned(),
    ];
    for mode in [vec!["--skip-provider-checks".to_owned()], with_providers] {
        let out = trellis()
            .arg("validate")
            .args(&mode)
            .args(["--format", "json", &parent])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{mode:?}: {}", stdout(&out));
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("one JSON object");
        let found: Vec<(&str, u64, &str)> = v["diagnostics"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| matches!(d["code"].as_str(), Some("T0406" | "T0707")))
            .map(|d| {
                (
                    d["code"].as_str().unwrap(),
                    d["line"].as_u64().unwrap(),
                    d["message"].as_str().unwrap(),
                )
            })
            .collect();
        let codes: Vec<(&str, u64)> = found.iter().map(|(c, l, _)| (*c, *l)).collect();
        assert_eq!(
            codes,
            [("T0707", 7), ("T0406", 10), ("T0406", 14)],
            "{mode:?}: {found:?}"
        );
        assert!(found[0].2.contains("`port`"), "{}", found[0].2);
        assert!(found[1].2.contains("declares as string"), "{}", found[1].2);
        assert!(found[2].2.contains("declares as string"), "{}", found[2].2);
    }
}

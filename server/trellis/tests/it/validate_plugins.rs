//! `trellis validate` with real plugin processes: the `local` provider's
//! schemas and own validation, the `celerity-2023-04-20` transformer, and
//! findings mapped to the lines the user wrote.

use crate::plugins_common::{TempDir, workspace_binary};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A plugin directory with the real `local` provider and `celerity`
/// transformer, and nothing else.
fn plugin_dir(root: &TempDir) -> PathBuf {
    let dir = root.join("plugins");
    std::fs::create_dir_all(&dir).unwrap();
    for (package, bin) in [
        ("trellis-provider-local", "trellis-provider-local"),
        (
            "trellis-transformer-celerity",
            "trellis-transformer-celerity-2023-04-20",
        ),
    ] {
        let path = workspace_binary(package, bin, "TRELLIS_TEST_NONE");
        std::os::unix::fs::symlink(path, dir.join(bin)).unwrap();
    }
    dir
}

/// Runs `trellis validate --format json` and returns (exit code, [(code, line)], messages).
fn validate(
    root: &TempDir,
    plugins: &Path,
    file: &Path,
) -> (Option<i32>, Vec<(String, u64)>, Vec<String>) {
    let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args([
            "validate",
            "--format",
            "json",
            "--no-bundled-plugins",
            "--plugin-dir",
        ])
        .arg(plugins)
        .arg("--data-dir")
        .arg(root.join("data"))
        .arg(file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let diags = v["diagnostics"].as_array().unwrap();
    (
        out.status.code(),
        diags
            .iter()
            .map(|d| {
                (
                    d["code"].as_str().unwrap().to_owned(),
                    d["line"].as_u64().unwrap(),
                )
            })
            .collect(),
        diags
            .iter()
            .map(|d| d["message"].as_str().unwrap().to_owned())
            .collect(),
    )
}

#[test]
fn the_example_blueprint_is_valid_with_the_bundled_local_provider() {
    let root = TempDir::new("validate-example");
    let plugins = plugin_dir(&root);
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/local-app.yaml");
    let (code, diags, _) = validate(&root, &plugins, &example);
    assert_eq!((code, diags), (Some(0), vec![]));
}

#[test]
fn schemas_provider_validation_and_variable_options_point_at_the_right_lines() {
    let root = TempDir::new("validate-local");
    let plugins = plugin_dir(&root);
    let file = root.join("bp.yaml");
    std::fs::write(
        &file,
        "version: 2023-04-20
variables:
  mode: {type: local/fileMode, default: sharde}
  other: {type: local/nope}
resources:
  f:
    type: local/fiel
    spec: {path: /tmp/x}
  g:
    type: local/file
    spec:
      path: /tmp/y
      mode: \"0777\"
      sha256: abc
      colour: red
  s:
    type: local/randomSecret
    spec:
      length: 3
  h:
    type: local/file
    spec:
      content: ${sha256(1)}
  b:
    type: aws/s3/bucket
    spec: {}
",
    )
    .unwrap();
    let (code, diags, messages) = validate(&root, &plugins, &file);
    assert_eq!(code, Some(1));
    let want: Vec<(String, u64)> = [
        ("T0810", 3),
        ("T0809", 4),
        ("T0802", 7),
        ("T0807", 13),
        ("T0808", 14),
        ("T0804", 15),
        ("T0811", 19),
        ("T0805", 23),
        ("T0701", 23),
        ("T0801", 25),
    ]
    .iter()
    .map(|(c, l)| ((*c).to_owned(), *l))
    .collect();
    assert_eq!(diags, want, "{messages:#?}");
    assert!(
        messages[6].contains("[local.length-out-of-range]"),
        "{}",
        messages[6]
    );
}

#[test]
fn transformer_output_is_validated_and_findings_point_at_the_abstract_resource() {
    let root = TempDir::new("validate-transform");
    let plugins = plugin_dir(&root);
    let file = root.join("bp.yaml");
    std::fs::write(
        &file,
        "version: 2023-04-20
transform: celerity-2023-04-20
resources:
  saveOrder:
    type: celerity/handler
    spec:
      handler: save.handler
      runtime: cobol
      codeLocation: ./orders
",
    )
    .unwrap();
    let (code, diags, messages) = validate(&root, &plugins, &file);
    assert_eq!(code, Some(1));
    // The transformer's own finding, at the field; then the generated
    // aws/lambda/function (no aws provider here), at the abstract resource.
    assert_eq!(
        diags,
        [("T0801".to_owned(), 4), ("T0811".to_owned(), 8)],
        "{messages:#?}"
    );
    assert!(messages[0].contains("generated from `saveOrder` by transform `celerity-2023-04-20`"));
    assert!(messages[1].contains("[celerity.schema.not-allowed]"));
    assert!(
        messages[1].contains("`runtime` must be one of"),
        "{messages:#?}"
    );
}

#[test]
fn a_missing_transformer_is_reported_at_the_transform_field() {
    let root = TempDir::new("validate-no-transform");
    let plugins = plugin_dir(&root);
    let file = root.join("bp.yaml");
    std::fs::write(
        &file,
        "version: 2023-04-20\ntransform: [nope-2024]\nresources:\n  a:\n    type: local/file\n    spec: {path: /tmp/a}\n",
    )
    .unwrap();
    let (code, diags, messages) = validate(&root, &plugins, &file);
    assert_eq!(
        (code, diags),
        (Some(1), vec![("T0814".to_owned(), 2)]),
        "{messages:#?}"
    );
    assert!(messages[0].contains("nope-2024"));
}

#[test]
fn a_missing_transformer_is_reported_at_its_own_entry() {
    let root = TempDir::new("validate-second-transform");
    let plugins = plugin_dir(&root);
    let file = root.join("bp.yaml");
    std::fs::write(
        &file,
        "version: 2023-04-20\ntransform:\n  - celerity-2023-04-20\n  - nope-2024\nresources:\n  a:\n    type: local/file\n    spec: {path: /tmp/a}\n",
    )
    .unwrap();
    let (code, diags, messages) = validate(&root, &plugins, &file);
    // The second entry is the one missing: line 4, not the first entry's line 3.
    assert_eq!(
        (code, diags),
        (Some(1), vec![("T0814".to_owned(), 4)]),
        "{messages:#?}"
    );
    assert!(messages[0].contains("nope-2024"));
}

#[test]
fn provider_functions_are_callable_from_eval() {
    let root = TempDir::new("eval-provider-fn");
    let plugins = plugin_dir(&root);
    let file = root.join("bp.yaml");
    std::fs::write(
        &file,
        "version: 2023-04-20\nvalues:\n  digest:\n    type: string\n    value: ${sha256(\"abc\")}\nresources:\n  a:\n    type: local/file\n    spec:\n      path: /tmp/a\n      content: ${values.digest}\n",
    )
    .unwrap();
    let eval = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
            .arg("eval")
            .args(args)
            .args(["--format", "json", "--no-bundled-plugins", "--plugin-dir"])
            .arg(&plugins)
            .arg("--data-dir")
            .arg(root.join("data"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (
            out.status.code(),
            serde_json::from_str::<serde_json::Value>(text.trim())
                .unwrap_or_else(|e| panic!("{e}: {text}")),
        )
    };
    let digest = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    let (code, v) = eval(&["${to_upper(sha256(\"abc\"))}"]);
    assert_eq!(
        (code, v),
        (Some(0), serde_json::json!({"value": digest.to_uppercase()}))
    );
    let (code, v) = eval(&[
        "--blueprint",
        file.to_str().unwrap(),
        "${resources.a.spec.content}",
    ]);
    assert_eq!((code, v), (Some(0), serde_json::json!({"value": digest})));
    let (code, v) = eval(&["${sha256(1)}"]);
    assert_eq!(code, Some(1));
    assert_eq!(v["diagnostics"][0]["code"], "T0701");
}

#[test]
fn an_installed_provider_that_cannot_start_is_reported_as_unavailable() {
    let root = TempDir::new("validate-unavailable");
    let plugins = plugin_dir(&root);
    crate::plugins_common::script(
        &plugins,
        "trellis-provider-broken",
        "echo 'cannot load config' >&2\nexit 3\n",
    );
    let file = root.join("bp.yaml");
    std::fs::write(
        &file,
        "version: 2023-04-20\nresources:\n  a:\n    type: broken/thing\n    spec: {}\n",
    )
    .unwrap();
    let (code, diags, messages) = validate(&root, &plugins, &file);
    assert_eq!(
        (code, diags),
        (Some(1), vec![("T0815".to_owned(), 4)]),
        "{messages:#?}"
    );
    assert!(
        messages[0].contains("provider `broken` is installed but unavailable"),
        "{}",
        messages[0]
    );
    assert!(
        messages[0].contains("cannot load config"),
        "{}",
        messages[0]
    );
}

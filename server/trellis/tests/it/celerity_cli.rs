//! The celerity transformer through the CLI: the transformed blueprint shown, abstract names in plans and events, and the conformance folder of the Celerity documentation's examples.
//!
//! The conformance folder is `tests/conformance/celerity/<case>/`, written by its
//! `extract.py`: `blueprint.yaml`, `variables.json` when the example reads variables, and
//! `expected.json`, the diagnostics `trellis validate --format json` reports for it
//! (`{"diagnostics": [{"code", "plugin_code"?, "severity", "line"}]}`, in report order; empty
//! when the example is valid; `plugin_code` is the transformer's or provider's own code of a
//! T0811 diagnostic, e.g. `celerity.not-supported`). `TRELLIS_BLESS=1` rewrites expected.json
//! from the actual output: review the diff. Bless or not, a case may carry errors only when it
//! is in [`NOT_SUPPORTED`] and each of its errors has a code of [`NOT_SUPPORTED_CODES`] (or is
//! one of [`KNOWN_GAPS`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::aws_moto::{moto, unique};
use crate::engine_common::{Engine, plugin_dir, write};
use crate::plugins_common::{TempDir, workspace_binary};

const TRANSFORM: &str = "celerity-2023-04-20";

/// `root/plugins` with the end-to-end providers, `aws` and the celerity transformer.
fn celerity_plugins(root: &Path) -> PathBuf {
    let dir = plugin_dir(root);
    for (package, bin) in [
        ("trellis-provider-aws", "trellis-provider-aws"),
        (
            "trellis-transformer-celerity",
            "trellis-transformer-celerity-2023-04-20",
        ),
    ] {
        let link = dir.join(bin);
        if !link.exists() {
            let path = workspace_binary(package, bin, "TRELLIS_TEST_NONE");
            std::os::unix::fs::symlink(path, link).unwrap();
        }
    }
    dir
}

/// `trellis validate` with only the plugins of `plugins`, and `args`.
fn validate(root: &Path, plugins: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trellis"))
        .arg("validate")
        .args(args)
        .arg("--no-bundled-plugins")
        .arg("--plugin-dir")
        .arg(plugins)
        .arg("--data-dir")
        .arg(root.join("data"))
        .current_dir(root)
        .output()
        .expect("run trellis validate")
}

/// One handler, as the transformer turns it into AWS resources.
const HANDLER: &str = "version: 2023-04-20
transform: celerity-2023-04-20
resources:
  saveOrder:
    type: celerity/handler
    spec:
      handler: save.handler
      runtime: python3.12.x
      codeLocation: ./orders
";

fn handler_blueprint(root: &Path) -> PathBuf {
    let file = root.join("orders.yaml");
    write(&file, HANDLER);
    write(
        &root.join("orders/save.py"),
        "def handler(event, context):\n    return {}\n",
    );
    file
}

/// The generated resources of a transformed blueprint, with what `derivedFrom` says of each.
fn derived(transformed: &Value) -> Vec<(String, String, Value)> {
    transformed["blueprint"]["resources"]
        .as_object()
        .expect("resources")
        .iter()
        .map(|(name, r)| {
            (
                name.clone(),
                r["type"].as_str().unwrap_or_default().to_owned(),
                transformed["derivedFrom"][name].clone(),
            )
        })
        .collect()
}

#[test]
fn show_transformed_prints_the_aws_blueprint_with_the_abstract_resource_of_each_resource() {
    let dir = TempDir::new("celerity-show");
    let root = dir.path();
    let plugins = celerity_plugins(root);
    let file = handler_blueprint(root);
    let path = file.to_str().unwrap();

    let out = validate(
        root,
        &plugins,
        &["--show-transformed", "--format", "json", path],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(out.status.code(), Some(0), "{v:#}");
    let shown = &v["transformed"];
    assert_eq!(shown.as_array().map(Vec::len), Some(1), "{v:#}");
    let shown = &shown[0];
    assert_eq!(shown["file"], json!(path));
    assert_eq!(shown["transforms"], json!([TRANSFORM]));
    // An ordinary blueprint: every resource an AWS one generated from the handler, and a
    // function among them.
    assert_eq!(
        shown["blueprint"]["version"],
        json!("2023-04-20"),
        "{shown:#}"
    );
    let resources = derived(shown);
    assert!(
        resources
            .iter()
            .any(|(_, ty, _)| ty == "aws/lambda/function"),
        "{shown:#}"
    );
    for (name, ty, from) in &resources {
        assert!(ty.starts_with("aws/"), "{name}: {ty}");
        assert_eq!(
            from,
            &json!({"resource": "saveOrder", "transform": TRANSFORM}),
            "{name}"
        );
    }

    // As YAML: a comment above each generated resource names where it came from, and the
    // document reads back as the same blueprint.
    let out = validate(root, &plugins, &["--show-transformed", path]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.starts_with(&format!("# {path} after transform {TRANSFORM}\n")),
        "{text}"
    );
    for (name, _, _) in &resources {
        assert!(
            text.contains(&format!("  # from saveOrder ({TRANSFORM})\n  {name}:\n")),
            "{name} in:\n{text}"
        );
    }
    assert!(text.trim_end().ends_with("ok: 1 file valid"), "{text}");
    let yaml = text.split("\nok: 1 file valid").next().unwrap();
    write(&root.join("shown.yaml"), yaml);
    let again = validate(
        root,
        &plugins,
        &["--show-transformed", "--format", "json", "shown.yaml"],
    );
    let again: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(
        again["transformed"][0]["blueprint"], shown["blueprint"],
        "the YAML is the transformed blueprint"
    );

    // Without the flag the output is as before.
    let plain = validate(root, &plugins, &["--format", "json", path]);
    let plain: Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert!(plain.get("transformed").is_none(), "{plain:#}");
}

#[test]
fn show_transformed_needs_the_plugins() {
    let dir = TempDir::new("celerity-show-skip");
    let root = dir.path();
    let file = handler_blueprint(root);
    let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["validate", "--show-transformed", "--skip-provider-checks"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot be used with"),
        "{out:?}"
    );
}

/// An engine with the celerity plugins, its AWS provider pointed at `endpoint`.
fn engine(root: &Path, endpoint: &str) -> Engine {
    celerity_plugins(root);
    crate::aws_e2e::engine_at(root, endpoint)
}

#[test]
fn plans_and_events_name_the_abstract_resource_of_each_generated_one() {
    let dir = TempDir::new("celerity-plan");
    let root = dir.path();
    // Planning calls no provider: without moto the endpoint is never reached.
    let m = moto();
    let endpoint = m.map_or("http://127.0.0.1:9".to_owned(), |m| m.endpoint.clone());
    let engine = engine(root, &endpoint);
    handler_blueprint(root);
    // Names unique per run: moto is shared between tests.
    let blueprint = HANDLER.replace(
        "      handler: save.handler\n",
        &format!(
            "      handlerName: {}\n      handler: save.handler\n",
            unique("save-order")
        ),
    );
    write(&root.join("orders.yaml"), &blueprint);

    let (code, plan) = engine.json(&["plan", "orders.yaml", "--instance", "orders"]);
    assert_eq!(code, 0, "{plan:#}");
    let resources = plan["changeSet"]["resources"]
        .as_array()
        .expect("resources");
    assert!(!resources.is_empty(), "{plan:#}");
    for r in resources {
        assert_eq!(r["action"], json!("CREATE"), "{r:#}");
        assert_eq!(
            r["derivedFrom"],
            json!({"resource": "saveOrder", "transform": TRANSFORM}),
            "{r:#}"
        );
    }
    let function = resources
        .iter()
        .find(|r| r["type"] == json!("aws/lambda/function"))
        .unwrap_or_else(|| panic!("a function in {plan:#}"));
    let function = function["name"].as_str().unwrap().to_owned();

    // The text plan shows both names on the resource's line.
    let out = engine.cli(&["plan", "orders.yaml", "--instance", "orders"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "+ {function}  (aws/lambda/function)  from saveOrder ({TRANSFORM})\n"
        )),
        "{text}"
    );

    // Deploying needs AWS: moto stands in for it.
    let Some(_) = m else { return };
    let out = engine.cli(&["deploy", "orders.yaml", "--instance", "orders"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = engine.events("orders");
    let about: Vec<&(String, Value)> = events
        .iter()
        .filter(|(kind, _)| kind.starts_with("resource."))
        .collect();
    assert!(
        about
            .iter()
            .any(|(kind, p)| kind == "resource.created" && p["resource"] == json!(function)),
        "{events:#?}"
    );
    for (kind, payload) in &about {
        assert_eq!(
            payload["derivedFrom"],
            json!({"resource": "saveOrder", "transform": TRANSFORM}),
            "{kind}: {payload:#}"
        );
    }
    // And the event lines of `trellis events` show both.
    let out = engine.cli(&["events", "--instance", "orders"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains(&format!(
            "resource.created  {function}  (aws/lambda/function)  from saveOrder ({TRANSFORM})"
        )),
        "{text}"
    );
    let out = engine.cli(&["destroy", "--instance", "orders"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

fn conformance_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance/celerity")
}

/// The plugin's own code of a T0811 diagnostic: the `[celerity.xxx]` the engine puts after
/// the transform's or resource's name in the message, before the `: ` of the plugin's text.
fn plugin_code(message: &str) -> Option<&str> {
    message.match_indices(" [").find_map(|(at, _)| {
        let rest = &message[at + 2..];
        let end = rest.find("]: ")?;
        let code = &rest[..end];
        (!code.is_empty() && !code.contains(' ')).then_some(code)
    })
}

/// The plugin codes an example's error may have when the example uses a feature the AWS
/// target reports as not supported yet (docs/celerity/*.md, "Not supported yet").
const NOT_SUPPORTED_CODES: &[&str] = &["celerity.not-supported"];

/// The cases whose examples use such a feature, and which. Any other case must validate with
/// no error; these may carry errors of [`NOT_SUPPORTED_CODES`] only.
const NOT_SUPPORTED: &[(&str, &str)] = &[
    ("api-02", "custom domains"),
    ("api-03", "auth guards"),
    ("api-04a", "WebSocket, auth guards"),
    ("api-04b", "WebSocket, auth guards"),
    ("api-05", "WebSocket, custom domains"),
    ("api-06", "WebSocket, custom domains"),
    ("api-07a", "auth guards"),
    ("api-07b", "auth guards"),
    ("api-08", "WebSocket, auth guards"),
    ("api-09", "WebSocket, auth guards"),
    ("api-10", "custom domains, auth guards"),
    ("api-11", "WebSocket, custom domains, auth guards"),
    ("api-12", "WebSocket, custom domains, auth guards"),
    ("api-13", "WebSocket, custom domains, auth guards"),
    ("api-14", "WebSocket, auth guards"),
    ("api-15", "WebSocket, auth guards"),
    ("consumer-00", "`sourceId` outside the blueprint"),
    ("handler-02", "auth guards"),
    ("handler-05", "`sourceId` outside the blueprint"),
    ("handler-06", "`sourceId` outside the blueprint"),
    (
        "handler-08",
        "`sourceId` outside the blueprint, WebSocket handlers, auth guards",
    ),
    ("handler-10", "`externalEvents`"),
    ("handler-11", "`externalEvents`"),
    ("handler-config-01", "custom domains"),
];

/// Errors that are neither the example's nor a not-supported feature but a gap of the
/// transformer, accepted (exactly: case, engine code, plugin code or "") until it is closed so
/// that the test stays a guard for every other case. Each is reported in
/// docs/celerity/conformance.md.
const KNOWN_GAPS: &[(&str, &str, &str)] = &[
    // A config listing `plaintext` keys without `values` emits no parameter, so the blueprint
    // is left with no resource.
    ("config-00", "T0305", ""),
];

/// Why `case`'s diagnostics are not acceptable as an expectation, if they are not.
fn unacceptable(case: &str, actual: &[Value]) -> Option<String> {
    let errors: Vec<&Value> = actual.iter().filter(|d| d["severity"] == "error").collect();
    let errors: Vec<&Value> = errors
        .into_iter()
        .filter(|d| {
            !KNOWN_GAPS.iter().any(|(c, code, own)| {
                *c == case
                    && d["code"] == *code
                    && d["plugin_code"].as_str().unwrap_or_default() == *own
            })
        })
        .collect();
    if errors.is_empty() {
        return None;
    }
    let Some((_, feature)) = NOT_SUPPORTED.iter().find(|(name, _)| *name == case) else {
        return Some(format!(
            "{case}: errors in a case not listed in NOT_SUPPORTED: {}",
            Value::Array(errors.into_iter().cloned().collect())
        ));
    };
    let other: Vec<Value> = errors
        .into_iter()
        .filter(|d| {
            !d["plugin_code"]
                .as_str()
                .is_some_and(|c| NOT_SUPPORTED_CODES.contains(&c))
        })
        .cloned()
        .collect();
    (!other.is_empty()).then(|| {
        format!(
            "{case} (not supported: {feature}): errors other than {NOT_SUPPORTED_CODES:?}: {}",
            Value::Array(other)
        )
    })
}

/// `trellis validate --format json` of one case: its diagnostics as (code, severity, line),
/// and the messages (for failure reports).
fn run_case(root: &Path, plugins: &Path, case: &Path) -> (Vec<Value>, Vec<String>) {
    let mut args = vec!["--format", "json"];
    let vars = case.join("variables.json");
    let vars = vars.to_str().unwrap();
    if Path::new(vars).exists() {
        args.extend(["--var-file", vars]);
    }
    let file = case.join("blueprint.yaml");
    let file = file.to_str().unwrap();
    args.push(file);
    let out = validate(root, plugins, &args);
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "{}: not JSON ({e}): {text}\n{}",
            case.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let diags = v["diagnostics"].as_array().cloned().unwrap_or_default();
    (
        diags
            .iter()
            .map(|d| {
                let mut e = json!({"code": d["code"]});
                if let Some(own) = plugin_code(d["message"].as_str().unwrap_or_default()) {
                    e["plugin_code"] = json!(own);
                }
                e["severity"] = d["severity"].clone();
                e["line"] = d["line"].clone();
                e
            })
            .collect(),
        diags
            .iter()
            .map(|d| {
                format!(
                    "{} {}:{}: {}",
                    d["code"].as_str().unwrap_or_default(),
                    d["file"].as_str().unwrap_or_default(),
                    d["line"],
                    d["message"].as_str().unwrap_or_default()
                )
            })
            .collect(),
    )
}

#[test]
fn the_celerity_documentation_examples_validate_as_expected() {
    let dir = TempDir::new("celerity-conformance");
    let root = dir.path();
    let plugins = celerity_plugins(root);
    let mut cases: Vec<PathBuf> = std::fs::read_dir(conformance_root())
        .expect("tests/conformance/celerity exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 40,
        "the extracted examples: run tests/conformance/celerity/extract.py"
    );
    let bless = std::env::var_os("TRELLIS_BLESS").is_some();
    let mut failures = Vec::new();
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let (actual, messages) = run_case(root, &plugins, case);
        let expected_path = case.join("expected.json");
        let expected: Option<Value> = std::fs::read_to_string(&expected_path)
            .ok()
            .map(|t| serde_json::from_str(&t).unwrap_or_else(|e| panic!("{name}: {e}")));
        let want = expected.as_ref().map(|e| e["diagnostics"].clone());
        if let Some(why) = unacceptable(&name, &actual) {
            failures.push(format!("{why}\n    {}", messages.join("\n    ")));
            continue;
        }
        let reason = NOT_SUPPORTED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, feature)| *feature);
        let want_reason = expected.as_ref().and_then(|e| e["not_supported"].as_str());
        if want.as_ref() == Some(&Value::Array(actual.clone())) && want_reason == reason {
            continue;
        }
        if bless {
            let lines: Vec<String> = actual.iter().map(|d| format!("    {d}")).collect();
            let head = reason.map_or(String::new(), |r| {
                format!("\"not_supported\": {},\n", Value::from(r))
            });
            let text = if lines.is_empty() {
                format!("{{{head}\"diagnostics\": []}}\n")
            } else {
                format!("{{{head}\"diagnostics\": [\n{}\n]}}\n", lines.join(",\n"))
            };
            std::fs::write(&expected_path, text).unwrap();
            continue;
        }
        failures.push(format!(
            "{name}{}:\n  expected: {}\n  actual:   {}\n    {}",
            reason.map_or(String::new(), |r| format!(" (not supported: {r})")),
            want.map_or("(no expected.json)".to_owned(), |w| w.to_string()),
            Value::Array(actual),
            messages.join("\n    ")
        ));
    }
    assert!(
        failures.is_empty(),
        "{} of {} celerity cases differ (TRELLIS_BLESS=1 rewrites them; review the diff):\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

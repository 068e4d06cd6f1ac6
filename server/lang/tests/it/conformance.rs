//! The conformance corpus runner: `tests/conformance/validate/<case>/`.
//!
//! Each case directory holds one or more blueprint files (`*.yaml`, `*.yml`,
//! `*.json`, `*.jsonc`) and `expected.json`:
//!
//! ```json
//! { "vars": {"name": "value"},            // optional: --var inputs
//!   "diagnostics": [                      // exactly these, in report order
//!     {"file": "blueprint.yaml", "code": "T0501", "line": 12} ] }
//! ```
//!
//! `file` may be left out when the case has one blueprint file. An empty
//! `diagnostics` list means the blueprint is valid (no diagnostics at all).
//! Every mismatch in every case is reported before the test fails.
//! `TRELLIS_BLESS=1` rewrites expected.json from the actual output — review
//! the diff: a blessed expectation is only as good as the reading of the
//! specification behind it.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use trellis_lang::diag::Diagnostics;
use trellis_lang::document::DEFAULT_MAX_INPUT_BYTES;
use trellis_lang::source::SourceMap;
use trellis_lang::validate::Options;
use trellis_lang::validate::validate_source_with_children;

fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance/validate")
}

fn is_blueprint(p: &Path) -> bool {
    matches!(
        p.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json" | "jsonc")
    ) && p.file_name().is_some_and(|n| n != "expected.json")
}

/// (file, code, line) triples the validator reports for a case.
fn run_case(dir: &Path, vars: &[(String, String)]) -> Vec<(String, String, u32)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| is_blueprint(p))
        .collect();
    files.sort();
    let opts = Options {
        variables: vars,
        ..Options::default()
    };
    let mut sources = SourceMap::new();
    let mut diags = Diagnostics::default();
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(f).unwrap();
        // Local child files are read from the case directory, as `trellis validate` reads
        // them next to the blueprint.
        let read_child = |path: &str| std::fs::read(dir.join(path)).ok();
        validate_source_with_children(
            &mut sources,
            &name,
            bytes,
            &opts,
            DEFAULT_MAX_INPUT_BYTES,
            &read_child,
            &mut diags,
        );
    }
    diags
        .items
        .iter()
        .map(|d| {
            let (start, _) = sources.resolve(d.span);
            (
                sources.get(d.span.file).name.clone(),
                d.code.id.to_owned(),
                start.line,
            )
        })
        .collect()
}

#[test]
fn conformance_corpus() {
    let root = corpus_root();
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("tests/conformance/validate exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    let bless = std::env::var_os("TRELLIS_BLESS").is_some();
    let mut failures = Vec::new();
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let expected_path = case.join("expected.json");
        let expected: Value = match std::fs::read_to_string(&expected_path) {
            Ok(t) => {
                serde_json::from_str(&t).unwrap_or_else(|e| panic!("{name}/expected.json: {e}"))
            }
            Err(_) if bless => json!({"diagnostics": []}),
            Err(e) => panic!("{name}/expected.json: {e}"),
        };
        let vars: Vec<(String, String)> = expected
            .get("vars")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().expect("vars are strings").to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let actual = run_case(case, &vars);
        let single = actual
            .iter()
            .all(|(f, _, _)| f == &actual.first().map(|a| a.0.clone()).unwrap_or_default())
            && std::fs::read_dir(case)
                .unwrap()
                .filter(|e| is_blueprint(&e.as_ref().unwrap().path()))
                .count()
                == 1;
        let want: Vec<(Option<String>, String, u32)> = expected["diagnostics"]
            .as_array()
            .unwrap_or_else(|| panic!("{name}: `diagnostics` must be a list"))
            .iter()
            .map(|d| {
                (
                    d.get("file").and_then(Value::as_str).map(str::to_owned),
                    d["code"]
                        .as_str()
                        .unwrap_or_else(|| panic!("{name}: code"))
                        .to_owned(),
                    d["line"].as_u64().unwrap_or_else(|| panic!("{name}: line")) as u32,
                )
            })
            .collect();
        let matches = want.len() == actual.len()
            && want
                .iter()
                .zip(&actual)
                .all(|((wf, wc, wl), (af, ac, al))| {
                    wf.as_ref().is_none_or(|f| f == af) && wc == ac && wl == al
                });
        if matches {
            continue;
        }
        if bless {
            let diagnostics: Vec<Value> = actual
                .iter()
                .map(|(f, c, l)| {
                    if single {
                        json!({"code": c, "line": l})
                    } else {
                        json!({"file": f, "code": c, "line": l})
                    }
                })
                .collect();
            let mut out = serde_json::Map::new();
            if let Some(v) = expected.get("vars") {
                out.insert("vars".into(), v.clone());
            }
            out.insert("diagnostics".into(), Value::Array(diagnostics));
            std::fs::write(
                &expected_path,
                serde_json::to_string_pretty(&Value::Object(out)).unwrap() + "\n",
            )
            .unwrap();
            continue;
        }
        failures.push(format!(
            "{name}:\n  expected: {:?}\n  actual:   {:?}",
            want.iter()
                .map(|(f, c, l)| format!(
                    "{}{c}@{l}",
                    f.as_deref().map(|f| format!("{f}:")).unwrap_or_default()
                ))
                .collect::<Vec<_>>(),
            actual
                .iter()
                .map(|(f, c, l)| format!("{f}:{c}@{l}"))
                .collect::<Vec<_>>()
        ));
    }
    assert!(
        failures.is_empty(),
        "{} of {} conformance cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    eprintln!("{} conformance cases passed", cases.len());
}

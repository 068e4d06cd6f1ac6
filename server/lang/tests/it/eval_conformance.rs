//! The evaluation corpus runner: `tests/conformance/eval/*.json`.
//!
//! Each file is one group of cases evaluated exactly as `trellis eval` does
//! (through `trellis_lang::eval::console`):
//!
//! ```json
//! { "blueprint": "blueprints/orders.yaml",   // optional, relative to tests/conformance/eval
//!   "vars": {"env": "prod"},                   // optional, --var inputs for every case
//!   "now": 1681985730, "cwd": "/srv/app",      // optional clock (Unix seconds) and working dir
//!   "cases": [
//!     {"expr": "${len(\"héllo\")}", "value": 5},
//!     {"expr": "${resources.a.state.id}", "unknown": true},
//!     {"expr": "${variables.password}", "sensitive": true},
//!     {"expr": "${substr(\"ab\", \"x\")}", "error": "T0701", "message": "substr"},
//!     {"expr": "${variables.x}", "vars": {"x": "1"}, "value": "1"} ] }
//! ```
//!
//! `value` is compared as JSON (unknowns nested in a value are
//! `{"unknown": true}`); `error` is the code of the first error diagnostic,
//! `message` a substring of its message. Every mismatch is reported.

use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use trellis_lang::eval::console::{Console, Outcome};
use trellis_lang::eval::functions::Env;
use trellis_lang::eval::render;
use trellis_lang::eval::value::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance/eval")
}

fn vars_of(v: Option<&Json>) -> Vec<(String, String)> {
    v.and_then(Json::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str().map_or_else(|| v.to_string(), str::to_owned),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn eval_corpus() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root())
        .expect("tests/conformance/eval exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut failures = Vec::new();
    let mut total = 0;
    for file in &files {
        let group = file.file_name().unwrap().to_string_lossy().into_owned();
        let doc: Json = serde_json::from_str(&std::fs::read_to_string(file).unwrap())
            .unwrap_or_else(|e| panic!("{group}: {e}"));
        let blueprint = doc.get("blueprint").and_then(Json::as_str).map(|p| {
            let path = root().join(p);
            (
                p.to_owned(),
                std::fs::read(&path).unwrap_or_else(|e| panic!("{group}: {p}: {e}")),
            )
        });
        let cwd = doc
            .get("cwd")
            .and_then(Json::as_str)
            .unwrap_or("/srv/app")
            .to_owned();
        let now = doc
            .get("now")
            .and_then(Json::as_i64)
            .unwrap_or(1_681_985_730);
        let link = |_: &str, _: &str| Value::Unknown;
        let env = Env {
            cwd: &cwd,
            now_unix_nanos: i128::from(now) * 1_000_000_000,
            link: &link,
        };
        let group_vars = vars_of(doc.get("vars"));
        for (i, case) in doc["cases"]
            .as_array()
            .unwrap_or_else(|| panic!("{group}: cases"))
            .iter()
            .enumerate()
        {
            total += 1;
            let expr = case["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{group} #{i}: expr"));
            let mut vars = group_vars.clone();
            vars.extend(vars_of(case.get("vars")));
            let bp = blueprint.as_ref().map(|(n, b)| (n.as_str(), b.clone()));
            let mut console = Console::new(bp, &vars, &env, 1 << 20);
            let outcome = if console.ready() {
                console.eval(expr, &env)
            } else {
                Outcome::Failed
            };
            let first_error = console.diags.items.iter().find(|d| d.is_error());
            let actual = match &outcome {
                Outcome::Value(v) => format!("value {}", render::to_json(v)),
                Outcome::Unknown => "unknown".to_owned(),
                Outcome::Sensitive(_) => "sensitive".to_owned(),
                Outcome::Failed => match first_error {
                    Some(d) => format!("error {}: {}", d.code.id, d.message),
                    None => "failed without a diagnostic".to_owned(),
                },
            };
            let ok = if let Some(want) = case.get("value") {
                matches!(&outcome, Outcome::Value(v) if render::to_json(v) == *want)
            } else if case.get("unknown").is_some() {
                outcome == Outcome::Unknown
            } else if case.get("sensitive").is_some() {
                matches!(outcome, Outcome::Sensitive(_))
            } else if let Some(code) = case.get("error").and_then(Json::as_str) {
                let message = case.get("message").and_then(Json::as_str).unwrap_or("");
                outcome == Outcome::Failed
                    && first_error.is_some_and(|d| d.code.id == code && d.message.contains(message))
            } else {
                panic!("{group} #{i}: a case needs value, unknown, sensitive or error");
            };
            if !ok {
                failures.push(format!(
                    "{group} #{i} `{expr}`:\n  expected: {}\n  actual:   {actual}",
                    {
                        let mut c = case.clone();
                        if let Some(o) = c.as_object_mut() {
                            o.remove("expr");
                        }
                        c
                    }
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {total} eval cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("{total} eval cases passed");
}

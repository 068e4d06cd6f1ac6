//! End to end: evaluation limits on a real `trellis serve`. Hostile blueprints (strings that
//! double forty times, an `each` over a megabyte, a blueprint copying a large value over and
//! over) are refused with a diagnostic naming the limit, and the engine goes on answering.

use crate::engine_common::{Engine, write};
use crate::plugins_common::TempDir;

/// Forty values, each its predecessor twice over: 64 bytes times 2^40 at the end.
fn doubling() -> String {
    let mut y = String::from("version: 2023-04-20\nvalues:\n  v0:\n    type: string\n");
    y.push_str(&format!("    value: \"{}\"\n", "x".repeat(64)));
    for i in 1..=40 {
        y.push_str(&format!(
            "  v{i}:\n    type: string\n    value: \"${{values.v{p}}}${{values.v{p}}}\"\n",
            p = i - 1
        ));
    }
    y.push_str(
        "resources:\n  r:\n    type: sim/resource\n    spec:\n      payload: ${values.v40}\n",
    );
    y
}

/// A resource per element of `list` split at `delimiter`.
fn each_over(list: &str, delimiter: &str) -> String {
    format!(
        "version: 2023-04-20\nvariables:\n  names:\n    type: string\n    default: \"{list}\"\n\
         resources:\n  f:\n    type: sim/resource\n    each: ${{split(variables.names, \"{delimiter}\")}}\n\
         \x20   spec:\n      payload: ${{elem}}\n"
    )
}

/// `trellis plan FILE`: its exit code and everything it printed.
fn plan(engine: &Engine, file: &str, instance: &str) -> (i32, String) {
    let out = engine.cli(&["plan", file, "--instance", instance]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn assert_refused(engine: &Engine, file: &str, code: &str, also: &str) {
    let (exit, text) = plan(engine, file, file);
    assert_ne!(exit, 0, "{file}: {text}");
    assert!(text.contains(code), "{file}: expected {code}:\n{text}");
    assert!(text.contains(also), "{file}: expected {also:?}:\n{text}");
}

fn assert_answers(engine: &Engine) {
    let (exit, text) = plan(engine, "ok.yaml", "ok");
    assert_eq!(exit, 0, "a normal plan after the hostile ones: {text}");
}

const OK: &str =
    "version: 2023-04-20\nresources:\n  r:\n    type: sim/resource\n    spec:\n      payload: hi\n";

#[test]
fn hostile_blueprints_are_refused_by_the_limits_and_the_engine_keeps_answering() {
    let root = TempDir::new("limits-hostile");
    let engine = Engine::start(root.path());
    write(&root.join("ok.yaml"), OK);
    write(&root.join("doubling.yaml"), &doubling());
    // A megabyte split into characters: a million elements.
    write(
        &root.join("megabyte.yaml"),
        &each_over(&"a".repeat(1_000_000), ""),
    );
    // 30,000 short names: a small list, but more resources than the default 20,000.
    let names: Vec<String> = (0..30_000).map(|i| format!("n{i}")).collect();
    write(&root.join("many.yaml"), &each_over(&names.join(","), ","));

    assert_refused(&engine, "doubling.yaml", "T0709", "--max-value-bytes");
    assert_answers(&engine);
    assert_refused(&engine, "megabyte.yaml", "T0709", "1000000 elements");
    assert_refused(&engine, "many.yaml", "T0710", "--max-resources");
    assert_answers(&engine);
}

#[test]
fn the_limits_are_serve_settings() {
    let root = TempDir::new("limits-settings");
    write(&root.join("trellis.toml"), "max-eval-bytes = 4194304\n");
    let engine = Engine::builder(root.path())
        .args(&["--max-resources", "5", "--config"])
        .args(&[root.join("trellis.toml")])
        .env("TRELLIS_MAX_VALUE_BYTES", "100000")
        .start();
    write(&root.join("ok.yaml"), OK);
    let names: Vec<String> = (0..6).map(|i| format!("n{i}")).collect();
    write(&root.join("six.yaml"), &each_over(&names.join(","), ","));
    write(
        &root.join("five.yaml"),
        &each_over(&names[..5].join(","), ","),
    );
    // A string just over the value limit set in the environment.
    write(
        &root.join("long.yaml"),
        &each_over(&"a".repeat(100_000), ","),
    );
    // Each element copies a 64 KiB string: 128 copies is 8 MiB, twice the budget of 4 MiB.
    let mut copies = format!(
        "version: 2023-04-20\nvariables:\n  big:\n    type: string\n    default: \"{}\"\n\
         resources:\n",
        "b".repeat(64 << 10)
    );
    for i in 0..4 {
        copies.push_str(&format!(
            "  r{i}:\n    type: sim/resource\n    spec:\n      payload:\n{}",
            "        - ${variables.big}\n".repeat(32)
        ));
    }
    write(&root.join("copies.yaml"), &copies);

    assert_refused(&engine, "six.yaml", "T0710", "limit of 5 resources");
    let (exit, text) = plan(&engine, "five.yaml", "five");
    assert_eq!(exit, 0, "{text}");
    assert_refused(&engine, "long.yaml", "T0709", "limit of 100000 bytes");
    assert_refused(&engine, "copies.yaml", "T0711", "budget of 4194304 bytes");
    assert_answers(&engine);
}

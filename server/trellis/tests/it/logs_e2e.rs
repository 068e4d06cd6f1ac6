//! Request, operation and plugin log lines (docs/serve.md, "Logs and request ids"): a real
//! engine with `--log-format json` and `[auth]`, the real CLI, and the lines it wrote parsed.

use serde_json::Value;

use crate::auth_e2e::{as_token, create_token};
use crate::engine_common::{Engine, write};
use crate::plugins_common::TempDir;

const SIM: &str = "version: 2023-04-20\nresources:\n  a:\n    type: sim/resource\n    spec:\n      latencyMs: 0\n";

/// The engine's JSON log lines under `target`.
fn lines(logs: &str, target: &str) -> Vec<Value> {
    logs.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .filter(|v| v["target"] == target)
        .collect()
}

#[test]
fn requests_operations_and_plugin_lines_are_structured() {
    let root = TempDir::new("logs-json");
    let tokens = root.join("tokens.toml");
    let deployer = create_token(&tokens, "ci-bot", "deployer", Some("team-a/*"));
    write(
        &root.join("trellis.toml"),
        "log-format = \"json\"\n[auth]\ntokens_file = \"tokens.toml\"\n",
    );
    write(&root.join("sim.yaml"), SIM);
    let engine = Engine::builder(root.path())
        .args(&["--config", root.join("trellis.toml").to_str().unwrap()])
        // The SDK logs each call's end at debug; the engine keeps a plugin's level.
        .env("TRELLIS_LOG_LEVEL", "info,trellis::plugin=debug")
        .env("TRELLIS_PLUGIN_LOG", "info,trellis_plugin_sdk=debug")
        .capture_stderr()
        .start();

    let (code, v) = as_token(
        &engine,
        Some(&deployer),
        &["deploy", "sim.yaml", "--instance", "team-a/web"],
    );
    assert_eq!(code, 0, "{v}");
    let (code, v) = as_token(
        &engine,
        Some(&deployer),
        &["deploy", "sim.yaml", "--instance", "team-b/web"],
    );
    assert_eq!(code, 2, "{v}");
    let (code, instance) = as_token(&engine, Some(&deployer), &["instance", "team-a/web"]);
    assert_eq!(code, 0, "{instance}");
    let (_, logs) = engine.stop();

    // One line per request, with who, what, how it ended and how long it took.
    let rpcs = lines(&logs, "trellis::rpc");
    let field = |v: &Value, k: &str| v["fields"][k].as_str().unwrap_or_default().to_owned();
    let execute: Vec<&Value> = rpcs
        .iter()
        .filter(|v| field(v, "method") == "ExecuteChangeSet")
        .collect();
    assert_eq!(execute.len(), 1, "{rpcs:#?}");
    let execute = execute[0];
    assert_eq!(field(execute, "message"), "request");
    assert_eq!(field(execute, "caller"), "ci-bot");
    assert_eq!(field(execute, "instance"), "team-a/web");
    assert_eq!(field(execute, "code"), "OK");
    assert!(execute["fields"]["ms"].is_u64(), "{execute}");
    let request_id = field(execute, "request_id");
    assert!(!request_id.is_empty(), "{execute}");
    let refused: Vec<&Value> = rpcs
        .iter()
        .filter(|v| field(v, "instance") == "team-b/web")
        .collect();
    assert_eq!(refused.len(), 1, "{rpcs:#?}");
    assert_eq!(field(refused[0], "code"), "PERMISSION_DENIED");
    assert_eq!(field(refused[0], "caller"), "ci-bot");

    // The operation's start and end, tied to the request that started it.
    let ops = lines(&logs, "trellis::operation");
    let statuses: Vec<(String, String)> = ops
        .iter()
        .map(|v| (field(v, "message"), field(v, "status")))
        .collect();
    assert_eq!(
        statuses,
        [
            ("operation started".to_owned(), "running".to_owned()),
            ("operation ended".to_owned(), "succeeded".to_owned())
        ],
        "{ops:#?}"
    );
    let instance_id = instance["id"].as_str().unwrap_or_default();
    assert!(instance_id.starts_with("ins_"), "{instance}");
    for op in &ops {
        assert_eq!(field(op, "instance_id"), instance_id, "{op}");
        assert_eq!(field(op, "kind"), "deploy");
        assert_eq!(field(op, "request_id"), request_id, "{op}");
    }
    assert_eq!(field(&ops[0], "operation"), field(&ops[1], "operation"));

    // The sim plugin's own lines arrive as fields, not as its JSON inside a message.
    let plugin = lines(&logs, "trellis::plugin");
    let sim: Vec<&Value> = plugin
        .iter()
        .filter(|v| field(v, "plugin") == "sim")
        .collect();
    assert!(!sim.is_empty(), "{plugin:#?}");
    for line in &sim {
        // Not the plugin's JSON object as text.
        assert!(!field(line, "message").starts_with('{'), "{line}");
        assert!(!field(line, "plugin_target").is_empty(), "{line}");
    }
    // The deploy's provider call names the request that started the operation.
    let apply = sim
        .iter()
        .find(|v| field(v, "fields").contains("method=ApplyResource"))
        .unwrap_or_else(|| panic!("no ApplyResource line: {sim:#?}"));
    assert!(
        field(apply, "fields").contains(&format!("request_id={request_id}")),
        "{apply}"
    );
    // So do the plan's: the provider's validation names the request that planned.
    let planned = rpcs
        .iter()
        .find(|v| field(v, "method") == "CreateChangeSet" && field(v, "instance") == "team-a/web")
        .unwrap_or_else(|| panic!("no CreateChangeSet line: {rpcs:#?}"));
    let plan_id = field(planned, "request_id");
    let validate = sim
        .iter()
        .find(|v| field(v, "fields").contains("method=ValidateResource"))
        .unwrap_or_else(|| panic!("no ValidateResource line: {sim:#?}"));
    assert!(
        field(validate, "fields").contains(&format!("request_id={plan_id}")),
        "{validate}"
    );
}

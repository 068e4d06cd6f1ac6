//! End to end, secrets in what the engine shows: exports derived from a secret (also through a
//! child blueprint) are masked in `trellis instance`, `GetExports`, events, plans and logs
//! unless the caller asks to reveal them, and provider error messages that quote a secret inside
//! a longer text (an absolute path) reach neither the CLI, the stored events and operation
//! errors, nor the engine's log. The real `trellis serve` with the real `local` plugin, driven
//! by the real CLI.

use crate::engine_common::{Engine, read, write};
use crate::plugins_common::TempDir;
use serde_json::{Value, json};
use trellis_proto::engine::v1 as api;
use trellis_proto::plugin::v1 as pv;

/// Unusual enough to appear nowhere by chance.
const SECRET: &str = "Zk7Qw-api-key-9Xv2";

const CHILD: &str = r#"version: 2023-04-20
variables:
  token:
    type: string
    secret: true
values:
  dsn:
    type: string
    value: "db://app:${variables.token}@db"
resources:
  marker:
    type: local/file
    spec:
      path: child.txt
      content: child
exports:
  dsn:
    type: string
    field: values.dsn
"#;

const PARENT: &str = r#"version: 2023-04-20
variables:
  apiKey:
    type: string
    secret: true
values:
  url:
    type: string
    value: "https://x/?key=${variables.apiKey}"
include:
  db:
    path: child.yaml
    variables:
      token: "${variables.apiKey}"
resources:
  conf:
    type: local/file
    spec:
      path: conf.txt
      content: "${children.db.dsn}"
exports:
  url:
    type: string
    field: values.url
  dsn:
    type: string
    field: children.db.dsn
  confPath:
    type: string
    field: resources.conf.spec.path
"#;

/// Everything a command printed, both streams.
fn output(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn assert_hidden(what: &str, text: &str) {
    assert!(!text.contains(SECRET), "the secret is in {what}:\n{text}");
}

/// `GetExports` of `instance`, by export name.
fn get_exports(engine: &Engine, instance: &str, reveal: bool) -> Vec<(String, pv::Value)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut client = trellis::cli::client::connect(&engine.addr).await.unwrap();
        client
            .get_exports(api::GetExportsRequest {
                instance: instance.to_owned(),
                reveal_secrets: reveal,
            })
            .await
            .unwrap()
            .into_inner()
            .exports
            .into_iter()
            .map(|e| (e.name, e.value.unwrap_or_default()))
            .collect()
    })
}

fn string(s: &str) -> Option<pv::value::Kind> {
    Some(pv::value::Kind::String(s.to_owned()))
}

#[test]
fn exports_derived_from_a_secret_are_masked_unless_revealed() {
    let root = TempDir::new("secret-exports");
    write(&root.join("child.yaml"), CHILD);
    write(&root.join("main.yaml"), PARENT);
    let engine = Engine::builder(root.path()).capture_stderr().start();
    let var = format!("apiKey={SECRET}");
    let deploy = ["deploy", "main.yaml", "--instance", "p", "--var", &var];

    let out = engine.cli(&deploy);
    assert_eq!(out.status.code(), Some(0), "{}", output(&out));
    assert_hidden("the deploy's output", &output(&out));
    // Inside, the child's export is the real value: the parent's file holds it.
    assert_eq!(
        read(&root.join("conf.txt")),
        format!("db://app:{SECRET}@db")
    );

    for instance in ["p", "p/db"] {
        let text = engine.cli(&["instance", instance]);
        assert_eq!(text.status.code(), Some(0), "{}", output(&text));
        assert_hidden("`trellis instance`", &output(&text));
        assert!(output(&text).contains("(sensitive)"), "{}", output(&text));
        let inst = engine.instance(instance);
        assert_hidden("`trellis instance --format json`", &inst.to_string());
        assert_eq!(inst["exports"]["dsn"], json!({"sensitive": true}), "{inst}");
        for e in get_exports(&engine, instance, false) {
            assert!(e.1.sensitive || e.0 == "confPath", "{e:?}");
            assert_hidden("GetExports", &format!("{e:?}"));
        }
        let events = engine.cli(&["events", "--instance", instance]);
        assert_hidden("`trellis events`", &output(&events));
        let events = engine.cli(&["events", "--instance", instance, "--format", "json"]);
        assert_hidden("`trellis events --format json`", &output(&events));
    }
    let inst = engine.instance("p");
    assert_eq!(inst["exports"]["url"], json!({"sensitive": true}), "{inst}");
    // What is not derived from a secret is shown as it is.
    assert_eq!(inst["exports"]["confPath"], json!("conf.txt"), "{inst}");

    // Asked for, the values come, still flagged sensitive.
    let revealed = get_exports(&engine, "p", true);
    let url = &revealed.iter().find(|e| e.0 == "url").unwrap().1;
    assert!(url.sensitive, "{url:?}");
    assert_eq!(url.kind, string(&format!("https://x/?key={SECRET}")));
    let dsn = &revealed.iter().find(|e| e.0 == "dsn").unwrap().1;
    assert_eq!(dsn.kind, string(&format!("db://app:{SECRET}@db")));
    let (code, inst) = engine.json(&["instance", "p", "--reveal-secrets"]);
    assert_eq!(code, 0, "{inst}");
    assert_eq!(
        inst["exports"]["url"],
        json!(format!("https://x/?key={SECRET}")),
        "{inst}"
    );
    let text = engine.cli(&["instance", "p", "--reveal-secrets"]);
    assert!(output(&text).contains(SECRET), "{}", output(&text));

    // Plans, unchanged and with a new secret: the child's exports change but are not shown.
    for key in [SECRET.to_owned(), format!("{SECRET}-rotated")] {
        let var = format!("apiKey={key}");
        let plan = ["plan", "main.yaml", "--instance", "p", "--var", &var];
        let text = engine.cli(&plan);
        assert_eq!(text.status.code(), Some(0), "{}", output(&text));
        assert_hidden("the plan", &output(&text));
        let (code, json_plan) = engine.json(&plan);
        assert_eq!(code, 0, "{json_plan}");
        assert_hidden("the plan as JSON", &json_plan.to_string());
        let child = &json_plan["changeSet"]["children"][0];
        let dsn = child["exports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "dsn")
            .unwrap_or_else(|| panic!("{child}"));
        assert_eq!(dsn["new"], json!({"sensitive": true}), "{dsn}");
        if key == SECRET {
            assert_eq!(dsn["action"], "NO_CHANGE", "{dsn}");
        } else {
            assert_eq!(dsn["action"], "UPDATE", "{dsn}");
        }
    }

    let (code, out) = engine.json(&["destroy", "--instance", "p"]);
    assert_eq!(code, 0, "{out}");
    let (code, logs) = engine.stop();
    assert_eq!(code, Some(0), "{logs}");
    assert_hidden("the engine's log", &logs);
}

/// A parent directory whose name is secret: the `local` provider quotes the absolute path of
/// the missing directory, which no value the engine sent equals.
const FAILING_FILE: &str = r#"version: 2023-04-20
variables:
  dirName:
    type: string
    secret: true
resources:
  bad:
    type: local/file
    spec:
      path: "./missing/${variables.dirName}/f.txt"
      content: hello
"#;

/// A file linked to a directory it is not inside: the link fails, quoting the directory's
/// absolute path, which holds the secret.
const FAILING_LINK: &str = r#"version: 2023-04-20
variables:
  dirName:
    type: string
    secret: true
resources:
  dir:
    type: local/directory
    metadata:
      labels:
        role: home
    spec:
      path: "./dirs/${variables.dirName}"
  notes:
    type: local/file
    linkSelector:
      byLabel:
        role: home
    spec:
      path: elsewhere/notes.txt
      content: notes
"#;

/// The same failing file, in a child blueprint that gets the secret from its parent.
const FAILING_PARENT: &str = r#"version: 2023-04-20
variables:
  dirName:
    type: string
    secret: true
include:
  part:
    path: failing_file.yaml
    variables:
      dirName: "${variables.dirName}"
resources:
  after:
    type: local/directory
    dependsOn: [part]
    spec:
      path: after-part
"#;

#[test]
fn provider_errors_never_quote_a_secret() {
    let root = TempDir::new("secret-errors");
    std::fs::create_dir_all(root.join("elsewhere")).unwrap();
    std::fs::create_dir_all(root.join("dirs")).unwrap();
    write(&root.join("failing_file.yaml"), FAILING_FILE);
    write(&root.join("failing_link.yaml"), FAILING_LINK);
    write(&root.join("failing_parent.yaml"), FAILING_PARENT);
    let engine = Engine::builder(root.path()).capture_stderr().start();
    let var = format!("dirName={SECRET}");

    for (file, instance) in [
        ("failing_file.yaml", "file"),
        ("failing_link.yaml", "link"),
        ("failing_parent.yaml", "parent"),
    ] {
        let deploy = ["deploy", file, "--instance", instance, "--var", &var];
        let out = engine.cli(&deploy);
        assert_eq!(out.status.code(), Some(1), "{}", output(&out));
        let text = output(&out);
        assert_hidden("the deploy's output", &text);
        // The message is there, with the secret cut out of it.
        assert!(text.contains("(sensitive)"), "{instance}: {text}");

        let again = ["deploy", file, "--instance", instance, "--var", &var];
        let (code, out) = engine.json(&again);
        assert_eq!(code, 1, "{out}");
        assert_hidden("the deploy's JSON", &out.to_string());
        let error = out["operation"]["error"].as_str().unwrap_or_default();
        assert!(error.contains("(sensitive)"), "{instance}: {out}");

        let mut instances = vec![instance.to_owned()];
        if instance == "parent" {
            instances.push("parent/part".to_owned());
        }
        for name in &instances {
            let inst = engine.instance(name);
            assert_hidden("the instance", &inst.to_string());
            let text = engine.cli(&["instance", name]);
            assert_hidden("`trellis instance`", &output(&text));
            let events = engine.cli(&["events", "--instance", name]);
            assert_eq!(events.status.code(), Some(0), "{}", output(&events));
            assert_hidden("`trellis events`", &output(&events));
            let events = engine.cli(&["events", "--instance", name, "--format", "json"]);
            assert_hidden("`trellis events --format json`", &output(&events));
        }
    }
    // The link's failure is recorded against the link.
    let inst: Value = engine.instance("link");
    assert!(
        inst["links"][0]["status"]
            .as_str()
            .is_some_and(|s| s.ends_with("FAILED")),
        "{inst}"
    );

    let (code, logs) = engine.stop();
    assert_eq!(code, Some(0), "{logs}");
    assert_hidden("the engine's log", &logs);
}

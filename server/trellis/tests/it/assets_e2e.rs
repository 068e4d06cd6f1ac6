//! End to end, local assets (docs/assets.md): a function's `codeUri` is read by the CLI
//! relative to the blueprint file, sent with the plan when the engine asks for it, kept by
//! digest, and a change of code (and only of code) is a change in the plan.

use serde_json::{Value, json};

use crate::aws_e2e::engine;
use crate::aws_moto::{boto, moto, unique};
use crate::engine_common::{client, runtime, write};
use crate::plugins_common::TempDir;

fn code_sha(m: &crate::aws_moto::Moto, name: &str) -> String {
    boto(
        m,
        "lambda",
        "get_function_configuration",
        json!({"FunctionName": name}),
    )
    .expect("function")["CodeSha256"]
        .as_str()
        .expect("sha")
        .to_owned()
}

/// The `codeUri` change of the plan's one resource: (previous, new), or None.
fn code_change(plan: &Value) -> Option<(Value, Value)> {
    plan["changeSet"]["resources"][0]["fields"]
        .as_array()?
        .iter()
        .find(|f| f["path"] == "spec.codeUri")
        .map(|f| (f["previous"].clone(), f["new"].clone()))
}

#[test]
fn function_code_travels_with_the_plan_and_its_changes_are_planned() {
    let Some(m) = moto() else { return };
    let dir = TempDir::new("assets-e2e");
    let root = dir.path();
    let engine = engine(root, m);
    let name = unique("assets-fn");
    // The blueprint sits in `app/`; its code is `app/code`, written relative to it. The
    // engine's working directory is the root, where no `code` exists.
    write(
        &root.join("app/fn.yaml"),
        &format!(
            "version: 2023-04-20\nresources:\n  fn:\n    type: aws/lambda/function\n    spec:\n      \
             functionName: {name}\n      codeUri: code\n      handler: handler.handle\n      \
             runtime: python3.12\n"
        ),
    );
    let handler = root.join("app/code/handler.py");
    write(&handler, "def handle(event, context):\n    return 1\n");

    // A raw API client that sends no assets is told which it must send, at the field.
    let rt = runtime();
    let answer = rt.block_on(async {
        use trellis_proto::engine::v1 as pb;
        let mut api = client(&engine.addr).await;
        api.create_change_set(pb::CreateChangeSetRequest {
            instance: "bare".into(),
            source: Some(pb::BlueprintSource {
                source: Some(pb::blueprint_source::Source::Inline(pb::InlineBlueprint {
                    file_name: "app/fn.yaml".into(),
                    content: std::fs::read(root.join("app/fn.yaml")).expect("read"),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        })
        .await
        .expect("answered")
        .into_inner()
    });
    assert_eq!(answer.status, pb_invalid(), "{answer:?}");
    assert_eq!(answer.missing_assets, ["app/code"], "{answer:?}");
    let d = &answer.diagnostics[0];
    assert_eq!((d.code.as_str(), d.line), ("T0816", 7), "{d:?}");
    assert!(d.message.contains("`codeUri`"), "{d:?}");
    // Nothing was kept for it, and no instance was recorded.
    assert!(!engine.data.join("assets").exists());

    // The CLI sends what the engine asks for.
    let out = engine.cli(&["deploy", "app/fn.yaml", "--instance", "assets"]);
    assert!(out.status.success(), "{out:?}");
    let first = code_sha(m, &name);
    let kept: Vec<_> = std::fs::read_dir(engine.data.join("assets"))
        .expect("assets kept")
        .collect();
    assert_eq!(kept.len(), 1);

    // The same content (rewritten, so its timestamps change) plans nothing.
    write(&handler, "def handle(event, context):\n    return 1\n");
    let (code, plan) = engine.json(&["plan", "app/fn.yaml", "--instance", "assets"]);
    assert_eq!(code, 0, "{plan}");
    assert_eq!(code_change(&plan), None, "{plan}");

    // One byte of code changed: `codeUri` changes in the plan, to another asset.
    write(&handler, "def handle(event, context):\n    return 2\n");
    let (code, plan) = engine.json(&["plan", "app/fn.yaml", "--instance", "assets"]);
    assert_eq!(code, 0, "{plan}");
    let (previous, new) = code_change(&plan).expect("codeUri changes");
    let (previous, new) = (
        previous.as_str().unwrap_or_default().to_owned(),
        new.as_str().unwrap_or_default().to_owned(),
    );
    assert!(
        previous.starts_with("asset:sha256:") && previous.ends_with("/code"),
        "{plan}"
    );
    assert!(
        new.starts_with("asset:sha256:") && new != previous,
        "{plan}"
    );
    let out = engine.cli(&["deploy", "app/fn.yaml", "--instance", "assets"]);
    assert!(out.status.success(), "{out:?}");
    assert_ne!(code_sha(m, &name), first);
    // The deployed spec records the asset, and drift reads it back unchanged.
    let inst = engine.instance("assets");
    assert_eq!(
        inst["resources"]["fn"]["spec"]["codeUri"],
        json!(new),
        "{inst}"
    );
    let out = engine.cli(&["drift", "--instance", "assets"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    let out = engine.cli(&["destroy", "--instance", "assets"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        boto(
            m,
            "lambda",
            "get_function_configuration",
            json!({"FunctionName": name})
        )
        .is_err()
    );
}

fn pb_invalid() -> i32 {
    trellis_proto::engine::v1::ChangeSetStatus::Invalid as i32
}

//! End to end: the specification's two `include` examples (*Modular Blueprints > Using
//! Include*: children in the same directory, and children relative to the working directory)
//! planned and deployed by the real `trellis serve` with the real `sim` plugin.
//!
//! The documents are the verbatim copies kept in the validation corpus
//! (`tests/conformance/validate/spec-include-same-directory` and
//! `spec-include-cwd-corrected`), with the AWS types swapped for `sim/resource` by the table
//! in [`swap_aws_for_sim`]: nothing else about them is rewritten by hand. (The main blueprints
//! end with one `bucket` resource the published examples lack: `resources` is required.)

use std::path::Path;

use crate::engine_common::{Engine, write};
use crate::plugins_common::TempDir;
use serde_json::Value;

/// The corpus directory of a specification example.
fn corpus(case: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/conformance/validate")
        .join(case)
}

/// A document of the example with its AWS types swapped for `sim/resource`:
/// - every `aws/*` resource type becomes `sim/resource`, and `aws/region` variables `string`
///   (no AWS provider is installed in these tests);
/// - the one spec field each example resource sets moves under `payload`, where `sim/resource`
///   keeps arbitrary fields;
/// - exports of `spec.arn` and `spec.endpoint` read `spec.id`, the field `sim/resource`
///   computes (as an AWS provider would compute the others).
fn swap_aws_for_sim(text: &str) -> String {
    let mut out = text.to_owned();
    for (from, to) in [
        ("type: aws/sns/topic", "type: sim/resource"),
        ("type: aws/eventbridge/event-bus", "type: sim/resource"),
        ("type: aws/api-gateway/rest-api", "type: sim/resource"),
        ("type: aws/s3/bucket", "type: sim/resource"),
        ("type: aws/region", "type: string"),
        ("    spec:\n      ", "    spec:\n      payload:\n        "),
        ("spec.arn", "spec.id"),
        ("spec.endpoint", "spec.id"),
    ] {
        out = out.replace(from, to);
    }
    assert!(!out.contains("aws/"), "an AWS type left unswapped:\n{out}");
    out
}

/// The example's API child as published passes `orderTopicId` to a blueprint that does not
/// declare it; the fixed copy declares it and records it, so the test can see the value flow
/// from one child to the other.
fn declare_order_topic(api: &str) -> String {
    let fixed = api
        .replace(
            "variables:\n  region:",
            "variables:\n  orderTopicId:\n    type: string\n  region:",
        )
        .replace(
            "        region: ${variables.region}",
            "        region: ${variables.region}\n        orderTopicId: ${variables.orderTopicId}",
        );
    assert_ne!(fixed, api, "the API child no longer has the expected shape");
    fixed
}

/// Copies the example's files from the corpus into `dir` (at `layout`'s paths), swapped.
fn lay_out(case: &str, dir: &Path, layout: &[(&str, &str)]) {
    for (from, to) in layout {
        let text = std::fs::read_to_string(corpus(case).join(from)).unwrap();
        write(&dir.join(to), &swap_aws_for_sim(&text));
    }
}

/// The id `sim/resource` computed for `resource` in instance `instance`.
fn sim_id(engine: &Engine, instance: &str, resource: &str) -> String {
    let inst = engine.instance(instance);
    let id = inst["resources"][resource]["state"]["id"].as_str();
    id.unwrap_or_else(|| panic!("no state.id for {resource} in {inst}"))
        .to_owned()
}

fn payload(engine: &Engine, instance: &str, resource: &str) -> Value {
    engine.instance(instance)["resources"][resource]["spec"]["payload"].clone()
}

/// The error text of a failed command's JSON answer.
fn failure(out: &Value) -> String {
    out.to_string()
}

#[test]
fn the_same_directory_example_plans_and_deploys() {
    let root = TempDir::new("spec-same-dir");
    let case = "spec-include-same-directory";
    lay_out(
        case,
        root.path(),
        &[
            ("main-blueprint.yaml", "main-blueprint.yaml"),
            ("core-infra.yaml", "core-infra.yaml"),
            ("app-infra.yaml", "app-infra.yaml"),
        ],
    );
    let engine = Engine::start(root.path());
    let deploy = |args: &[&str]| {
        let mut all = vec!["deploy", "main-blueprint.yaml", "--instance", "orders"];
        all.extend(args);
        engine.json(&all)
    };

    // As published, the API child is passed a variable it does not declare: the plan says so,
    // naming the include and the variable, before anything is created.
    let (code, out) = engine.json(&["plan", "main-blueprint.yaml", "--instance", "orders"]);
    assert_eq!(code, 1, "{out}");
    let text = failure(&out);
    assert!(
        text.contains("include `appInfrastructure` passes variable `orderTopicId`"),
        "{text}"
    );
    assert!(text.contains("app-infra.yaml"), "{text}");
    // A diagnostic at the key in the parent's include.
    let at_include = out["changeSet"]["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["code"] == "T0406")
        .unwrap_or_else(|| panic!("no T0406: {text}"));
    assert_eq!(at_include["file"], "main-blueprint.yaml", "{text}");
    assert_eq!(
        (&at_include["line"], &at_include["column"]),
        (&33.into(), &7.into()),
        "{text}"
    );
    let (code, list) = engine.json(&["instances"]);
    assert_eq!(code, 0, "{list}");
    // A blueprint that fails to plan leaves no instance behind, parent or child.
    assert!(!list.to_string().contains("orders"), "{list}");

    let app = std::fs::read_to_string(root.join("app-infra.yaml")).unwrap();
    write(&root.join("app-infra.yaml"), &declare_order_topic(&app));

    // A value outside the variable's allowedValues is refused.
    let (code, out) = deploy(&["--var", "orderTopicType=priority"]);
    assert_ne!(code, 0, "{out}");
    assert!(failure(&out).contains("allowed"), "{out}");

    // The plan lists both children, each with the resource it creates.
    let (code, plan) = engine.json(&["plan", "main-blueprint.yaml", "--instance", "orders"]);
    assert_eq!(code, 0, "{plan}");
    let children: Vec<&str> = plan["changeSet"]["children"]
        .as_array()
        .unwrap_or_else(|| panic!("no children in {plan}"))
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        children,
        ["coreInfrastructure", "appInfrastructure"],
        "{plan}"
    );

    let (code, out) = deploy(&["--var", "orderTopicType=fifo"]);
    assert_eq!(code, 0, "{out}");
    // The core child ran first: its topic's computed id reached the API child's variable.
    let topic = sim_id(&engine, "orders/coreInfrastructure", "ordersTopic");
    let api = sim_id(&engine, "orders/appInfrastructure", "api");
    assert_eq!(
        payload(&engine, "orders/coreInfrastructure", "ordersTopic"),
        serde_json::json!({"topicType": "fifo"})
    );
    assert_eq!(
        payload(&engine, "orders/appInfrastructure", "api"),
        serde_json::json!({"region": "eu-west-1", "orderTopicId": topic})
    );
    let orders = engine.instance("orders");
    assert_eq!(orders["status"], "DEPLOYED", "{orders}");
    assert_eq!(
        orders["exports"],
        serde_json::json!({"coreOrdersTopic": topic, "apiBaseUrl": api}),
        "{orders}"
    );

    // Planning again finds nothing to do.
    let (code, plan) = engine.json(&[
        "plan",
        "main-blueprint.yaml",
        "--instance",
        "orders",
        "--var",
        "orderTopicType=fifo",
    ]);
    assert_eq!(code, 0, "{plan}");
    for child in plan["changeSet"]["children"].as_array().unwrap() {
        let resources = child["resources"].as_array().unwrap();
        assert_eq!(resources.len(), 1, "{plan}");
        assert_eq!(resources[0]["action"], "NO_CHANGE", "{plan}");
    }

    let (code, out) = engine.json(&["destroy", "--instance", "orders"]);
    assert_eq!(code, 0, "{out}");
    for name in [
        "orders",
        "orders/coreInfrastructure",
        "orders/appInfrastructure",
    ] {
        assert_eq!(engine.instance(name)["status"], "DESTROYED", "{name}");
    }
}

#[test]
fn the_working_directory_example_plans_and_deploys() {
    let root = TempDir::new("spec-cwd");
    let case = "spec-include-cwd-corrected";
    lay_out(
        case,
        root.path(),
        &[
            ("main-blueprint.yaml", "app-infra/main-blueprint.yaml"),
            ("api.yaml", "app-infra/api.yaml"),
            ("topics.yaml", "core-infra/topics.yaml"),
            ("event-bus.yaml", "core-infra/event-bus.yaml"),
        ],
    );
    let api = std::fs::read_to_string(root.join("app-infra/api.yaml")).unwrap();
    write(&root.join("app-infra/api.yaml"), &declare_order_topic(&api));
    // `${cwd()}` is the engine's working directory: the engine reads these files from its own
    // disk, so the directory must be an allowed root.
    let engine = Engine::builder(root.path()).allow_path(root.path()).start();

    let (code, out) = engine.json(&[
        "deploy",
        "app-infra/main-blueprint.yaml",
        "--instance",
        "orders",
        "--var",
        "eventBusName=orders-bus",
    ]);
    assert_eq!(code, 0, "{out}");
    let topic = sim_id(&engine, "orders/topics", "ordersTopic");
    let bus = sim_id(&engine, "orders/eventBus", "eventBus");
    let api = sim_id(&engine, "orders/appInfrastructure", "api");
    assert_eq!(
        payload(&engine, "orders/eventBus", "eventBus"),
        serde_json::json!({"eventBusName": "orders-bus"})
    );
    assert_eq!(
        payload(&engine, "orders/appInfrastructure", "api"),
        serde_json::json!({"region": "eu-west-1", "orderTopicId": topic})
    );
    let orders = engine.instance("orders");
    assert_eq!(
        orders["exports"],
        serde_json::json!({"coreOrdersTopic": topic, "coreEventBus": bus, "apiBaseUrl": api}),
        "{orders}"
    );

    let (code, out) = engine.json(&["destroy", "--instance", "orders"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(engine.instance("orders/eventBus")["status"], "DESTROYED");
}

/// A reference to a spec field that neither the blueprint sets nor the type's schema declares
/// (so the provider will never compute it) is refused at plan time, before anything is
/// created, with the field named and the schema's closest field suggested.
#[test]
fn a_spec_field_nobody_sets_is_refused_before_deploy() {
    let root = TempDir::new("spec-export");
    write(
        &root.join("bp.yaml"),
        "version: 2023-04-20\nresources:\n  api:\n    type: sim/resource\n    spec:\n      payload: {}\n\
         exports:\n  url:\n    type: string\n    field: resources.api.spec.ids\n",
    );
    let engine = Engine::start(root.path());
    let (code, out) = engine.json(&["deploy", "bp.yaml", "--instance", "x"]);
    assert_eq!(code, 1, "{out}");
    let text = failure(&out);
    assert!(text.contains("T0804"), "{text}");
    assert!(
        text.contains("resource `api` (sim/resource) has no spec field `ids`"),
        "{text}"
    );
    assert!(text.contains("did you mean `id`?"), "{text}");
    // Nothing was created, not even the instance the request named.
    let (code, out) = engine.json(&["instance", "x"]);
    assert_eq!(code, 2, "{out}");
    assert_eq!(out["error"]["code"], "NOT_FOUND", "{out}");
    // A declared input field the blueprint leaves unset is not computed either: it will never
    // have a value.
    write(
        &root.join("bp.yaml"),
        "version: 2023-04-20\nresources:\n  api:\n    type: sim/resource\n    spec:\n      payload: {}\n\
         exports:\n  wait:\n    type: integer\n    field: resources.api.spec.latencyMs\n",
    );
    let (code, out) = engine.json(&["deploy", "bp.yaml", "--instance", "x"]);
    assert_eq!(code, 1, "{out}");
    let text = failure(&out);
    assert!(
        text.contains(
            "resource `api` does not set spec field `latencyMs`, and sim/resource does not \
             compute it"
        ),
        "{text}"
    );
}

use super::*;
use serde_json::json;

/// A body as the engine wrote it before the format had a version (hand-encoded), with a
/// child, a link and every kind of shown value.
fn unversioned() -> Json {
    json!({
        "inputs": {
            "files": [{ "name": "app.yaml", "content": "version: 2023-04-20\n" }],
            "variables": [["region", "eu-west-1"]],
            "nowUnixNanos": "1764000000000000000",
            "includeChain": []
        },
        "plan": [{
            "name": "db",
            "type": "sim/resource",
            "action": "UPDATE",
            "fields": [
                { "path": "spec.size", "previous": { "value": 1 }, "new": { "value": 2 },
                  "mustRecreate": false },
                { "path": "spec.password", "previous": { "sensitive": true },
                  "new": { "sensitive": true }, "mustRecreate": false },
                { "path": "spec.endpoint", "new": { "unknown": true }, "mustRecreate": true },
                { "path": "spec.note", "previous": { "value": null }, "mustRecreate": false }
            ],
            "reason": "",
            "dependsOn": ["net"]
        }],
        "links": [{ "a": "api", "b": "db", "linkType": "sim/a::sim/b", "provider": "sim",
                    "action": "CREATE" }],
        "children": [{
            "name": "network",
            "instance": "app/network",
            "action": "CREATE",
            "plannedVersion": 0,
            "plan": [],
            "links": [],
            "children": [],
            "exports": [{ "name": "vpc", "action": "CREATE", "new": { "unknown": true } },
                        { "name": "key", "action": "UPDATE", "previous": { "value": "a" },
                          "new": { "value": "b" }, "sensitive": true }],
            "unknownVariables": [],
            "deferred": "",
            "diagnostics": []
        }],
        "datasources": { "net": { "id": "vpc-1" } },
        "summary": "0 to create, 1 to update, 0 to recreate, 0 to delete, 0 unchanged",
        "diagnostics": []
    })
}

#[test]
fn a_body_from_before_versions_reads_as_version_one() {
    let body = decode(&unversioned()).unwrap();
    assert_eq!(
        body.inputs.files,
        vec![("app.yaml".to_owned(), b"version: 2023-04-20\n".to_vec())]
    );
    assert_eq!(
        body.inputs.variables,
        vec![("region".to_owned(), "eu-west-1".to_owned())]
    );
    assert_eq!(body.inputs.now_unix_nanos, 1_764_000_000_000_000_000);
    let db = &body.plan.resources[0];
    assert_eq!((db.name.as_str(), db.action), ("db", Action::Update));
    assert_eq!(db.fields[0].previous, Some(Shown::Value(json!(1))));
    assert_eq!(db.fields[1].new, Some(Shown::Sensitive));
    assert_eq!(
        (db.fields[2].previous.clone(), db.fields[2].new.clone()),
        (None, Some(Shown::Unknown))
    );
    assert_eq!(
        db.fields[3].previous,
        Some(Shown::Value(Json::Null)),
        "a null value stays a value"
    );
    assert_eq!(body.plan.links[0].link_type, "sim/a::sim/b");
    let child = &body.plan.children[0];
    assert_eq!(child.instance, "app/network");
    assert!(child.exports[1].sensitive && !child.exports[0].sensitive);
    assert_eq!(body.datasources["net"], json!({ "id": "vpc-1" }));
}

#[test]
fn what_is_written_reads_back_the_same() {
    let before = decode(&unversioned()).unwrap();
    let written = encode(
        &before.inputs,
        &before.plan,
        before.datasources.clone(),
        vec![],
    );
    assert_eq!(written["version"], json!(BODY_VERSION));
    let after = decode(&written).unwrap();
    assert_eq!(after.inputs, before.inputs);
    assert_eq!(after.plan, before.plan);
    assert_eq!(after.datasources, before.datasources);
    assert_eq!(written["summary"], json!(before.plan.summary()));
    assert_eq!(decode_inputs(&written).unwrap(), before.inputs);
    assert_eq!(decode_plan(&written).unwrap().0, before.plan);
    assert_eq!(written["summary"], json!(before.plan.summary()));
    assert_eq!(decode_inputs(&written).unwrap(), before.inputs);
    assert_eq!(decode_plan(&written).unwrap().0, before.plan);
    // The stored shape is the one bodies always had: an older engine reads it too.
    let mut unversioned_again = written.clone();
    unversioned_again.as_object_mut().unwrap().remove("version");
    assert_eq!(unversioned_again["plan"], unversioned()["plan"]);
    assert_eq!(unversioned_again["children"], unversioned()["children"]);
}

#[test]
fn a_bad_field_is_named() {
    let mut body = unversioned();
    body["plan"][0]["fields"][1]["mustRecreate"] = json!("yes");
    let e = decode(&body).unwrap_err();
    assert_eq!(e.path, "plan[0].fields[1].mustRecreate");
    assert!(
        e.to_string().contains("plan[0].fields[1].mustRecreate"),
        "{e}"
    );

    let mut body = unversioned();
    body["children"][0]["exports"][0]["new"] = json!({ "unknown": true, "value": 3 });
    let e = decode(&body).unwrap_err();
    assert_eq!(e.path, "children[0].exports[0].new");
    assert!(e.message.contains("exactly one of"), "{e}");

    let mut body = unversioned();
    body["plan"][0]["action"] = json!("EXPLODE");
    assert_eq!(decode(&body).unwrap_err().path, "plan[0].action");

    let mut body = unversioned();
    body["inputs"]["nowUnixNanos"] = json!("soon");
    let e = decode(&body).unwrap_err();
    assert_eq!(e.path, "inputs.nowUnixNanos");
    assert!(e.message.contains("`soon`"), "{e}");

    let mut body = unversioned();
    body.as_object_mut().unwrap().remove("inputs");
    let e = decode(&body).unwrap_err();
    assert!(e.message.contains("missing field `inputs`"), "{e}");
}

#[test]
fn a_newer_version_is_refused_with_what_to_do() {
    let mut body = unversioned();
    body["version"] = json!(BODY_VERSION + 1);
    let e = decode(&body).unwrap_err();
    assert_eq!(e.path, "version");
    assert!(e.message.contains("newer engine"), "{e}");
    assert!(e.to_string().contains("plan the change again"), "{e}");
    body["version"] = json!(0);
    assert_eq!(decode(&body).unwrap_err().path, "version");
}

/// Recorded change sets carry the digest of their inputs and execution checks it: the digest
/// of given inputs never changes (this value was computed independently: SHA-256 over each
/// part framed by its length as a little-endian u64).
#[test]
fn the_inputs_digest_is_stable() {
    let inputs = Inputs {
        files: vec![("a.yaml".into(), b"x: 1\n".to_vec())],
        variables: vec![("k".into(), "v".into())],
        now_unix_nanos: 7,
        include_chain: vec![],
        environment: Default::default(),
        engine_injectors: Default::default(),
        assets: Default::default(),
    };
    assert_eq!(
        inputs.digest(),
        "sha256:af5a8002308f468795d280a221452ecbc15384bde1be9d1069e1526e3bd46e58"
    );
}

/// An environment and the engine's injectors are part of what was planned: the digest covers
/// them and the body keeps them (secrets still wrapped) for execution.
#[test]
fn settings_are_digested_and_kept() {
    let plain = Inputs {
        files: vec![("a.yaml".into(), b"x: 1\n".to_vec())],
        variables: vec![],
        now_unix_nanos: 7,
        include_chain: vec![],
        environment: Default::default(),
        engine_injectors: Default::default(),
        assets: Default::default(),
    };
    let mut with = plain.clone();
    with.environment.name = "dev".into();
    with.environment.providers.insert(
        "aws".into(),
        json!({"key": {"$sensitive": "s3cret"}})
            .as_object()
            .cloned()
            .unwrap_or_default(),
    );
    with.environment.secret_variables = vec!["password".into()];
    with.engine_injectors
        .insert("local/file".into(), json!({"mode": "0640"}));
    assert_ne!(plain.digest(), with.digest());
    let body = crate::body::encode(&with, &Plan::default(), Default::default(), vec![]);
    let back = crate::body::decode_inputs(&body).expect("decodes");
    assert_eq!(back, with);
    assert_eq!(back.digest(), with.digest());
    // Local assets (path → digest) are part of what was planned.
    let mut code = plain.clone();
    code.assets
        .insert("fn/code".into(), format!("sha256:{}", "a".repeat(64)));
    assert_ne!(plain.digest(), code.digest());
    let back = crate::body::decode_inputs(&crate::body::encode(
        &code,
        &Plan::default(),
        Default::default(),
        vec![],
    ))
    .expect("decodes");
    assert_eq!(back, code);
}

#[test]
fn the_abstract_resource_of_a_generated_one_is_kept() {
    let mut before = decode(&unversioned()).unwrap();
    assert_eq!(
        before.plan.resources[0].derived_from, None,
        "older bodies have none"
    );
    before.plan.resources[0].derived_from = Some(DerivedFrom {
        resource: "saveOrder".into(),
        transform: "celerity-2023-04-20".into(),
    });
    let written = encode(
        &before.inputs,
        &before.plan,
        before.datasources.clone(),
        vec![],
    );
    assert_eq!(
        written["plan"][0]["derivedFrom"],
        json!({"resource": "saveOrder", "transform": "celerity-2023-04-20"})
    );
    assert_eq!(decode_plan(&written).unwrap().0, before.plan);
}

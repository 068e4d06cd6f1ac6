//! Every knob of `sim/resource` (except crashOn, see process.rs) through the
//! real protocol, with the SDK's in-process harness.

use std::time::{Duration, Instant};

use trellis_plugin_sdk::prelude::*;
use trellis_plugin_sdk::proto as pb;
use trellis_plugin_sdk::testing::Harness;
use trellis_provider_sim::{RESOURCE_TYPE, Sim, sim_id};

async fn sim() -> Harness {
    match Harness::provider(Sim::new()).await {
        Ok(h) => h,
        Err(e) => panic!("harness: {e}"),
    }
}

fn spec(json: serde_json::Value) -> Value {
    Value::from(json)
}

#[tokio::test]
async fn manifest_declares_the_resource_function_and_retries() {
    let h = sim().await;
    let hs = h.handshake().await.expect("handshake");
    assert_eq!(hs.plugin.as_ref().map(|p| p.name.as_str()), Some("sim"));
    let caps = hs.capabilities.expect("capabilities");
    assert!(caps.read_resource && caps.functions && caps.cancel && caps.plan_resource);
    assert!(!caps.links && !caps.data_sources);

    let m = h.manifest().await.expect("manifest");
    let rt = &m.resource_types[0];
    assert_eq!(rt.r#type, RESOURCE_TYPE);
    let schema = Schema::from_proto(rt.spec_schema.clone().expect("schema"));
    let names: Vec<&str> = schema.fields().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "latencyMs",
            "failOn",
            "failTimes",
            "failClass",
            "failPartial",
            "crashOn",
            "crashAfter",
            "recreateOn",
            "planWarning",
            "payload",
            "id"
        ]
    );
    assert!(schema.get_field("id").is_some_and(Field::is_computed));
    assert_eq!(
        schema
            .get_field("failOn")
            .map(|f| f.schema().allowed_values().len()),
        Some(3)
    );
    let retry = m.retry_policy.expect("retry policy");
    assert!(
        retry.max_attempts > 1 && retry.max_attempts <= 5,
        "{retry:?}"
    );
    assert_eq!(m.functions[0].name, "echo");
}

#[tokio::test]
async fn id_is_stable_per_name_and_payload_is_echoed() {
    let h = sim().await;
    let payload = serde_json::json!({"nested": [1, 2.5, "x", null, {"k": true}]});
    let a = h
        .create(
            RESOURCE_TYPE,
            "a",
            spec(serde_json::json!({"payload": payload})),
        )
        .await
        .expect("create");
    assert_eq!(a.external_id, sim_id("a"));
    assert_eq!(
        a.state.get("id").and_then(Value::as_str),
        Some(sim_id("a").as_str())
    );
    assert_eq!(a.state.get("payload").map(Value::to_json), Some(payload));

    let again = h
        .create(RESOURCE_TYPE, "a", Value::map())
        .await
        .expect("create");
    assert_eq!(again.external_id, a.external_id);
    assert_eq!(again.state.get("payload"), None);
    let b = h
        .create(RESOURCE_TYPE, "b", Value::map())
        .await
        .expect("create");
    assert_ne!(b.external_id, a.external_id);

    let secret = Value::map().with("payload", Value::sensitive("pw"));
    let s = h.create(RESOURCE_TYPE, "s", secret).await.expect("create");
    assert!(s.state.get("payload").is_some_and(Value::is_sensitive));

    let updated = h
        .update(&a, spec(serde_json::json!({"payload": 7})))
        .await
        .expect("update");
    assert_eq!(updated.external_id, a.external_id);
    assert_eq!(updated.state.get("payload"), Some(&Value::Int(7)));

    let read = h.read(&updated).await.expect("read").expect("exists");
    assert_eq!(read.spec, updated.spec);
    assert_eq!(read.state, updated.state);
    h.destroy(&updated).await.expect("destroy");
}

#[tokio::test]
async fn latency_applies_to_every_operation() {
    let h = sim().await;
    let slow = spec(serde_json::json!({"latencyMs": 150}));
    let t = Instant::now();
    let st = h
        .create(RESOURCE_TYPE, "slow", slow.clone())
        .await
        .expect("create");
    assert!(t.elapsed() >= Duration::from_millis(150));
    let t = Instant::now();
    let st = h.update(&st, slow).await.expect("update");
    assert!(t.elapsed() >= Duration::from_millis(150));
    let t = Instant::now();
    h.read(&st).await.expect("read");
    assert!(t.elapsed() >= Duration::from_millis(150));
    let t = Instant::now();
    h.destroy(&st).await.expect("destroy");
    assert!(t.elapsed() >= Duration::from_millis(150));

    let mut req = pb::ApplyResourceRequest {
        context: Some(h.call_context()),
        resource_type: RESOURCE_TYPE.into(),
        resource_name: "p".into(),
        desired_spec: Some(spec(serde_json::json!({"latencyMs": 10})).to_proto()),
        current: None,
    };
    let out = h.apply_with(req.clone()).await.expect("apply");
    assert_eq!(out.progress.len(), 1, "latency is reported as progress");

    req.desired_spec = Some(spec(serde_json::json!({"latencyMs": -1})).to_proto());
    let err = h
        .apply_with(req)
        .await
        .expect("apply")
        .result
        .expect_err("negative latency");
    assert_eq!(
        (err.class, err.path),
        (ErrorClass::BadInput, Some(AttrPath::from("latencyMs")))
    );
}

#[tokio::test]
async fn latency_is_cancellable() {
    let h = sim().await;
    let ctx = h.call_context();
    let id = ctx.call_id.clone();
    let req = pb::ApplyResourceRequest {
        context: Some(ctx),
        resource_type: RESOURCE_TYPE.into(),
        resource_name: "long".into(),
        desired_spec: Some(spec(serde_json::json!({"latencyMs": 60_000})).to_proto()),
        current: None,
    };
    let cancel = async {
        while !h.cancel(&id).await.expect("cancel") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let (out, ()) = tokio::join!(h.apply_with(req), cancel);
    let err = out.expect("apply").result.expect_err("cancelled");
    assert_eq!(err.class, ErrorClass::Transient);
}

#[tokio::test]
async fn fail_times_counts_per_name_and_operation() {
    let h = sim().await;
    let flaky = spec(serde_json::json!({"failOn": "create", "failTimes": 2}));
    for n in 1..=2 {
        let err = h
            .create(RESOURCE_TYPE, "f", flaky.clone())
            .await
            .expect_err("injected failure");
        assert_eq!(err.class, ErrorClass::Transient);
        assert!(
            err.message.contains(&format!("failure {n} of 2")),
            "{}",
            err.message
        );
    }
    let st = h
        .create(RESOURCE_TYPE, "f", flaky.clone())
        .await
        .expect("third attempt succeeds");
    assert!(
        h.create(RESOURCE_TYPE, "f", flaky.clone()).await.is_ok(),
        "and later ones too"
    );

    // Another name has its own count.
    assert!(h.create(RESOURCE_TYPE, "g", flaky).await.is_err());

    // Another operation has its own count; update uses the desired spec.
    let on_update = spec(serde_json::json!({"failOn": "update", "failTimes": 1}));
    assert!(h.update(&st, on_update.clone()).await.is_err());
    let st = h
        .update(&st, on_update)
        .await
        .expect("second update succeeds");

    // Destroy uses the spec as last applied.
    let doomed = ResourceState {
        spec: spec(serde_json::json!({"failOn": "destroy", "failTimes": 1})),
        ..st
    };
    assert_eq!(
        h.destroy(&doomed).await.err().map(|e| e.class),
        Some(ErrorClass::Transient)
    );
    h.destroy(&doomed).await.expect("second destroy succeeds");

    // A fresh process (here: a fresh provider) starts counting again.
    let h2 = sim().await;
    let again = spec(serde_json::json!({"failOn": "create", "failTimes": 1}));
    assert!(h2.create(RESOURCE_TYPE, "f", again).await.is_err());
}

#[tokio::test]
async fn fail_on_without_times_fails_always_with_the_chosen_class() {
    let h = sim().await;
    let always = spec(serde_json::json!({"failOn": "create"}));
    for _ in 0..3 {
        let err = h
            .create(RESOURCE_TYPE, "x", always.clone())
            .await
            .expect_err("fails");
        assert_eq!(err.class, ErrorClass::Transient);
        assert!(err.message.contains("always"), "{}", err.message);
    }
    // failOn targets one operation only.
    let st = h
        .create(
            RESOURCE_TYPE,
            "y",
            spec(serde_json::json!({"failOn": "destroy"})),
        )
        .await
        .expect("create");
    assert!(h.destroy(&st).await.is_err());

    for (class, want) in [
        ("badInput", ErrorClass::BadInput),
        ("conflict", ErrorClass::Conflict),
        ("notFound", ErrorClass::NotFound),
        ("permission", ErrorClass::Permission),
        ("internal", ErrorClass::Internal),
    ] {
        let s = spec(serde_json::json!({"failOn": "create", "failClass": class}));
        assert_eq!(
            h.create(RESOURCE_TYPE, class, s)
                .await
                .err()
                .map(|e| e.class),
            Some(want)
        );
    }
}

#[tokio::test]
async fn fail_partial_reports_what_was_created() {
    let h = sim().await;
    let s = spec(serde_json::json!({"failOn": "create", "failPartial": true, "payload": "p"}));
    let err = h.create(RESOURCE_TYPE, "half", s).await.expect_err("fails");
    assert_eq!(err.partial_external_id, Some(sim_id("half")));
    let ps = err.partial_state.expect("partial state");
    assert_eq!(ps.get("payload").and_then(Value::as_str), Some("p"));
}

#[tokio::test]
async fn validation_reports_bad_knobs_with_paths() {
    let h = sim().await;
    let bad = spec(serde_json::json!({
        "latencyMs": 99_999_999, "failOn": "explode", "failTimes": -1, "failClass": "oops", "crashOn": "create"
    }));
    let ds = h.validate(RESOURCE_TYPE, "v", bad).await.expect("validate");
    let got: Vec<(Severity, String)> = ds
        .iter()
        .map(|d| {
            (
                d.severity,
                d.path.as_ref().map(ToString::to_string).unwrap_or_default(),
            )
        })
        .collect();
    let want = [
        (Severity::Error, "latencyMs"),
        (Severity::Error, "failTimes"),
        (Severity::Error, "failOn"),
        (Severity::Error, "failClass"),
        (Severity::Warning, "crashOn"),
    ];
    let want: Vec<(Severity, String)> = want.iter().map(|(s, p)| (*s, (*p).to_owned())).collect();
    assert_eq!(got, want, "{ds:#?}");

    let unknown = Value::map()
        .with("latencyMs", Value::Unknown)
        .with("failOn", Value::Unknown);
    assert!(
        h.validate(RESOURCE_TYPE, "v", unknown)
            .await
            .expect("validate")
            .is_empty()
    );
    let orphan = spec(serde_json::json!({"failTimes": 2}));
    let ds = h
        .validate(RESOURCE_TYPE, "v", orphan)
        .await
        .expect("validate");
    assert_eq!(
        ds.iter().map(|d| d.code.as_str()).collect::<Vec<_>>(),
        ["sim.fail-times-without-fail-on"]
    );
}

#[tokio::test]
async fn echo_round_trips_any_value() {
    let h = sim().await;
    let values = [
        Value::Null,
        Value::from(true),
        Value::from(-3),
        Value::from(2.5),
        Value::from("text"),
        spec(serde_json::json!({"b": [1, {"c": null}], "a": "z"})),
        Value::sensitive("secret"),
    ];
    for v in values {
        assert_eq!(
            h.call_function("echo", vec![v.clone()])
                .await
                .expect("echo"),
            v
        );
    }
    let err = h
        .call_function("echo", vec![])
        .await
        .expect_err("missing argument");
    assert_eq!(err.class, ErrorClass::BadInput);
    let err = h
        .call_function("echo", vec![1.into(), 2.into()])
        .await
        .expect_err("extra argument");
    assert_eq!(err.path, Some(AttrPath::root().index(1)));
}

/// The plan states the id (from the name) and the payload where known, and passes the
/// `recreateOn` and `planWarning` knobs on as recreate paths and a warning.
#[tokio::test]
async fn the_plan_states_what_sim_knows_and_its_knobs() {
    let h = sim().await;
    let desired = spec(serde_json::json!({
        "payload": "p",
        "recreateOn": ["payload"],
        "planWarning": "careful"
    }));
    let current = ResourceState {
        resource_type: RESOURCE_TYPE.into(),
        name: "thing".into(),
        external_id: sim_id("thing"),
        spec: spec(serde_json::json!({ "payload": "old" })),
        state: spec(serde_json::json!({ "id": sim_id("thing"), "payload": "old" })),
    };
    let plan = h.plan(Some(&current), desired).await.expect("plan");
    assert_eq!(plan.recreate_paths, vec![AttrPath::root().field("payload")]);
    assert_eq!(
        plan.planned_state,
        spec(serde_json::json!({ "id": sim_id("thing"), "payload": "p" }))
    );
    assert_eq!(plan.diagnostics.len(), 1, "{:?}", plan.diagnostics);
    assert_eq!(plan.diagnostics[0].severity, Severity::Warning);
    // An unknown payload stays unknown in the planned state.
    let unknown = Value::map().with("payload", Value::Unknown);
    let plan = h.plan(Some(&current), unknown).await.expect("plan");
    assert_eq!(
        plan.planned_state,
        Value::map()
            .with("id", sim_id("thing"))
            .with("payload", Value::Unknown)
    );
}

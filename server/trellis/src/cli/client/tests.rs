use super::*;

fn v(kind: Kind) -> pv::Value {
    pv::Value {
        kind: Some(kind),
        sensitive: false,
    }
}

fn s(text: &str) -> pv::Value {
    v(Kind::String(text.to_owned()))
}

fn unknown() -> pv::Value {
    v(Kind::Unknown(pv::Unknown {}))
}

fn secret() -> pv::Value {
    // The engine never sends a secret in clear: the marker and a masked value.
    pv::Value {
        kind: Some(Kind::String("****".into())),
        sensitive: true,
    }
}

fn map(entries: &[(&str, pv::Value)]) -> pv::Value {
    v(Kind::Map(pv::MapValue {
        entries: entries
            .iter()
            .map(|(k, val)| pv::MapEntry {
                key: (*k).to_owned(),
                value: Some(val.clone()),
            })
            .collect(),
    }))
}

fn field(path: &str, previous: Option<pv::Value>, new: Option<pv::Value>) -> pb::FieldChange {
    pb::FieldChange {
        path: path.into(),
        previous,
        new,
        must_recreate: false,
        origin: String::new(),
    }
}

fn change(name: &str, ty: &str, action: pb::ChangeAction) -> pb::ResourceChange {
    pb::ResourceChange {
        name: name.into(),
        resource_type: ty.into(),
        action: action as i32,
        ..Default::default()
    }
}

fn sample_change_set() -> pb::ChangeSet {
    use pb::ChangeAction as A;
    let mut config = change("config", "local/file", A::Create);
    config.fields = vec![
        // Immutable, but this is a create: no "(forces recreate)".
        pb::FieldChange {
            must_recreate: true,
            ..field("spec.path", None, Some(s("/tmp/app.conf")))
        },
        field("spec.id", None, Some(unknown())),
        field("spec.token", None, Some(secret())),
    ];
    let mut web = change("web", "aws/lambda/function", A::Update);
    web.fields = vec![field(
        "spec.memory",
        Some(v(Kind::Int(128))),
        Some(v(Kind::Int(256))),
    )];
    web.depends_on = vec!["config".into()];
    let mut db = change("db", "aws/rds/instance", A::Recreate);
    db.reason = "spec.engine cannot change in place".into();
    db.fields = vec![pb::FieldChange {
        must_recreate: true,
        ..field("spec.engine", Some(s("postgres")), Some(s("mysql")))
    }];
    pb::ChangeSet {
        id: "cs_1".into(),
        instance: "app".into(),
        instance_id: "inst_1".into(),
        status: pb::ChangeSetStatus::Planned as i32,
        planned_version: 3,
        digest: "sha256:abc".into(),
        resources: vec![
            config,
            web,
            db,
            change("old", "local/file", A::Delete),
            change("same", "local/dir", A::NoChange),
        ],
        exports: vec![pb::ExportChange {
            name: "url".into(),
            action: A::Create as i32,
            previous: None,
            new: Some(unknown()),
        }],
        diagnostics: vec![pb::Diagnostic {
            code: "T0301".into(),
            severity: pb::Severity::Warning as i32,
            message: "unused variable `x`".into(),
            file: "app.yaml".into(),
            line: 3,
            column: 5,
            end_line: 3,
            end_column: 6,
            hint: String::new(),
        }],
        summary: "1 to create, 1 to update, 1 to recreate, 1 to delete".into(),
        created_at_unix_ms: 0,
        links: vec![pb::LinkChange {
            resource_a: "env".into(),
            resource_b: "config".into(),
            link_type: "local/envFile::local/file".into(),
            action: A::Create as i32,
        }],
        children: vec![],
        missing_assets: vec![],
    }
}

#[test]
fn engine_addresses() {
    let http = |s: &str| Ok(EngineAddr::Http(s.to_owned()));
    assert_eq!(
        parse_engine_addr("http://127.0.0.1:8325"),
        http("http://127.0.0.1:8325")
    );
    assert_eq!(parse_engine_addr("engine:8325"), http("http://engine:8325"));
    assert_eq!(parse_engine_addr(" [::1]:8325 "), http("http://[::1]:8325"));
    assert_eq!(
        parse_engine_addr("unix:/run/trellis.sock"),
        Ok(EngineAddr::Unix("/run/trellis.sock".into()))
    );
    assert_eq!(
        parse_engine_addr("unix:///run/trellis.sock"),
        Ok(EngineAddr::Unix("/run/trellis.sock".into()))
    );
    assert_eq!(
        parse_engine_addr("https://engine:8325"),
        Ok(EngineAddr::Https("https://engine:8325".into()))
    );
    assert!(parse_engine_addr("https://").is_err());
    assert!(
        parse_engine_addr("grpc://engine:1")
            .unwrap_err()
            .contains("scheme")
    );
    assert!(parse_engine_addr("unix:").is_err());
    assert!(parse_engine_addr("").is_err());
    assert!(parse_engine_addr("http://").is_err());
}

#[test]
fn enum_prefixes_are_dropped() {
    let deployed = pb::InstanceStatus::Deployed.as_str_name();
    assert_eq!(short(deployed, "INSTANCE_STATUS"), "DEPLOYED");
    let failed = pb::ResourceStatus::CreateFailed.as_str_name();
    assert_eq!(short(failed, "RESOURCE_STATUS"), "CREATE_FAILED");
    let no_change = pb::ChangeAction::NoChange.as_str_name();
    assert_eq!(short(no_change, "CHANGE_ACTION"), "NO_CHANGE");
    // A name without the prefix is kept whole.
    assert_eq!(short("OTHER", "INSTANCE_STATUS"), "OTHER");
}

#[test]
fn instance_json_shape() {
    let inst = pb::Instance {
        id: "inst_1".into(),
        name: "app".into(),
        status: pb::InstanceStatus::Deployed as i32,
        version: 7,
        last_seq: 40,
        resources: vec![pb::Resource {
            name: "config".into(),
            resource_type: "local/file".into(),
            status: pb::ResourceStatus::Created as i32,
            spec: Some(map(&[("path", s("/tmp/x")), ("token", secret())])),
            state: Some(map(&[("id", unknown())])),
            external_id: "/tmp/x".into(),
            failure_reason: String::new(),
            depends_on: vec!["dir".into()],
            updated_at_unix_ms: 0,
        }],
        links: vec![pb::Link {
            resource_a: "config".into(),
            resource_b: "dir".into(),
            link_type: "local/file::local/dir".into(),
            status: pb::ResourceStatus::Created as i32,
            data: None,
        }],
        children: vec![],
        exports: vec![pb::Export {
            name: "path".into(),
            r#type: "string".into(),
            value: Some(s("/tmp/x")),
        }],
        created_at_unix_ms: 0,
        updated_at_unix_ms: 0,
        environment: Some(pb::InstanceEnvironment {
            name: "dev".into(),
            digest: "sha256:ab".into(),
            providers: Some(map(&[(
                "local",
                map(&[("root", s("/srv")), ("token", secret())]),
            )])),
        }),
        queued: vec![pb::QueuedOperation {
            kind: pb::OperationKind::Deploy as i32,
            request_id: "req-2".into(),
            caller: "ci".into(),
            change_set_id: "cs_9".into(),
            since_unix_ms: 0,
        }],
    };
    assert_eq!(
        instance_json(&inst),
        json!({
            "name": "app",
            "id": "inst_1",
            "status": "DEPLOYED",
            "version": 7,
            "resources": {
                "config": {
                    "type": "local/file",
                    "status": "CREATED",
                    "spec": {"path": "/tmp/x", "token": {"sensitive": true}},
                    "state": {"id": {"unknown": true}},
                    "externalId": "/tmp/x",
                    "dependsOn": ["dir"],
                    "failureReason": null,
                }
            },
            "links": [{
                "resourceA": "config",
                "resourceB": "dir",
                "linkType": "local/file::local/dir",
                "status": "CREATED",
                "data": null,
            }],
            "children": [],
            "exports": {"path": "/tmp/x"},
            "environment": {
                "name": "dev",
                "digest": "sha256:ab",
                "providers": {"local": {"root": "/srv", "token": {"sensitive": true}}},
            },
            "queued": [{
                "kind": "DEPLOY",
                "requestId": "req-2",
                "caller": "ci",
                "changeSetId": "cs_9",
                "since": 0,
            }],
        })
    );
    let text = instance_text(&inst);
    assert!(
        text.contains("Waiting for their turn") && text.contains("req-2") && text.contains("ci"),
        "{text}"
    );
    assert!(text.contains("Status:  DEPLOYED"), "{text}");
    assert!(text.contains("Environment: dev sha256:ab"), "{text}");
    assert!(
        text.contains("  local {\"root\": \"/srv\", \"token\": (sensitive)}"),
        "{text}"
    );
    assert!(text.contains("config    local/file  CREATED"), "{text}");
    assert!(text.contains("  path = \"/tmp/x\""), "{text}");
}

#[test]
fn instances_json_and_text() {
    let list = pb::ListInstancesResponse {
        instances: vec![pb::Instance {
            id: "inst_1".into(),
            name: "app".into(),
            status: pb::InstanceStatus::UpdateFailed as i32,
            version: 2,
            ..Default::default()
        }],
    };
    assert_eq!(
        instances_json(&list),
        json!({"instances": [{"name": "app", "id": "inst_1", "status": "UPDATE_FAILED", "version": 2}]})
    );
    assert_eq!(
        instances_text(&list),
        "NAME  STATUS         VERSION  ID\napp   UPDATE_FAILED  2        inst_1\n"
    );
    assert_eq!(
        instances_text(&pb::ListInstancesResponse::default()),
        "No instances.\n"
    );
}

#[test]
fn change_set_json_shape() {
    let doc = change_set_json(&sample_change_set());
    assert_eq!(doc["id"], "cs_1");
    assert_eq!(doc["status"], "PLANNED");
    assert_eq!(doc["plannedVersion"], 3);
    let actions: Vec<&str> = doc["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["CREATE", "UPDATE", "RECREATE", "DELETE", "NO_CHANGE"]
    );
    // A new field has no `previous`; values keep their markers.
    assert_eq!(
        doc["resources"][0]["fields"],
        json!([
            {"path": "spec.path", "new": "/tmp/app.conf", "mustRecreate": true},
            {"path": "spec.id", "new": {"unknown": true}, "mustRecreate": false},
            {"path": "spec.token", "new": {"sensitive": true}, "mustRecreate": false},
        ])
    );
    assert_eq!(doc["resources"][0]["reason"], Json::Null);
    assert_eq!(doc["resources"][1]["dependsOn"], json!(["config"]));
    assert_eq!(
        doc["resources"][2]["reason"],
        "spec.engine cannot change in place"
    );
    assert_eq!(doc["resources"][2]["fields"][0]["mustRecreate"], true);
    assert_eq!(
        doc["exports"],
        json!([{"name": "url", "action": "CREATE", "new": {"unknown": true}}])
    );
    assert_eq!(
        doc["links"],
        json!([{"resourceA": "env", "resourceB": "config",
                    "linkType": "local/envFile::local/file", "action": "CREATE"}])
    );
    assert_eq!(doc["diagnostics"][0]["severity"], "warning");
    assert_eq!(doc["diagnostics"][0]["code"], "T0301");
    assert_eq!(doc["diagnostics"][0]["end_column"], 6);
}

#[test]
fn plan_text_shows_changes_and_hides_secrets() {
    let text = plan_text(&sample_change_set(), true);
    let expected = "\
Change set cs_1 for instance app (planned against version 3)

  + config  (local/file)
      spec.path: \"/tmp/app.conf\"
      spec.id: (known after deploy)
      spec.token: (sensitive)

  ~ web  (aws/lambda/function)
      spec.memory: 128 → 256

-/+ db  (aws/rds/instance)  must be recreated: spec.engine cannot change in place
      spec.engine: \"postgres\" → \"mysql\"  (forces recreate)

  - old  (local/file)

Links:
  + env -> config  (local/envFile::local/file)

Exports:
  + url: (known after deploy)

warning[T0301]: unused variable `x`
  --> app.yaml:3:5

Plan: 1 to create, 1 to update, 1 to recreate, 1 to delete, 1 unchanged.
To deploy it: trellis deploy --change-set cs_1
";
    assert_eq!(text, expected);
    assert!(!text.contains("****"));
    assert!(!plan_text(&sample_change_set(), false).contains("trellis deploy"));
}

#[test]
fn plan_without_changes() {
    let cs = pb::ChangeSet {
        id: "cs_2".into(),
        instance: "app".into(),
        resources: vec![change("same", "local/dir", pb::ChangeAction::NoChange)],
        ..Default::default()
    };
    let text = plan_text(&cs, true);
    assert!(
        text.contains("\nNo changes: 1 resource unchanged.\n"),
        "{text}"
    );
    assert!(!text.contains("same"), "{text}");
}

#[test]
fn values_as_text() {
    let nested = map(&[
        (
            "a",
            v(Kind::List(pv::ListValue {
                items: vec![v(Kind::Bool(true)), unknown()],
            })),
        ),
        ("b", secret()),
        ("c", v(Kind::Float(1.5))),
        ("d", v(Kind::Null(0))),
    ]);
    assert_eq!(
        value_text(&nested),
        "{\"a\": [true, (known after deploy)], \"b\": (sensitive), \"c\": 1.5, \"d\": null}"
    );
    assert_eq!(value_text(&s("line\nbreak")), "\"line\\nbreak\"");
    // A local asset: its name and the start of its digest.
    let uri = format!("asset:sha256:{}/code", "0123456789abcdef".repeat(4));
    assert_eq!(value_text(&s(&uri)), "\"code\" (sha256:0123456789ab…)");
    // Not quite one: as any string.
    assert_eq!(value_text(&s("asset:x/code")), "\"asset:x/code\"");
}

#[test]
fn drift_json_and_text() {
    let report = pb::DriftReport {
        instance: "app".into(),
        drifted: true,
        resources: vec![
            pb::ResourceDrift {
                name: "web".into(),
                resource_type: "aws/lambda/function".into(),
                kind: pb::DriftKind::Changed as i32,
                fields: vec![field(
                    "spec.memory",
                    Some(v(Kind::Int(128))),
                    Some(v(Kind::Int(512))),
                )],
                detail: String::new(),
            },
            pb::ResourceDrift {
                name: "db".into(),
                resource_type: "aws/rds/instance".into(),
                kind: pb::DriftKind::Missing as i32,
                fields: vec![],
                detail: "not found".into(),
            },
        ],
        errors: vec!["cache: provider unavailable".into()],
    };
    assert_eq!(
        drift_json(&report),
        json!({
            "instance": "app",
            "drifted": true,
            "resources": [
                {"name": "web", "type": "aws/lambda/function", "kind": "CHANGED",
                 "fields": [{"path": "spec.memory", "previous": 128, "new": 512, "mustRecreate": false}],
                 "detail": null},
                {"name": "db", "type": "aws/rds/instance", "kind": "MISSING", "fields": [],
                 "detail": "not found"},
            ],
            "errors": ["cache: provider unavailable"],
        })
    );
    let text = drift_text(&report);
    assert!(
        text.contains("~ web  (aws/lambda/function)  changed\n    spec.memory: 128 → 512\n"),
        "{text}"
    );
    assert!(
        text.contains("- db  (aws/rds/instance)  missing: not found\n"),
        "{text}"
    );
    assert!(
        text.contains("Could not read:\n  cache: provider unavailable\n"),
        "{text}"
    );
    assert_eq!(drift_exit_code(&report), 3);
    let clean = pb::DriftReport {
        instance: "app".into(),
        ..Default::default()
    };
    assert_eq!(drift_exit_code(&clean), 0);
    assert_eq!(drift_text(&clean), "No drift in instance app.\n");
    let unread = pb::DriftReport {
        errors: vec!["x".into()],
        ..clean
    };
    assert_eq!(drift_exit_code(&unread), 1);
}

#[test]
fn exit_codes() {
    use pb::OperationStatus as S;
    let op = |status: S| pb::Operation {
        status: status as i32,
        ..Default::default()
    };
    assert_eq!(operation_exit_code(&op(S::Succeeded)), 0);
    for s in [S::Failed, S::Cancelled, S::Interrupted] {
        assert_eq!(operation_exit_code(&op(s)), 1);
    }
    assert_eq!(plan_exit_code(&sample_change_set()), 0);
    let mut bad = sample_change_set();
    bad.diagnostics[0].severity = pb::Severity::Error as i32;
    assert_eq!(plan_exit_code(&bad), 1);
    assert!(!plan_text(&bad, true).contains("To deploy it"));
}

#[test]
fn status_mapping() {
    let engine = "http://127.0.0.1:8325";
    let f = status_failure(&tonic::Status::not_found("instance x not found"), engine);
    assert_eq!(
        (f.exit, f.code.as_str(), f.message.as_str()),
        (2, "NOT_FOUND", "instance x not found")
    );
    let f = status_failure(
        &tonic::Status::failed_precondition("change set cs_1 is stale: plan again"),
        engine,
    );
    assert_eq!(
        (f.exit, f.message.as_str()),
        (1, "change set cs_1 is stale: plan again")
    );
    let f = status_failure(&tonic::Status::aborted("instance app is busy"), engine);
    assert_eq!(f.exit, 1);
    assert!(
        f.message
            .starts_with("instance app is busy (another operation")
    );
    let diags = "error[T0301]: unknown variable\n  --> app.yaml:3:5";
    let f = status_failure(&tonic::Status::invalid_argument(diags), engine);
    assert_eq!((f.exit, f.message.as_str()), (1, diags));
    let f = status_failure(&tonic::Status::already_exists("request id reused"), engine);
    assert_eq!((f.exit, f.code.as_str()), (2, "ALREADY_EXISTS"));
    assert!(f.message.contains("--request-id"));
    let f = status_failure(&tonic::Status::unavailable("connection refused"), engine);
    assert_eq!(f.exit, 2);
    assert_eq!(
        f.message,
        "cannot reach the engine at http://127.0.0.1:8325: connection refused (is `trellis serve` running?)"
    );
    let f = status_failure(&tonic::Status::internal("boom"), engine);
    assert_eq!(
        (f.exit, f.message.as_str()),
        (1, "the engine answered INTERNAL: boom")
    );
    assert_eq!(code_name(Code::DeadlineExceeded), "DEADLINE_EXCEEDED");
}

fn event(seq: u64, kind: &str, payload: Json) -> pb::Event {
    pb::Event {
        instance_id: "inst_1".into(),
        seq,
        kind: kind.into(),
        payload_json: payload.to_string(),
        at_unix_ms: 1_700_000_000_123,
        operation_id: "op_1".into(),
    }
}

#[test]
fn an_operation_ends_as_its_terminal_event_says_when_the_engine_is_gone() {
    let op = pb::Operation {
        id: "op_1".into(),
        status: pb::OperationStatus::Running as i32,
        ..Default::default()
    };
    let ok = event(9, "operation.finished", json!({"status": "succeeded"}));
    assert_eq!(ended_as(&op, &ok).status(), pb::OperationStatus::Succeeded);
    let failed = event(
        9,
        "operation.finished",
        json!({"status": "failed", "error": "boom"}),
    );
    let done = ended_as(&op, &failed);
    assert_eq!(done.status(), pb::OperationStatus::Failed);
    assert_eq!(done.error, "boom");
    assert_eq!(done.id, "op_1");
    let cut = event(9, "operation.interrupted", json!({}));
    assert_eq!(
        ended_as(&op, &cut).status(),
        pb::OperationStatus::Interrupted
    );
}

/// Every write a sink makes, one entry each.
#[derive(Clone, Default)]
struct Writes(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Write for Writes {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf).into_owned();
        self.0.lock().unwrap().push(text);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Writes {
    fn taken(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

fn destroyed(i: u64) -> pb::Event {
    event(
        i + 1,
        "resource.destroyed",
        json!({"resource": format!("r{i}"), "type": "sim/resource"}),
    )
}

/// A destroy's display of `total` resources, as on a terminal (`tty`) or not, and its writes.
fn display(tty: bool, total: usize) -> (LiveDisplay, Writes) {
    let writes = Writes::default();
    let progress = Progress::new("destroy", "app", Some(total));
    let display = LiveDisplay::writing_to(progress, tty, Box::new(writes.clone()));
    (display, writes)
}

#[test]
fn progress_lines_go_out_together_when_the_stream_pauses() {
    let (mut display, writes) = display(false, 2100);
    for i in 0..100 {
        display.event(&destroyed(i)).unwrap();
    }
    assert_eq!(writes.taken(), Vec::<String>::new());
    display.idle().unwrap();
    let written = writes.taken();
    assert_eq!(written.len(), 1, "{written:?}");
    let lines: Vec<&str> = written[0].lines().collect();
    let expected: Vec<String> = (0..100)
        .map(|i| format!("resource.destroyed  r{i}  (sim/resource)"))
        .collect();
    assert_eq!(lines, expected);
    display.idle().unwrap();
    assert_eq!(writes.taken(), Vec::<String>::new());
    // A long burst is written in pieces of at least HELD_BACK bytes, nothing lost.
    for i in 100..2100 {
        display.event(&destroyed(i)).unwrap();
    }
    display.clear();
    let written = writes.taken();
    let sizes: Vec<usize> = written.iter().map(String::len).collect();
    assert!(sizes.len() >= 3, "{sizes:?}");
    assert!(
        sizes[..sizes.len() - 1]
            .iter()
            .all(|&n| (HELD_BACK..HELD_BACK + 100).contains(&n)),
        "{sizes:?}"
    );
    let lines: Vec<String> = written.concat().lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 2000);
    assert_eq!(lines[1999], "resource.destroyed  r2099  (sim/resource)");
}

#[test]
fn a_terminal_gets_the_finished_lines_then_one_status_line() {
    let (mut display, writes) = display(true, 3);
    for i in 0..3 {
        display.event(&destroyed(i)).unwrap();
    }
    assert_eq!(writes.taken(), Vec::<String>::new());
    display.idle().unwrap();
    let written = writes.taken();
    assert_eq!(written.len(), 1, "{written:?}");
    let text = &written[0];
    assert!(
        text.starts_with(
            "\r\x1b[2Kresource.destroyed  r0  (sim/resource)\n\r\x1b[2Kresource.destroyed  r1  (sim/resource)\n"
        ),
        "{text:?}"
    );
    assert!(
        text.ends_with("\r\x1b[2Kdestroying app: 3/3 resources done, 0 in progress [00:00]"),
        "{text:?}"
    );
    // Clearing removes the status line.
    display.clear();
    assert_eq!(writes.taken(), vec!["\r\x1b[2K".to_owned()]);
}

#[test]
fn events_as_json_and_lines() {
    let e = event(
        12,
        "resource.created",
        json!({"resource": "config", "externalId": "/x"}),
    );
    assert_eq!(
        event_json(&e, payload(&e)),
        json!({
            "seq": 12,
            "kind": "resource.created",
            "at": "2023-11-14T22:13:20.123Z",
            "operationId": "op_1",
            "payload": {"resource": "config", "externalId": "/x"},
        })
    );
    let types = HashMap::from([("config".to_owned(), "local/file".to_owned())]);
    assert_eq!(
        event_line(&e, &payload(&e), &types),
        "resource.created  config  (local/file)"
    );
    let failed = event(
        13,
        "resource.failed",
        json!({"resource": "web", "reason": "timeout"}),
    );
    assert_eq!(
        event_line(&failed, &payload(&failed), &types),
        "resource.failed  web: timeout"
    );
    let linked = event(
        15,
        "link.created",
        json!({"resourceA": "env", "resourceB": "config", "linkType": "local/envFile::local/file"}),
    );
    assert_eq!(
        event_line(&linked, &payload(&linked), &types),
        "link.created  env -> config  (local/envFile::local/file)"
    );
    let finished = event(14, "operation.finished", json!({"status": "succeeded"}));
    assert_eq!(
        event_line(&finished, &payload(&finished), &types),
        "operation.finished  SUCCEEDED"
    );
    let raw = pb::Event {
        payload_json: "not json".into(),
        operation_id: String::new(),
        at_unix_ms: 0,
        ..e
    };
    assert_eq!(event_json(&raw, payload(&raw))["payload"], "not json");
    assert_eq!(event_json(&raw, payload(&raw))["operationId"], Json::Null);
    assert_eq!(event_json(&raw, payload(&raw))["at"], Json::Null);
}

#[test]
fn timestamps() {
    assert_eq!(rfc3339(0, false), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(951_782_400_000, false), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(1_709_251_199_999, true), "2024-02-29T23:59:59.999Z");
    assert_eq!(clock(Duration::from_secs(4)), "00:04");
    assert_eq!(clock(Duration::from_secs(3725)), "1:02:05");
}

#[test]
fn progress_counts_resources_from_events() {
    let mut p = Progress::new("deploy", "app", Some(3));
    let r = |seq, kind: &str, name: &str| {
        event(seq, kind, json!({"resource": name, "type": "local/file"}))
    };
    assert!(!p.observe(&r(1, "resource.create_requested", "a")).1);
    p.observe(&r(2, "resource.create_requested", "b"));
    let (line, finished) = p.observe(&r(3, "resource.created", "a"));
    assert!(finished);
    assert_eq!(line, "resource.created  a  (local/file)");
    p.observe(&r(4, "resource.failed", "b"));
    p.observe(&r(5, "resource.update_requested", "c"));
    assert_eq!(
        p.status_line(Duration::from_secs(4)),
        "deploying app: 1/3 resources done, 1 in progress, 1 failed [00:04]"
    );
    assert_eq!(p.events, 5);
    let mut q = Progress::new("destroy", "app", None);
    q.observe(&r(1, "resource.destroyed", "a"));
    assert_eq!(
        q.status_line(Duration::ZERO),
        "destroying app: 1 resource done, 0 in progress [00:00]"
    );
    q.observe(&r(2, "resource.forgotten", "b"));
    q.observe(&r(3, "rollback.started", "b"));
    assert_eq!(
        q.status_line(Duration::ZERO),
        "destroying app: 2 resources done, 0 in progress [00:00]"
    );
}

#[test]
fn progress_messages_show_in_lines_and_the_status_line() {
    let mut p = Progress::new("deploy", "app", Some(2));
    let ev = |seq, kind: &str, payload: Json| event(seq, kind, payload);
    p.observe(&ev(
        1,
        "resource.create_requested",
        json!({"resource": "fn", "type": "aws/lambda/function"}),
    ));
    let (line, finished) = p.observe(&ev(
        2,
        "resource.progress",
        json!({"resource": "fn", "type": "aws/lambda/function", "message": "uploading code", "fraction": 0.4}),
    ));
    assert!(!finished);
    assert_eq!(
        line,
        "resource.progress  fn  (aws/lambda/function): uploading code (40%)"
    );
    assert_eq!(
        p.status_line(Duration::from_secs(3)),
        "deploying app: 0/2 resources done, 1 in progress [00:03] fn: uploading code (40%)"
    );
    // A message without a fraction (negative in the protocol, left out of the event).
    let (line, _) = p.observe(&ev(
        3,
        "resource.progress",
        json!({"resource": "fn", "message": "waiting for the function"}),
    ));
    assert_eq!(
        line,
        "resource.progress  fn  (aws/lambda/function): waiting for the function"
    );
    // The resource's end clears its message.
    p.observe(&ev(4, "resource.created", json!({"resource": "fn"})));
    assert_eq!(
        p.status_line(Duration::from_secs(4)),
        "deploying app: 1/2 resources done, 0 in progress [00:04]"
    );
}

#[test]
fn operation_result_text() {
    let op = pb::Operation {
        id: "op_1".into(),
        instance: "app".into(),
        kind: pb::OperationKind::Deploy as i32,
        status: pb::OperationStatus::Failed as i32,
        error: "web: timeout".into(),
        created_at_unix_ms: 1_000,
        finished_at_unix_ms: 13_000,
        change_set_id: "cs_1".into(),
        ..Default::default()
    };
    assert_eq!(
        operation_text(&op, Duration::ZERO),
        "Deploy of app FAILED after 00:12 (operation op_1).\nerror: web: timeout\n"
    );
    assert_eq!(
        cancel_text(&op),
        "Nothing to cancel: operation op_1 (deploy of app) already ended FAILED.\n"
    );
    assert_eq!(
        operation_json(&op),
        json!({"id": "op_1", "instance": "app", "kind": "DEPLOY", "status": "FAILED",
                   "error": "web: timeout", "changeSetId": "cs_1"})
    );
}

// ---- against a fake engine ----------------------------------------------------------------

use pb::engine_server::{Engine, EngineServer};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};

type Stream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::WatchResponse, Status>> + Send>>;

/// Serves the events of operation `op_1` (seq 5 to 9), breaking the first stream after two
/// events, and records the `after_seq` of every watch.
#[derive(Default)]
struct FakeEngine {
    watches: Arc<Mutex<Vec<u64>>>,
    /// Backup: send a SHA-256 that is not the content's.
    damaged_backup: bool,
}

/// What the fake's backup sends, in two chunks.
const BACKUP: [&[u8]; 2] = [b"SQLite format 3\0", b"the rest of the pages"];

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("not in the fake"))
}

#[tonic::async_trait]
impl Engine for FakeEngine {
    type ValidateStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::Diagnostic, Status>> + Send>>;
    type WatchOperationStream = Stream;
    type WatchInstanceStream = Stream;
    type BackupStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::BackupChunk, Status>> + Send>>;

    async fn backup(
        &self,
        _: Request<pb::BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        let whole = BACKUP.concat();
        let sha256 = if self.damaged_backup {
            trellis_ids::sha256_hex(b"something else")
        } else {
            trellis_ids::sha256_hex(&whole)
        };
        let total_bytes = whole.len() as u64;
        let chunks = vec![
            Ok(pb::BackupChunk {
                data: BACKUP[0].to_vec(),
                total_bytes,
                sha256: String::new(),
            }),
            Ok(pb::BackupChunk {
                data: BACKUP[1].to_vec(),
                total_bytes,
                sha256,
            }),
        ];
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }

    async fn validate(
        &self,
        _: Request<pb::ValidateRequest>,
    ) -> Result<Response<Self::ValidateStream>, Status> {
        unimplemented()
    }
    async fn create_change_set(
        &self,
        _: Request<pb::CreateChangeSetRequest>,
    ) -> Result<Response<pb::ChangeSet>, Status> {
        unimplemented()
    }
    async fn get_change_set(
        &self,
        _: Request<pb::GetChangeSetRequest>,
    ) -> Result<Response<pb::ChangeSet>, Status> {
        unimplemented()
    }
    async fn list_change_sets(
        &self,
        _: Request<pb::ListChangeSetsRequest>,
    ) -> Result<Response<pb::ListChangeSetsResponse>, Status> {
        unimplemented()
    }
    async fn execute_change_set(
        &self,
        _: Request<pb::ExecuteChangeSetRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        unimplemented()
    }
    async fn destroy(
        &self,
        _: Request<pb::DestroyRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        unimplemented()
    }
    async fn get_instance(
        &self,
        _: Request<pb::GetInstanceRequest>,
    ) -> Result<Response<pb::Instance>, Status> {
        Err(Status::not_found("instance x not found"))
    }
    async fn list_instances(
        &self,
        _: Request<pb::ListInstancesRequest>,
    ) -> Result<Response<pb::ListInstancesResponse>, Status> {
        Ok(Response::new(pb::ListInstancesResponse::default()))
    }
    async fn get_exports(
        &self,
        _: Request<pb::GetExportsRequest>,
    ) -> Result<Response<pb::GetExportsResponse>, Status> {
        unimplemented()
    }
    async fn get_operation(
        &self,
        _: Request<pb::GetOperationRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        unimplemented()
    }
    async fn list_operations(
        &self,
        _: Request<pb::ListOperationsRequest>,
    ) -> Result<Response<pb::ListOperationsResponse>, Status> {
        unimplemented()
    }
    async fn watch_operation(
        &self,
        request: Request<pb::WatchOperationRequest>,
    ) -> Result<Response<Stream>, Status> {
        let after = request.into_inner().after_seq;
        let first = {
            let mut watches = self.watches.lock().unwrap();
            watches.push(after);
            watches.len() == 1
        };
        let item = |e: pb::Event| {
            Ok(pb::WatchResponse {
                item: Some(pb::watch_response::Item::Event(e)),
            })
        };
        let kinds = [
            (5, "operation.started"),
            (6, "resource.create_requested"),
            (7, "resource.created"),
            (8, "link.created"),
            (9, "operation.finished"),
        ];
        let mut items: Vec<Result<pb::WatchResponse, Status>> = vec![Ok(pb::WatchResponse {
            item: Some(pb::watch_response::Item::Heartbeat(pb::Heartbeat {
                last_seq: 9,
            })),
        })];
        items.extend(
            kinds
                .iter()
                .filter(|(seq, _)| *seq > after)
                .map(|(seq, kind)| item(event(*seq, kind, json!({"resource": "a"})))),
        );
        if first {
            items.truncate(3);
            items.push(Err(Status::unavailable("connection reset")));
        }
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }
    async fn watch_instance(
        &self,
        _: Request<pb::WatchInstanceRequest>,
    ) -> Result<Response<Stream>, Status> {
        unimplemented()
    }
    async fn cancel_operation(
        &self,
        _: Request<pb::CancelOperationRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        unimplemented()
    }
    async fn check_drift(
        &self,
        _: Request<pb::CheckDriftRequest>,
    ) -> Result<Response<pb::DriftReport>, Status> {
        unimplemented()
    }
    async fn reconcile(
        &self,
        _: Request<pb::ReconcileRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        unimplemented()
    }
    async fn import_resource(
        &self,
        _: Request<pb::ImportResourceRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        unimplemented()
    }
}

#[derive(Default)]
struct Collect(Vec<u64>);

impl WatchSink for Collect {
    fn event(&mut self, event: &pb::Event) -> Result<(), Failure> {
        self.0.push(event.seq);
        Ok(())
    }
}

#[tokio::test]
async fn watch_resumes_after_a_broken_stream() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let fake = FakeEngine::default();
    let watches = fake.watches.clone();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(EngineServer::new(fake))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut client = Client {
        api: connect_with(&addr, None, BearerToken::default())
            .await
            .unwrap(),
        engine: addr,
    };
    let mut seen = Collect::default();
    let target = WatchTarget::Operation("op_1".into());
    watch(&mut client, &target, 0, &mut seen).await.unwrap();
    // Nothing missed, nothing repeated, stopped at `operation.finished`.
    assert_eq!(seen.0, [5, 6, 7, 8, 9]);
    assert_eq!(*watches.lock().unwrap(), [0, 6]);

    let err = client
        .api
        .get_instance(pb::GetInstanceRequest {
            instance: "x".into(),
            reveal_secrets: false,
        })
        .await
        .unwrap_err();
    assert_eq!(client.fail(err).message, "instance x not found");
}

#[tokio::test]
async fn connects_over_a_unix_socket() {
    let dir = std::env::temp_dir().join(format!("trellis-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("engine.sock");
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(EngineServer::new(FakeEngine::default()))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let mut api = connect(&format!("unix:{}", path.display())).await.unwrap();
    let list = api
        .list_instances(pb::ListInstancesRequest {})
        .await
        .unwrap();
    assert!(list.into_inner().instances.is_empty());
    let _ = std::fs::remove_dir_all(&dir);

    let missing = connect(&format!("unix:{}", dir.join("none.sock").display()))
        .await
        .unwrap_err();
    assert_eq!(missing.exit, 2);
    assert!(
        missing.message.contains("(is `trellis serve` running?)"),
        "{}",
        missing.message
    );
}

#[test]
fn invalid_plan_shows_diagnostics_like_validate() {
    let cs = pb::ChangeSet {
        instance: "app".into(),
        status: pb::ChangeSetStatus::Invalid as i32,
        diagnostics: vec![
            pb::Diagnostic {
                code: "T0501".into(),
                severity: pb::Severity::Error as i32,
                message: "unknown variable `x`".into(),
                file: "app.yaml".into(),
                line: 2,
                column: 14,
                end_line: 2,
                end_column: 15,
                ..Default::default()
            },
            pb::Diagnostic {
                code: "T0501".into(),
                severity: pb::Severity::Error as i32,
                message: "unknown variable `y`".into(),
                file: "on-the-engine-host.yaml".into(),
                line: 1,
                column: 1,
                hint: "declare it".into(),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    assert_eq!(plan_exit_code(&cs), 1);
    let sent = vec![(
        "app.yaml".to_owned(),
        b"version: 2023-04-20\nvalue: \"\xc3\xa9${x}\"\n".to_vec(),
    )];
    let text = invalid_plan_text(&cs, &sent);
    let expected = "\
error[T0501]: unknown variable `x`
 --> app.yaml:2:14
  |
2 | value: \"\u{e9}${x}\"
  |              ^

error[T0501]: unknown variable `y`
  --> on-the-engine-host.yaml:1:1
  = hint: declare it

error: the blueprint is invalid: 2 errors, 0 warnings; nothing was planned
";
    assert_eq!(text, expected);
    assert_eq!(text_offset("ab\ncd", 2, 2), Some(4));
    assert_eq!(
        text_offset("ab\ncd", 2, 9),
        Some(5),
        "capped at the line's end"
    );
    assert_eq!(text_offset("ab", 3, 1), None);
}

/// The fake engine on a free port, and a client of it.
async fn fake_client(fake: FakeEngine) -> Client {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(EngineServer::new(fake))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    Client {
        api: connect_with(&addr, None, BearerToken::default())
            .await
            .unwrap(),
        engine: addr,
    }
}

#[tokio::test]
async fn a_backup_is_written_whole_owner_only_or_not_at_all() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("trellis-cli-backup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("state.bak");
    let args = BackupArgs {
        file: file.clone(),
        engine: EngineArgs {
            engine: String::new(),
            ca_cert: None,
            token_file: None,
            format: OutputFormat::Json,
        },
    };
    let names = || {
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };

    let mut client = fake_client(FakeEngine::default()).await;
    assert_eq!(backup::backup(&mut client, &args).await, Ok(0));
    assert_eq!(std::fs::read(&file).unwrap(), BACKUP.concat());
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
    assert_eq!(names(), ["state.bak"]);

    // A copy that does not match the engine's checksum never replaces the file.
    let mut client = fake_client(FakeEngine {
        damaged_backup: true,
        ..FakeEngine::default()
    })
    .await;
    std::fs::write(&file, b"the older backup").unwrap();
    let failure = backup::backup(&mut client, &args).await.unwrap_err();
    assert_eq!((failure.exit, failure.code.as_str()), (1, "DATA_LOSS"));
    assert!(
        failure.message.contains("did not arrive whole"),
        "{failure}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"the older backup");
    assert_eq!(names(), ["state.bak"]);
    let _ = std::fs::remove_dir_all(&dir);
}

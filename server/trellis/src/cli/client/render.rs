//! Rendering: change sets, instances, drift and events as documented JSON (`*_json`) and as
//! text (`*_text`), pure functions of the API's messages.

use super::*;
use crate::cli::plural;

/// Drops a proto enum value's prefix: `short("INSTANCE_STATUS_DEPLOYED", "INSTANCE_STATUS")` is
/// `DEPLOYED`.
pub(super) fn short<'a>(name: &'a str, prefix: &str) -> &'a str {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('_'))
        .filter(|rest| !rest.is_empty())
        .unwrap_or(name)
}

pub(crate) fn kind_word(op: &pb::Operation) -> &'static str {
    match op.kind() {
        pb::OperationKind::Destroy => "destroy",
        pb::OperationKind::Reconcile => "reconcile",
        pb::OperationKind::Import => "import",
        _ => "deploy",
    }
}

pub(crate) fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    chars.next().map_or_else(String::new, |c| {
        c.to_uppercase().chain(chars).collect::<String>()
    })
}

/// Optional text: `null` in JSON when empty.
fn opt_str(s: &str) -> Json {
    if s.is_empty() {
        Json::Null
    } else {
        Json::String(s.to_owned())
    }
}

/// A value as JSON, with the markers `trellis eval --format json` uses: a value known only
/// after deploy is `{"unknown": true}`, a secret `{"sensitive": true}`.
pub(super) fn value_json(v: Option<&pv::Value>) -> Json {
    use pv::value::Kind;
    let Some(v) = v else { return Json::Null };
    if v.sensitive {
        return json!({ "sensitive": true });
    }
    match &v.kind {
        Some(Kind::Unknown(_)) => json!({ "unknown": true }),
        Some(Kind::List(l)) => Json::Array(l.items.iter().map(|i| value_json(Some(i))).collect()),
        Some(Kind::Map(m)) => Json::Object(
            m.entries
                .iter()
                .map(|e| (e.key.clone(), value_json(e.value.as_ref())))
                .collect(),
        ),
        _ => values::to_json(
            v,
            JsonMarks {
                mask_sensitive: true,
            },
        ),
    }
}

/// Asked for with `--reveal-secrets`: secrets the engine sent with their values print as
/// those values (a masked one, without a value, stays masked).
pub(crate) fn reveal_instance(inst: &mut pb::Instance) {
    pub(crate) fn reveal(v: &mut pv::Value) {
        use pv::value::Kind;
        if v.kind.is_some() {
            v.sensitive = false;
        }
        match &mut v.kind {
            Some(Kind::List(l)) => l.items.iter_mut().for_each(reveal),
            Some(Kind::Map(m)) => m
                .entries
                .iter_mut()
                .filter_map(|e| e.value.as_mut())
                .for_each(reveal),
            _ => {}
        }
    }
    for r in &mut inst.resources {
        r.spec.iter_mut().chain(r.state.iter_mut()).for_each(reveal);
    }
    for l in &mut inst.links {
        l.data.iter_mut().for_each(reveal);
    }
    for e in &mut inst.exports {
        e.value.iter_mut().for_each(reveal);
    }
}

// ---- rendering: JSON --------------------------------------------------------------------------

/// `trellis instance --format json`.
pub(super) fn instance_json(inst: &pb::Instance) -> Json {
    let resources: Map<String, Json> = inst
        .resources
        .iter()
        .map(|r| {
            let v = json!({
                "type": r.resource_type,
                "status": short(r.status().as_str_name(), "RESOURCE_STATUS"),
                "spec": value_json(r.spec.as_ref()),
                "state": value_json(r.state.as_ref()),
                "externalId": opt_str(&r.external_id),
                "dependsOn": r.depends_on,
                "failureReason": opt_str(&r.failure_reason),
            });
            (r.name.clone(), v)
        })
        .collect();
    let links: Vec<Json> = inst
        .links
        .iter()
        .map(|l| {
            json!({
                "resourceA": l.resource_a,
                "resourceB": l.resource_b,
                "linkType": l.link_type,
                "status": short(l.status().as_str_name(), "RESOURCE_STATUS"),
                "data": value_json(l.data.as_ref()),
            })
        })
        .collect();
    let children: Vec<Json> = inst
        .children
        .iter()
        .map(|c| json!({ "name": c.name, "instanceId": c.instance_id }))
        .collect();
    let exports: Map<String, Json> = inst
        .exports
        .iter()
        .map(|e| (e.name.clone(), value_json(e.value.as_ref())))
        .collect();
    json!({
        "name": inst.name,
        "id": inst.id,
        "status": short(inst.status().as_str_name(), "INSTANCE_STATUS"),
        "version": inst.version,
        "resources": resources,
        "links": links,
        "children": children,
        "exports": exports,
        "environment": inst.environment.as_ref().map(|e| json!({
            "name": e.name,
            "digest": e.digest,
            "providers": value_json(e.providers.as_ref()),
        })),
        "queued": inst.queued.iter().map(queued_json).collect::<Vec<_>>(),
    })
}

/// A request waiting for its turn on the instance (`--wait`).
fn queued_json(q: &pb::QueuedOperation) -> Json {
    json!({
        "kind": short(q.kind().as_str_name(), "OPERATION_KIND"),
        "requestId": q.request_id,
        "caller": opt_str(&q.caller),
        "changeSetId": opt_str(&q.change_set_id),
        "since": q.since_unix_ms,
    })
}

/// `trellis instances --format json`.
pub(super) fn instances_json(list: &pb::ListInstancesResponse) -> Json {
    let items: Vec<Json> = list
        .instances
        .iter()
        .map(|i| {
            json!({
                "name": i.name,
                "id": i.id,
                "status": short(i.status().as_str_name(), "INSTANCE_STATUS"),
                "version": i.version,
            })
        })
        .collect();
    json!({ "instances": items })
}

fn field_json(f: &pb::FieldChange) -> Json {
    let mut o = Map::new();
    o.insert("path".into(), json!(f.path));
    if let Some(v) = &f.previous {
        o.insert("previous".into(), value_json(Some(v)));
    }
    if let Some(v) = &f.new {
        o.insert("new".into(), value_json(Some(v)));
    }
    o.insert("mustRecreate".into(), json!(f.must_recreate));
    if !f.origin.is_empty() {
        o.insert("origin".into(), json!(f.origin));
    }
    Json::Object(o)
}

fn action_name(action: pb::ChangeAction) -> &'static str {
    short(action.as_str_name(), "CHANGE_ACTION")
}

/// A diagnostic in the shape `trellis validate --format json` uses.
fn diagnostic_json(d: &pb::Diagnostic) -> Json {
    let mut v = json!({
        "severity": severity_word(d),
        "code": d.code,
        "message": d.message,
        "file": d.file,
        "line": d.line,
        "column": d.column,
        "end_line": d.end_line,
        "end_column": d.end_column,
    });
    if !d.hint.is_empty()
        && let Some(o) = v.as_object_mut()
    {
        o.insert("hint".into(), json!(d.hint));
    }
    v
}

fn severity_word(d: &pb::Diagnostic) -> &'static str {
    match d.severity() {
        pb::Severity::Error => "error",
        pb::Severity::Warning => "warning",
        pb::Severity::Info | pb::Severity::Unspecified => "info",
    }
}

fn resources_json(resources: &[pb::ResourceChange]) -> Vec<Json> {
    resources
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "type": r.resource_type,
                "action": action_name(r.action()),
                "fields": r.fields.iter().map(field_json).collect::<Vec<_>>(),
                "reason": opt_str(&r.reason),
                "dependsOn": r.depends_on,
                "derivedFrom": r.derived_from.as_ref().map(|d| json!({
                    "resource": d.resource,
                    "transform": d.transform,
                })),
            })
        })
        .collect()
}

fn links_json(links: &[pb::LinkChange]) -> Vec<Json> {
    links
        .iter()
        .map(|l| {
            json!({
                "resourceA": l.resource_a,
                "resourceB": l.resource_b,
                "linkType": l.link_type,
                "action": action_name(l.action()),
            })
        })
        .collect()
}

fn exports_json(exports: &[pb::ExportChange]) -> Vec<Json> {
    exports
        .iter()
        .map(|e| {
            let mut o = Map::new();
            o.insert("name".into(), json!(e.name));
            o.insert("action".into(), json!(action_name(e.action())));
            if let Some(v) = &e.previous {
                o.insert("previous".into(), value_json(Some(v)));
            }
            if let Some(v) = &e.new {
                o.insert("new".into(), value_json(Some(v)));
            }
            Json::Object(o)
        })
        .collect()
}

/// One entry of `children` in the `changeSet` object (nested for the child's own children).
fn child_json(c: &pb::ChildChange) -> Json {
    json!({
        "name": c.name,
        "instance": c.instance,
        "action": action_name(c.action()),
        "plannedVersion": c.planned_version,
        "summary": c.summary,
        "resources": resources_json(&c.resources),
        "links": links_json(&c.links),
        "exports": exports_json(&c.exports),
        "children": c.children.iter().map(child_json).collect::<Vec<_>>(),
        "unknownVariables": c.unknown_variables,
        "deferred": opt_str(&c.deferred),
        "diagnostics": c.diagnostics.iter().map(diagnostic_json).collect::<Vec<_>>(),
    })
}

/// The `changeSet` object of `trellis plan/deploy --format json`.
pub(super) fn change_set_json(cs: &pb::ChangeSet) -> Json {
    json!({
        "id": cs.id,
        "instance": cs.instance,
        "status": short(cs.status().as_str_name(), "CHANGE_SET_STATUS"),
        "plannedVersion": cs.planned_version,
        "digest": cs.digest,
        "summary": cs.summary,
        "resources": resources_json(&cs.resources),
        "links": links_json(&cs.links),
        "exports": exports_json(&cs.exports),
        "diagnostics": cs.diagnostics.iter().map(diagnostic_json).collect::<Vec<_>>(),
        "children": cs.children.iter().map(child_json).collect::<Vec<_>>(),
    })
}

/// The `operation` object of `trellis deploy/destroy/reconcile/cancel --format json`.
pub(super) fn operation_json(op: &pb::Operation) -> Json {
    json!({
        "id": op.id,
        "instance": op.instance,
        "kind": short(op.kind().as_str_name(), "OPERATION_KIND"),
        "status": short(op.status().as_str_name(), "OPERATION_STATUS"),
        "error": opt_str(&op.error),
        "changeSetId": opt_str(&op.change_set_id),
    })
}

/// One line of `trellis events --format json`.
/// `payload` is the event's, parsed ([`payload`]).
pub(super) fn event_json(event: &pb::Event, payload: Json) -> Json {
    json!({
        "seq": event.seq,
        "kind": event.kind,
        "at": if event.at_unix_ms == 0 { Json::Null } else { json!(rfc3339(event.at_unix_ms, true)) },
        "operationId": opt_str(&event.operation_id),
        "payload": payload,
    })
}

/// The event's payload as JSON (`{}` when empty; kept as a string if it is not JSON).
pub(crate) fn payload(event: &pb::Event) -> Json {
    if event.payload_json.trim().is_empty() {
        return json!({});
    }
    serde_json::from_str(&event.payload_json)
        .unwrap_or_else(|_| Json::String(event.payload_json.clone()))
}

pub(crate) fn str_field<'a>(payload: &'a Json, key: &str) -> Option<&'a str> {
    payload
        .get(key)
        .and_then(Json::as_str)
        .filter(|s| !s.is_empty())
}

pub(crate) fn resource_of(payload: &Json) -> Option<&str> {
    str_field(payload, "resource").or_else(|| str_field(payload, "name"))
}

/// `trellis drift --format json`.
pub(super) fn drift_json(report: &pb::DriftReport) -> Json {
    let resources: Vec<Json> = report
        .resources
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "type": r.resource_type,
                "kind": short(r.kind().as_str_name(), "DRIFT_KIND"),
                "fields": r.fields.iter().map(field_json).collect::<Vec<_>>(),
                "detail": opt_str(&r.detail),
            })
        })
        .collect();
    json!({
        "instance": report.instance,
        "drifted": report.drifted,
        "resources": resources,
        "errors": report.errors,
    })
}

// ---- rendering: text --------------------------------------------------------------------------

pub(crate) const UNKNOWN_TEXT: &str = crate::eval::render::UNKNOWN_TEXT;
pub(crate) const SENSITIVE_TEXT: &str = crate::eval::render::SENSITIVE_TEXT;

/// A value on one line: JSON-like, with `(known after deploy)` and `(sensitive)` in place.
pub(super) fn value_text(v: &pv::Value) -> String {
    let mut out = String::new();
    write_value(v, &mut out);
    out
}

fn write_value(v: &pv::Value, out: &mut String) {
    if v.sensitive {
        out.push_str(SENSITIVE_TEXT);
        return;
    }
    match &v.kind {
        None | Some(Kind::Null(_)) => out.push_str("null"),
        Some(Kind::Bool(b)) => out.push_str(if *b { "true" } else { "false" }),
        Some(Kind::Int(i)) => out.push_str(&i.to_string()),
        Some(Kind::Float(f)) => out.push_str(&Json::from(*f).to_string()),
        // A local asset reads as its name and a short digest (`code (sha256:1a2b3c4d5e6f…)`):
        // enough to see which content changed (the JSON output keeps the whole URI).
        Some(Kind::String(s)) => match crate::engine::assets::parse_uri(s) {
            Some((digest, name)) => out.push_str(&format!(
                "{} ({}…)",
                Json::String(name.to_owned()),
                &digest[..digest.len().min(19)]
            )),
            None => out.push_str(&Json::String(s.clone()).to_string()),
        },
        Some(Kind::Unknown(_)) => out.push_str(UNKNOWN_TEXT),
        Some(Kind::List(l)) => {
            out.push('[');
            for (i, item) in l.items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Some(Kind::Map(m)) => {
            out.push('{');
            for (i, e) in m.entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&Json::String(e.key.clone()).to_string());
                out.push_str(": ");
                match &e.value {
                    Some(v) => write_value(v, out),
                    None => out.push_str("null"),
                }
            }
            out.push('}');
        }
    }
}

/// `path: old → new`; `forcing` marks the fields that force a recreate (only meaningful when
/// the resource is recreated: the engine flags immutable fields on creates too).
fn field_text(f: &pb::FieldChange, forcing: bool) -> String {
    let mut line = format!("{}: ", f.path);
    match (&f.previous, &f.new) {
        (Some(old), Some(new)) => {
            line.push_str(&format!("{} → {}", value_text(old), value_text(new)));
        }
        (None, Some(new)) => line.push_str(&value_text(new)),
        (Some(old), None) => line.push_str(&format!("{} → (removed)", value_text(old))),
        (None, None) => line.push_str("(removed)"),
    }
    if f.origin == "provider" {
        // A state value the provider's PlanResource says the resource will have.
        line.push_str("  (planned by the provider)");
    } else if !f.origin.is_empty() {
        line.push_str(&format!("  (injected by {})", f.origin));
    }
    if forcing && f.must_recreate {
        line.push_str("  (forces recreate)");
    }
    line
}

fn action_sign(action: pb::ChangeAction) -> &'static str {
    match action {
        pb::ChangeAction::Create => "+",
        pb::ChangeAction::Update => "~",
        pb::ChangeAction::Recreate => "-/+",
        pb::ChangeAction::Delete => "-",
        pb::ChangeAction::NoChange | pb::ChangeAction::Unspecified => " ",
    }
}

/// The engine found the blueprint invalid: nothing was planned, `diagnostics` say why.
pub(super) fn is_invalid(cs: &pb::ChangeSet) -> bool {
    cs.status() == pb::ChangeSetStatus::Invalid
}

/// The documents a request sends (to show diagnostics with their source lines); none for a
/// path on the engine host.
pub(crate) fn sent_files(source: &pb::BlueprintSource) -> Vec<(String, Vec<u8>)> {
    match &source.source {
        Some(pb::blueprint_source::Source::Inline(b)) => {
            std::iter::once((b.file_name.clone(), b.content.clone()))
                .chain(
                    b.children
                        .iter()
                        .map(|c| (c.path.clone(), c.content.clone())),
                )
                .collect()
        }
        _ => Vec::new(),
    }
}

/// An invalid blueprint, as `trellis validate` shows one: every diagnostic (with its source
/// line when it is in a document this command sent), then a summary line.
pub(super) fn invalid_plan_text(cs: &pb::ChangeSet, sent: &[(String, Vec<u8>)]) -> String {
    let mut sources = crate::source::SourceMap::new();
    let files: Vec<(&str, crate::source::FileId)> = sent
        .iter()
        .map(|(name, bytes)| {
            let text = String::from_utf8_lossy(bytes).into_owned();
            (name.as_str(), sources.add(name.clone(), text))
        })
        .collect();
    let mut out = String::new();
    for d in &cs.diagnostics {
        let located = files
            .iter()
            .find(|(name, _)| *name == d.file)
            .and_then(|(_, id)| located_diagnostic(d, *id, &sources));
        match located {
            Some(diag) => out.push_str(&crate::diag::render_text(&diag, &sources)),
            None => out.push_str(&diagnostic_text(d)),
        }
        out.push('\n');
    }
    let errors = cs
        .diagnostics
        .iter()
        .filter(|d| d.severity() == pb::Severity::Error)
        .count();
    let warnings = cs.diagnostics.len() - errors;
    out.push_str(&format!(
        "error: the blueprint is invalid: {errors} error{}, {warnings} warning{}; nothing was \
         planned\n",
        plural(errors),
        plural(warnings)
    ));
    out
}

/// `d` as a diagnostic spanning its lines and columns in `file`, to render with its source
/// line; `None` when its code or location does not fit.
fn located_diagnostic(
    d: &pb::Diagnostic,
    file: crate::source::FileId,
    sources: &crate::source::SourceMap,
) -> Option<crate::diag::Diagnostic> {
    use crate::diag::Severity;
    let code = crate::diag::lookup(&d.code)?;
    let text = &sources.get(file).text;
    let start = text_offset(text, d.line, d.column)?;
    let end = text_offset(text, d.end_line, d.end_column)
        .filter(|&e| e >= start)
        .unwrap_or(start);
    Some(crate::diag::Diagnostic {
        severity: match d.severity() {
            pb::Severity::Error => Severity::Error,
            pb::Severity::Warning => Severity::Warning,
            pb::Severity::Info | pb::Severity::Unspecified => Severity::Info,
        },
        code,
        message: d.message.clone(),
        span: crate::source::Span::new(file, start, end),
        hint: (!d.hint.is_empty()).then(|| d.hint.clone()),
    })
}

/// The byte offset of 1-based `line` and `column` (in characters) in `text`, the column
/// capped at the line's end.
pub(crate) fn text_offset(text: &str, line: u32, column: u32) -> Option<usize> {
    if line == 0 || column == 0 {
        return None;
    }
    let mut start = 0;
    for _ in 1..line {
        start += text[start..].find('\n')? + 1;
    }
    let line_text = text[start..].split('\n').next().unwrap_or("");
    let within = line_text
        .char_indices()
        .nth(column as usize - 1)
        .map_or(line_text.len(), |(i, _)| i);
    Some(start + within)
}

fn diagnostic_text(d: &pb::Diagnostic) -> String {
    let mut text = if d.code.is_empty() {
        format!("{}: {}\n", severity_word(d), d.message)
    } else {
        format!("{}[{}]: {}\n", severity_word(d), d.code, d.message)
    };
    if d.line > 0 {
        text.push_str(&format!("  --> {}:{}:{}\n", d.file, d.line, d.column));
    } else if !d.file.is_empty() {
        text.push_str(&format!("  --> {}\n", d.file));
    }
    if !d.hint.is_empty() {
        text.push_str(&format!("  = hint: {}\n", d.hint));
    }
    text
}

/// Resource blocks (those that change), then link and export changes, as `trellis plan`
/// shows them; returns the resource counts (create, update, recreate, delete, unchanged).
fn changes_text(
    resources: &[pb::ResourceChange],
    links: &[pb::LinkChange],
    exports: &[pb::ExportChange],
    out: &mut String,
) -> [usize; 5] {
    use pb::ChangeAction as A;
    let mut counts = [0usize; 5]; // create, update, recreate, delete, unchanged
    for r in resources {
        let action = r.action();
        let slot = match action {
            A::Create => 0,
            A::Update => 1,
            A::Recreate => 2,
            A::Delete => 3,
            A::NoChange | A::Unspecified => 4,
        };
        counts[slot] += 1;
        if slot == 4 {
            continue;
        }
        out.push_str(&format!(
            "\n{:>3} {}  ({})",
            action_sign(action),
            r.name,
            r.resource_type
        ));
        if let Some(d) = &r.derived_from {
            out.push_str(&derived_text(&d.resource, &d.transform));
        }
        if action == A::Recreate && !r.reason.is_empty() {
            out.push_str(&format!("  must be recreated: {}", r.reason));
        }
        out.push('\n');
        for f in &r.fields {
            let line = field_text(f, action == A::Recreate);
            out.push_str(&format!("      {line}\n"));
        }
    }
    let links: Vec<_> = links
        .iter()
        .filter(|l| !matches!(l.action(), A::NoChange | A::Unspecified))
        .collect();
    if !links.is_empty() {
        out.push_str("\nLinks:\n");
        for l in links {
            out.push_str(&format!(
                "{:>3} {} -> {}  ({})\n",
                action_sign(l.action()),
                l.resource_a,
                l.resource_b,
                l.link_type
            ));
        }
    }
    let exports: Vec<_> = exports
        .iter()
        .filter(|e| !matches!(e.action(), A::NoChange | A::Unspecified))
        .collect();
    if !exports.is_empty() {
        out.push_str("\nExports:\n");
        for e in exports {
            let f = pb::FieldChange {
                path: e.name.clone(),
                previous: e.previous.clone(),
                new: e.new.clone(),
                must_recreate: false,
                origin: String::new(),
            };
            out.push_str(&format!(
                "{:>3} {}\n",
                action_sign(e.action()),
                field_text(&f, false)
            ));
        }
    }
    counts
}

/// Children that change, each with its own changes indented under it; unchanged children are
/// only counted. Returns the counts (create, update, delete, unchanged).
fn children_text(children: &[pb::ChildChange], out: &mut String) -> [usize; 4] {
    use pb::ChangeAction as A;
    let mut counts = [0usize; 4];
    for c in children {
        let action = c.action();
        let slot = match action {
            A::Create => 0,
            A::Update | A::Recreate => 1,
            A::Delete => 2,
            A::NoChange | A::Unspecified => 3,
        };
        counts[slot] += 1;
        if slot == 3 {
            continue;
        }
        out.push_str(&format!(
            "\n{:>3} {}  (instance {})",
            action_sign(action),
            c.name,
            c.instance
        ));
        if !c.deferred.is_empty() {
            out.push_str(&format!("  changes known at deploy: {}", c.deferred));
        } else if !c.unknown_variables.is_empty() {
            out.push_str(&format!(
                "  known after deploy: {}",
                c.unknown_variables
                    .iter()
                    .map(|v| format!("variables.{v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        out.push('\n');
        let mut body = String::new();
        changes_text(&c.resources, &c.links, &c.exports, &mut body);
        if c.children.iter().any(|n| n.action() != A::NoChange) {
            body.push_str("\nChildren:\n");
            children_text(&c.children, &mut body);
        }
        for d in &c.diagnostics {
            body.push('\n');
            body.push_str(&diagnostic_text(d));
        }
        if c.deferred.is_empty() && !c.summary.is_empty() {
            body.push_str(&format!("\n{}\n", c.summary));
        }
        for line in body.split_inclusive('\n') {
            if line != "\n" {
                out.push_str("    ");
            }
            out.push_str(line);
        }
    }
    counts
}

/// The human change set: one block per resource that changes, exports, children, diagnostics,
/// the summary and (with `hint`) the command that deploys it.
pub(super) fn plan_text(cs: &pb::ChangeSet, hint: bool) -> String {
    let mut out = format!(
        "Change set {} for instance {} (planned against version {})\n",
        cs.id, cs.instance, cs.planned_version
    );
    let counts = changes_text(&cs.resources, &cs.links, &cs.exports, &mut out);
    let mut children = [0usize; 4];
    if cs
        .children
        .iter()
        .any(|c| c.action() != pb::ChangeAction::NoChange)
    {
        out.push_str("\nChildren:\n");
    }
    if !cs.children.is_empty() {
        children = children_text(&cs.children, &mut out);
    }
    if !cs.diagnostics.is_empty() {
        out.push('\n');
        for d in &cs.diagnostics {
            out.push_str(&diagnostic_text(d));
        }
    }
    let [create, update, recreate, delete, unchanged] = counts;
    let [c_create, c_update, c_delete, c_unchanged] = children;
    let child_summary = if cs.children.is_empty() {
        String::new()
    } else {
        format!(
            "; children: {c_create} to create, {c_update} to update, {c_delete} to delete, \
             {c_unchanged} unchanged"
        )
    };
    if create + update + recreate + delete + c_create + c_update + c_delete == 0 {
        out.push_str(&format!(
            "\nNo changes: {unchanged} resource{} unchanged",
            plural(unchanged)
        ));
        if !cs.children.is_empty() {
            out.push_str(&format!(
                ", {c_unchanged} child{} unchanged",
                if c_unchanged == 1 { "" } else { "ren" }
            ));
        }
        out.push_str(".\n");
    } else {
        out.push_str(&format!(
            "\nPlan: {create} to create, {update} to update, {recreate} to recreate, {delete} to \
             delete, {unchanged} unchanged{child_summary}.\n"
        ));
    }
    if hint && plan_exit_code(cs) == 0 {
        out.push_str(&format!(
            "To deploy it: trellis deploy --change-set {}\n",
            cs.id
        ));
    }
    out
}

/// Left-aligned columns separated by two spaces.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            s.push_str(cell);
            s.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
        }
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(&mut header.iter().copied());
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// `trellis instances`.
pub(super) fn instances_text(list: &pb::ListInstancesResponse) -> String {
    if list.instances.is_empty() {
        return "No instances.\n".to_owned();
    }
    let rows: Vec<Vec<String>> = list
        .instances
        .iter()
        .map(|i| {
            vec![
                i.name.clone(),
                short(i.status().as_str_name(), "INSTANCE_STATUS").to_owned(),
                i.version.to_string(),
                i.id.clone(),
            ]
        })
        .collect();
    table(&["NAME", "STATUS", "VERSION", "ID"], &rows)
}

/// The environment an instance was last deployed with, and the provider settings it used.
fn environment_text(env: &pb::InstanceEnvironment) -> String {
    let mut out = String::new();
    if !env.name.is_empty() || !env.digest.is_empty() {
        let name = if env.name.is_empty() {
            "(unnamed)"
        } else {
            &env.name
        };
        out.push_str(&format!(
            "Environment: {name} {}
",
            env.digest
        ));
    }
    let providers = match env.providers.as_ref().and_then(|p| p.kind.as_ref()) {
        Some(pv::value::Kind::Map(m)) if !m.entries.is_empty() => &m.entries,
        _ => return out,
    };
    out.push_str("Provider settings:\n");
    for p in providers {
        let settings = p.value.as_ref().map_or_else(|| "{}".to_owned(), value_text);
        out.push_str(&format!("  {} {settings}\n", p.key));
    }
    out
}

/// `trellis instance NAME`: status, resources, failures, exports.
pub(super) fn instance_text(inst: &pb::Instance) -> String {
    let mut out = format!(
        "Instance {} ({})\nStatus:  {}\nVersion: {}\n",
        inst.name,
        inst.id,
        short(inst.status().as_str_name(), "INSTANCE_STATUS"),
        inst.version
    );
    if let Some(env) = &inst.environment {
        out.push_str(&environment_text(env));
    }
    if inst.resources.is_empty() {
        out.push_str("\nNo resources.\n");
    } else {
        let rows: Vec<Vec<String>> = inst
            .resources
            .iter()
            .map(|r| {
                vec![
                    r.name.clone(),
                    r.resource_type.clone(),
                    short(r.status().as_str_name(), "RESOURCE_STATUS").to_owned(),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table(&["RESOURCE", "TYPE", "STATUS"], &rows));
        for r in inst
            .resources
            .iter()
            .filter(|r| !r.failure_reason.is_empty())
        {
            out.push_str(&format!("  {}: {}\n", r.name, r.failure_reason));
        }
    }
    if !inst.exports.is_empty() {
        out.push_str("\nExports:\n");
        for e in &inst.exports {
            let value = e
                .value
                .as_ref()
                .map_or_else(|| "null".to_owned(), value_text);
            out.push_str(&format!("  {} = {}\n", e.name, value));
        }
    }
    if !inst.queued.is_empty() {
        out.push_str("\nWaiting for their turn (first first):\n");
        let rows: Vec<Vec<String>> = inst
            .queued
            .iter()
            .enumerate()
            .map(|(i, q)| {
                vec![
                    (i + 1).to_string(),
                    short(q.kind().as_str_name(), "OPERATION_KIND").to_ascii_lowercase(),
                    q.request_id.clone(),
                    if q.caller.is_empty() {
                        "-".to_owned()
                    } else {
                        q.caller.clone()
                    },
                    rfc3339(q.since_unix_ms, false),
                ]
            })
            .collect();
        out.push_str(&table(&["#", "KIND", "REQUEST", "CALLER", "SINCE"], &rows));
    }
    out
}

/// `trellis drift`.
pub(super) fn drift_text(report: &pb::DriftReport) -> String {
    let mut out = if report.drifted {
        let n = report.resources.len();
        format!(
            "Drift in instance {}: {n} resource{} drifted (values: state → found)\n",
            report.instance,
            plural(n)
        )
    } else {
        format!("No drift in instance {}.\n", report.instance)
    };
    for r in &report.resources {
        let (sign, word) = match r.kind() {
            pb::DriftKind::Changed => ("~", "changed"),
            pb::DriftKind::Missing => ("-", "missing"),
            pb::DriftKind::Unresolved => ("?", "unresolved"),
            pb::DriftKind::Unspecified => (" ", "drifted"),
        };
        out.push_str(&format!(
            "\n{sign} {}  ({})  {word}",
            r.name, r.resource_type
        ));
        if !r.detail.is_empty() {
            out.push_str(&format!(": {}", r.detail));
        }
        out.push('\n');
        for f in &r.fields {
            out.push_str(&format!("    {}\n", field_text(f, false)));
        }
    }
    if !report.errors.is_empty() {
        out.push_str("\nCould not read:\n");
        for e in &report.errors {
            out.push_str(&format!("  {e}\n"));
        }
    }
    if report.drifted {
        out.push_str(&format!(
            "\nTo resolve: trellis reconcile --instance {} --mode accept|reapply\n",
            report.instance
        ));
    }
    out
}

/// `  from saveOrder (celerity-2023-04-20)`: after a generated resource's name and type, the
/// abstract resource it came from and the transform.
fn derived_text(resource: &str, transform: &str) -> String {
    format!("  from {resource} ({transform})")
}

/// One event as a line: `resource.created  config  (local/file)`, with the status or reason
/// when the payload (the event's, parsed: [`payload`]) has one.
pub(super) fn event_line(
    event: &pb::Event,
    payload: &Json,
    types: &HashMap<String, String>,
) -> String {
    let mut line = event.kind.clone();
    if let Some(resource) = resource_of(payload) {
        line.push_str("  ");
        line.push_str(resource);
        let ty = str_field(payload, "type").or_else(|| types.get(resource).map(String::as_str));
        if let Some(ty) = ty {
            line.push_str(&format!("  ({ty})"));
        }
        if let Some(d) = payload.get("derivedFrom")
            && let (Some(from), Some(transform)) =
                (str_field(d, "resource"), str_field(d, "transform"))
        {
            line.push_str(&derived_text(from, transform));
        }
    }
    if let (Some(a), Some(b)) = (
        str_field(payload, "resourceA"),
        str_field(payload, "resourceB"),
    ) {
        line.push_str(&format!("  {a} -> {b}"));
        if let Some(ty) = str_field(payload, "linkType") {
            line.push_str(&format!("  ({ty})"));
        }
    }
    if let Some(status) = str_field(payload, "status") {
        line.push_str("  ");
        line.push_str(&status.to_uppercase());
    }
    if let Some(reason) = str_field(payload, "reason").or_else(|| str_field(payload, "error")) {
        line.push_str(": ");
        line.push_str(reason);
    }
    if event.kind == "resource.progress"
        && let Some(message) = progress_text(payload)
    {
        line.push_str(": ");
        line.push_str(&message);
    }
    line
}

/// A provider's progress message, with its fraction as a percentage when it gave one:
/// `uploading code (40%)`.
pub(super) fn progress_text(payload: &Json) -> Option<String> {
    let message = str_field(payload, "message")?;
    Some(match payload.get("fraction").and_then(Json::as_f64) {
        Some(f) if (0.0..=1.0).contains(&f) => format!("{message} ({:.0}%)", f * 100.0),
        _ => message.to_owned(),
    })
}

/// `trellis cancel`: what the engine answered.
pub(super) fn cancel_text(op: &pb::Operation) -> String {
    let what = format!("operation {} ({} of {})", op.id, kind_word(op), op.instance);
    let status = short(op.status().as_str_name(), "OPERATION_STATUS");
    if is_terminal(op.status()) {
        format!("Nothing to cancel: {what} already ended {status}.\n")
    } else {
        format!("Cancellation requested: {what} is {status}; it stops at its next safe point.\n")
    }
}

/// `trellis deploy/destroy/reconcile`: the final status.
pub(super) fn operation_text(op: &pb::Operation, watched: Duration) -> String {
    let took = if op.created_at_unix_ms > 0 && op.finished_at_unix_ms >= op.created_at_unix_ms {
        Duration::from_millis((op.finished_at_unix_ms - op.created_at_unix_ms) as u64)
    } else {
        watched
    };
    let status = short(op.status().as_str_name(), "OPERATION_STATUS");
    let what = format!("{} of {}", capitalized(kind_word(op)), op.instance);
    let mut out = match op.status() {
        pb::OperationStatus::Succeeded => {
            format!(
                "{what} succeeded in {} (operation {}).\n",
                clock(took),
                op.id
            )
        }
        _ => format!(
            "{what} {status} after {} (operation {}).\n",
            clock(took),
            op.id
        ),
    };
    if !op.error.is_empty() {
        out.push_str(&format!("error: {}\n", op.error));
    }
    if op.status() == pb::OperationStatus::Interrupted {
        out.push_str(&format!(
            "The engine stopped while it ran: check `trellis drift --instance {}`, then \
             `trellis reconcile`.\n",
            op.instance
        ));
    }
    out
}

/// `mm:ss`, or `h:mm:ss` past an hour.
pub(crate) fn clock(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{:02}:{:02}", s / 60, s % 60)
    }
}

/// Unix milliseconds as RFC 3339 UTC (`2024-05-01T12:00:00.123Z`).
pub(crate) fn rfc3339(unix_ms: i64, millis: bool) -> String {
    let secs = unix_ms.div_euclid(1000);
    let ms = unix_ms.rem_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (rem / 3600, rem / 60 % 60, rem % 60);
    if millis {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{ms:03}Z")
    } else {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
    }
}

//! `PlanResource`: once the engine has planned, providers that declare
//! `Capabilities.plan_resource` are asked for their view of each create, update and recreate
//! (all at once, bounded), and what they answer goes into the plan:
//!
//! - `recreate_paths`: a changed field at or under one replaces the resource, as a schema's
//!   `must_recreate` would; an update becomes a recreate, saying why.
//! - `planned_state`: each known value of the state the provider expects is a field change of
//!   the plan at `state.<path>` (origin `provider`), so plans show what is known before
//!   deploy; values the provider cannot tell yet, and those that do not change, are left out.
//! - `diagnostics` (warnings) are the plan's, at the field they name; an `error`, or an error
//!   diagnostic, fails the plan like a validation error.
//!
//! Planning itself (`plan.rs`) stays free of provider calls; this runs after it, only while
//! planning a change set (never when executing one: its plan is recorded).

use std::collections::HashMap;

use serde_json::Value as Json;
use trellis_proto::plugin::v1 as pb;

use crate::blueprint::PathStep;
use crate::check::PluginContext;
use crate::diag::{Diagnostic, Severity, codes};
use crate::diff::{FieldChange, RecreatePaths, Shown, push_key, spec_path};
use crate::plan::{Action, Plan, PlannedResource};
use crate::plugins::CallOptions;
use crate::prepare::Prepared;
use crate::state::InstanceState;
use trellis_lang::plugin_checks::path_steps;

/// Calls in flight at once (one connection per plugin carries them all).
const IN_FLIGHT: usize = 32;

/// Asks the providers that plan, and applies their answers to `plan` (diagnostics into
/// `prepared`).
pub(crate) fn consult(
    plan: &mut Plan,
    prepared: &mut Prepared,
    current: &InstanceState,
    plugins: &PluginContext<'_>,
) {
    let candidates: Vec<usize> = plan
        .resources
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r.action, Action::Create | Action::Update | Action::Recreate))
        .map(|(i, _)| i)
        .collect();
    if candidates.is_empty() || !plugins.ask_providers {
        return;
    }
    // Which namespaces plan: asked once each (the providers are running: validation used them).
    let mut planning: HashMap<String, bool> = HashMap::new();
    for &i in &candidates {
        let ns = namespace(&plan.resources[i].resource_type).to_owned();
        if planning.contains_key(&ns) {
            continue;
        }
        let declared = plugins.host.provider(&ns).ok().is_some_and(|client| {
            plugins
                .rt
                .block_on(client.capabilities())
                .is_ok_and(|c| c.plan_resource)
        });
        planning.insert(ns, declared);
    }
    let recorded: HashMap<&str, &crate::state::Resource> = current
        .resources
        .iter()
        .map(|r| (r.name.as_str(), r))
        .collect();
    let asked: Vec<(usize, pb::PlanResourceRequest)> = candidates
        .into_iter()
        .filter(|&i| planning[namespace(&plan.resources[i].resource_type)])
        .filter_map(|i| {
            let r = &plan.resources[i];
            let x = prepared
                .evaluation
                .resources
                .iter()
                .find(|x| x.name == r.name && x.included())?;
            let desired = crate::plugins::values::from_eval(prepared.evaluation.spec(x))?;
            // A recreate is a new resource to the provider.
            let current = (r.action == Action::Update)
                .then(|| recorded.get(r.name.as_str()))
                .flatten()
                .map(|rec| pb::ResourceState {
                    resource_type: rec.resource_type.clone(),
                    resource_name: rec.name.clone(),
                    external_id: rec.external_id.clone().unwrap_or_default(),
                    spec: Some(crate::state_values::to_pb(&rec.spec)),
                    state: rec.state.as_ref().map(crate::state_values::to_pb),
                });
            Some((
                i,
                pb::PlanResourceRequest {
                    context: None,
                    current,
                    desired_spec: Some(desired),
                    resource_type: r.resource_type.clone(),
                    resource_name: r.name.clone(),
                },
            ))
        })
        .collect();
    if asked.is_empty() {
        return;
    }
    let instance_id = current.instance.id.clone();
    let answers = {
        use futures_util::stream::{self, StreamExt};
        let calls = asked.iter().map(|(_, req)| {
            let ns = namespace(&req.resource_type).to_owned();
            let options = CallOptions {
                instance_id: instance_id.clone(),
                provider_config: plugins.configs.get(&ns),
                request_id: plugins.request_id.clone(),
                ..CallOptions::default()
            };
            let req = req.clone();
            async move {
                let client = plugins.host.provider(&ns).map_err(|e| e.to_string())?;
                client
                    .plan_resource(req, &options)
                    .await
                    .map_err(|e| e.to_string())
            }
        });
        plugins
            .rt
            .block_on(stream::iter(calls).buffered(IN_FLIGHT).collect::<Vec<_>>())
    };
    for ((i, _), answer) in asked.into_iter().zip(answers) {
        let resource = &mut plan.resources[i];
        let recorded_state = recorded
            .get(resource.name.as_str())
            .and_then(|r| r.state.as_ref());
        match answer {
            Err(message) => {
                let at = locate(prepared, resource, &[]);
                prepared.diags.push(Diagnostic::new(
                    &codes::PLUGIN_UNAVAILABLE,
                    at,
                    format!(
                        "resource `{}`: PlanResource failed: {message}",
                        resource.name
                    ),
                ));
            }
            Ok(resp) => {
                if let Some(e) = &resp.error {
                    let steps = path_steps(e.path.as_ref());
                    let at = locate(prepared, resource, &steps);
                    prepared.diags.push(Diagnostic::new(
                        &codes::PROVIDER_DIAGNOSTIC,
                        at,
                        format!(
                            "resource `{}` ({}): the provider cannot plan it: {}",
                            resource.name, resource.resource_type, e.message
                        ),
                    ));
                    continue;
                }
                for d in &resp.diagnostics {
                    let at = locate(prepared, resource, &path_steps(d.path.as_ref()));
                    let mut diag = Diagnostic::new(
                        &codes::PROVIDER_DIAGNOSTIC,
                        at,
                        format!(
                            "resource `{}` ({}){}: {}",
                            resource.name,
                            resource.resource_type,
                            if d.code.is_empty() {
                                String::new()
                            } else {
                                format!(" [{}]", d.code)
                            },
                            d.message
                        ),
                    );
                    diag.severity =
                        match pb::Severity::try_from(d.severity).unwrap_or(pb::Severity::Error) {
                            pb::Severity::Warning => Severity::Warning,
                            pb::Severity::Info => Severity::Info,
                            _ => Severity::Error,
                        };
                    if !d.hint.is_empty() {
                        diag.hint = Some(d.hint.clone());
                    }
                    prepared.diags.push(diag);
                }
                apply_recreate_paths(resource, &resp.recreate_paths);
                if let Some(state) = &resp.planned_state {
                    planned_state_fields(resource, state, recorded_state);
                }
            }
        }
    }
}

fn namespace(resource_type: &str) -> &str {
    resource_type.split('/').next().unwrap_or_default()
}

/// Marks the fields the provider says cannot change in place; an update they touch becomes a
/// recreate.
fn apply_recreate_paths(resource: &mut PlannedResource, paths: &[pb::AttributePath]) {
    if paths.is_empty() {
        return;
    }
    let mut recreate = RecreatePaths::default();
    for p in paths {
        recreate.add(&attribute_path(p));
    }
    let mut forcing = Vec::new();
    for f in &mut resource.fields {
        if f.path.starts_with("spec") && recreate.matches(&f.path) {
            f.must_recreate = true;
            forcing.push(f.path.clone());
        }
    }
    if resource.action == Action::Update && !forcing.is_empty() {
        resource.action = Action::Recreate;
        resource.reason = format!(
            "{} cannot change in place (the provider's plan)",
            forcing.join(", ")
        );
    }
}

/// `spec.a.b[0]`, the [`FieldChange::path`] spelling of a spec path.
fn attribute_path(p: &pb::AttributePath) -> String {
    let mut out = "spec".to_owned();
    for step in &p.steps {
        match &step.step {
            Some(pb::path_step::Step::Field(f)) => push_key(&mut out, f),
            Some(pb::path_step::Step::Index(i)) => out.push_str(&format!("[{i}]")),
            None => {}
        }
    }
    out
}

/// Each known value of the planned state as a field change at `state.<path>`, where it
/// differs from the recorded state.
fn planned_state_fields(
    resource: &mut PlannedResource,
    state: &pb::Value,
    recorded: Option<&Json>,
) {
    let mut leaves = Vec::new();
    leaves_of(state, &mut Vec::new(), &mut leaves);
    for (keys, leaf) in leaves {
        let previous = recorded.and_then(|r| at_keys(r, &keys));
        let new = shown(leaf);
        let previous_shown = previous.map(|p| match crate::state_values::sensitive_inner(p) {
            Some(_) => Shown::Sensitive,
            None => Shown::Value(p.clone()),
        });
        if previous_shown.as_ref() == Some(&new) {
            continue;
        }
        let path = format!("state{}", &spec_path(&keys)[4..]);
        resource.fields.push(FieldChange {
            path,
            previous: previous_shown,
            new: Some(new),
            must_recreate: false,
            origin: Some("provider".to_owned()),
        });
    }
}

/// The known leaves of a value (a map's entries, recursively; anything else whole).
fn leaves_of<'v>(
    v: &'v pb::Value,
    keys: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, &'v pb::Value)>,
) {
    use pb::value::Kind;
    match &v.kind {
        Some(Kind::Unknown(_)) => {}
        Some(Kind::Map(m)) if !v.sensitive => {
            for e in &m.entries {
                if let Some(child) = &e.value {
                    keys.push(e.key.clone());
                    leaves_of(child, keys, out);
                    keys.pop();
                }
            }
        }
        _ if keys.is_empty() => {}
        _ if contains_unknown(v) => {}
        _ => out.push((keys.clone(), v)),
    }
}

fn contains_unknown(v: &pb::Value) -> bool {
    use pb::value::Kind;
    match &v.kind {
        Some(Kind::Unknown(_)) => true,
        Some(Kind::List(l)) => l.items.iter().any(contains_unknown),
        Some(Kind::Map(m)) => m
            .entries
            .iter()
            .any(|e| e.value.as_ref().is_some_and(contains_unknown)),
        _ => false,
    }
}

fn shown(v: &pb::Value) -> Shown {
    if crate::plugins::values::any_sensitive(v) {
        Shown::Sensitive
    } else {
        Shown::Value(crate::plugins::values::to_json(v, Default::default()))
    }
}

fn at_keys<'j>(v: &'j Json, keys: &[String]) -> Option<&'j Json> {
    let mut cur = v;
    for k in keys {
        cur = crate::state_values::sensitive_inner(cur).unwrap_or(cur);
        cur = cur.as_object()?.get(k)?;
    }
    Some(cur)
}

/// Where a diagnostic about `resource` at spec path `steps` points: the field as written,
/// else the resource (for a generated one, the abstract resource it came from).
fn locate(
    prepared: &Prepared,
    resource: &PlannedResource,
    steps: &[PathStep],
) -> crate::source::Span {
    let template = prepared
        .evaluation
        .resources
        .iter()
        .find(|x| x.name == resource.name)
        .map(|x| x.template.clone());
    let written = template
        .as_deref()
        .or(resource.derived_from.as_ref().map(|d| d.resource.as_str()));
    let node = written.and_then(|t| {
        prepared
            .blueprint
            .resources
            .iter()
            .find(|r| r.name.value == t)
    });
    node.and_then(|r| r.spec.as_ref().map(|s| s.locate(steps)))
        .or_else(|| node.map(|r| r.name.span))
        .unwrap_or(prepared.blueprint.span)
}

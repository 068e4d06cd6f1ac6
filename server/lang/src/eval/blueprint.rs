//! Blueprint-level evaluation: variables from inputs and defaults, values in
//! dependency order parsed to their declared types, resource templates with
//! `each` expanded element by element, and conditions deciding which
//! resources exist. Data sources and children are unknown here (they are
//! fetched and deployed by the engine); resource state is unknown until
//! deploy.

use super::expr::{EvalError, ExternalFunctions, ResourceEntry, ResourceValue, Scope};
use super::functions::Env;
use super::limits::{Budget, Limits};
use super::value::Value;
use crate::blueprint::{Blueprint, Condition, Resource, Scalar, TKind, TNode};
use crate::diag::{Diagnostic, Diagnostics, codes};
use crate::validate::refs::{Graph, NodeRef};
use indexmap::IndexMap;
use std::cell::Cell;

/// One concrete resource after `each` expansion.
#[derive(Clone, Debug)]
pub struct Expanded {
    /// `name` or, for an element of an `each` template, `name_<i>`.
    pub name: String,
    /// The resource template's name in the blueprint.
    pub template: String,
    pub index: Option<usize>,
    /// The `each` element it was expanded from.
    pub element: Option<Value>,
    pub ty: String,
    /// `None` without a condition; otherwise `Bool` or `Unknown`.
    pub condition: Option<Value>,
    /// Index of the evaluated spec and metadata in [`Evaluation::instances`].
    pub instance: usize,
}

impl Evaluation {
    /// The evaluated spec of a resource.
    pub fn spec(&self, x: &Expanded) -> &Value {
        &self.instances[x.instance].spec
    }

    /// The spec as it may be printed: secrets masked.
    pub fn display_spec<'a>(&'a self, x: &'a Expanded) -> &'a Value {
        let v = &self.instances[x.instance];
        v.masked_spec.as_ref().unwrap_or(&v.spec)
    }

    pub fn metadata(&self, x: &Expanded) -> &Value {
        &self.instances[x.instance].metadata
    }

    /// The masked copy of the metadata, when an annotation read a secret.
    pub fn masked_metadata(&self, x: &Expanded) -> Option<&Value> {
        self.instances[x.instance].masked_metadata.as_ref()
    }

    /// The metadata as it may be printed: secrets masked.
    pub fn display_metadata<'a>(&'a self, x: &'a Expanded) -> &'a Value {
        self.masked_metadata(x).unwrap_or_else(|| self.metadata(x))
    }
}

impl Expanded {
    /// Whether the resource will exist (a condition not yet known counts as
    /// "maybe", reported separately).
    pub fn included(&self) -> bool {
        !matches!(self.condition, Some(Value::Bool(false)))
    }
}

#[derive(Debug, Default)]
pub struct Evaluation {
    pub variables: IndexMap<String, Value>,
    pub missing_variables: Vec<String>,
    pub secret_variables: Vec<String>,
    pub values: IndexMap<String, Value>,
    pub secret_values: Vec<String>,
    pub resources: Vec<Expanded>,
    pub entries: IndexMap<String, ResourceEntry>,
    pub instances: Vec<ResourceValue>,
    pub datasources: IndexMap<String, IndexMap<String, Value>>,
    pub children: IndexMap<String, Value>,
    /// The limits of this evaluation and what it has produced so far: every scope made from
    /// it (also when resources are evaluated again at deploy) charges the same budget.
    pub budget: Budget,
    /// Per child, the exports it marked sensitive: reading one marks the scope.
    pub secret_children: IndexMap<String, Vec<String>>,
}

impl Evaluation {
    pub fn scope<'a>(&'a self, env: &'a Env<'a>, elem: Option<(&'a Value, usize)>) -> Scope<'a> {
        self.scope_with(env, elem, None)
    }

    /// A scope that can also call provider functions.
    pub fn scope_with<'a>(
        &'a self,
        env: &'a Env<'a>,
        elem: Option<(&'a Value, usize)>,
        external: Option<&'a dyn ExternalFunctions>,
    ) -> Scope<'a> {
        Scope {
            variables: &self.variables,
            missing_variables: &self.missing_variables,
            secret_variables: &self.secret_variables,
            values: &self.values,
            secret_values: &self.secret_values,
            datasources: &self.datasources,
            children: &self.children,
            secret_children: &self.secret_children,
            resources: &self.entries,
            instances: &self.instances,
            elem,
            env,
            external,
            touched_secret: Cell::new(false),
            budget: &self.budget,
        }
    }

    /// Whether a value may be shown (it did not come from a secret).
    pub fn is_secret_value(&self, name: &str) -> bool {
        self.secret_values.iter().any(|s| s == name)
    }

    /// The text of every scalar of the secret variables and of the values derived from them:
    /// what must never be quoted back, also inside a longer text (`crate::redact`).
    pub fn secret_texts(&self) -> Vec<String> {
        let env = Env {
            cwd: "",
            now_unix_nanos: 0,
            link: &|_, _| Value::Unknown,
        };
        self.scope(&env, None).secret_texts()
    }
}

/// The text of every string and number inside `v`.
pub fn scalar_texts(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Str(s) if !s.is_empty() => out.push(s.clone()),
        Value::Int(i) => out.push(i.to_string()),
        Value::Float(f) => out.push(f.to_string()),
        Value::List(items) => items.iter().for_each(|i| scalar_texts(i, out)),
        Value::Map(m) => m.values().for_each(|i| scalar_texts(i, out)),
        _ => {}
    }
}

/// Resolves variables only: supplied text parsed to the declared type, else
/// the default. Variables without either are listed as missing; reading one
/// is an error (`T0707`) at the reference.
pub fn resolve_variables(bp: &Blueprint, supplied: &[(String, String)]) -> Evaluation {
    let mut ev = Evaluation::default();
    for v in &bp.variables {
        let name = v.name.value.clone();
        if v.secret {
            ev.secret_variables.push(name.clone());
        }
        let ty = v.ty.as_ref().map_or("string", |t| t.value.as_str());
        let given = supplied
            .iter()
            .rev()
            .find(|(k, _)| *k == name)
            .map(|(_, t)| t);
        let value = match given {
            // Inputs were checked against the definition by validation.
            Some(text) => crate::validate::parse_variable_input(ty, text).map(scalar_value),
            None => v.default.as_ref().map(|d| scalar_value(d.value.clone())),
        };
        // A float written as `2` is still a float.
        let value = match (ty, value) {
            ("float", Some(Value::Int(i))) => Some(Value::Float(i as f64)),
            (_, v) => v,
        };
        match value {
            Some(val) => {
                ev.variables.insert(name, val);
            }
            None => ev.missing_variables.push(name),
        }
    }
    ev
}

fn scalar_value(s: Scalar) -> Value {
    match s {
        Scalar::Str(s) => Value::Str(s),
        Scalar::Int(i) => Value::Int(i),
        Scalar::Float(f) => Value::Float(f),
        Scalar::Bool(b) => Value::Bool(b),
    }
}

/// Evaluates values and expands resources, in dependency order. Problems
/// are reported to `diags`; what could not be evaluated is left unknown.
pub fn evaluate(
    bp: &Blueprint,
    graph: &Graph,
    supplied: &[(String, String)],
    env: &Env<'_>,
    external: Option<&dyn ExternalFunctions>,
    diags: &mut Diagnostics,
) -> Evaluation {
    evaluate_with(
        bp,
        graph,
        supplied,
        env,
        external,
        None,
        Limits::default(),
        diags,
    )
}

/// Fetches the candidate items of a data source type from its provider (the engine's plugin
/// host). Filters are passed as a hint; the engine applies them itself.
pub trait DataSourceFetcher {
    fn fetch(
        &self,
        data_source_type: &str,
        filters: &[crate::datasource::filter::Filter],
    ) -> Result<Vec<Value>, String>;

    /// The exports recorded for the data source named `name` when it was fetched before (a
    /// change set executes with what its plan fetched); `None` fetches.
    fn recorded(&self, _name: &str) -> Option<IndexMap<String, Value>> {
        None
    }
}

/// [`evaluate`], fetching data sources in dependency order when `fetcher` is given (at plan
/// time); without one they stay unknown. `limits` bound what the evaluation may build.
#[allow(clippy::too_many_arguments)]
pub fn evaluate_with(
    bp: &Blueprint,
    graph: &Graph,
    supplied: &[(String, String)],
    env: &Env<'_>,
    external: Option<&dyn ExternalFunctions>,
    fetcher: Option<&dyn DataSourceFetcher>,
    limits: Limits,
    diags: &mut Diagnostics,
) -> Evaluation {
    let first = diags.items.len();
    let ev = evaluate_nodes(bp, graph, supplied, env, external, fetcher, limits, diags);
    once_over_budget(diags, first);
    ev
}

#[allow(clippy::too_many_arguments)]
fn evaluate_nodes(
    bp: &Blueprint,
    graph: &Graph,
    supplied: &[(String, String)],
    env: &Env<'_>,
    external: Option<&dyn ExternalFunctions>,
    fetcher: Option<&dyn DataSourceFetcher>,
    limits: Limits,
    diags: &mut Diagnostics,
) -> Evaluation {
    let mut ev = resolve_variables(bp, supplied);
    ev.budget = Budget::new(limits);
    for v in &bp.values {
        if v.secret {
            ev.secret_values.push(v.name.value.clone());
        }
    }
    for r in &bp.resources {
        ev.entries
            .insert(r.name.value.clone(), ResourceEntry::Pending);
    }
    // Nothing can be planned without every input: report each missing one
    // once, where it is declared, rather than at every reference.
    if !ev.missing_variables.is_empty() {
        for v in bp
            .variables
            .iter()
            .filter(|v| ev.missing_variables.contains(&v.name.value))
        {
            diags.push(
                Diagnostic::new(
                    &codes::VARIABLE_REQUIRED,
                    v.name.span,
                    format!(
                        "variable `{}` has no default and no value was given",
                        v.name.value
                    ),
                )
                .with_hint(format!("pass it with --var {}=...", v.name.value)),
            );
        }
        return ev;
    }
    for node in graph.dependency_order() {
        match node {
            NodeRef::Value(i) => {
                let def = &bp.values[i];
                let Some(t) = &def.value else { continue };
                let declared = def.ty.as_ref().map_or("string", |t| t.value.as_str());
                let scope = ev.scope_with(env, None, external);
                let result = scope.guard(scope.whole(t).and_then(|v| {
                    convert(v, declared).map_err(|msg| EvalError {
                        code: &codes::VALUE_TYPE_MISMATCH,
                        span: t.span,
                        message: format!("value `{}`: {msg}", def.name.value),
                    })
                }));
                // A value computed from a secret is itself secret.
                let tainted = scope.touched_secret.get();
                let value = match result {
                    Ok(v) => v,
                    Err(e) => {
                        diags.push(e.into_diagnostic());
                        Value::Unknown
                    }
                };
                if tainted && !def.secret {
                    ev.secret_values.push(def.name.value.clone());
                }
                ev.values.insert(def.name.value.clone(), value);
            }
            NodeRef::Resource(i) => {
                if !expand(&bp.resources[i], &mut ev, env, external, diags) {
                    break;
                }
            }
            NodeRef::DataSource(i) => {
                if let Some(fetch) = fetcher {
                    let ds = &bp.datasources[i];
                    let scope = ev.scope_with(env, None, external);
                    if let Some(exports) = fetch_datasource(ds, &scope, fetch, diags) {
                        ev.datasources.insert(ds.name.value.clone(), exports);
                    }
                }
            }
            NodeRef::Child(_) => {}
        }
        // Out of budget: everything after would fail the same way.
        if ev.budget.exhausted() {
            break;
        }
    }
    ev
}

/// Keeps only the first of the budget diagnostics pushed since `first`: once the budget is
/// spent, every expression after fails alike.
fn once_over_budget(diags: &mut Diagnostics, first: usize) {
    let mut seen = false;
    let mut i = 0;
    diags.items.retain(|d| {
        let keep =
            i < first || d.code != &codes::EVALUATION_BUDGET || !std::mem::replace(&mut seen, true);
        i += 1;
        keep
    });
}

/// Fetches one data source: its filters' search values evaluated, the provider's items filtered
/// with the specification's operator semantics, the first match's exports read and typed.
/// `None` (with a diagnostic) when any step fails; references to it then read unknown.
fn fetch_datasource(
    ds: &crate::blueprint::DataSource,
    scope: &Scope<'_>,
    fetch: &dyn DataSourceFetcher,
    diags: &mut Diagnostics,
) -> Option<IndexMap<String, Value>> {
    use crate::datasource::filter::{Export, ExportType, Filter, Operator, export, select};
    let name = &ds.name.value;
    if let Some(recorded) = fetch.recorded(name) {
        return Some(recorded);
    }
    let ty = ds.ty.as_ref()?;
    let mut filters = Vec::new();
    let mut failed = false;
    for f in &ds.filters {
        let (Some(field), Some(op), Some(search)) = (&f.field, &f.operator, &f.search) else {
            // Incomplete filters are validation errors already.
            return None;
        };
        let op = Operator::parse(&op.value)?;
        let search = node(search, scope, &mut |e| {
            failed = true;
            diags.push(scope.hide(e).into_diagnostic());
        });
        if search.deep_contains_unknown() {
            diags.push(Diagnostic::new(
                &codes::DATASOURCE_FILTER,
                f.span,
                format!(
                    "data source `{name}`: the search value of the filter on `{}` is known only after deploy; data sources are fetched when planning",
                    field.value
                ),
            ));
            return None;
        }
        filters.push(Filter::new(field.value.clone(), op, search));
    }
    if failed {
        return None;
    }
    // The provider may quote a secret it was sent (a search value) or one it found, inside a
    // longer text of its own: its answer and its log lines are cleaned of every secret the
    // blueprint holds.
    let _held = crate::redact::hold(scope.secret_texts());
    let items = match fetch.fetch(&ty.value, &filters) {
        Ok(items) => items,
        Err(message) => {
            let mut sent = Vec::new();
            if scope.touched_secret.get() {
                filters
                    .iter()
                    .for_each(|f| scalar_texts(&f.search, &mut sent));
            }
            let message = crate::redact::redact(&message, &sent);
            diags.push(Diagnostic::new(
                &codes::DATASOURCE_FETCH,
                ty.span,
                format!("data source `{name}` ({}): {message}", ty.value),
            ));
            return None;
        }
    };
    let item = match select(&items, &filters) {
        Ok(Some(item)) => item,
        Ok(None) => {
            let absent = crate::datasource::filter::absent_fields(&items, &filters);
            let mut d = Diagnostic::new(
                &codes::DATASOURCE_NO_MATCH,
                ds.name.span,
                format!(
                    "data source `{name}` ({}): none of the {} item{} the provider returned matched every filter",
                    ty.value,
                    items.len(),
                    if items.len() == 1 { "" } else { "s" }
                ),
            );
            if !absent.is_empty() {
                d = d.with_hint(format!(
                    "no item has the field{} {}",
                    if absent.len() == 1 { "" } else { "s" },
                    absent
                        .iter()
                        .map(|f| format!("`{f}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            diags.push(d);
            return None;
        }
        Err(e) => {
            let span = ds
                .filters
                .iter()
                .find(|f| f.field.as_ref().is_some_and(|x| x.value == e.field))
                .map_or(ds.name.span, |f| f.span);
            diags.push(Diagnostic::new(
                &codes::DATASOURCE_FILTER,
                span,
                format!("data source `{name}`: {e}"),
            ));
            return None;
        }
    };
    let exports: Vec<Export> = ds
        .exports
        .iter()
        .filter_map(|x| {
            let t = ExportType::parse(x.ty.as_ref().map_or("string", |t| t.value.as_str()))?;
            let mut e = Export::new(x.name.value.clone(), t);
            if let Some(a) = &x.alias_for {
                e = e.alias_for(a.value.clone());
            }
            Some(e)
        })
        .collect();
    match export(item, &exports) {
        Ok(values) => Some(values),
        Err(e) => {
            let span = ds
                .exports
                .iter()
                .find(|x| x.name.value == e.export)
                .map_or(ds.name.span, |x| x.name.span);
            diags.push(Diagnostic::new(
                &codes::DATASOURCE_EXPORT,
                span,
                format!("data source `{name}`: {e}"),
            ));
            None
        }
    }
}

/// Evaluates resource `idx` of `ev.resources` again, against the scope as it is now: the
/// executor calls this just before applying a resource, after recording the fresh state of what
/// it depends on in `ev.instances[..].state`. Values that were unknown (because they read state
/// that did not exist yet) are evaluated again first. Returns whether the resource is included.
/// `r` is the resource's template in `bp`.
#[allow(clippy::too_many_arguments)]
pub fn reevaluate(
    bp: &Blueprint,
    graph: &Graph,
    ev: &mut Evaluation,
    idx: usize,
    r: &Resource,
    env: &Env<'_>,
    external: Option<&dyn ExternalFunctions>,
    diags: &mut Diagnostics,
) -> bool {
    let first = diags.items.len();
    let included = reevaluate_one(bp, graph, ev, idx, r, env, external, diags);
    once_over_budget(diags, first);
    included
}

#[allow(clippy::too_many_arguments)]
fn reevaluate_one(
    bp: &Blueprint,
    graph: &Graph,
    ev: &mut Evaluation,
    idx: usize,
    r: &Resource,
    env: &Env<'_>,
    external: Option<&dyn ExternalFunctions>,
    diags: &mut Diagnostics,
) -> bool {
    refresh_values(bp, graph, ev, env, external, diags);
    let x = &ev.resources[idx];
    let element = x.element.clone().zip(x.index);
    let (fresh, value) = instance(
        r,
        &x.name,
        element.as_ref().map(|(v, i)| (v, *i)),
        ev,
        env,
        external,
        diags,
    );
    let slot = ev.resources[idx].instance;
    let state = ev.instances[slot].state.take();
    let masked_state = ev.instances[slot].masked_state.take();
    ev.instances[slot] = ResourceValue {
        state,
        masked_state,
        ..value
    };
    ev.resources[idx].condition = fresh.condition;
    ev.resources[idx].included()
}

/// Evaluates again, in dependency order, the values that are still (partly) unknown.
fn refresh_values(
    bp: &Blueprint,
    graph: &Graph,
    ev: &mut Evaluation,
    env: &Env<'_>,
    external: Option<&dyn ExternalFunctions>,
    diags: &mut Diagnostics,
) {
    if !ev.values.values().any(Value::deep_contains_unknown) {
        return;
    }
    for node in graph.dependency_order() {
        let NodeRef::Value(i) = node else { continue };
        let def = &bp.values[i];
        let name = &def.name.value;
        if !ev
            .values
            .get(name)
            .is_some_and(Value::deep_contains_unknown)
        {
            continue;
        }
        let Some(t) = &def.value else { continue };
        let declared = def.ty.as_ref().map_or("string", |t| t.value.as_str());
        let scope = ev.scope_with(env, None, external);
        let result = scope.guard(scope.whole(t)).map(|v| convert(v, declared));
        let value = match result {
            Ok(Ok(v)) => v,
            Ok(Err(msg)) => {
                diags.push(Diagnostic::new(
                    &codes::VALUE_TYPE_MISMATCH,
                    t.span,
                    format!("value `{name}`: {msg}"),
                ));
                Value::Unknown
            }
            Err(e) => {
                diags.push(e.into_diagnostic());
                Value::Unknown
            }
        };
        ev.values.insert(name.clone(), value);
    }
}

/// Converts a value's result to its declared type: "integers, floats and
/// booleans are parsed from the string value".
fn convert(v: Value, declared: &str) -> Result<Value, String> {
    if v.is_unknown() {
        return Ok(v);
    }
    let found = v.type_name();
    match (declared, v) {
        ("string", Value::Str(s)) => Ok(Value::Str(s)),
        ("string", v @ (Value::Int(_) | Value::Float(_) | Value::Bool(_))) => {
            Ok(Value::Str(v.display_string().unwrap_or_default()))
        }
        ("integer", Value::Int(i)) => Ok(Value::Int(i)),
        ("float", Value::Float(f)) => Ok(Value::Float(f)),
        ("float", Value::Int(i)) => Ok(Value::Float(i as f64)),
        ("boolean", Value::Bool(b)) => Ok(Value::Bool(b)),
        (ty @ ("integer" | "float" | "boolean"), Value::Str(s)) => {
            crate::validate::parse_variable_input(ty, &s)
                .map(scalar_value)
                .ok_or_else(|| format!("{s:?} cannot be parsed as {ty}"))
        }
        ("array", v @ Value::List(_)) => Ok(v),
        ("object", v @ Value::Map(_)) => Ok(v),
        (ty, _) => Err(format!("declared {ty} but the substitution yields {found}")),
    }
}

/// Expands one resource template. `false` when the blueprint has reached the resource limit:
/// nothing after it is expanded.
fn expand(
    r: &Resource,
    ev: &mut Evaluation,
    env: &Env<'_>,
    external: Option<&dyn ExternalFunctions>,
    diags: &mut Diagnostics,
) -> bool {
    let name = r.name.value.clone();
    let max = ev.budget.limits().max_resources;
    let before = ev.resources.len();
    let Some(each) = &r.each else {
        if before >= max {
            diags.push(
                EvalError {
                    code: &codes::TOO_MANY_RESOURCES,
                    span: r.name.span,
                    message: format!(
                        "resource `{name}` would be resource number {} of this blueprint, more \
                         than the limit of {max} resources per blueprint (max-resources)",
                        before + 1
                    ),
                }
                .into_diagnostic(),
            );
            return false;
        }
        let (x, value) = instance(r, &name, None, ev, env, external, diags);
        let index = push_instance(ev, x, value);
        ev.entries.insert(name, ResourceEntry::Single(index.1));
        return true;
    };
    let items = match ev.scope_with(env, None, external).whole(each) {
        Ok(Value::List(items)) => items,
        Ok(Value::Unknown) => {
            diags.push(Diagnostic::new(
                &codes::EVALUATION,
                each.span,
                format!("`each` of resource `{name}` must be known before deploy, but its value is known only after deploy"),
            ));
            return true;
        }
        Ok(other) => {
            diags.push(Diagnostic::new(
                &codes::EACH_TYPE,
                each.span,
                format!(
                    "`each` of resource `{name}` must yield an array, but it yields {}",
                    crate::blueprint::article_of(other.type_name())
                ),
            ));
            return true;
        }
        Err(e) => {
            diags.push(e.into_diagnostic());
            return true;
        }
    };
    if before + items.len() > max {
        diags.push(
            EvalError {
                code: &codes::TOO_MANY_RESOURCES,
                span: each.span,
                message: format!(
                    "`each` of resource `{name}` yields {} elements, which would make {} \
                     resources in this blueprint ({before} before it), more than the limit of \
                     {max} resources per blueprint (max-resources)",
                    items.len(),
                    before + items.len()
                ),
            }
            .into_diagnostic(),
        );
        return false;
    }
    let mut elements = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        // Out of budget: the elements after would fail alike.
        if ev.budget.exhausted() {
            break;
        }
        let (x, value) = instance(
            r,
            &format!("{name}_{i}"),
            Some((item, i)),
            ev,
            env,
            external,
            diags,
        );
        elements.push(push_instance(ev, x, value).1);
    }
    ev.entries.insert(name, ResourceEntry::Template(elements));
    true
}

/// Stores a concrete resource; returns its index in `resources` and `instances`.
fn push_instance(ev: &mut Evaluation, mut x: Expanded, value: ResourceValue) -> (usize, usize) {
    x.instance = ev.instances.len();
    ev.instances.push(value);
    ev.resources.push(x);
    (ev.resources.len() - 1, ev.instances.len() - 1)
}

/// One concrete resource; `element` is the `each` element and its index.
fn instance(
    r: &Resource,
    name: &str,
    element: Option<(&Value, usize)>,
    ev: &Evaluation,
    env: &Env<'_>,
    external: Option<&dyn ExternalFunctions>,
    diags: &mut Diagnostics,
) -> (Expanded, ResourceValue) {
    let scope = ev.scope_with(env, element, external);
    let condition = r.condition.as_ref().map(|c| match condition(c, &scope) {
        Ok(v) => v,
        Err(e) => {
            diags.push(e.into_diagnostic());
            Value::Unknown
        }
    });
    let mut report = |e: EvalError| diags.push(scope.hide(e).into_diagnostic());
    let spec = match &r.spec {
        Some(s) => node(s, &scope, &mut report),
        None => Value::Map(IndexMap::new()),
    };
    // Only a resource that read a secret pays for a masked copy.
    let masked_spec = match &r.spec {
        Some(s) if scope.touched_secret.get() => {
            let quiet = ev.scope_with(env, element, external);
            Some(node_masked(s, &quiet, &mut |_| {}).1)
        }
        _ => None,
    };
    let mut md = IndexMap::new();
    if let Some(d) = &r.metadata.display_name {
        md.insert(
            "displayName".to_owned(),
            scope.template(d).unwrap_or_else(|e| {
                report(e);
                Value::Unknown
            }),
        );
    }
    let labels: IndexMap<String, Value> = r
        .metadata
        .labels
        .iter()
        .map(|(k, v)| (k.name.clone(), Value::Str(v.value.clone())))
        .collect();
    md.insert("labels".to_owned(), Value::Map(labels));
    // Annotations are the metadata that can read a secret: noticed apart from the spec's.
    let spec_touched = scope.touched_secret.replace(false);
    let annotations: IndexMap<String, Value> = r
        .metadata
        .annotations
        .iter()
        .map(|(k, v)| (k.name.clone(), node(v, &scope, &mut report)))
        .collect();
    let masked_annotations = scope.touched_secret.get().then(|| {
        let quiet = ev.scope_with(env, element, external);
        r.metadata
            .annotations
            .iter()
            .map(|(k, v)| (k.name.clone(), node_masked(v, &quiet, &mut |_| {}).1))
            .collect::<IndexMap<String, Value>>()
    });
    scope
        .touched_secret
        .set(spec_touched || masked_annotations.is_some());
    md.insert("annotations".to_owned(), Value::Map(annotations));
    if let Some(c) = &r.metadata.custom {
        md.insert("custom".to_owned(), node(c, &scope, &mut report));
    }
    let masked_metadata = masked_annotations.map(|masked| {
        let mut copy = md.clone();
        copy.insert("annotations".to_owned(), Value::Map(masked));
        Value::Map(copy)
    });
    let x = Expanded {
        name: name.to_owned(),
        template: r.name.value.clone(),
        index: element.map(|(_, i)| i),
        element: element.map(|(v, _)| v.clone()),
        ty: r.ty.as_ref().map(|t| t.value.clone()).unwrap_or_default(),
        condition,
        instance: 0,
    };
    let value = ResourceValue {
        spec,
        metadata: Value::Map(md),
        state: None,
        masked_state: None,
        masked_spec,
        masked_metadata,
        exists: x.included(),
    };
    (x, value)
}

/// A condition tree, short-circuiting `and` and `or`. An unknown operand
/// that cannot be decided around makes the whole condition unknown.
fn condition(c: &Condition, scope: &Scope<'_>) -> Result<Value, EvalError> {
    let as_bool = |v: Value, span| match v {
        Value::Bool(_) | Value::Unknown => Ok(v),
        other => Err(EvalError {
            code: &codes::CONDITION_TYPE,
            span,
            message: format!(
                "a condition must be a boolean, but this is {}",
                crate::blueprint::article_of(other.type_name())
            ),
        }),
    };
    match c {
        Condition::Expr(t) => as_bool(scope.whole(t)?, t.span),
        Condition::Not(inner, _) => Ok(match condition(inner, scope)? {
            Value::Bool(b) => Value::Bool(!b),
            other => other,
        }),
        Condition::And(items, _) | Condition::Or(items, _) => {
            let is_and = matches!(c, Condition::And(..));
            let mut unknown = false;
            for item in items {
                match condition(item, scope)? {
                    Value::Bool(b) if b != is_and => return Ok(Value::Bool(b)),
                    Value::Unknown => unknown = true,
                    _ => {}
                }
            }
            Ok(if unknown {
                Value::Unknown
            } else {
                Value::Bool(is_and)
            })
        }
    }
}

/// A spec or metadata tree: strings are templates, the rest is as written.
pub fn node(n: &TNode, scope: &Scope<'_>, report: &mut impl FnMut(EvalError)) -> Value {
    match &n.kind {
        TKind::Null => Value::Null,
        TKind::Bool(b) => Value::Bool(*b),
        TKind::Int(i) => Value::Int(*i),
        TKind::Float(f) => Value::Float(*f),
        TKind::Str(t) => scope.template(t).unwrap_or_else(|e| {
            report(e);
            Value::Unknown
        }),
        TKind::List(items) => Value::List(items.iter().map(|i| node(i, scope, report)).collect()),
        TKind::Map(entries) => Value::Map(
            entries
                .iter()
                .map(|(k, v)| (k.name.clone(), node(v, scope, report)))
                .collect(),
        ),
    }
}

/// Like [`node`], also returning a copy in which every string field that
/// read a secret is replaced by `(sensitive)`.
pub fn node_masked(
    n: &TNode,
    scope: &Scope<'_>,
    report: &mut impl FnMut(EvalError),
) -> (Value, Value) {
    match &n.kind {
        TKind::Str(t) => {
            let before = scope.touched_secret.replace(false);
            let v = scope.template(t).unwrap_or_else(|e| {
                report(e);
                Value::Unknown
            });
            let secret = scope.touched_secret.get();
            scope.touched_secret.set(before || secret);
            let shown = if secret {
                Value::Str(super::render::SENSITIVE_TEXT.to_owned())
            } else {
                v.clone()
            };
            (v, shown)
        }
        TKind::List(items) => {
            let (a, b) = items.iter().map(|i| node_masked(i, scope, report)).unzip();
            (Value::List(a), Value::List(b))
        }
        TKind::Map(entries) => {
            let mut a = IndexMap::with_capacity(entries.len());
            let mut b = IndexMap::with_capacity(entries.len());
            for (k, v) in entries {
                let (x, y) = node_masked(v, scope, report);
                a.insert(k.name.clone(), x);
                b.insert(k.name.clone(), y);
            }
            (Value::Map(a), Value::Map(b))
        }
        _ => {
            let v = node(n, scope, report);
            (v.clone(), v)
        }
    }
}

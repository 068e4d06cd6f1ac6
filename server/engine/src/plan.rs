//! Change staging: what executing a blueprint would do to an instance, resource by resource,
//! with field-level differences. Pure apart from re-evaluating specs against the recorded state
//! of unchanged dependencies (through [`Prepared::reevaluate`]).

use std::collections::{HashMap, HashSet};

use serde_json::Value as Json;

use indexmap::IndexMap;

use super::diff::{self, FieldChange, RecreatePaths, Shown};
use super::prepare::Prepared;
use crate::blueprint::Scalar;
use crate::check::PluginContext;
use crate::eval::functions::Env;
use crate::eval::value::Value;
use crate::state::{InstanceState, ResourceStatus};
use crate::validate::providers::Manifests;
use crate::validate::refs::NodeRef;

/// What happens to one resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Create,
    Update,
    Recreate,
    Delete,
    NoChange,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "CREATE",
            Action::Update => "UPDATE",
            Action::Recreate => "RECREATE",
            Action::Delete => "DELETE",
            Action::NoChange => "NO_CHANGE",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct PlannedResource {
    pub name: String,
    pub resource_type: String,
    pub action: Action,
    pub fields: Vec<FieldChange>,
    pub reason: String,
    pub depends_on: Vec<String>,
    /// The abstract resource a transformer generated this one from, and the transform.
    pub derived_from: Option<DerivedFrom>,
}

/// The abstract resource (as the user wrote it) a generated resource came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DerivedFrom {
    pub resource: String,
    pub transform: String,
}

impl DerivedFrom {
    /// The derivation of `generated` among a blueprint's, if a transformer generated it.
    pub fn find(derivations: &[crate::transform::Derivation], generated: &str) -> Option<Self> {
        crate::transform::derivation_of(derivations, generated).map(|d| DerivedFrom {
            resource: d.abstract_resource.clone(),
            transform: d.transform.clone(),
        })
    }
}

/// Marks the fields of `resource` (a template name) that property injectors set, and what is
/// inside them, with the injector's origin.
fn mark_injected(injected: &[crate::inject::Injected], resource: &str, fields: &mut [FieldChange]) {
    for i in injected.iter().filter(|i| i.resource == resource) {
        let path = super::diff::spec_path(&i.keys);
        for f in fields.iter_mut() {
            let inside = f.path == path
                || f.path
                    .strip_prefix(path.as_str())
                    .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['));
            if inside && f.origin.is_none() {
                f.origin = Some(i.origin.clone());
            }
        }
    }
}

/// A change set's content, in execution order: creates and updates with dependencies first,
/// then deletions with dependents first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub resources: Vec<PlannedResource>,
    /// Link changes: removals run before the resources, the rest after them.
    pub links: Vec<super::links::PlannedLink>,
    /// The child blueprints, in deploy order, then the ones no longer included.
    pub children: Vec<ChildPlan>,
}

impl Plan {
    pub fn count(&self, action: Action) -> usize {
        self.resources.iter().filter(|r| r.action == action).count()
    }

    /// "2 to create, 1 to update, 0 to recreate, 1 to delete, 3 unchanged", then the link
    /// changes when there are any.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} to create, {} to update, {} to recreate, {} to delete, {} unchanged",
            self.count(Action::Create),
            self.count(Action::Update),
            self.count(Action::Recreate),
            self.count(Action::Delete),
            self.count(Action::NoChange),
        );
        let links = |a: Action| self.links.iter().filter(|l| l.action == a).count();
        let (new, changed, gone) = (
            links(Action::Create),
            links(Action::Update),
            links(Action::Delete),
        );
        if new + changed + gone > 0 {
            s.push_str(&format!(
                "; links: {new} to create, {changed} to update, {gone} to remove"
            ));
        }
        if !self.children.is_empty() {
            let children = |a: Action| self.children.iter().filter(|c| c.action == a).count();
            s.push_str(&format!(
                "; children: {} to create, {} to update, {} to delete, {} unchanged",
                children(Action::Create),
                children(Action::Update),
                children(Action::Delete),
                children(Action::NoChange),
            ));
        }
        s
    }

    pub fn is_empty(&self) -> bool {
        self.resources.iter().all(|r| r.action == Action::NoChange)
            && self.links.iter().all(|l| l.action == Action::NoChange)
            && self.children.iter().all(|c| c.action == Action::NoChange)
    }

    /// The planned child named `name` (an include name).
    pub fn child(&self, name: &str) -> Option<&ChildPlan> {
        self.children.iter().find(|c| c.name == name)
    }
}

/// Whether a recorded resource is settled: deployed and not waiting on an unfinished call.
fn settled(status: ResourceStatus) -> bool {
    matches!(status, ResourceStatus::Created | ResourceStatus::Updated)
}

/// The changes of a resource's annotations against the recorded ones, at
/// `metadata.annotations.<key>`, shown as spec changes are (`masked`: the metadata's masked
/// copy, when an annotation read a secret).
fn annotation_changes(recorded: &Json, new: &Value, masked: Option<&Value>) -> Vec<FieldChange> {
    let empty = Json::Object(serde_json::Map::new());
    let before = recorded.get("annotations").unwrap_or(&empty);
    let annotations = |v: &Value| match v {
        Value::Map(m) => m.get("annotations").cloned(),
        _ => None,
    };
    let after = annotations(new).unwrap_or_else(|| Value::Map(IndexMap::new()));
    let masked = masked.and_then(annotations);
    diff::diff_at(
        "metadata.annotations",
        Some(before),
        &after,
        masked.as_ref(),
        &RecreatePaths::default(),
    )
}

/// Link annotations written with `${..}` checked, once evaluated, against the link types of
/// the links they take part in (literal ones were checked with the blueprint): a wrong type or
/// a value outside the allowed ones is a diagnostic at the annotation.
fn check_evaluated_annotations(prepared: &mut Prepared, manifests: &Manifests) {
    let mut found = Vec::new();
    for link in &prepared.links {
        let Some((_, def)) = manifests.link_types().find(|(ns, d)| {
            *ns == link.provider
                && format!("{}::{}", d.resource_type_a, d.resource_type_b) == link.link_type
        }) else {
            continue;
        };
        for end in [&link.a, &link.b] {
            let Some(idx) = prepared.find(end) else {
                continue;
            };
            let x = &prepared.evaluation.resources[idx];
            let Some(r) = prepared
                .blueprint
                .resources
                .iter()
                .find(|r| r.name.value == x.template)
            else {
                continue;
            };
            let ty = r.ty.as_ref().map_or("", |t| t.value.as_str());
            let Value::Map(metadata) = prepared.evaluation.metadata(x) else {
                continue;
            };
            let Some(Value::Map(values)) = metadata.get("annotations") else {
                continue;
            };
            for (key, node) in &r.metadata.annotations {
                let crate::blueprint::TKind::Str(t) = &node.kind else {
                    continue;
                };
                let (Some(d), Some(value)) = (
                    def.annotations
                        .iter()
                        .find(|d| d.name == key.name && d.applies_to == ty),
                    values.get(&key.name).and_then(Value::to_json),
                ) else {
                    continue;
                };
                if !t.has_substitutions() {
                    continue;
                }
                let value = crate::plugins::values::from_json(&value);
                if let Some((code, message, hint)) =
                    crate::validate::links::check_evaluated_annotation(
                        &key.name, end, def, d, &value,
                    )
                {
                    found.push(
                        crate::diag::Diagnostic::new(code, node.span, message).with_hint(hint),
                    );
                }
            }
        }
    }
    // A resource linked several times is checked once per link: report each problem once.
    found.dedup_by(|a, b| a.span == b.span && a.message == b.message);
    for d in found {
        prepared.diags.push(d);
    }
}

/// The metadata of resource entry `idx` as stored: each annotation that read a secret kept
/// with its secret mark, so plans never show it and providers get it flagged sensitive.
pub(super) fn stored_metadata(prepared: &Prepared, idx: usize) -> Json {
    let x = &prepared.evaluation.resources[idx];
    super::state_values::eval_to_stored(
        prepared.evaluation.metadata(x),
        prepared.evaluation.masked_metadata(x),
    )
}

/// Plans `prepared` against `current`. Resources whose dependencies do not change are
/// evaluated against their dependencies' recorded state, so their fields are known; the rest
/// read `(known after deploy)`.
pub fn plan(
    prepared: &mut Prepared,
    current: &InstanceState,
    manifests: &Manifests,
    plugins: &PluginContext<'_>,
) -> Plan {
    let recorded: HashMap<&str, &crate::state::Resource> = current
        .resources
        .iter()
        .map(|r| (r.name.as_str(), r))
        .collect();
    let mut recreate_cache: HashMap<String, RecreatePaths> = HashMap::new();
    let mut out = Vec::new();
    // Resources whose state after this plan is known now (unchanged and settled).
    let mut stable: HashSet<usize> = HashSet::new();
    let mut wanted: HashSet<String> = HashSet::new();
    let order = prepared.order.clone();
    for idx in order {
        let x = &prepared.evaluation.resources[idx];
        if !x.included() {
            continue;
        }
        let name = x.name.clone();
        let template = x.template.clone();
        let ty = x.ty.clone();
        let deps = prepared.deps[idx].clone();
        // Dependencies that stay as they are lend their recorded state to this evaluation.
        let mut reevaluate = false;
        for &d in &deps {
            let dx = &prepared.evaluation.resources[d];
            let slot = dx.instance;
            if stable.contains(&d)
                && let Some(rec) = recorded.get(dx.name.as_str())
            {
                super::state_values::set_state(
                    &mut prepared.evaluation.instances[slot],
                    rec.state.as_ref(),
                );
                reevaluate = true;
            }
        }
        if reevaluate {
            let found = prepared.reevaluate(idx, plugins);
            prepared.diags.extend(found);
        }
        let x = &prepared.evaluation.resources[idx];
        if !x.included() {
            continue;
        }
        wanted.insert(name.clone());
        let spec = prepared.evaluation.spec(x).clone();
        let masked = prepared.evaluation.instances[x.instance]
            .masked_spec
            .clone();
        let recreate = recreate_cache
            .entry(ty.clone())
            .or_insert_with(|| {
                RecreatePaths::from_schema(
                    manifests
                        .resource_type(&ty)
                        .and_then(|d| d.spec_schema.as_ref()),
                )
            })
            .clone();
        let depends_on: Vec<String> = deps
            .iter()
            .map(|&d| prepared.evaluation.resources[d].name.clone())
            .collect();
        let (action, fields, reason) = match recorded.get(name.as_str()) {
            None => (
                Action::Create,
                diff::diff_spec(None, &spec, masked.as_ref(), &recreate),
                String::new(),
            ),
            Some(rec) if rec.resource_type != ty => (
                Action::Recreate,
                diff::diff_spec(None, &spec, masked.as_ref(), &recreate),
                format!("the type changes from {} to {ty}", rec.resource_type),
            ),
            Some(rec)
                if matches!(
                    rec.status,
                    ResourceStatus::CreateFailed | ResourceStatus::CreateRequested
                ) =>
            {
                (
                    Action::Create,
                    diff::diff_spec(None, &spec, masked.as_ref(), &recreate),
                    format!("its last create did not finish ({})", rec.status),
                )
            }
            Some(rec) => {
                // The stored spec, secret marks included: a recorded secret is never shown.
                let mut fields =
                    diff::diff_spec(Some(&rec.spec), &spec, masked.as_ref(), &recreate);
                // Links read annotations from the recorded metadata: a changed one makes the
                // resource an update (which records it) and so its links updates too.
                fields.extend(annotation_changes(
                    &rec.metadata,
                    prepared.evaluation.metadata(x),
                    prepared.evaluation.masked_metadata(x),
                ));
                let forcing: Vec<&str> = fields
                    .iter()
                    .filter(|f| f.must_recreate)
                    .map(|f| f.path.as_str())
                    .collect();
                if !forcing.is_empty() {
                    let reason = format!("{} cannot change in place", forcing.join(", "));
                    (Action::Recreate, fields, reason)
                } else if !fields.is_empty() {
                    (Action::Update, fields, String::new())
                } else if !settled(rec.status) {
                    (
                        Action::Update,
                        fields,
                        format!("its last change did not finish ({})", rec.status),
                    )
                } else {
                    (Action::NoChange, fields, String::new())
                }
            }
        };
        if action == Action::NoChange && deps.iter().all(|d| stable.contains(d)) {
            stable.insert(idx);
        }
        let mut fields = fields;
        mark_injected(&prepared.injected, &template, &mut fields);
        let derived_from = DerivedFrom::find(&prepared.derivations, &template);
        out.push(PlannedResource {
            name,
            resource_type: ty,
            action,
            fields,
            reason,
            depends_on,
            derived_from,
        });
    }
    // What the blueprint no longer has goes, dependents before what they depend on.
    let removed: Vec<&crate::state::Resource> = current
        .resources
        .iter()
        .filter(|r| !wanted.contains(&r.name))
        .collect();
    for r in removal_order(&removed) {
        out.push(PlannedResource {
            name: r.name.clone(),
            resource_type: r.resource_type.clone(),
            action: Action::Delete,
            fields: Vec::new(),
            reason: "no longer in the blueprint".to_owned(),
            depends_on: r.depends_on.clone(),
            derived_from: None,
        });
    }
    check_evaluated_annotations(prepared, manifests);
    let links = super::links::plan_links(&prepared.links, current, &out);
    Plan {
        resources: out,
        links,
        children: Vec::new(),
    }
}

/// Recorded resources ordered so that each comes before everything it depends on (reverse
/// dependency order), by the `depends_on` lists kept in state. Stable: among independent
/// resources, later-created ones go first.
pub fn removal_order<'a>(
    resources: &[&'a crate::state::Resource],
) -> Vec<&'a crate::state::Resource> {
    let names: HashMap<&str, usize> = resources
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.as_str(), i))
        .collect();
    // Post-order DFS over "depends on" gives dependencies first; reversed, dependents first.
    let mut state = vec![0u8; resources.len()];
    let mut order = Vec::with_capacity(resources.len());
    for root in 0..resources.len() {
        if state[root] != 0 {
            continue;
        }
        let mut stack = vec![(root, 0usize)];
        state[root] = 1;
        while let Some(&mut (v, ref mut pos)) = stack.last_mut() {
            let deps = &resources[v].depends_on;
            if let Some(d) = deps.get(*pos) {
                *pos += 1;
                if let Some(&w) = names.get(d.as_str())
                    && state[w] == 0
                {
                    state[w] = 1;
                    stack.push((w, 0));
                }
                continue;
            }
            stack.pop();
            state[v] = 2;
            order.push(resources[v]);
        }
    }
    order.reverse();
    order
}

// ---- child blueprints --------------------------------------------------------------------------

/// One export of a child: its recorded value and the one the plan expects.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedExport {
    pub name: String,
    pub action: Action,
    /// `None`: the export is new.
    pub previous: Option<Shown>,
    /// `None`: the export goes away.
    pub new: Option<Shown>,
    /// The new value was derived from a secret: `new` holds it for the evaluation of what
    /// reads it (the parent, later children), and everything shown masks it.
    pub sensitive: bool,
}

impl PlannedExport {
    /// `new` as it may be shown.
    pub fn shown_new(&self) -> Option<Shown> {
        match &self.new {
            Some(Shown::Value(_)) if self.sensitive => Some(Shown::Sensitive),
            other => other.clone(),
        }
    }
}

/// What executing a parent's change set does to one of its children (an include, deployed as
/// the instance `<parent>/<name>`). Execution plans the child again against its state at that
/// moment; `planned_version` lets it refuse when the child changed since.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildPlan {
    /// The include's name.
    pub name: String,
    /// The child's instance name.
    pub instance: String,
    /// `Create` (not deployed yet), `Update`, `NoChange` or `Delete` (no longer included).
    pub action: Action,
    /// The child instance's version the plan read (0: no instance yet).
    pub planned_version: u64,
    /// The child's own resources, links and children.
    pub plan: Plan,
    pub exports: Vec<PlannedExport>,
    /// Variables known only after deploy (they read exports of other children that are not
    /// known yet).
    pub unknown_variables: Vec<String>,
    /// Why the child's changes could not be worked out before deploy; empty when they were.
    pub deferred: String,
    /// Warnings found while planning the child (the engine API's flat form).
    pub diagnostics: Vec<Json>,
}

impl ChildPlan {
    /// The child's one-line summary.
    pub fn summary(&self) -> String {
        if self.deferred.is_empty() {
            self.plan.summary()
        } else {
            format!("planned at deploy: {}", self.deferred)
        }
    }

    /// The names of the exports derived from a secret.
    pub fn secret_exports(&self) -> Vec<String> {
        self.exports
            .iter()
            .filter(|e| e.sensitive)
            .map(|e| e.name.clone())
            .collect()
    }

    /// The export values the plan knows (for `${children.name.field}` in the parent and the
    /// children after it); the others are unknown.
    pub fn known_exports(&self) -> IndexMap<String, Value> {
        self.exports
            .iter()
            .filter(|e| e.action != Action::Delete)
            .map(|e| {
                let v = match &e.new {
                    Some(Shown::Value(j)) => Value::from_json(j),
                    _ => Value::Unknown,
                };
                (e.name.clone(), v)
            })
            .collect()
    }
}

/// Whether an instance holds a deployment: anything recorded, and not new or destroyed.
/// A child that is not deployed is created by its parent's operation (and destroyed when that
/// operation rolls back).
pub fn deployed(state: &InstanceState) -> bool {
    use crate::state::InstanceStatus;
    let holds_something =
        !state.resources.is_empty() || !state.exports.is_empty() || !state.children.is_empty();
    !matches!(
        state.instance.status,
        InstanceStatus::New | InstanceStatus::Destroyed
    ) && holds_something
}

/// A child's action from whether its instance is deployed and what its plan changes.
pub fn child_action(deployed: bool, plan: &Plan, exports: &[PlannedExport]) -> Action {
    if !deployed {
        Action::Create
    } else if plan.is_empty() && exports.iter().all(|e| e.action == Action::NoChange) {
        Action::NoChange
    } else {
        Action::Update
    }
}

/// How a recorded export value may be shown.
fn stored_shown(v: &Json) -> Shown {
    let plain = super::state_values::unwrap(v);
    if &plain == v {
        Shown::Value(plain)
    } else {
        Shown::Sensitive
    }
}

/// The plan of a child the blueprint no longer includes: everything it has goes (its own
/// children, already planned the same way, are `nested`).
pub fn deleted_child(name: &str, state: &InstanceState, nested: Vec<ChildPlan>) -> ChildPlan {
    let recorded: Vec<&crate::state::Resource> = state.resources.iter().collect();
    let resources = removal_order(&recorded)
        .into_iter()
        .map(|r| PlannedResource {
            name: r.name.clone(),
            resource_type: r.resource_type.clone(),
            action: Action::Delete,
            fields: Vec::new(),
            reason: "the child is no longer included".to_owned(),
            depends_on: r.depends_on.clone(),
            derived_from: None,
        })
        .collect();
    let links = state
        .links
        .iter()
        .map(|l| super::links::PlannedLink {
            a: l.resource_a.clone(),
            b: l.resource_b.clone(),
            link_type: l.link_type.clone(),
            provider: String::new(),
            action: Action::Delete,
        })
        .collect();
    ChildPlan {
        name: name.to_owned(),
        instance: state.instance.name.clone(),
        action: Action::Delete,
        planned_version: state.instance.version,
        plan: Plan {
            resources,
            links,
            children: nested,
        },
        exports: state
            .exports
            .iter()
            .map(|e| PlannedExport {
                name: e.name.clone(),
                action: Action::Delete,
                previous: Some(stored_shown(&e.value)),
                new: None,
                sensitive: false,
            })
            .collect(),
        unknown_variables: Vec::new(),
        deferred: String::new(),
        diagnostics: Vec::new(),
    }
}

/// An include's inputs at plan time, evaluated in the parent's scope as planned so far (with
/// the exports the plan knows of the children before it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IncludeAtPlan {
    /// `None` when the path is known only after deploy.
    pub path: Option<String>,
    /// The variables whose values are known, as `--var` text.
    pub variables: Vec<(String, String)>,
    /// The variables whose values are known only after deploy.
    pub unknown: Vec<String>,
    /// The type of each known value (`Value::type_name`), by variable, checked against the
    /// child's declared types ([`mistyped_child_variable`]).
    pub types: Vec<(String, &'static str)>,
}

/// [`Prepared::include_inputs`] for planning: a value known only after deploy is reported as
/// such instead of failing.
pub fn include_at_plan(
    prepared: &Prepared,
    i: usize,
    plugins: &PluginContext<'_>,
) -> Result<IncludeAtPlan, String> {
    let inc = &prepared.blueprint.include[i];
    let name = &inc.name.value;
    let link = |a: &str, b: &str| super::prepare::link_value(&prepared.link_data, a, b);
    let env = Env {
        cwd: &prepared.cwd,
        now_unix_nanos: prepared.now_unix_nanos,
        link: &link,
    };
    let scope = prepared.evaluation.scope_with(&env, None, Some(plugins));
    let path = match &inc.path {
        Some(t) => match scope.template(t) {
            Ok(Value::Str(s)) => Some(s),
            Ok(other) if other.deep_contains_unknown() => None,
            Ok(other) => {
                return Err(format!(
                    "include `{name}`: its path must be a string, not {}",
                    other.type_name()
                ));
            }
            Err(e) => return Err(format!("include `{name}`: {}", e.message)),
        },
        None => return Err(format!("include `{name}` has no path")),
    };
    let mut out = IncludeAtPlan {
        path,
        ..IncludeAtPlan::default()
    };
    for (key, node) in &inc.variables {
        let mut failed = None;
        let v = crate::eval::blueprint::node(node, &scope, &mut |e| {
            failed.get_or_insert(e.message);
        });
        if let Some(m) = failed {
            return Err(format!("include `{name}`, variable `{}`: {m}", key.name));
        }
        if v.deep_contains_unknown() {
            out.unknown.push(key.name.clone());
            continue;
        }
        let text = match &v {
            Value::Str(s) => s.clone(),
            other => super::state_values::eval_to_json(other).to_string(),
        };
        out.types.push((key.name.clone(), v.type_name()));
        out.variables.push((key.name.clone(), text));
    }
    Ok(out)
}

/// The variables a child document declares; `None` when it does not load (preparing the
/// child then reports why).
pub fn child_variables(
    file: &str,
    content: &[u8],
    max_input_size: usize,
) -> Option<Vec<crate::blueprint::Variable>> {
    let mut sources = crate::source::SourceMap::new();
    let mut diags = crate::diag::Diagnostics::default();
    let id = crate::document::load_bytes(
        &mut sources,
        file,
        content.to_vec(),
        max_input_size,
        &mut diags,
    )?;
    let format = crate::document::Format::from_path(file);
    let root = crate::document::parse(&sources, id, format, &mut diags)?;
    Some(crate::blueprint::load(&root, sources.get(id), id, &mut diags).variables)
}

/// A variable the include passes that the child (`file`, declaring `declared`) does not
/// declare, whatever its value (an unknown one must not hide a misspelt name until deploy):
/// `T0406` at the key in the parent's include; else a literal value of another type than
/// the child declares: `T0406` at the value.
pub fn undeclared_child_variable(
    include: &crate::blueprint::Include,
    file: &str,
    declared: &[crate::blueprint::Variable],
) -> Option<crate::diag::Diagnostic> {
    let names = || declared.iter().map(|v| v.name.value.as_str());
    let Some((key, _)) = include
        .variables
        .iter()
        .find(|(k, _)| !names().any(|d| d == k.name))
    else {
        // A literal of another type than the child declares (`name: 42` for a string) is
        // refused, not coerced (the substitutions were checked by validate where the child
        // file was local).
        let mut found = crate::diag::Diagnostics::default();
        crate::validate::includes::check_include_variables(
            &crate::blueprint::Blueprint::default(),
            include,
            file,
            declared,
            &trellis_lang::functions::CoreFunctions,
            &mut found,
        );
        return found
            .items
            .into_iter()
            .find(|d| d.code.id == crate::diag::codes::VARIABLE_INPUT.id);
    };
    let mut d = crate::diag::Diagnostic::new(
        &crate::diag::codes::VARIABLE_INPUT,
        key.span,
        format!(
            "include `{}` passes variable `{}`, which `{file}` does not declare",
            include.name.value, key.name
        ),
    );
    if let Some(s) = crate::diag::did_you_mean(&key.name, names()) {
        d = d.with_hint(format!("did you mean `{s}`?"));
    }
    Some(d)
}

/// A value the include passes, as evaluated at plan (`at`), of another type than the child
/// (`file`, declaring `declared`) declares for its variable (`${variables.port}` of an integer
/// variable given to a `string` one): `T0406` at the value, as validate reports what it can
/// type statically. An integer is accepted for a float and a custom type's values are
/// strings; nothing is coerced. Null and values of variables declared without a known type
/// are left alone.
pub fn mistyped_child_variable(
    include: &crate::blueprint::Include,
    file: &str,
    declared: &[crate::blueprint::Variable],
    at: &IncludeAtPlan,
) -> Option<crate::diag::Diagnostic> {
    use crate::blueprint::TKind;
    for (name, got) in &at.types {
        let Some(v) = declared.iter().find(|v| v.name.value == *name) else {
            continue;
        };
        let Some(ty) = v.ty.as_ref().map(|t| t.value.as_str()) else {
            continue;
        };
        let want = match ty {
            t if t.contains('/') => "string",
            t @ ("string" | "integer" | "float" | "boolean") => t,
            _ => continue,
        };
        if matches!(*got, "null" | "function" | "unknown")
            || *got == want
            || (*got == "integer" && want == "float")
        {
            continue;
        }
        let Some((_, node)) = include.variables.iter().find(|(k, _)| k.name == *name) else {
            continue;
        };
        let span = match &node.kind {
            TKind::Str(t) => t.single_substitution().map_or(node.span, |s| s.span),
            _ => node.span,
        };
        let hint = if want == "string" && matches!(*got, "integer" | "float" | "boolean") {
            "a literal must be quoted to pass a string; a substitution must yield a string"
        } else {
            "pass a value of the type the child declares"
        };
        return Some(
            crate::diag::Diagnostic::new(
                &crate::diag::codes::VARIABLE_INPUT,
                span,
                format!(
                    "include `{}` passes {} for variable `{name}`, which `{file}` declares as {ty}",
                    include.name.value,
                    crate::blueprint::article_of(got),
                ),
            )
            .with_hint(hint),
        );
    }
    None
}

/// Stand-in `--var` inputs for the variables of a child known only after deploy, so its
/// document validates and evaluates; [`forget_variables`] then makes them unknown. A variable
/// with a default needs none; otherwise the first allowed value, or the type's zero.
pub fn placeholder_variables(
    declared: &[crate::blueprint::Variable],
    unknown: &[String],
) -> Vec<(String, String)> {
    let text = |s: &Scalar| match s {
        Scalar::Str(s) => s.clone(),
        Scalar::Int(i) => i.to_string(),
        Scalar::Float(f) => f.to_string(),
        Scalar::Bool(b) => b.to_string(),
    };
    declared
        .iter()
        .filter(|v| unknown.contains(&v.name.value) && v.default.is_none())
        .map(|v| {
            let stand_in = match v.allowed_values.as_ref().and_then(|a| a.value.first()) {
                Some(first) => text(&first.value),
                None => match v.ty.as_ref().map_or("string", |t| t.value.as_str()) {
                    "integer" | "float" => "0".to_owned(),
                    "boolean" => "false".to_owned(),
                    _ => String::new(),
                },
            };
            (v.name.value.clone(), stand_in)
        })
        .collect()
}

/// Makes `names` unknown in an evaluation made with stand-in values for them: the values that
/// read them are evaluated again (unknown now), and so is every resource.
pub fn forget_variables(prepared: &mut Prepared, names: &[String], plugins: &PluginContext<'_>) {
    if names.is_empty() {
        return;
    }
    for n in names {
        prepared
            .evaluation
            .variables
            .insert(n.clone(), Value::Unknown);
    }
    let data = prepared.link_data.clone();
    let link = |a: &str, b: &str| super::prepare::link_value(&data, a, b);
    let cwd = prepared.cwd.clone();
    let env = Env {
        cwd: &cwd,
        now_unix_nanos: prepared.now_unix_nanos,
        link: &link,
    };
    for node in prepared.graph.dependency_order() {
        let NodeRef::Value(i) = node else { continue };
        let def = &prepared.blueprint.values[i];
        let Some(t) = &def.value else { continue };
        let fresh = {
            let scope = prepared.evaluation.scope_with(&env, None, Some(plugins));
            scope.guard(scope.whole(t))
        };
        // A value that no longer comes out known read a forgotten variable.
        if let Ok(v) = fresh
            && v.deep_contains_unknown()
        {
            prepared.evaluation.values.insert(def.name.value.clone(), v);
        }
    }
    for idx in prepared.order.clone() {
        let found = prepared.reevaluate(idx, plugins);
        prepared.diags.extend(found);
    }
}

/// A planned child's exports: what its instance records against what the plan expects, and
/// the values known now. Resources the plan leaves alone keep their recorded state, so what
/// their state gives is known; what reads a resource that changes is known after deploy.
pub fn planned_exports(
    prepared: &mut Prepared,
    plan: &Plan,
    current: &InstanceState,
    plugins: &PluginContext<'_>,
) -> Vec<PlannedExport> {
    for r in plan
        .resources
        .iter()
        .filter(|r| r.action == Action::NoChange)
    {
        if let (Some(idx), Some(rec)) = (prepared.find(&r.name), current.resource(&r.name))
            && let Some(state) = &rec.state
        {
            let slot = prepared.evaluation.resources[idx].instance;
            super::state_values::set_state(&mut prepared.evaluation.instances[slot], Some(state));
        }
    }
    let mut out = Vec::new();
    for super::prepare::EvaluatedExport {
        name,
        value: result,
        sensitive,
        ..
    } in prepared.exports(plugins)
    {
        // Not known yet, or not of its type (the deploy reports that).
        let new = match result {
            Ok(v) => Shown::Value(super::state_values::eval_to_json(&v)),
            Err(_) => Shown::Unknown,
        };
        let recorded = current.export(&name);
        let action = match (recorded, &new) {
            (None, _) => Action::Create,
            (Some(e), Shown::Value(v)) if &super::state_values::unwrap(&e.value) == v => {
                Action::NoChange
            }
            _ => Action::Update,
        };
        out.push(PlannedExport {
            name,
            action,
            previous: recorded.map(|e| stored_shown(&e.value)),
            new: Some(new),
            sensitive,
        });
    }
    for old in &current.exports {
        if !out.iter().any(|e| e.name == old.name) {
            out.push(PlannedExport {
                name: old.name.clone(),
                action: Action::Delete,
                previous: Some(stored_shown(&old.value)),
                new: None,
                sensitive: false,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Resource, Timestamp};
    use serde_json::json;

    fn recorded(name: &str, depends_on: &[&str]) -> Resource {
        let t = Timestamp::from_millis(0);
        Resource {
            instance_id: "i".into(),
            name: name.into(),
            resource_type: "sim/resource".into(),
            spec: Json::Null,
            state: None,
            status: ResourceStatus::Created,
            depends_on: depends_on.iter().map(|d| (*d).to_owned()).collect(),
            metadata: Json::Null,
            external_id: None,
            failure_reason: None,
            call_key: None,
            created_at: t,
            updated_at: t,
        }
    }

    #[test]
    fn removals_go_dependents_first() {
        // app reads db and cache; db reads net.
        let rs = [
            recorded("net", &[]),
            recorded("db", &["net"]),
            recorded("cache", &[]),
            recorded("app", &["db", "cache"]),
        ];
        let refs: Vec<&Resource> = rs.iter().collect();
        let order: Vec<&str> = removal_order(&refs)
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        let pos = |n: &str| order.iter().position(|x| *x == n).unwrap();
        assert_eq!(order.len(), 4);
        assert!(
            pos("app") < pos("db") && pos("app") < pos("cache"),
            "{order:?}"
        );
        assert!(pos("db") < pos("net"), "{order:?}");
    }

    #[test]
    fn plans_summarise_their_changes() {
        let plan = Plan {
            resources: vec![PlannedResource {
                name: "a".into(),
                resource_type: "local/file".into(),
                action: Action::Update,
                fields: vec![FieldChange {
                    path: "spec.content".into(),
                    previous: Some(Shown::Value(json!("x"))),
                    new: Some(Shown::Sensitive),
                    must_recreate: false,
                    origin: None,
                }],
                reason: String::new(),
                depends_on: vec!["b".into()],
                derived_from: None,
            }],
            links: vec![],
            children: vec![],
        };
        assert_eq!(
            plan.summary(),
            "0 to create, 1 to update, 0 to recreate, 0 to delete, 0 unchanged"
        );
        assert!(!plan.is_empty());
    }

    #[test]
    fn annotation_changes_are_metadata_field_changes() {
        let recorded = json!({
            "labels": {"app": "x"},
            "annotations": {"local.envFile.name": "config", "keep": 1, "gone": true}
        });
        let annotations = |pairs: Vec<(&str, Value)>| {
            let a: IndexMap<String, Value> =
                pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            let mut md = IndexMap::new();
            md.insert("annotations".to_owned(), Value::Map(a));
            Value::Map(md)
        };
        // The same annotations (an integer kept as one): nothing to do.
        let same = annotations(vec![
            ("local.envFile.name", Value::Str("config".into())),
            ("keep", Value::Int(1)),
            ("gone", Value::Bool(true)),
        ]);
        assert!(annotation_changes(&recorded, &same, None).is_empty());
        let new = annotations(vec![
            ("local.envFile.name", Value::Str("settings".into())),
            ("keep", Value::Int(1)),
            ("added", Value::Unknown),
        ]);
        let changes = annotation_changes(&recorded, &new, None);
        let shown = |v: Json| Some(Shown::Value(v));
        assert_eq!(
            changes,
            [
                FieldChange {
                    path: r#"metadata.annotations["local.envFile.name"]"#.into(),
                    previous: shown(json!("config")),
                    new: shown(json!("settings")),
                    must_recreate: false,
                    origin: None,
                },
                FieldChange {
                    path: "metadata.annotations.added".into(),
                    previous: None,
                    new: Some(Shown::Unknown),
                    must_recreate: false,
                    origin: None,
                },
                FieldChange {
                    path: "metadata.annotations.gone".into(),
                    previous: shown(json!(true)),
                    new: None,
                    must_recreate: false,
                    origin: None,
                },
            ]
        );
        // A value read from a secret is not shown, nor what it replaces.
        let masked = annotations(vec![
            (
                "local.envFile.name",
                Value::Str(crate::eval::render::SENSITIVE_TEXT.into()),
            ),
            ("keep", Value::Int(1)),
            ("added", Value::Unknown),
        ]);
        let secret = annotation_changes(&recorded, &new, Some(&masked));
        assert_eq!(secret[0].previous, Some(Shown::Sensitive));
        assert_eq!(secret[0].new, Some(Shown::Sensitive));
        // Recorded before annotations were kept (no metadata): every annotation is new.
        let fresh = annotation_changes(&Json::Null, &same, None);
        assert_eq!(fresh.len(), 3);
        assert!(fresh.iter().all(|f| f.previous.is_none()));
        // Recorded with its secret mark: never shown, changed to a plain value or removed.
        let marked = json!({"annotations": {"token": {"$sensitive": "hunter2"}, "old": {"$sensitive": "x"}}});
        let now = annotations(vec![("token", Value::Str("plain".into()))]);
        let changes = annotation_changes(&marked, &now, None);
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert!(changes.iter().all(|c| c.previous == Some(Shown::Sensitive)));
        assert_eq!(changes[0].new, shown(json!("plain")));
        assert!(!format!("{changes:?}").contains("hunter2"));
    }

    /// `parent.yaml` with `text`, loaded.
    fn parent_blueprint(text: &[u8]) -> (crate::source::SourceMap, crate::blueprint::Blueprint) {
        let mut sources = crate::source::SourceMap::new();
        let mut diags = crate::diag::Diagnostics::default();
        let id = crate::document::load_bytes(
            &mut sources,
            "parent.yaml",
            text.to_vec(),
            1 << 20,
            &mut diags,
        )
        .unwrap();
        let root = crate::document::parse(
            &sources,
            id,
            crate::document::Format::from_path("parent.yaml"),
            &mut diags,
        )
        .unwrap();
        let bp = crate::blueprint::load(&root, sources.get(id), id, &mut diags);
        (sources, bp)
    }

    /// Issue 21, item 3: a literal of another type than the child declares is refused at
    /// plan, not coerced into the child's variable.
    #[test]
    fn an_include_passing_a_literal_of_the_wrong_type_is_refused() {
        let parent = b"version: 2023-04-20\ninclude:\n  core:\n    path: core.yaml\n    variables:\n      name: 42\n      port: 8080\n";
        let child = b"version: 2023-04-20\nvariables:\n  name:\n    type: string\n  port:\n    type: integer\nresources: {}\n";
        let declared = child_variables("core.yaml", child, 1 << 20).unwrap();
        let (sources, bp) = parent_blueprint(parent);
        let d = undeclared_child_variable(&bp.include[0], "core.yaml", &declared)
            .expect("a string variable given 42 is refused");
        assert_eq!(d.code.id, "T0406");
        assert_eq!(sources.resolve(d.span).0.line, 6, "{}", d.message);
        assert!(d.message.contains("declares as string"), "{}", d.message);
    }

    /// Issue 21, item 3: a value evaluated at plan (`${variables.port}` of an integer
    /// variable) of another type than the child declares is refused at the substitution, not
    /// coerced; an integer is accepted for a float.
    #[test]
    fn an_include_passing_an_evaluated_value_of_the_wrong_type_is_refused() {
        let parent = b"version: 2023-04-20\nvariables:\n  port:\n    type: integer\ninclude:\n  core:\n    path: core.yaml\n    variables:\n      ratio: ${variables.port}\n      name: ${variables.port}\n      port: ${variables.port}\n";
        let child = b"version: 2023-04-20\nvariables:\n  name:\n    type: string\n  port:\n    type: integer\n  ratio:\n    type: float\nresources: {}\n";
        let declared = child_variables("core.yaml", child, 1 << 20).unwrap();
        let (sources, bp) = parent_blueprint(parent);
        let include = &bp.include[0];
        // Statically the substitutions are not known to the literal check.
        assert!(undeclared_child_variable(include, "core.yaml", &declared).is_none());
        let at = |types: &[(&str, &'static str)]| IncludeAtPlan {
            types: types.iter().map(|(n, t)| ((*n).to_owned(), *t)).collect(),
            ..IncludeAtPlan::default()
        };
        let wrong = at(&[
            ("ratio", "integer"),
            ("name", "integer"),
            ("port", "integer"),
        ]);
        let d = mistyped_child_variable(include, "core.yaml", &declared, &wrong)
            .expect("a string variable given an integer is refused");
        assert_eq!(d.code.id, "T0406");
        let (start, _) = sources.resolve(d.span);
        assert_eq!((start.line, start.column), (10, 13), "{}", d.message);
        assert!(d.message.contains("passes an integer"), "{}", d.message);
        assert!(d.message.contains("declares as string"), "{}", d.message);
        let right = at(&[
            ("ratio", "integer"),
            ("name", "string"),
            ("port", "integer"),
        ]);
        assert!(mistyped_child_variable(include, "core.yaml", &declared, &right).is_none());
        let float_for_integer = at(&[("port", "float")]);
        let d = mistyped_child_variable(include, "core.yaml", &declared, &float_for_integer)
            .expect("an integer variable given a float is refused");
        assert_eq!(sources.resolve(d.span).0.line, 11, "{}", d.message);
        assert!(
            mistyped_child_variable(include, "core.yaml", &declared, &at(&[("name", "null")]))
                .is_none()
        );
    }
}

//! Change staging: what executing a blueprint would do to an instance, resource by resource,
//! with field-level differences. Pure apart from re-evaluating specs against the recorded state
//! of unchanged dependencies (through [`Prepared::reevaluate`]).

use std::collections::{HashMap, HashSet};

use serde_json::{Value as Json, json};

use super::diff::{self, FieldChange, RecreatePaths, Shown};
use super::prepare::Prepared;
use crate::check::PluginContext;
use crate::state::{InstanceState, ResourceStatus};
use crate::validate::providers::Manifests;

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

    pub fn parse(s: &str) -> Option<Action> {
        Some(match s {
            "CREATE" => Action::Create,
            "UPDATE" => Action::Update,
            "RECREATE" => Action::Recreate,
            "DELETE" => Action::Delete,
            "NO_CHANGE" => Action::NoChange,
            _ => return None,
        })
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
}

/// A change set's content, in execution order: creates and updates with dependencies first,
/// then deletions with dependents first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub resources: Vec<PlannedResource>,
    /// Link changes: removals run before the resources, the rest after them.
    pub links: Vec<super::links::PlannedLink>,
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
        s
    }

    pub fn is_empty(&self) -> bool {
        self.resources.iter().all(|r| r.action == Action::NoChange)
            && self.links.iter().all(|l| l.action == Action::NoChange)
    }

    pub fn to_json(&self) -> Json {
        Json::Array(
            self.resources
                .iter()
                .map(|r| {
                    json!({
                        "name": r.name,
                        "type": r.resource_type,
                        "action": r.action.as_str(),
                        "fields": r.fields.iter().map(field_json).collect::<Vec<_>>(),
                        "reason": r.reason,
                        "dependsOn": r.depends_on,
                    })
                })
                .collect(),
        )
    }

    /// The plan of a change set body: its resources (`plan`) and links (`links`).
    pub fn from_body(body: &Json) -> Option<Plan> {
        let mut plan = Plan::from_json(body.get("plan")?)?;
        plan.links = body
            .get("links")
            .and_then(super::links::from_json)
            .unwrap_or_default();
        Some(plan)
    }

    pub fn from_json(v: &Json) -> Option<Plan> {
        let resources = v
            .as_array()?
            .iter()
            .map(|r| {
                Some(PlannedResource {
                    name: r.get("name")?.as_str()?.to_owned(),
                    resource_type: r.get("type")?.as_str()?.to_owned(),
                    action: Action::parse(r.get("action")?.as_str()?)?,
                    fields: r
                        .get("fields")?
                        .as_array()?
                        .iter()
                        .map(field_from_json)
                        .collect::<Option<Vec<_>>>()?,
                    reason: r.get("reason")?.as_str()?.to_owned(),
                    depends_on: r
                        .get("dependsOn")?
                        .as_array()?
                        .iter()
                        .map(|d| d.as_str().map(str::to_owned))
                        .collect::<Option<Vec<_>>>()?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Plan {
            resources,
            links: Vec::new(),
        })
    }
}

pub fn shown_json(s: &Shown) -> Json {
    match s {
        Shown::Value(v) => json!({ "value": v }),
        Shown::Unknown => json!({ "unknown": true }),
        Shown::Sensitive => json!({ "sensitive": true }),
    }
}

fn shown_from_json(v: &Json) -> Option<Shown> {
    if let Some(x) = v.get("value") {
        return Some(Shown::Value(x.clone()));
    }
    if v.get("unknown").is_some() {
        return Some(Shown::Unknown);
    }
    v.get("sensitive").map(|_| Shown::Sensitive)
}

fn field_json(f: &FieldChange) -> Json {
    let mut o = serde_json::Map::new();
    o.insert("path".into(), Json::String(f.path.clone()));
    if let Some(p) = &f.previous {
        o.insert("previous".into(), shown_json(p));
    }
    if let Some(n) = &f.new {
        o.insert("new".into(), shown_json(n));
    }
    o.insert("mustRecreate".into(), Json::Bool(f.must_recreate));
    Json::Object(o)
}

fn field_from_json(v: &Json) -> Option<FieldChange> {
    Some(FieldChange {
        path: v.get("path")?.as_str()?.to_owned(),
        previous: match v.get("previous") {
            Some(p) => Some(shown_from_json(p)?),
            None => None,
        },
        new: match v.get("new") {
            Some(n) => Some(shown_from_json(n)?),
            None => None,
        },
        must_recreate: v.get("mustRecreate")?.as_bool()?,
    })
}

/// Whether a recorded resource is settled: deployed and not waiting on an unfinished call.
fn settled(status: ResourceStatus) -> bool {
    matches!(status, ResourceStatus::Created | ResourceStatus::Updated)
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
                let state = rec.state.as_ref().map(super::state_values::to_eval);
                prepared.evaluation.instances[slot].state = state;
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
                let previous = super::state_values::unwrap(&rec.spec);
                let fields = diff::diff_spec(Some(&previous), &spec, masked.as_ref(), &recreate);
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
        out.push(PlannedResource {
            name,
            resource_type: ty,
            action,
            fields,
            reason,
            depends_on,
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
        });
    }
    let links = super::links::plan_links(&prepared.links, current, &out);
    Plan {
        resources: out,
        links,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Resource, Timestamp};

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
    fn plans_round_trip_through_the_change_set_body() {
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
                }],
                reason: String::new(),
                depends_on: vec!["b".into()],
            }],
            links: vec![],
        };
        assert_eq!(Plan::from_json(&plan.to_json()).unwrap(), plan);
        assert_eq!(
            plan.summary(),
            "0 to create, 1 to update, 0 to recreate, 0 to delete, 0 unchanged"
        );
        assert!(!plan.is_empty());
    }
}

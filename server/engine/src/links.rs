//! Links at deploy time: which links the blueprint wants (the validated selection, with `each`
//! templates expanded element-wise), what changes against the links in state, the order
//! hard links impose on resources, and the fields each link owns.

use std::collections::{HashMap, HashSet};

use serde_json::{Value as Json, json};

use super::plan::{Action, PlannedResource};
use super::prepare::Prepared;
use crate::state::{InstanceState, Link};
use crate::validate::links::select_links;
use crate::validate::providers::Manifests;

/// One concrete link the blueprint wants.
#[derive(Clone, Debug, PartialEq)]
pub struct WantedLink {
    pub a: String,
    pub b: String,
    pub link_type: String,
    pub provider: String,
    /// For a hard link: (first, second) — the second waits for the first.
    pub order: Option<(String, String)>,
}

/// A link's part of a change set.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedLink {
    pub a: String,
    pub b: String,
    pub link_type: String,
    pub provider: String,
    pub action: Action,
}

/// The links between included resources, in selection order.
pub fn wanted(prepared: &Prepared, manifests: &Manifests) -> Vec<WantedLink> {
    let ev = &prepared.evaluation;
    let included: HashSet<&str> = ev
        .resources
        .iter()
        .filter(|x| x.included())
        .map(|x| x.name.as_str())
        .collect();
    let count = |template: &str| match ev.entries.get(template) {
        Some(crate::eval::expr::ResourceEntry::Template(items)) => items.len(),
        _ => 1,
    };
    let mut out = Vec::new();
    for plan in select_links(&prepared.blueprint, manifests) {
        let pairs = plan.element_pairs(count(&plan.resource_a), count(&plan.resource_b));
        let order = plan.order().map(|(first, _)| first == plan.resource_a);
        for (a, b) in pairs {
            if !included.contains(a.as_str()) || !included.contains(b.as_str()) {
                continue;
            }
            let order = order.map(|a_first| {
                if a_first {
                    (a.clone(), b.clone())
                } else {
                    (b.clone(), a.clone())
                }
            });
            out.push(WantedLink {
                a,
                b,
                link_type: plan.link_type.clone(),
                provider: plan.provider.clone(),
                order,
            });
        }
    }
    out
}

/// Hard links order their resources: the second waits for the first.
pub fn add_hard_link_order(prepared: &mut Prepared, links: &[WantedLink]) {
    for l in links {
        let Some((first, second)) = &l.order else {
            continue;
        };
        if let (Some(f), Some(s)) = (prepared.find(first), prepared.find(second))
            && !prepared.deps[s].contains(&f)
        {
            prepared.deps[s].push(f);
        }
    }
}

/// What happens to each link: new ones are created, existing ones updated when an end
/// changes (created again when an end is recreated: its removal took the link with it),
/// and links in state the blueprint no longer selects are removed. A link whose last
/// application failed (or never finished) is applied again even when its ends stay as they
/// are: otherwise nothing would ever retry it.
pub fn plan_links(
    wanted: &[WantedLink],
    current: &InstanceState,
    resources: &[PlannedResource],
) -> Vec<PlannedLink> {
    use crate::state::LinkStatus as S;
    let action_of: HashMap<&str, Action> = resources
        .iter()
        .map(|r| (r.name.as_str(), r.action))
        .collect();
    let existing: HashMap<(&str, &str), S> = current
        .links
        .iter()
        .map(|l| ((l.resource_a.as_str(), l.resource_b.as_str()), l.status))
        .collect();
    let mut out = Vec::new();
    let mut keep: HashSet<(&str, &str)> = HashSet::new();
    for w in wanted {
        keep.insert((w.a.as_str(), w.b.as_str()));
        let ends = [action_of.get(w.a.as_str()), action_of.get(w.b.as_str())];
        let end_changes = ends
            .iter()
            .any(|a| matches!(a, Some(Action::Update | Action::Create)));
        let action = match existing.get(&(w.a.as_str(), w.b.as_str())) {
            None => Action::Create,
            // A recreated end took the link with it: it is created again.
            Some(_) if ends.contains(&Some(&Action::Recreate)) => Action::Create,
            // Never created: the provider is asked to create it, not to update it.
            Some(S::CreateFailed | S::CreateRequested) => Action::Create,
            Some(S::Created | S::Updated) if !end_changes => Action::NoChange,
            // An end changed, or an update or removal failed half-way: applied again.
            Some(_) => Action::Update,
        };
        out.push(PlannedLink {
            a: w.a.clone(),
            b: w.b.clone(),
            link_type: w.link_type.clone(),
            provider: w.provider.clone(),
            action,
        });
    }
    for l in &current.links {
        if !keep.contains(&(l.resource_a.as_str(), l.resource_b.as_str())) {
            out.push(PlannedLink {
                a: l.resource_a.clone(),
                b: l.resource_b.clone(),
                link_type: l.link_type.clone(),
                provider: provider_of(&l.link_type),
                action: Action::Delete,
            });
        }
    }
    out
}

/// The provider of a recorded link: the namespace of its first resource type.
pub fn provider_of(link_type: &str) -> String {
    link_type.split('/').next().unwrap_or_default().to_owned()
}

/// The key of a link record's data (`state::Link::data`) under which the engine keeps the
/// fields the link owns: `{"$owned": {"a": ["spec.values.FILE_A"], "b": []}}`, next to the
/// provider's link data. It is never shown as link data: [`link_data`] leaves it out, for
/// `${link(a, b)}`, API answers and the provider's next call.
pub const OWNED_KEY: &str = "$owned";

/// The fields of resources A and B a link owns (from its StageLink), as
/// [`super::diff::FieldChange::path`]s: `spec.values.FILE_A`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnedPaths {
    pub a: Vec<String>,
    pub b: Vec<String>,
}

impl OwnedPaths {
    pub fn is_empty(&self) -> bool {
        self.a.is_empty() && self.b.is_empty()
    }

    /// From the attribute paths a provider's StageLink returns (relative to the spec).
    pub fn from_pb(
        a: &[trellis_proto::plugin::v1::AttributePath],
        b: &[trellis_proto::plugin::v1::AttributePath],
    ) -> OwnedPaths {
        let render = |paths: &[trellis_proto::plugin::v1::AttributePath]| {
            let mut out: Vec<String> = Vec::new();
            for p in paths.iter().map(spec_path) {
                if !out.contains(&p) {
                    out.push(p);
                }
            }
            out
        };
        OwnedPaths {
            a: render(a),
            b: render(b),
        }
    }
}

/// An attribute path of a spec as a field path: `values` / `FILE_A` → `spec.values.FILE_A`;
/// an empty path is the whole spec, `spec`.
pub fn spec_path(p: &trellis_proto::plugin::v1::AttributePath) -> String {
    use trellis_proto::plugin::v1::path_step::Step;
    let mut out = "spec".to_owned();
    for step in &p.steps {
        match &step.step {
            Some(Step::Field(name)) => super::drift::push_key(&mut out, name),
            Some(Step::Index(i)) => out.push_str(&format!("[{i}]")),
            None => {}
        }
    }
    out
}

/// Whether a stored value is a secret wrapper (`state_values`): its data cannot take a key.
fn is_secret_wrapper(o: &serde_json::Map<String, Json>) -> bool {
    o.len() == 1 && o.contains_key("$sensitive")
}

/// The data to record for a link: the provider's link data with the owned paths beside it.
/// Link data that is not a mapping (or null) cannot hold them: they are then not recorded,
/// and the fields stay subject to drift.
pub fn record_data(data: Json, owned: &OwnedPaths) -> Json {
    let mut data = data;
    if let Json::Object(o) = &mut data {
        o.remove(OWNED_KEY);
    }
    if owned.is_empty() {
        return data;
    }
    let entry = json!({ "a": owned.a, "b": owned.b });
    match data {
        Json::Null => json!({ OWNED_KEY: entry }),
        Json::Object(mut o) if !is_secret_wrapper(&o) => {
            o.insert(OWNED_KEY.to_owned(), entry);
            Json::Object(o)
        }
        other => {
            tracing::warn!(
                "link data is not a mapping: the fields the link owns are not recorded, and drift checks compare them"
            );
            other
        }
    }
}

/// The provider's link data of a link record (without the owned paths).
pub fn link_data(stored: &Json) -> Json {
    match stored {
        Json::Object(o) if o.contains_key(OWNED_KEY) => {
            let rest: serde_json::Map<String, Json> = o
                .iter()
                .filter(|(k, _)| *k != OWNED_KEY)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if rest.is_empty() {
                Json::Null
            } else {
                Json::Object(rest)
            }
        }
        other => other.clone(),
    }
}

/// The owned paths recorded with a link.
pub fn owned_paths(stored: &Json) -> OwnedPaths {
    let list = |side: &str| -> Vec<String> {
        stored
            .get(OWNED_KEY)
            .and_then(|o| o.get(side))
            .and_then(Json::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(Json::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    OwnedPaths {
        a: list("a"),
        b: list("b"),
    }
}

/// Resource name → the fields links own on it (A's paths of the links it is A of, B's of the
/// links it is B of).
pub fn owned_by_resource(links: &[Link]) -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for l in links {
        let owned = owned_paths(&l.data);
        for (name, paths) in [(&l.resource_a, owned.a), (&l.resource_b, owned.b)] {
            if !paths.is_empty() {
                out.entry(name.clone()).or_default().extend(paths);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Instance, InstanceStatus, Link, ResourceStatus, Timestamp};

    fn wanted(a: &str, b: &str) -> WantedLink {
        WantedLink {
            a: a.into(),
            b: b.into(),
            link_type: "local/envFile::local/file".into(),
            provider: "local".into(),
            order: None,
        }
    }

    fn planned(name: &str, action: Action) -> PlannedResource {
        PlannedResource {
            name: name.into(),
            resource_type: "local/file".into(),
            action,
            fields: vec![],
            reason: String::new(),
            depends_on: vec![],
            derived_from: None,
        }
    }

    fn state(links: &[(&str, &str)]) -> InstanceState {
        let t = Timestamp::from_millis(0);
        InstanceState {
            instance: Instance {
                id: "i".into(),
                name: "i".into(),
                status: InstanceStatus::Deployed,
                version: 1,
                last_seq: 0,
                pruned_through: 0,
                lease_epoch: 0,
                lease: None,
                environment: serde_json::Value::Null,
                created_at: t,
                updated_at: t,
            },
            resources: vec![],
            links: links
                .iter()
                .map(|(a, b)| Link {
                    instance_id: "i".into(),
                    resource_a: (*a).into(),
                    resource_b: (*b).into(),
                    link_type: "local/envFile::local/file".into(),
                    status: ResourceStatus::Created,
                    data: Json::Null,
                    created_at: t,
                    updated_at: t,
                })
                .collect(),
            children: vec![],
            exports: vec![],
        }
    }

    #[test]
    fn owned_paths_are_kept_beside_link_data() {
        use trellis_proto::plugin::v1::{AttributePath, PathStep, path_step::Step};
        let path = |steps: &[&str]| AttributePath {
            steps: steps
                .iter()
                .map(|s| PathStep {
                    step: Some(match s.parse::<u64>() {
                        Ok(i) => Step::Index(i),
                        Err(_) => Step::Field((*s).to_owned()),
                    }),
                })
                .collect(),
        };
        let owned = OwnedPaths::from_pb(
            &[
                path(&["values", "FILE_A"]),
                path(&["values", "FILE_A"]),
                path(&["list", "0", "a.b"]),
            ],
            &[path(&[])],
        );
        assert_eq!(
            owned,
            OwnedPaths {
                a: vec!["spec.values.FILE_A".into(), r#"spec.list[0]["a.b"]"#.into()],
                b: vec!["spec".into()],
            }
        );
        let data = json!({ "variable": "FILE_A" });
        let stored = record_data(data.clone(), &owned);
        assert_eq!(stored["variable"], "FILE_A");
        assert_eq!(link_data(&stored), data);
        assert_eq!(owned_paths(&stored), owned);
        // Recorded again (an update): replaced, not nested.
        let again = record_data(stored.clone(), &OwnedPaths::default());
        assert_eq!(again, data);
        // Null link data; non-mapping link data cannot hold them.
        let stored = record_data(Json::Null, &owned);
        assert_eq!(link_data(&stored), Json::Null);
        assert_eq!(owned_paths(&stored), owned);
        assert_eq!(record_data(json!([1]), &owned), json!([1]));
        let secret = json!({ "$sensitive": { "x": 1 } });
        assert_eq!(record_data(secret.clone(), &owned), secret);
        assert_eq!(owned_paths(&json!({ "a": 1 })), OwnedPaths::default());
    }

    #[test]
    fn owned_paths_by_resource() {
        let mut s = state(&[("env", "f"), ("env", "g")]);
        s.links[0].data = record_data(
            Json::Null,
            &OwnedPaths {
                a: vec!["spec.values.FILE_F".into()],
                b: vec!["spec.tags".into()],
            },
        );
        s.links[1].data = record_data(
            json!({ "x": 1 }),
            &OwnedPaths {
                a: vec!["spec.values.FILE_G".into()],
                b: vec![],
            },
        );
        let owned = owned_by_resource(&s.links);
        assert_eq!(
            owned["env"],
            [
                "spec.values.FILE_F".to_owned(),
                "spec.values.FILE_G".to_owned()
            ]
        );
        assert_eq!(owned["f"], ["spec.tags".to_owned()]);
        assert!(!owned.contains_key("g"));
    }

    fn actions(links: &[PlannedLink]) -> Vec<(String, &'static str)> {
        links
            .iter()
            .map(|l| (format!("{}->{}", l.a, l.b), l.action.as_str()))
            .collect()
    }

    #[test]
    fn link_changes_follow_their_ends() {
        let want = [
            wanted("env", "a"),
            wanted("env", "b"),
            wanted("env", "c"),
            wanted("env", "d"),
        ];
        let current = state(&[("env", "a"), ("env", "b"), ("env", "c"), ("env", "gone")]);
        let resources = [
            planned("env", Action::NoChange),
            planned("a", Action::NoChange),
            planned("b", Action::Update),
            planned("c", Action::Recreate),
            planned("d", Action::Create),
        ];
        assert_eq!(
            actions(&plan_links(&want, &current, &resources)),
            [
                ("env->a".to_owned(), "NO_CHANGE"),
                // An end changed: the provider sees the link again.
                ("env->b".to_owned(), "UPDATE"),
                // A recreated end lost its link with its removal.
                ("env->c".to_owned(), "CREATE"),
                ("env->d".to_owned(), "CREATE"),
                // Selected no more.
                ("env->gone".to_owned(), "DELETE"),
            ]
        );
    }

    #[test]
    fn links_whose_last_application_failed_are_applied_again() {
        use crate::state::LinkStatus as S;
        let statuses = [
            ("created", S::Created),
            ("updated", S::Updated),
            ("createFailed", S::CreateFailed),
            ("createRequested", S::CreateRequested),
            ("updateFailed", S::UpdateFailed),
            ("updateRequested", S::UpdateRequested),
            ("destroyFailed", S::DestroyFailed),
        ];
        let want: Vec<WantedLink> = statuses.iter().map(|(b, _)| wanted("env", b)).collect();
        let ends: Vec<(&str, &str)> = statuses.iter().map(|(b, _)| ("env", *b)).collect();
        let mut current = state(&ends);
        for (l, (_, status)) in current.links.iter_mut().zip(statuses) {
            l.status = status;
        }
        // Both ends of every link stay as they are.
        let mut resources = vec![planned("env", Action::NoChange)];
        resources.extend(statuses.iter().map(|(b, _)| planned(b, Action::NoChange)));
        assert_eq!(
            actions(&plan_links(&want, &current, &resources)),
            [
                ("env->created".to_owned(), "NO_CHANGE"),
                ("env->updated".to_owned(), "NO_CHANGE"),
                // Never created: created again.
                ("env->createFailed".to_owned(), "CREATE"),
                ("env->createRequested".to_owned(), "CREATE"),
                // Created once, then an update or a removal did not finish: applied again.
                ("env->updateFailed".to_owned(), "UPDATE"),
                ("env->updateRequested".to_owned(), "UPDATE"),
                ("env->destroyFailed".to_owned(), "UPDATE"),
            ]
        );
        // A failed update whose end is recreated: created, like any link of a recreated end.
        assert_eq!(resources[5].name, "updateFailed");
        resources[5].action = Action::Recreate;
        assert_eq!(
            plan_links(&want, &current, &resources)[4].action,
            Action::Create
        );
    }

    #[test]
    fn providers_of_link_types() {
        assert_eq!(provider_of("local/envFile::local/file"), "local");
    }
}

//! Links at deploy time: which links the blueprint wants (the validated selection, with `each`
//! templates expanded element-wise), what changes against the links in state, and the order
//! hard links impose on resources.

use std::collections::{HashMap, HashSet};

use serde_json::{Value as Json, json};

use super::plan::{Action, PlannedResource};
use super::prepare::Prepared;
use crate::state::InstanceState;
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
/// and links in state the blueprint no longer selects are removed.
pub fn plan_links(
    wanted: &[WantedLink],
    current: &InstanceState,
    resources: &[PlannedResource],
) -> Vec<PlannedLink> {
    let action_of: HashMap<&str, Action> = resources
        .iter()
        .map(|r| (r.name.as_str(), r.action))
        .collect();
    let existing: HashSet<(&str, &str)> = current
        .links
        .iter()
        .map(|l| (l.resource_a.as_str(), l.resource_b.as_str()))
        .collect();
    let mut out = Vec::new();
    let mut keep: HashSet<(&str, &str)> = HashSet::new();
    for w in wanted {
        keep.insert((w.a.as_str(), w.b.as_str()));
        let ends = [action_of.get(w.a.as_str()), action_of.get(w.b.as_str())];
        // A recreated end took the link with it: it is created again.
        let action = if !existing.contains(&(w.a.as_str(), w.b.as_str()))
            || ends.contains(&Some(&Action::Recreate))
        {
            Action::Create
        } else if ends
            .iter()
            .any(|a| matches!(a, Some(Action::Update | Action::Create)))
        {
            Action::Update
        } else {
            Action::NoChange
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

pub fn to_json(links: &[PlannedLink]) -> Json {
    Json::Array(
        links
            .iter()
            .map(|l| {
                json!({ "a": l.a, "b": l.b, "linkType": l.link_type,
                        "provider": l.provider, "action": l.action.as_str() })
            })
            .collect(),
    )
}

pub fn from_json(v: &Json) -> Option<Vec<PlannedLink>> {
    v.as_array()?
        .iter()
        .map(|l| {
            Some(PlannedLink {
                a: l.get("a")?.as_str()?.to_owned(),
                b: l.get("b")?.as_str()?.to_owned(),
                link_type: l.get("linkType")?.as_str()?.to_owned(),
                provider: l.get("provider")?.as_str()?.to_owned(),
                action: Action::parse(l.get("action")?.as_str()?)?,
            })
        })
        .collect()
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
    fn planned_links_round_trip_through_the_change_set_body() {
        let links = plan_links(&[wanted("env", "a")], &state(&[("x", "y")]), &[]);
        assert_eq!(from_json(&to_json(&links)).unwrap(), links);
        assert_eq!(provider_of("local/envFile::local/file"), "local");
    }
}

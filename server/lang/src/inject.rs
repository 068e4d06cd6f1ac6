//! Property injectors: organisation- and stage-wide defaults for resource spec fields.
//!
//! Runs on the document tree after transforms and before [`crate::blueprint::load`], so injected
//! values are validated like written ones. Each scope's defaults become a synthetic JSON file in
//! the [`SourceMap`] and injected nodes are cloned from its parsed tree, so diagnostics about an
//! injected value point at the line of the default that supplied it.
//!
//! Precedence: what the author wrote > environment > engine. Scopes are applied nearest first and
//! only fill what is absent; nested maps merge key by key, lists and scalars are taken whole.

use indexmap::IndexMap;

use crate::diag::Diagnostics;
use crate::document::{Key, Node, NodeKind, parse_json};
use crate::source::SourceMap;

/// One scope of injectors: defaults per resource type.
pub struct InjectorScope {
    /// "environment" or "engine": what the plan shows as the origin of an injected field.
    pub origin: String,
    /// The name of the source the defaults are shown under in diagnostics,
    /// e.g. "environment dev.yaml (injectors)" or "engine config (injectors)".
    pub label: String,
    /// Resource type (e.g. "local/file") -> a JSON object of spec defaults.
    pub by_type: IndexMap<String, serde_json::Value>,
}

/// A field the injectors set on a resource template.
#[derive(Clone, Debug, PartialEq)]
pub struct Injected {
    /// The resource's name in the blueprint (the template name; `each` expansion happens later).
    pub resource: String,
    /// Keys from the spec root, e.g. ["mode"] or ["tags", "team"]: the field that was absent and was filled.
    pub keys: Vec<String>,
    /// The scope's `origin`.
    pub origin: String,
}

/// Fills absent spec fields of every resource in `root` (the blueprint document) whose `type`
/// has an injector. `scopes` are ordered nearest first. Each scope's defaults are added to
/// `sources` as a synthetic JSON file named by its `label`, the first time one of its injectors
/// applies to a resource (so a scope that injects nothing adds no file), and injected nodes are
/// clones of that parsed tree. Returns what was injected, in document order.
///
/// Malformed documents are left as they are: validation reports them later. A type whose
/// defaults are not a JSON object is ignored, as is a scope nested too deeply for the reader.
/// A resource without `spec` gets one whose key and node spans are the empty span at the start
/// of its `type` value: the type is what selected the injectors, so diagnostics about the
/// spec as a whole land there.
pub fn inject(sources: &mut SourceMap, root: &mut Node, scopes: &[InjectorScope]) -> Vec<Injected> {
    let mut out = Vec::new();
    let NodeKind::Map(top) = &mut root.kind else {
        return out;
    };
    let resources = top.iter_mut().find(|(k, _)| k.name == "resources");
    let Some(NodeKind::Map(resources)) = resources.map(|(_, v)| &mut v.kind) else {
        return out;
    };
    // Per scope, once used: its defaults by type, parsed from its synthetic file.
    let mut parsed: Vec<Option<Vec<(Key, Node)>>> = vec![None; scopes.len()];
    for (name, resource) in resources.iter_mut() {
        let NodeKind::Map(fields) = &mut resource.kind else {
            continue;
        };
        let Some((ty, anchor)) = fields
            .iter()
            .find(|(k, _)| k.name == "type")
            .and_then(|(_, v)| Some((v.as_str()?.to_owned(), v.span.start_point())))
        else {
            continue;
        };
        let existing = fields.iter().position(|(k, _)| k.name == "spec");
        let mut fresh = Node {
            kind: NodeKind::Map(Vec::new()),
            span: anchor,
        };
        let spec = match existing {
            Some(i) => &mut fields[i].1,
            None => &mut fresh,
        };
        let NodeKind::Map(spec_entries) = &mut spec.kind else {
            continue;
        };
        let mut filled: Vec<(Vec<String>, &str)> = Vec::new();
        for (scope, tree) in scopes.iter().zip(parsed.iter_mut()) {
            if !matches!(scope.by_type.get(&ty), Some(serde_json::Value::Object(_))) {
                continue;
            }
            let tree = tree.get_or_insert_with(|| parse_scope(sources, scope));
            let defaults = tree
                .iter()
                .find(|(k, _)| k.name == ty)
                .map(|(_, v)| &v.kind);
            if let Some(NodeKind::Map(defaults)) = defaults {
                merge(
                    spec_entries,
                    defaults,
                    &mut Vec::new(),
                    &scope.origin,
                    &mut filled,
                );
            }
        }
        if filled.is_empty() {
            continue;
        }
        // Scopes were applied one after another; report in the order of the merged tree.
        filled.sort_by_cached_key(|(keys, _)| position(spec_entries, keys));
        out.extend(filled.into_iter().map(|(keys, origin)| Injected {
            resource: name.name.clone(),
            keys,
            origin: origin.to_owned(),
        }));
        if existing.is_none() {
            let key = Key {
                name: "spec".to_owned(),
                span: anchor,
            };
            fields.push((key, fresh));
        }
    }
    out
}

/// Adds the scope's defaults to the source map as pretty JSON and parses them back, so every
/// injected node has a real span. Empty only if the reader refuses the text (nesting deeper
/// than [`crate::document::MAX_DEPTH`]).
fn parse_scope(sources: &mut SourceMap, scope: &InjectorScope) -> Vec<(Key, Node)> {
    // Through a serde_json map, whose order is preserved (`preserve_order`).
    let object: serde_json::Map<String, serde_json::Value> = scope
        .by_type
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(object)).unwrap_or_default();
    let file = sources.add(scope.label.clone(), text);
    match parse_json(&sources.get(file).text, file, &mut Diagnostics::default()) {
        Some(Node {
            kind: NodeKind::Map(by_type),
            ..
        }) => by_type,
        _ => Vec::new(),
    }
}

/// Inserts into `target` every key of `defaults` it lacks (appended, in the defaults' order)
/// and recurses where both sides are maps; anything else already present is kept whole.
/// Records the key path of each insertion, with the scope's origin, in `filled`.
fn merge<'o>(
    target: &mut Vec<(Key, Node)>,
    defaults: &[(Key, Node)],
    path: &mut Vec<String>,
    origin: &'o str,
    filled: &mut Vec<(Vec<String>, &'o str)>,
) {
    for (key, value) in defaults {
        path.push(key.name.clone());
        match target.iter_mut().find(|(k, _)| k.name == key.name) {
            None => {
                target.push((key.clone(), value.clone()));
                filled.push((path.clone(), origin));
            }
            Some((_, existing)) => {
                if let (NodeKind::Map(inner), NodeKind::Map(more)) =
                    (&mut existing.kind, &value.kind)
                {
                    merge(inner, more, path, origin, filled);
                }
            }
        }
        path.pop();
    }
}

/// The indexes of a key path in a map tree, for sorting paths into document order.
fn position(entries: &[(Key, Node)], keys: &[String]) -> Vec<usize> {
    let mut at = Vec::with_capacity(keys.len());
    let mut entries = entries;
    for key in keys {
        let Some(i) = entries.iter().position(|(k, _)| &k.name == key) else {
            break;
        };
        at.push(i);
        entries = entries[i].1.as_map().unwrap_or(&[]);
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::FileId;
    use serde_json::{Value, json};

    fn doc(yaml: &str) -> (SourceMap, Node) {
        let mut sources = SourceMap::new();
        let file = sources.add("bp.yaml", yaml.to_owned());
        let mut diags = Diagnostics::default();
        let root = crate::document::parse_yaml(yaml, file, &mut diags).expect("parses");
        assert!(diags.items.is_empty(), "{:?}", diags.items);
        (sources, root)
    }

    fn run(yaml: &str, scopes: &[InjectorScope]) -> (SourceMap, Node, Vec<Injected>) {
        let (mut sources, mut root) = doc(yaml);
        let out = inject(&mut sources, &mut root, scopes);
        (sources, root, out)
    }

    fn scope(origin: &str, by_type: Value) -> InjectorScope {
        let Value::Object(m) = by_type else {
            panic!("an object")
        };
        InjectorScope {
            origin: origin.to_owned(),
            label: format!("{origin} (injectors)"),
            by_type: m.into_iter().collect(),
        }
    }

    fn got(resource: &str, keys: &[&str], origin: &str) -> Injected {
        Injected {
            resource: resource.to_owned(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
            origin: origin.to_owned(),
        }
    }

    fn get<'n>(node: &'n Node, name: &str) -> &'n Node {
        let m = node.as_map().expect("a map");
        &m.iter().find(|(k, _)| k.name == name).expect(name).1
    }

    fn spec<'n>(root: &'n Node, resource: &str) -> &'n Node {
        get(get(get(root, "resources"), resource), "spec")
    }

    fn json(node: &Node) -> Value {
        match &node.kind {
            NodeKind::Null => Value::Null,
            NodeKind::Bool(b) => json!(b),
            NodeKind::Int(i) => json!(i),
            NodeKind::Float(f) => json!(f),
            NodeKind::Str(s, _) => json!(s),
            NodeKind::List(l) => Value::Array(l.iter().map(json).collect()),
            NodeKind::Map(m) => {
                Value::Object(m.iter().map(|(k, v)| (k.name.clone(), json(v))).collect())
            }
        }
    }

    /// How many files the map holds: the id the next one gets.
    fn file_count(sources: &mut SourceMap) -> u32 {
        sources.add("probe", String::new()).0
    }

    const FILE: &str = "resources:\n  f:\n    type: local/file\n    spec:\n      path: /tmp/x\n";

    #[test]
    fn absent_field_is_filled() {
        let env = scope("environment", json!({"local/file": {"mode": "0600"}}));
        let (_, root, out) = run(FILE, &[env]);
        assert_eq!(out, [got("f", &["mode"], "environment")]);
        assert_eq!(
            json(spec(&root, "f")),
            json!({"path": "/tmp/x", "mode": "0600"})
        );
    }

    #[test]
    fn author_value_wins() {
        let engine = scope("engine", json!({"local/file": {"path": "/etc/default"}}));
        let (_, root, out) = run(FILE, &[engine]);
        assert_eq!(out, []);
        assert_eq!(json(spec(&root, "f")), json!({"path": "/tmp/x"}));
    }

    #[test]
    fn environment_beats_engine() {
        let env = scope("environment", json!({"local/file": {"mode": "0600"}}));
        let engine = scope(
            "engine",
            json!({"local/file": {"mode": "0644", "owner": "x"}}),
        );
        let (_, root, out) = run(FILE, &[env, engine]);
        assert_eq!(
            out,
            [
                got("f", &["mode"], "environment"),
                got("f", &["owner"], "engine")
            ]
        );
        assert_eq!(
            json(spec(&root, "f")),
            json!({"path": "/tmp/x", "mode": "0600", "owner": "x"})
        );
    }

    #[test]
    fn nested_maps_merge_across_author_environment_engine() {
        let yaml =
            "resources:\n  f:\n    type: local/file\n    spec:\n      tags:\n        app: web\n";
        let env = scope(
            "environment",
            json!({"local/file": {"mode": "0600", "tags": {"app": "env", "team": "core"}}}),
        );
        let engine = scope(
            "engine",
            json!({"local/file": {"tags": {"team": "org", "cost": {"centre": "42"}}}}),
        );
        let (_, root, out) = run(yaml, &[env, engine]);
        // Document order of the merged tree, not the order the scopes were applied in.
        assert_eq!(
            out,
            [
                got("f", &["tags", "team"], "environment"),
                got("f", &["tags", "cost"], "engine"),
                got("f", &["mode"], "environment"),
            ]
        );
        assert_eq!(
            json(spec(&root, "f")),
            json!({"tags": {"app": "web", "team": "core", "cost": {"centre": "42"}}, "mode": "0600"})
        );
    }

    #[test]
    fn lists_and_scalars_are_taken_whole() {
        let yaml = "resources:\n  f:\n    type: local/file\n    spec:\n      lines: [a]\n      opts: plain\n";
        let engine = scope(
            "engine",
            json!({"local/file": {"lines": ["b", "c"], "opts": {"x": 1}, "extra": [1, 2]}}),
        );
        let (_, root, out) = run(yaml, &[engine]);
        assert_eq!(out, [got("f", &["extra"], "engine")]);
        assert_eq!(
            json(spec(&root, "f")),
            json!({"lines": ["a"], "opts": "plain", "extra": [1, 2]})
        );
    }

    #[test]
    fn resource_without_spec_gets_one_at_its_type() {
        let env = scope("environment", json!({"local/dir": {"mode": "0700"}}));
        let (_, root, out) = run("resources:\n  d:\n    type: local/dir\n", &[env]);
        assert_eq!(out, [got("d", &["mode"], "environment")]);
        let resource = get(get(&root, "resources"), "d");
        let (key, spec) = resource.as_map().unwrap().last().unwrap();
        assert_eq!(key.name, "spec");
        let at = get(resource, "type").span.start_point();
        assert_eq!((key.span, spec.span), (at, at));
        assert_eq!(json(spec), json!({"mode": "0700"}));
    }

    #[test]
    fn other_types_and_empty_scopes_are_untouched() {
        let empty = scope("environment", json!({}));
        let other = scope("engine", json!({"local/dir": {"mode": "0700"}}));
        let (mut sources, root, out) = run(FILE, &[empty, other]);
        assert_eq!((out, root), (vec![], doc(FILE).1));
        // Neither scope applied, so neither added a file (bp.yaml is file 0).
        assert_eq!(file_count(&mut sources), 1);
    }

    #[test]
    fn malformed_documents_are_untouched() {
        for yaml in [
            "- a list\n",
            "resources: [f]\n",
            "resources:\n  f: [1]\n",
            "resources:\n  f:\n    spec: {}\n",
            "resources:\n  f:\n    type: [local/file]\n",
            "resources:\n  f:\n    type: local/file\n    spec: [mode]\n",
            "resources:\n  f:\n    type: local/file\n    spec:\n",
            "resources:\n  f:\n    type: local/file\n    spec: ${values.spec}\n",
        ] {
            let engine = scope("engine", json!({"local/file": {"mode": "0600"}}));
            let (_, root, out) = run(yaml, &[engine]);
            assert_eq!((out, root), (vec![], doc(yaml).1), "{yaml}");
        }
    }

    #[test]
    fn injected_span_points_at_the_default_in_the_labelled_file() {
        let yaml = "resources:\n  a:\n    type: local/file\n  b:\n    type: local/file\n";
        let engine = scope(
            "engine",
            json!({"local/dir": {"x": 1}, "local/file": {"owner": "ops", "mode": "0600"}}),
        );
        let (mut sources, root, out) = run(yaml, &[engine]);
        assert_eq!(out.len(), 4);
        for resource in ["a", "b"] {
            let (key, value) = &spec(&root, resource).as_map().unwrap()[1];
            assert_eq!(key.name, "mode");
            let file = sources.get(key.span.file);
            assert_eq!(file.name, "engine (injectors)");
            let line = file.line_text(sources.resolve(key.span).0.line);
            assert_eq!(line.trim(), r#""mode": "0600""#);
            assert_eq!(value.span.file, key.span.file);
            assert_eq!(
                sources.resolve(value.span).0.line,
                sources.resolve(key.span).0.line
            );
        }
        // One synthetic file for the scope, though two resources used it.
        assert_eq!(file_count(&mut sources), 2);
        assert_eq!(spec(&root, "a").as_map().unwrap()[0].0.span.file, FileId(1));
    }

    #[test]
    fn the_loaded_blueprint_sees_injected_fields() {
        let yaml = format!(
            "version: {}\nresources:\n  f:\n    type: local/file\n    spec:\n      path: /tmp/x\n  d:\n    type: local/dir\n",
            crate::blueprint::SPEC_VERSION
        );
        let env = scope("environment", json!({"local/file": {"mode": "0600"}}));
        let engine = scope(
            "engine",
            json!({"local/file": {"mode": "0644"}, "local/dir": {"path": "/srv"}}),
        );
        let (sources, root, _) = run(&yaml, &[env, engine]);
        let mut diags = Diagnostics::default();
        let bp = crate::blueprint::load(&root, sources.get(FileId(0)), FileId(0), &mut diags);
        // Without injection `d` would lack its required `spec`.
        assert!(!diags.has_errors(), "{:?}", diags.items);
        // Every string of each loaded spec, with the file its span points into.
        let strings: Vec<Vec<(String, &str)>> = bp
            .resources
            .iter()
            .map(|r| {
                let mut found = Vec::new();
                r.spec.as_ref().expect("a spec").templates(&mut |t| {
                    found.push((t.as_literal().unwrap(), &*sources.get(t.span.file).name));
                });
                found
            })
            .collect();
        assert_eq!(
            strings,
            [
                vec![
                    ("/tmp/x".into(), "bp.yaml"),
                    ("0600".into(), "environment (injectors)")
                ],
                vec![("/srv".into(), "engine (injectors)")],
            ]
        );
    }
}

//! Rewriting references to abstract fields inside `${…}` substitutions and
//! in the `field` paths of exports.

use serde_json::{Map, Value as Json};
use std::collections::BTreeMap;

type Aliases = BTreeMap<(String, String), String>;

/// Rewrites every `resources.<abstract>.spec.<field>` inside a substitution
/// of any string of the document, and at the start of an export's `field`
/// path, to the concrete path `aliases` names.
pub(crate) fn rewrite(doc: &mut Map<String, Json>, aliases: &Aliases) {
    if aliases.is_empty() {
        return;
    }
    for (_, v) in doc.iter_mut() {
        walk(v, aliases);
    }
    // `exports.<name>.field` is a path written without `${}`.
    if let Some(exports) = doc.get_mut("exports").and_then(Json::as_object_mut) {
        for export in exports.values_mut() {
            if let Some(Json::String(field)) = export.get_mut("field") {
                let (new, changed) = rewrite_inner(field, aliases);
                if changed {
                    *field = new;
                }
            }
        }
    }
}

fn walk(v: &mut Json, aliases: &Aliases) {
    match v {
        Json::String(s) if s.contains("${") => {
            if let Some(new) = rewrite_str(s, aliases) {
                *s = new;
            }
        }
        Json::Array(items) => items.iter_mut().for_each(|i| walk(i, aliases)),
        Json::Object(map) => map.values_mut().for_each(|i| walk(i, aliases)),
        _ => {}
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// The string with its substitutions' abstract references rewritten, or
/// `None` when nothing changed.
fn rewrite_str(s: &str, aliases: &Aliases) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut changed = false;
    let mut rest = s;
    while let Some(open) = rest.find("${") {
        out.push_str(&rest[..open]);
        let inner_start = open + 2;
        let Some(close) = rest[inner_start..].find('}') else {
            out.push_str(&rest[open..]);
            rest = "";
            break;
        };
        let inner = &rest[inner_start..inner_start + close];
        let (new_inner, c) = rewrite_inner(inner, aliases);
        changed |= c;
        out.push_str("${");
        out.push_str(&new_inner);
        out.push('}');
        rest = &rest[inner_start + close + 1..];
    }
    out.push_str(rest);
    changed.then_some(out)
}

fn rewrite_inner(inner: &str, aliases: &Aliases) -> (String, bool) {
    let mut out = String::with_capacity(inner.len());
    let mut changed = false;
    let mut i = 0;
    'scan: while i < inner.len() {
        let here = &inner[i..];
        let boundary = i == 0 || !inner[..i].ends_with(|c: char| is_ident(c) || c == '.');
        if boundary && here.starts_with("resources.") {
            for ((name, field), target) in aliases {
                let pat_len = "resources.".len() + name.len() + ".spec.".len() + field.len();
                if here.len() >= pat_len
                    && here["resources.".len()..].starts_with(name.as_str())
                    && here["resources.".len() + name.len()..].starts_with(".spec.")
                    && here[pat_len - field.len()..].starts_with(field.as_str())
                    && !here[pat_len..].starts_with(is_ident)
                {
                    out.push_str(target);
                    i += pat_len;
                    changed = true;
                    continue 'scan;
                }
            }
        }
        let c = here.chars().next().expect("in bounds");
        out.push(c);
        i += c.len_utf8();
    }
    (out, changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aliases() -> Aliases {
        let mut a = Aliases::new();
        a.insert(
            ("saveOrder".into(), "handlerName".into()),
            "resources.saveOrder.spec.functionName".into(),
        );
        a
    }

    #[test]
    fn references_to_abstract_fields_are_rewritten() {
        let a = aliases();
        assert_eq!(
            rewrite_str("fn ${resources.saveOrder.spec.handlerName}!", &a).as_deref(),
            Some("fn ${resources.saveOrder.spec.functionName}!")
        );
        assert_eq!(
            rewrite_str("${upper(resources.saveOrder.spec.handlerName)}", &a).as_deref(),
            Some("${upper(resources.saveOrder.spec.functionName)}")
        );
        // Another resource, a longer field, text outside substitutions: untouched.
        for s in [
            "${resources.saveOrders.spec.handlerName}",
            "${resources.saveOrder.spec.handlerNameX}",
            "resources.saveOrder.spec.handlerName",
            "${xresources.saveOrder.spec.handlerName}",
        ] {
            assert_eq!(rewrite_str(s, &a), None, "{s}");
        }
    }

    #[test]
    fn export_field_paths_are_rewritten() {
        let mut doc = serde_json::json!({
            "exports": {
                "fn": {"type": "string", "field": "resources.saveOrder.spec.handlerName"},
                "other": {"type": "string", "field": "resources.saveOrder.spec.memory"}
            }
        });
        rewrite(doc.as_object_mut().expect("object"), &aliases());
        assert_eq!(
            doc["exports"]["fn"]["field"],
            "resources.saveOrder.spec.functionName"
        );
        assert_eq!(
            doc["exports"]["other"]["field"],
            "resources.saveOrder.spec.memory"
        );
    }
}

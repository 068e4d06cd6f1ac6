//! `transform:`: running transformer plugins before validation, and pointing
//! what is found in their output back at the blueprint the user wrote.
//!
//! The document goes to each named transformer in order, as JSON. The result
//! becomes a new source file (shown as `<file> (after <transform>)`), which is
//! loaded and validated like any blueprint. A diagnostic that lands inside a
//! generated resource is moved to the abstract resource it was derived from,
//! with the generated resource named in the message; one that lands on an
//! entry that exists in the original (by section and name) is moved there.

use crate::diag::{Diagnostic, Diagnostics, Severity, codes};
use crate::document::{self, Node, NodeKind};
use crate::source::{FileId, SourceMap, Span};
use trellis_proto::plugin::v1 as pb;

/// Runs transformers by name (the plugin host implements this).
pub trait Transforms {
    /// `Err` is a message naming the transformer (not installed, crashed,
    /// answered with an error).
    fn transform(
        &self,
        name: &str,
        blueprint_json: String,
    ) -> Result<pb::TransformResponse, String>;
}

/// The state after the transforms: the document to validate and how to map
/// its diagnostics back.
pub struct Transformed {
    pub file: FileId,
    pub root: Node,
    /// Each generated resource with the abstract resource it came from, in the order the
    /// transformers reported them.
    pub derivations: Vec<Derivation>,
}

/// A resource a transformer generated, and the abstract resource (one the user wrote, or one
/// an earlier transform generated) it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Derivation {
    pub generated: String,
    pub abstract_resource: String,
    /// The transform that generated it (`celerity-2023-04-20`).
    pub transform: String,
}

/// The resource `generated` came from: the abstract resource the user wrote (followed back
/// through chained transforms) and the transform that generated it from that resource.
/// `None` for a resource no transformer generated.
pub fn derivation_of<'a>(derivations: &'a [Derivation], generated: &str) -> Option<&'a Derivation> {
    let mut found = derivations
        .iter()
        .rev()
        .find(|d| d.generated == generated)?;
    // A later transform may expand a resource an earlier one generated: the user wrote the
    // first abstract resource of the chain. Bounded by the list, so a malformed cycle ends.
    for _ in 0..derivations.len() {
        match derivations
            .iter()
            .find(|d| d.generated == found.abstract_resource && d.transform != found.transform)
        {
            Some(earlier) => found = earlier,
            None => break,
        }
    }
    Some(found)
}

/// A document as JSON text, insertion order kept.
pub fn to_json(n: &Node) -> serde_json::Value {
    use serde_json::Value as J;
    match &n.kind {
        NodeKind::Null => J::Null,
        NodeKind::Bool(b) => J::Bool(*b),
        NodeKind::Int(i) => J::from(*i),
        NodeKind::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
        NodeKind::Str(s, _) => J::String(s.clone()),
        NodeKind::List(items) => J::Array(items.iter().map(to_json).collect()),
        NodeKind::Map(entries) => J::Object(
            entries
                .iter()
                .map(|(k, v)| (k.name.clone(), to_json(v)))
                .collect(),
        ),
    }
}

/// The span of the node an attribute path (from the document root) reaches.
fn locate(root: &Node, path: Option<&pb::AttributePath>) -> Span {
    let mut node = root;
    let mut span = root.span.start_point();
    for step in path.map(|p| p.steps.as_slice()).unwrap_or_default() {
        let next = match (&node.kind, &step.step) {
            (NodeKind::Map(entries), Some(pb::path_step::Step::Field(f))) => entries
                .iter()
                .find(|(k, _)| &k.name == f)
                .map(|(k, v)| (k.span, v)),
            (NodeKind::List(items), Some(pb::path_step::Step::Index(i))) => {
                items.get(*i as usize).map(|v| (v.span, v))
            }
            _ => None,
        };
        match next {
            Some((s, n)) => {
                span = s;
                node = n;
            }
            None => break,
        }
    }
    span
}

/// Applies each transform in `names` to the document. Returns `None` when a
/// transform could not run (reported); transformer diagnostics are reported
/// against the original document.
pub fn run(
    sources: &mut SourceMap,
    original: &Node,
    names: &[(String, Span)],
    transforms: &dyn Transforms,
    diags: &mut Diagnostics,
) -> Option<Transformed> {
    let base_name = sources.get(original.span.file).name.clone();
    let mut current_json = to_json(original).to_string();
    let mut derivations = Vec::new();
    let mut result: Option<(FileId, Node)> = None;
    // A problem with one transform points at its own entry in `transform`.
    for (name, transform_span) in names {
        let transform_span = *transform_span;
        let response = match transforms.transform(name, current_json) {
            Ok(r) => r,
            Err(message) => {
                diags.push(Diagnostic::new(&codes::TRANSFORM, transform_span, message));
                return None;
            }
        };
        for d in &response.diagnostics {
            let severity = match pb::Severity::try_from(d.severity).unwrap_or(pb::Severity::Error) {
                pb::Severity::Warning => Severity::Warning,
                pb::Severity::Info => Severity::Info,
                _ => Severity::Error,
            };
            let code = if d.code.is_empty() {
                String::new()
            } else {
                format!(" [{}]", d.code)
            };
            let mut diag = Diagnostic::new(
                &codes::PROVIDER_DIAGNOSTIC,
                locate(original, d.path.as_ref()),
                format!("transform `{name}`{code}: {}", d.message),
            );
            diag.severity = severity;
            if !d.hint.is_empty() {
                diag.hint = Some(d.hint.clone());
            }
            diags.push(diag);
        }
        if let Some(e) = &response.error {
            diags.push(Diagnostic::new(
                &codes::TRANSFORM,
                locate(original, e.path.as_ref()),
                format!("transform `{name}` failed: {}", e.message),
            ));
            return None;
        }
        for d in &response.derivations {
            derivations.push(Derivation {
                generated: d.generated_resource.clone(),
                abstract_resource: d.abstract_resource.clone(),
                transform: name.clone(),
            });
        }
        let file = sources.add(
            format!("{base_name} (after {name})"),
            response.blueprint_json.clone(),
        );
        let mut local = Diagnostics::default();
        let Some(root) = document::parse_json(&sources.get(file).text, file, &mut local) else {
            diags.push(Diagnostic::new(
                &codes::TRANSFORM,
                transform_span,
                format!("transform `{name}` returned a document that is not valid JSON"),
            ));
            return None;
        };
        current_json = response.blueprint_json;
        result = Some((file, root));
    }
    result.map(|(file, root)| Transformed {
        file,
        root,
        derivations,
    })
}

impl Transformed {
    /// Moves diagnostics about the transformed document onto the original.
    pub fn map_back(&self, original: &Node, diags: &mut Diagnostics) {
        for d in &mut diags.items {
            if d.span.file != self.file {
                continue;
            }
            let Some((section, name, entry)) = entry_at(&self.root, d.span) else {
                continue;
            };
            let derived = (section == "resources")
                .then(|| derivation_of(&self.derivations, name))
                .flatten();
            let (target, note) = match derived {
                Some(d) => (
                    d.abstract_resource.as_str(),
                    format!(
                        "in `{name}`, generated from `{}` by transform `{}`: ",
                        d.abstract_resource, d.transform
                    ),
                ),
                None => (name, format!("after transform: in `{section}.{name}`: ")),
            };
            let _ = entry;
            if let Some(span) = key_span(original, section, target) {
                d.span = span;
                d.message = format!("{note}{}", d.message);
            }
        }
    }
}

/// The top-level section entry (`resources.x`) whose definition holds a span.
fn entry_at(root: &Node, span: Span) -> Option<(&str, &str, &Node)> {
    for (section, node) in root.as_map()? {
        for (key, value) in node.as_map().unwrap_or_default() {
            let whole = key.span.to(value.span);
            if whole.start <= span.start && span.end <= whole.end {
                return Some((section.name.as_str(), key.name.as_str(), value));
            }
        }
    }
    None
}

fn key_span(root: &Node, section: &str, name: &str) -> Option<Span> {
    let (_, node) = root.as_map()?.iter().find(|(k, _)| k.name == section)?;
    node.as_map()?
        .iter()
        .find(|(k, _)| k.name == name)
        .map(|(k, _)| k.span)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(generated: &str, abstract_resource: &str, transform: &str) -> Derivation {
        Derivation {
            generated: generated.into(),
            abstract_resource: abstract_resource.into(),
            transform: transform.into(),
        }
    }

    #[test]
    fn a_generated_resource_leads_back_to_the_resource_the_user_wrote() {
        let all = [
            d("saveOrder_function", "saveOrder", "celerity-2023-04-20"),
            d("saveOrder_fn_alarm", "saveOrder_function", "alarms"),
        ];
        assert_eq!(derivation_of(&all, "saveOrder_function"), Some(&all[0]));
        // Generated by the second transform from what the first generated: the user wrote
        // `saveOrder`, which the first transform expanded.
        assert_eq!(derivation_of(&all, "saveOrder_fn_alarm"), Some(&all[0]));
        assert_eq!(derivation_of(&all, "saveOrder"), None);
    }
}

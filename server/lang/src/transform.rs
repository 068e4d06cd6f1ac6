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
    /// (generated resource, abstract resource, transform name).
    derivations: Vec<(String, String, String)>,
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
            derivations.push((
                d.generated_resource.clone(),
                d.abstract_resource.clone(),
                name.clone(),
            ));
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
                .then(|| self.derivations.iter().find(|(g, _, _)| g == name))
                .flatten();
            let (target, note) = match derived {
                Some((generated, abstract_name, transform)) => (
                    abstract_name.as_str(),
                    format!(
                        "in `{generated}`, generated from `{abstract_name}` by transform `{transform}`: "
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

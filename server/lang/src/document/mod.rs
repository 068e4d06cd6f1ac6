//! Generic document trees with spans, read from YAML or JSON.
//!
//! Both readers produce the same [`Node`] tree, so everything above this module
//! is format-agnostic. Mapping order is preserved. Readers never panic and
//! never stop at the first problem when they can go on (a duplicate key, a
//! tag); syntax errors end the read because neither format can resynchronise.

mod json;
mod yaml;

use crate::diag::{Diagnostic, Diagnostics, codes};
use crate::source::{FileId, SourceMap, Span};

pub use json::parse_json;
pub use yaml::parse_yaml;

/// Default limit on the size of one input document.
pub const DEFAULT_MAX_INPUT_BYTES: usize = 10 * 1024 * 1024;
/// Deeper nesting is refused, so hostile input cannot overflow the stack.
pub const MAX_DEPTH: usize = 128;

/// How a string was written, which matters for mapping positions inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrStyle {
    /// The characters of the value appear verbatim in the source, starting
    /// at the given byte offset (plain YAML scalars, strings without escapes).
    Verbatim(u32),
    /// Quoted with escapes, folded or block style: positions are recovered by
    /// aligning the value with the source text (see `subst::SpanMap`).
    Transformed,
}

#[derive(Clone, Debug, PartialEq)]
pub enum NodeKind {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String, StrStyle),
    List(Vec<Node>),
    Map(Vec<(Key, Node)>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub kind: NodeKind,
    pub span: Span,
}

/// A mapping key. Keys are always strings; scalars of other types are kept
/// as written (`1: x` has key `"1"`).
#[derive(Clone, Debug, PartialEq)]
pub struct Key {
    pub name: String,
    pub span: Span,
}

impl Node {
    pub fn type_name(&self) -> &'static str {
        match &self.kind {
            NodeKind::Null => "null",
            NodeKind::Bool(_) => "boolean",
            NodeKind::Int(_) => "integer",
            NodeKind::Float(_) => "float",
            NodeKind::Str(..) => "string",
            NodeKind::List(_) => "array",
            NodeKind::Map(_) => "mapping",
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            NodeKind::Str(s, _) => Some(s),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&[(Key, Node)]> {
        match &self.kind {
            NodeKind::Map(m) => Some(m),
            _ => None,
        }
    }

    /// Whether the node is a scalar (not a list or mapping).
    pub fn is_scalar(&self) -> bool {
        !matches!(self.kind, NodeKind::List(_) | NodeKind::Map(_))
    }

    /// A short rendering of a scalar for messages.
    pub fn scalar_text(&self) -> String {
        match &self.kind {
            NodeKind::Null => "null".into(),
            NodeKind::Bool(b) => b.to_string(),
            NodeKind::Int(i) => i.to_string(),
            NodeKind::Float(f) => f.to_string(),
            NodeKind::Str(s, _) => format!("{s:?}"),
            NodeKind::List(_) => "[..]".into(),
            NodeKind::Map(_) => "{..}".into(),
        }
    }
}

/// The format of a blueprint file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

impl Format {
    /// `.json` and `.jsonc` are JSON; anything else is read as YAML (a
    /// superset of JSON, so a mislabelled JSON file still reads).
    pub fn from_path(path: &str) -> Format {
        let lower = path.to_ascii_lowercase();
        if lower.ends_with(".json") || lower.ends_with(".jsonc") {
            Format::Json
        } else {
            Format::Yaml
        }
    }
}

/// Parses a loaded file into a node tree. `None` when nothing usable was read;
/// the reasons are in `diags`.
pub fn parse(
    sources: &SourceMap,
    file: FileId,
    format: Format,
    diags: &mut Diagnostics,
) -> Option<Node> {
    let text = &sources.get(file).text;
    if text.trim().is_empty() {
        diags.push(Diagnostic::new(
            &codes::EMPTY_DOCUMENT,
            Span::new(file, 0, 0),
            "the document is empty",
        ));
        return None;
    }
    match format {
        Format::Yaml => parse_yaml(text, file, diags),
        Format::Json => parse_json(text, file, diags),
    }
}

/// Reads a file's bytes into the source map, refusing oversize or non-UTF-8
/// input with a diagnostic rather than an error, so callers report it like any
/// other problem.
pub fn load_bytes(
    sources: &mut SourceMap,
    name: &str,
    bytes: Vec<u8>,
    max_bytes: usize,
    diags: &mut Diagnostics,
) -> Option<FileId> {
    if bytes.len() > max_bytes {
        let id = sources.add(name, String::new());
        diags.push(
            Diagnostic::new(
                &codes::INPUT_TOO_LARGE,
                Span::new(id, 0, 0),
                format!("the input is larger than the limit of {max_bytes} bytes"),
            )
            .with_hint("raise the limit with --max-input-size (or TRELLIS_MAX_INPUT_SIZE) if this is intended"),
        );
        return None;
    }
    match String::from_utf8(bytes) {
        Ok(text) => Some(sources.add(name, text)),
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
            let id = sources.add(name, text);
            diags.push(Diagnostic::new(
                &codes::INVALID_UTF8,
                Span::new(id, at, at + 1),
                format!("the input is not valid UTF-8 (first bad byte at offset {at})"),
            ));
            None
        }
    }
}

/// Reports keys that appear twice in one mapping and keeps only the first
/// occurrence, so later stages see each name once.
fn check_duplicate_keys(entries: &mut Vec<(Key, Node)>, diags: &mut Diagnostics) {
    if entries.len() < 2 {
        return;
    }
    let mut dup = vec![false; entries.len()];
    if entries.len() <= 16 {
        for i in 1..entries.len() {
            dup[i] = entries[..i]
                .iter()
                .any(|(p, _)| p.name == entries[i].0.name);
        }
    } else {
        let mut seen = std::collections::HashSet::with_capacity(entries.len());
        for (i, (k, _)) in entries.iter().enumerate() {
            dup[i] = !seen.insert(k.name.as_str());
        }
    }
    if !dup.contains(&true) {
        return;
    }
    let mut i = 0;
    entries.retain(|(k, _)| {
        let is_dup = dup[i];
        i += 1;
        if is_dup {
            diags.push(
                Diagnostic::new(
                    &codes::DUPLICATE_KEY,
                    k.span,
                    format!("duplicate key `{}`", k.name),
                )
                .with_hint("a name may appear once in a mapping; the first definition is used"),
            );
        }
        !is_dup
    });
}

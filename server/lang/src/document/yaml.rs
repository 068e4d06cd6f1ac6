//! YAML reader: saphyr-parser events into a [`Node`] tree.
//!
//! saphyr is a YAML 1.2 parser that reports spans for every event; we build
//! the tree ourselves so that tags, anchors and aliases (which blueprints do
//! not support) become diagnostics instead of being resolved silently.
//! Plain scalars are typed with the YAML 1.2 core schema, so `2023-04-20`
//! stays a string, as the specification's examples expect.

use super::{Key, MAX_DEPTH, Node, NodeKind, StrStyle, check_duplicate_keys};
use crate::diag::{Diagnostic, Diagnostics, codes};
use crate::source::{FileId, Span};
use saphyr_parser::{Event, Parser, ScalarStyle};

/// Converts saphyr's character indexes into byte offsets.
struct Offsets {
    /// Byte offset of every character; empty when the text is ASCII.
    table: Vec<u32>,
    len: usize,
}

impl Offsets {
    fn new(text: &str) -> Offsets {
        let table = if text.is_ascii() {
            Vec::new()
        } else {
            text.char_indices().map(|(i, _)| i as u32).collect()
        };
        Offsets {
            table,
            len: text.len(),
        }
    }

    fn byte(&self, char_index: usize) -> usize {
        if self.table.is_empty() {
            char_index.min(self.len)
        } else {
            self.table
                .get(char_index)
                .map(|&b| b as usize)
                .unwrap_or(self.len)
        }
    }
}

enum Frame {
    List {
        items: Vec<Node>,
        start: usize,
        end: usize,
    },
    Map {
        entries: Vec<(Key, Node)>,
        start: usize,
        end: usize,
        pending: Pending,
    },
}

enum Pending {
    None,
    Key(Key),
    /// The key was not a scalar: its value is read and dropped.
    Skip,
}

pub fn parse_yaml(text: &str, file: FileId, diags: &mut Diagnostics) -> Option<Node> {
    let offsets = Offsets::new(text);
    let mut stack: Vec<Frame> = Vec::new();
    let mut root: Option<Node> = None;
    let mut documents = 0;
    for event in Parser::new_from_str(text) {
        let (event, span) = match event {
            Ok(ev) => ev,
            Err(e) => {
                let at = offsets.byte(e.marker().index());
                diags.push(Diagnostic::new(
                    &codes::YAML_SYNTAX,
                    Span::new(file, at, at),
                    format!("YAML syntax error: {}", e.info()),
                ));
                return None;
            }
        };
        let start = offsets.byte(span.start.index());
        let end = offsets.byte(span.end.index());
        let here = Span::new(file, start, end);
        let completed = match event {
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    diags.push(
                        Diagnostic::new(
                            &codes::MULTIPLE_DOCUMENTS,
                            here,
                            "a blueprint file holds one YAML document; this starts a second",
                        )
                        .with_hint("put each blueprint in its own file"),
                    );
                    break;
                }
                continue;
            }
            Event::Alias(_) => {
                diags.push(
                    Diagnostic::new(
                        &codes::YAML_ANCHOR,
                        here,
                        "YAML aliases are not supported in blueprints",
                    )
                    .with_hint("use a value (`values:`) and `${values.name}` to share data"),
                );
                Node {
                    kind: NodeKind::Null,
                    span: here,
                }
            }
            Event::Scalar(value, style, anchor, tag) => {
                check_anchor_and_tag(anchor, tag.is_some(), here, diags);
                scalar(text, value.into_owned(), style, here)
            }
            Event::SequenceStart(anchor, tag) | Event::MappingStart(anchor, tag)
                if stack.len() >= MAX_DEPTH =>
            {
                let _ = (anchor, tag);
                diags.push(Diagnostic::new(
                    &codes::NESTING_TOO_DEEP,
                    here,
                    format!("the document nests deeper than {MAX_DEPTH} levels"),
                ));
                return None;
            }
            Event::SequenceStart(anchor, tag) => {
                check_anchor_and_tag(anchor, tag.is_some(), here, diags);
                stack.push(Frame::List {
                    items: Vec::new(),
                    start,
                    end,
                });
                continue;
            }
            Event::MappingStart(anchor, tag) => {
                check_anchor_and_tag(anchor, tag.is_some(), here, diags);
                stack.push(Frame::Map {
                    entries: Vec::new(),
                    start,
                    end,
                    pending: Pending::None,
                });
                continue;
            }
            Event::SequenceEnd | Event::MappingEnd => match stack.pop() {
                Some(Frame::List {
                    items,
                    start: s,
                    end: e,
                }) => Node {
                    kind: NodeKind::List(items),
                    span: Span::new(file, s, e.max(end)),
                },
                Some(Frame::Map {
                    mut entries,
                    start: s,
                    end: e,
                    ..
                }) => {
                    check_duplicate_keys(&mut entries, diags);
                    // Block mappings report an empty end event; the last
                    // child's end is the honest end of the mapping.
                    let e = if end > start { e.max(end) } else { e };
                    Node {
                        kind: NodeKind::Map(entries),
                        span: Span::new(file, s, e),
                    }
                }
                None => continue,
            },
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => continue,
        };
        // Hand the completed node to its parent.
        match stack.last_mut() {
            None => root = Some(completed),
            Some(Frame::List { items, end, .. }) => {
                *end = (*end).max(completed.span.end as usize);
                items.push(completed);
            }
            Some(Frame::Map {
                entries,
                end,
                pending,
                ..
            }) => {
                *end = (*end).max(completed.span.end as usize);
                match std::mem::replace(pending, Pending::None) {
                    Pending::None => {
                        *pending = match key_of(completed, diags) {
                            Some(k) => Pending::Key(k),
                            None => Pending::Skip,
                        };
                    }
                    Pending::Key(k) => entries.push((k, completed)),
                    Pending::Skip => {}
                }
            }
        }
    }
    if root.is_none() {
        diags.push(Diagnostic::new(
            &codes::EMPTY_DOCUMENT,
            Span::new(file, 0, 0),
            "the document is empty (it holds only comments)",
        ));
    }
    root
}

fn check_anchor_and_tag(anchor: usize, tagged: bool, at: Span, diags: &mut Diagnostics) {
    if anchor != 0 {
        diags.push(
            Diagnostic::new(
                &codes::YAML_ANCHOR,
                at,
                "YAML anchors are not supported in blueprints",
            )
            .with_hint("use a value (`values:`) and `${values.name}` to share data"),
        );
    }
    if tagged {
        diags.push(Diagnostic::new(
            &codes::YAML_TAG,
            at,
            "YAML tags are not supported in blueprints",
        ));
    }
}

fn key_of(node: Node, diags: &mut Diagnostics) -> Option<Key> {
    let name = match node.kind {
        NodeKind::Str(s, _) => s,
        NodeKind::Null => String::new(),
        NodeKind::Bool(b) => b.to_string(),
        NodeKind::Int(i) => i.to_string(),
        NodeKind::Float(f) => f.to_string(),
        NodeKind::List(_) | NodeKind::Map(_) => {
            diags.push(Diagnostic::new(
                &codes::COMPLEX_KEY,
                node.span,
                "a mapping key must be a scalar, not a list or mapping",
            ));
            return None;
        }
    };
    Some(Key {
        name,
        span: node.span,
    })
}

fn scalar(text: &str, value: String, style: ScalarStyle, span: Span) -> Node {
    let raw = text
        .get(span.start as usize..span.end as usize)
        .unwrap_or("");
    let kind = match style {
        ScalarStyle::Plain => match resolve_plain(&value) {
            Some(kind) => kind,
            None => {
                let verbatim = if raw == value {
                    StrStyle::Verbatim(span.start)
                } else {
                    StrStyle::Transformed
                };
                NodeKind::Str(value, verbatim)
            }
        },
        ScalarStyle::SingleQuoted | ScalarStyle::DoubleQuoted => {
            let inner = raw.get(1..raw.len().saturating_sub(1)).unwrap_or("");
            let verbatim = if inner == value {
                StrStyle::Verbatim(span.start + 1)
            } else {
                StrStyle::Transformed
            };
            NodeKind::Str(value, verbatim)
        }
        _ => NodeKind::Str(value, StrStyle::Transformed),
    };
    Node { kind, span }
}

/// Types a plain scalar with the YAML 1.2 core schema; `None` means string.
/// An empty plain scalar (`key:` with nothing after it) is null, as the core
/// schema says; only a quoted `""` is the empty string.
fn resolve_plain(s: &str) -> Option<NodeKind> {
    let Some(&first) = s.as_bytes().first() else {
        return Some(NodeKind::Null);
    };
    // Fast path: most scalars are words, which are neither numbers nor keywords.
    if first.is_ascii_alphabetic() && !matches!(first, b'n' | b'N' | b't' | b'T' | b'f' | b'F') {
        return None;
    }
    match s {
        "~" | "null" | "Null" | "NULL" => return Some(NodeKind::Null),
        "true" | "True" | "TRUE" => return Some(NodeKind::Bool(true)),
        "false" | "False" | "FALSE" => return Some(NodeKind::Bool(false)),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Some(NodeKind::Float(f64::INFINITY));
        }
        "-.inf" | "-.Inf" | "-.INF" => return Some(NodeKind::Float(f64::NEG_INFINITY)),
        ".nan" | ".NaN" | ".NAN" => return Some(NodeKind::Float(f64::NAN)),
        _ => {}
    }
    let bytes = s.as_bytes();
    let digits = bytes
        .strip_prefix(b"-")
        .or_else(|| bytes.strip_prefix(b"+"))
        .unwrap_or(bytes);
    if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) {
        // Out-of-range integers stay strings rather than losing precision.
        return s.parse::<i64>().ok().map(NodeKind::Int);
    }
    if let Some(hex) = s.strip_prefix("0x") {
        return i64::from_str_radix(hex, 16).ok().map(NodeKind::Int);
    }
    if let Some(oct) = s.strip_prefix("0o") {
        return i64::from_str_radix(oct, 8).ok().map(NodeKind::Int);
    }
    if is_core_float(digits) {
        return s.parse::<f64>().ok().map(NodeKind::Float);
    }
    None
}

/// `( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?`
fn is_core_float(b: &[u8]) -> bool {
    let mut i = 0;
    let int_digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
    i += int_digits;
    let mut frac_digits = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        frac_digits = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
        i += frac_digits;
    }
    if int_digits == 0 && frac_digits == 0 {
        return false;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let exp = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
        if exp == 0 {
            return false;
        }
        i += exp;
    }
    i == b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> (Option<Node>, Vec<&'static str>) {
        let mut d = Diagnostics::default();
        let n = parse_yaml(text, FileId(0), &mut d);
        (n, d.items.iter().map(|d| d.code.id).collect())
    }

    #[test]
    fn core_schema_typing() {
        let (n, d) = parse(
            "a: 1\nb: 2.5\nc: true\nd: ~\ne: 2023-04-20\nf: '1'\ng: 0x1f\nh: 1e3\ni: .5\nj: 1.2.3\n",
        );
        assert!(d.is_empty());
        let m = n.unwrap();
        let kinds: Vec<_> = m
            .as_map()
            .unwrap()
            .iter()
            .map(|(_, v)| v.type_name())
            .collect();
        assert_eq!(
            kinds,
            [
                "integer", "float", "boolean", "null", "string", "string", "integer", "float",
                "float", "string"
            ]
        );
    }

    #[test]
    fn tags_anchors_aliases_and_documents_are_reported() {
        let (_, d) = parse("a: !!str x\nb: &x [1]\nc: *x\n");
        assert_eq!(d, ["T0105", "T0106", "T0106"]);
        let (_, d) = parse("a: 1\n---\nb: 2\n");
        assert_eq!(d, ["T0107"]);
    }

    #[test]
    fn duplicate_and_complex_keys() {
        let (n, mut d) = parse("a: 1\nb: 2\na: 3\n? [x]\n: 4\n");
        d.sort();
        assert_eq!(d, ["T0108", "T0109"]);
        assert_eq!(n.unwrap().as_map().unwrap().len(), 2);
    }

    #[test]
    fn verbatim_strings_know_their_offset() {
        let (n, _) = parse("a: plain ${x}\nb: \"q${y}\"\nc: \"e\\\"${z}\"\n");
        let m = n.unwrap();
        let m = m.as_map().unwrap();
        assert!(matches!(
            m[0].1.kind,
            NodeKind::Str(_, StrStyle::Verbatim(3))
        ));
        assert!(matches!(
            m[1].1.kind,
            NodeKind::Str(_, StrStyle::Verbatim(18))
        ));
        assert!(matches!(
            m[2].1.kind,
            NodeKind::Str(_, StrStyle::Transformed)
        ));
    }

    #[test]
    fn deep_nesting_is_refused() {
        let text = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let (n, d) = parse(&text);
        assert!(n.is_none());
        assert_eq!(d, ["T0110"]);
        // Far deeper (and unclosed) input is refused by the scanner itself.
        let (n, d) = parse(&"[".repeat(100_000));
        assert!(n.is_none());
        assert_eq!(d.len(), 1);
    }
}

//! JSON reader with the `.jsonc` extensions users expect: `//` and `/* */`
//! comments and trailing commas in arrays and objects.
//!
//! Hand-written because no maintained JSON crate gives spans for every value
//! and accepts comments; it is a few hundred lines, byte-oriented and fast
//! (strings without escapes are copied with one memchr scan).

use super::{Key, MAX_DEPTH, Node, NodeKind, StrStyle, check_duplicate_keys};
use crate::diag::{Diagnostic, Diagnostics, codes};
use crate::source::{FileId, Span};

struct Reader<'a> {
    text: &'a str,
    b: &'a [u8],
    pos: usize,
    file: FileId,
    depth: usize,
}

/// A syntax error: where and what.
struct Error(usize, usize, String);

type Result<T> = std::result::Result<T, Error>;

pub fn parse_json(text: &str, file: FileId, diags: &mut Diagnostics) -> Option<Node> {
    let mut r = Reader {
        text,
        b: text.as_bytes(),
        pos: 0,
        file,
        depth: 0,
    };
    // A UTF-8 byte order mark is tolerated, as editors write one.
    if r.b.starts_with(&[0xEF, 0xBB, 0xBF]) {
        r.pos = 3;
    }
    if r.skip_ws().is_ok() && r.pos >= r.b.len() {
        diags.push(Diagnostic::new(
            &codes::EMPTY_DOCUMENT,
            Span::new(file, 0, 0),
            "the document is empty (it holds only comments)",
        ));
        return None;
    }
    r.pos = if r.b.starts_with(&[0xEF, 0xBB, 0xBF]) {
        3
    } else {
        0
    };
    let result = r.value(diags).and_then(|v| {
        r.skip_ws()?;
        if r.pos < r.b.len() {
            Err(r.err(r.pos, r.pos + 1, "unexpected content after the document"))
        } else {
            Ok(v)
        }
    });
    match result {
        Ok(v) => Some(v),
        Err(Error(s, e, msg)) => {
            let code = if msg.starts_with("nesting") {
                &codes::NESTING_TOO_DEEP
            } else {
                &codes::JSON_SYNTAX
            };
            let e = e.min(text.len()).max(s.min(text.len()));
            let s = s.min(text.len());
            diags.push(Diagnostic::new(code, Span::new(file, s, e), msg));
            None
        }
    }
}

impl<'a> Reader<'a> {
    fn err(&self, start: usize, end: usize, msg: impl Into<String>) -> Error {
        // Never split a character: spans must land on char boundaries.
        let mut end = end.min(self.b.len());
        while !self.text.is_char_boundary(end) {
            end += 1;
        }
        Error(start, end, msg.into())
    }

    fn span(&self, start: usize) -> Span {
        Span::new(self.file, start, self.pos)
    }

    fn skip_ws(&mut self) -> Result<()> {
        loop {
            match self.b.get(self.pos) {
                Some(b' ' | b'\t' | b'\n' | b'\r') => self.pos += 1,
                Some(b'/') => match self.b.get(self.pos + 1) {
                    Some(b'/') => {
                        self.pos = memchr::memchr(b'\n', &self.b[self.pos..])
                            .map(|i| self.pos + i + 1)
                            .unwrap_or(self.b.len());
                    }
                    Some(b'*') => {
                        let start = self.pos;
                        match memchr::memmem::find(&self.b[self.pos + 2..], b"*/") {
                            Some(i) => self.pos += i + 4,
                            None => {
                                return Err(self.err(
                                    start,
                                    start + 2,
                                    "unterminated block comment",
                                ));
                            }
                        }
                    }
                    _ => return Ok(()),
                },
                _ => return Ok(()),
            }
        }
    }

    fn value(&mut self, diags: &mut Diagnostics) -> Result<Node> {
        self.skip_ws()?;
        let start = self.pos;
        let Some(&c) = self.b.get(self.pos) else {
            return Err(self.err(start, start, "unexpected end of input, expected a value"));
        };
        match c {
            b'{' => self.object(diags),
            b'[' => self.array(diags),
            b'"' => {
                let (s, style) = self.string()?;
                Ok(Node {
                    kind: NodeKind::Str(s, style),
                    span: self.span(start),
                })
            }
            b't' => self.keyword("true", NodeKind::Bool(true)),
            b'f' => self.keyword("false", NodeKind::Bool(false)),
            b'n' => self.keyword("null", NodeKind::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => {
                let ch = self.text[start..].chars().next().unwrap_or(' ');
                Err(self.err(
                    start,
                    start + ch.len_utf8(),
                    format!("unexpected character `{ch}`, expected a value"),
                ))
            }
        }
    }

    fn keyword(&mut self, word: &str, kind: NodeKind) -> Result<Node> {
        let start = self.pos;
        if self.b[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(Node {
                kind,
                span: self.span(start),
            })
        } else {
            let end = self.b[start..]
                .iter()
                .position(|c| !c.is_ascii_alphanumeric())
                .map(|i| start + i)
                .unwrap_or(self.b.len())
                .max(start + 1);
            Err(self.err(
                start,
                end,
                format!(
                    "unexpected `{}`, expected a value",
                    &self.text[start..end.min(self.text.len())]
                ),
            ))
        }
    }

    fn number(&mut self) -> Result<Node> {
        let start = self.pos;
        let b = self.b;
        let mut i = self.pos;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        let int_start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == int_start {
            return Err(self.err(start, i.max(start + 1), "invalid number"));
        }
        if b[int_start] == b'0' && i - int_start > 1 {
            return Err(self.err(start, i, "numbers cannot have leading zeros"));
        }
        let mut float = false;
        if b.get(i) == Some(&b'.') {
            float = true;
            i += 1;
            let f = i;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            if i == f {
                return Err(self.err(start, i, "a decimal point must be followed by digits"));
            }
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            float = true;
            i += 1;
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            let e = i;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            if i == e {
                return Err(self.err(start, i, "an exponent must have digits"));
            }
        }
        self.pos = i;
        let text = &self.text[start..i];
        let kind = if float {
            NodeKind::Float(
                text.parse()
                    .map_err(|_| self.err(start, i, "invalid number"))?,
            )
        } else {
            match text.parse::<i64>() {
                Ok(n) => NodeKind::Int(n),
                // Integers beyond 64 bits are kept approximately, as JSON readers do.
                Err(_) => NodeKind::Float(
                    text.parse()
                        .map_err(|_| self.err(start, i, "invalid number"))?,
                ),
            }
        };
        Ok(Node {
            kind,
            span: self.span(start),
        })
    }

    /// Reads a string starting at the opening quote.
    fn string(&mut self) -> Result<(String, StrStyle)> {
        let open = self.pos;
        let content = open + 1;
        let rest = &self.b[content..];
        // Fast path: no escapes before the closing quote.
        match memchr::memchr2(b'"', b'\\', rest) {
            Some(i) if rest[i] == b'"' => {
                let s = &self.text[content..content + i];
                if let Some(c) = s.bytes().position(|c| c < 0x20) {
                    return Err(self.err(
                        content + c,
                        content + c + 1,
                        "control characters must be escaped in strings",
                    ));
                }
                self.pos = content + i + 1;
                return Ok((s.to_owned(), StrStyle::Verbatim(content as u32)));
            }
            None => return Err(self.err(open, open + 1, "unterminated string")),
            _ => {}
        }
        let mut out = String::new();
        let mut i = content;
        loop {
            let Some(j) = memchr::memchr2(b'"', b'\\', &self.b[i..]) else {
                return Err(self.err(open, open + 1, "unterminated string"));
            };
            let chunk = &self.text[i..i + j];
            if let Some(c) = chunk.bytes().position(|c| c < 0x20) {
                return Err(self.err(
                    i + c,
                    i + c + 1,
                    "control characters must be escaped in strings",
                ));
            }
            out.push_str(chunk);
            i += j;
            if self.b[i] == b'"' {
                self.pos = i + 1;
                return Ok((out, StrStyle::Transformed));
            }
            let esc = i;
            i += 1;
            match self.b.get(i) {
                Some(b'"') => out.push('"'),
                Some(b'\\') => out.push('\\'),
                Some(b'/') => out.push('/'),
                Some(b'b') => out.push('\u{8}'),
                Some(b'f') => out.push('\u{c}'),
                Some(b'n') => out.push('\n'),
                Some(b'r') => out.push('\r'),
                Some(b't') => out.push('\t'),
                Some(b'u') => {
                    let hi = self.hex4(i + 1)?;
                    i += 4;
                    let c = if (0xD800..0xDC00).contains(&hi) {
                        // A high surrogate must be followed by `\u` and a low one.
                        if self.b.get(i + 1) == Some(&b'\\') && self.b.get(i + 2) == Some(&b'u') {
                            let lo = self.hex4(i + 3)?;
                            if !(0xDC00..0xE000).contains(&lo) {
                                return Err(self.err(esc, i + 7, "invalid surrogate pair"));
                            }
                            i += 6;
                            char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                        } else {
                            None
                        }
                    } else {
                        char::from_u32(hi)
                    };
                    match c {
                        Some(c) => out.push(c),
                        None => return Err(self.err(esc, i + 1, "invalid unicode escape")),
                    }
                }
                _ => {
                    return Err(self.err(
                        esc,
                        (esc + 2).min(self.b.len()),
                        "invalid escape sequence",
                    ));
                }
            }
            i += 1;
        }
    }

    fn hex4(&self, at: usize) -> Result<u32> {
        let digits = self
            .b
            .get(at..at + 4)
            .ok_or_else(|| self.err(at - 2, self.b.len(), "truncated unicode escape"))?;
        let s = std::str::from_utf8(digits)
            .map_err(|_| self.err(at - 2, at + 4, "invalid unicode escape"))?;
        u32::from_str_radix(s, 16).map_err(|_| self.err(at - 2, at + 4, "invalid unicode escape"))
    }

    fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err(
                self.pos,
                self.pos + 1,
                format!("nesting deeper than {MAX_DEPTH} levels"),
            ));
        }
        Ok(())
    }

    fn array(&mut self, diags: &mut Diagnostics) -> Result<Node> {
        let start = self.pos;
        self.enter()?;
        self.pos += 1;
        let mut items = Vec::new();
        loop {
            self.skip_ws()?;
            match self.b.get(self.pos) {
                Some(b']') => break,
                None => return Err(self.err(start, start + 1, "unclosed `[`")),
                _ => {}
            }
            items.push(self.value(diags)?);
            self.skip_ws()?;
            match self.b.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b']') => break,
                _ => return Err(self.err(self.pos, self.pos + 1, "expected `,` or `]`")),
            }
        }
        self.pos += 1;
        self.depth -= 1;
        Ok(Node {
            kind: NodeKind::List(items),
            span: self.span(start),
        })
    }

    fn object(&mut self, diags: &mut Diagnostics) -> Result<Node> {
        let start = self.pos;
        self.enter()?;
        self.pos += 1;
        let mut entries = Vec::new();
        loop {
            self.skip_ws()?;
            match self.b.get(self.pos) {
                Some(b'}') => break,
                Some(b'"') => {}
                None => return Err(self.err(start, start + 1, "unclosed `{`")),
                _ => return Err(self.err(self.pos, self.pos + 1, "expected a quoted key or `}`")),
            }
            let key_start = self.pos;
            let (name, _) = self.string()?;
            let key = Key {
                name,
                span: self.span(key_start),
            };
            self.skip_ws()?;
            if self.b.get(self.pos) != Some(&b':') {
                return Err(self.err(self.pos, self.pos + 1, "expected `:` after the key"));
            }
            self.pos += 1;
            let value = self.value(diags)?;
            entries.push((key, value));
            self.skip_ws()?;
            match self.b.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b'}') => break,
                _ => return Err(self.err(self.pos, self.pos + 1, "expected `,` or `}`")),
            }
        }
        self.pos += 1;
        self.depth -= 1;
        check_duplicate_keys(&mut entries, diags);
        Ok(Node {
            kind: NodeKind::Map(entries),
            span: self.span(start),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> (Option<Node>, Vec<&'static str>) {
        let mut d = Diagnostics::default();
        let n = parse_json(text, FileId(0), &mut d);
        (n, d.items.iter().map(|d| d.code.id).collect())
    }

    #[test]
    fn comments_and_trailing_commas() {
        let (n, d) = parse(
            "// lead\n{ /* c */ \"a\": [1, 2.5, true, null, \"x\",], \"b\": {\"c\": -3,}, }\n// end",
        );
        assert!(d.is_empty(), "{d:?}");
        let n = n.unwrap();
        let m = n.as_map().unwrap();
        assert_eq!(m[0].0.name, "a");
        assert_eq!(m[1].1.as_map().unwrap()[0].1.kind, NodeKind::Int(-3));
    }

    #[test]
    fn escapes_and_unicode() {
        let (n, _) = parse(r#"{"a": "q\"\u00e9\ud83d\ude00\n", "b": "plain"}"#);
        let n = n.unwrap();
        let m = n.as_map().unwrap();
        assert_eq!(m[0].1.as_str(), Some("q\"é😀\n"));
        assert!(matches!(
            m[1].1.kind,
            NodeKind::Str(_, StrStyle::Verbatim(_))
        ));
    }

    #[test]
    fn syntax_errors_have_positions() {
        for bad in [
            "{",
            "{\"a\" 1}",
            "[1 2]",
            "{\"a\": tru}",
            "\"abc",
            "01",
            "{\"a\":1} x",
            "/* open",
            "[\"\\x\"]",
        ] {
            let (n, d) = parse(bad);
            assert!(n.is_none(), "{bad}");
            assert_eq!(d, ["T0104"], "{bad}");
        }
        let (_, d) = parse(&"[".repeat(1000));
        assert_eq!(d, ["T0110"]);
    }

    #[test]
    fn duplicates_keep_the_first() {
        let (n, d) = parse(r#"{"a": 1, "a": 2}"#);
        assert_eq!(d, ["T0108"]);
        assert_eq!(n.unwrap().as_map().unwrap()[0].1.kind, NodeKind::Int(1));
    }
}

//! Recursive-descent parser for templates and substitution expressions.

use super::{Accessor, Arg, Expr, ExprKind, Literal, Name, Part, Subst, Template};
use crate::diag::{Code, Diagnostic, Diagnostics, codes};
use crate::document::StrStyle;
use crate::source::{FileId, Span};

/// Expressions nest at most this deep (calls within calls).
const MAX_EXPR_DEPTH: usize = 64;

/// Maps byte offsets in a decoded string to byte offsets in the source file.
pub struct SpanMap {
    file: FileId,
    kind: MapKind,
}

enum MapKind {
    /// The string appears verbatim at this source offset.
    Offset(u32),
    /// Source offset of every byte of the decoded string (and one past it).
    Table(Vec<u32>),
}

impl SpanMap {
    /// A map for a string node: exact for verbatim strings, otherwise built
    /// by aligning the decoded characters with the raw source text
    /// (`raw_start` is where the node's source text starts).
    pub fn new(file: FileId, value: &str, style: StrStyle, raw: &str, raw_start: u32) -> SpanMap {
        let kind = match style {
            StrStyle::Verbatim(at) => MapKind::Offset(at),
            StrStyle::Transformed => MapKind::Table(align(value, raw, raw_start)),
        };
        SpanMap { file, kind }
    }

    /// A map for text that starts at `offset` in the source, as written.
    pub fn verbatim(file: FileId, offset: u32) -> SpanMap {
        SpanMap {
            file,
            kind: MapKind::Offset(offset),
        }
    }

    fn at(&self, i: usize) -> u32 {
        match &self.kind {
            MapKind::Offset(base) => base + i as u32,
            MapKind::Table(t) => t.get(i).or(t.last()).copied().unwrap_or(0),
        }
    }

    pub fn span(&self, start: usize, end: usize) -> Span {
        let s = self.at(start);
        let e = self.at(end).max(s);
        Span {
            file: self.file,
            start: s,
            end: e,
        }
    }
}

/// Greedy alignment of decoded text with its source (escapes, quotes,
/// indentation and folding are skipped over). Good enough to put a caret on
/// the right token; exact for the common cases.
fn align(value: &str, raw: &str, raw_start: u32) -> Vec<u32> {
    let rb = raw.as_bytes();
    let mut table = Vec::with_capacity(value.len() + 1);
    let mut p = 0usize;
    for (_, c) in value.char_indices() {
        let mut buf = [0u8; 4];
        let enc = c.encode_utf8(&mut buf).as_bytes();
        let window_end = (p + 256).min(rb.len());
        let found = (p..window_end).find(|&q| {
            rb[q..].starts_with(enc) || (c == ' ' || c == '\n') && matches!(rb[q], b'\n' | b' ')
        });
        let at = found.unwrap_or(p);
        for k in 0..enc.len() {
            table.push(raw_start + (at + k).min(rb.len()) as u32);
        }
        if found.is_some() {
            p = at + enc.len().min(rb.len() - at);
        }
    }
    table.push(raw_start + p as u32);
    table
}

/// The next `${` at or after `from`. A `$` scan is faster than a substring
/// searcher for a two-byte needle in millions of short strings.
pub fn find_open(b: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(d) = memchr::memchr(b'$', b.get(i..)?) {
        if b.get(i + d + 1) == Some(&b'{') {
            return Some(i + d);
        }
        i += d + 1;
    }
    None
}

/// Parses a string that may contain `${..}` substitutions. A string without
/// `${` costs one memchr scan.
pub fn parse_template(s: &str, map: &SpanMap, whole: Span, diags: &mut Diagnostics) -> Template {
    if find_open(s.as_bytes(), 0).is_none() {
        return Template {
            parts: vec![Part::Lit(s.to_owned())],
            span: whole,
            broken: false,
        };
    }
    let b = s.as_bytes();
    let mut parts = Vec::new();
    let mut lit = String::new();
    let mut broken = false;
    let mut i = 0;
    while i < b.len() {
        let Some(d) = memchr::memchr(b'$', &b[i..]) else {
            lit.push_str(&s[i..]);
            break;
        };
        lit.push_str(&s[i..i + d]);
        i += d;
        if b[i..].starts_with(b"$${") {
            lit.push_str("${");
            i += 3;
        } else if b[i..].starts_with(b"${") {
            if !lit.is_empty() {
                parts.push(Part::Lit(std::mem::take(&mut lit)));
            }
            let mut p = Parser {
                s,
                b,
                pos: i + 2,
                map,
                depth: 0,
            };
            match p.substitution(i) {
                Ok(sub) => {
                    parts.push(Part::Sub(Box::new(sub)));
                    i = p.pos;
                }
                Err(e) => {
                    broken = true;
                    let (code, start, end) = (e.code, e.start, e.end);
                    diags.push(e.into_diagnostic(map));
                    i = recover(b, i, code, start, end);
                }
            }
        } else {
            lit.push('$');
            i += 1;
        }
    }
    if !lit.is_empty() {
        parts.push(Part::Lit(lit));
    }
    Template {
        parts,
        span: whole,
        broken,
    }
}

/// Where to go on after a broken substitution that opened at `open`, so the
/// substitutions after it in the same string are still checked: past the
/// `}` that closes it, unless another `${` starts first.
fn recover(b: &[u8], open: usize, code: &Code, start: usize, end: usize) -> usize {
    if code == &codes::SUBST_UNTERMINATED {
        return b.len();
    }
    if code == &codes::SUBST_EMPTY {
        return end;
    }
    let from = start.max(open + 2).min(b.len());
    let close = memchr::memchr(b'}', &b[from..]).map(|j| from + j + 1);
    let next_open = find_open(b, from);
    match (close, next_open) {
        (Some(c), Some(o)) if o < c => o,
        (Some(c), _) => c,
        (None, Some(o)) => o,
        (None, None) => b.len(),
    }
}

/// Parses a bare expression (the content of a `${..}` without delimiters),
/// as `trellis eval` and tests need.
pub fn parse_expression(s: &str, map: &SpanMap, diags: &mut Diagnostics) -> Option<Expr> {
    let mut p = Parser {
        s,
        b: s.as_bytes(),
        pos: 0,
        map,
        depth: 0,
    };
    let result = p.expr().and_then(|e| {
        p.skip_ws();
        if p.pos < p.b.len() {
            Err(p.err(
                &codes::SUBST_SYNTAX,
                p.pos,
                p.pos + 1,
                "unexpected text after the expression",
            ))
        } else {
            Ok(e)
        }
    });
    match result {
        Ok(e) => Some(e),
        Err(e) => {
            diags.push(e.into_diagnostic(map));
            None
        }
    }
}

struct Error {
    code: &'static Code,
    start: usize,
    end: usize,
    message: String,
}

impl Error {
    fn into_diagnostic(self, map: &SpanMap) -> Diagnostic {
        Diagnostic::new(self.code, map.span(self.start, self.end), self.message)
    }
}

type Result<T> = std::result::Result<T, Error>;

struct Parser<'a> {
    s: &'a str,
    b: &'a [u8],
    pos: usize,
    map: &'a SpanMap,
    depth: usize,
}

fn is_name_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
}

impl<'a> Parser<'a> {
    fn err(
        &self,
        code: &'static Code,
        start: usize,
        end: usize,
        message: impl Into<String>,
    ) -> Error {
        let mut end = end.min(self.b.len()).max(start.min(self.b.len()));
        while !self.s.is_char_boundary(end) {
            end += 1;
        }
        Error {
            code,
            start: start.min(self.b.len()),
            end,
            message: message.into(),
        }
    }

    fn span(&self, start: usize) -> Span {
        self.map.span(start, self.pos)
    }

    fn skip_ws(&mut self) {
        while self.pos < self.b.len() && matches!(self.b[self.pos], b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    /// What is at the cursor, for messages.
    fn describe_here(&self) -> String {
        match self.s[self.pos..].chars().next() {
            None => "the end of the substitution".into(),
            Some(c) => format!("`{c}`"),
        }
    }

    fn unexpected(&self, expected: &str) -> Error {
        if self.pos >= self.b.len() {
            return self.err(
                &codes::SUBST_UNTERMINATED,
                self.pos,
                self.pos,
                format!("substitution is not closed: expected {expected}"),
            );
        }
        let width = self.s[self.pos..].chars().next().map_or(1, char::len_utf8);
        self.err(
            &codes::SUBST_SYNTAX,
            self.pos,
            self.pos + width,
            format!("expected {expected}, found {}", self.describe_here()),
        )
    }

    /// After `${` at `open`: the expression and the closing `}`.
    fn substitution(&mut self, open: usize) -> Result<Subst> {
        self.skip_ws();
        match self.peek() {
            None => {
                return Err(self.err(
                    &codes::SUBST_UNTERMINATED,
                    open,
                    open + 2,
                    "`${` is never closed with `}`",
                ));
            }
            Some(b'}') => {
                self.pos += 1;
                return Err(self.err(
                    &codes::SUBST_EMPTY,
                    open,
                    self.pos,
                    "empty substitution `${}`",
                ));
            }
            _ => {}
        }
        // Running out of text anywhere inside means this `${` is unclosed:
        // point at it, not at the end of the string.
        let at_open = |e: Error| {
            if e.code == &codes::SUBST_UNTERMINATED {
                Error {
                    start: open,
                    end: open + 2,
                    message: "`${` is never closed with `}`".to_owned(),
                    ..e
                }
            } else {
                e
            }
        };
        let expr = self.expr().map_err(at_open)?;
        self.skip_ws();
        match self.peek() {
            Some(b'}') => {
                self.pos += 1;
                Ok(Subst {
                    expr,
                    span: self.span(open),
                })
            }
            None => Err(self.err(
                &codes::SUBST_UNTERMINATED,
                open,
                open + 2,
                "`${` is never closed with `}`",
            )),
            _ => Err(self.unexpected("`}` to close the substitution")),
        }
    }

    fn name(&mut self) -> Option<Name> {
        let start = self.pos;
        if !self.peek().is_some_and(is_name_start) {
            return None;
        }
        self.pos += 1;
        while self.peek().is_some_and(is_name_char) {
            self.pos += 1;
        }
        Some(Name {
            text: self.s[start..self.pos].to_owned(),
            span: self.span(start),
        })
    }

    fn expr(&mut self) -> Result<Expr> {
        self.depth += 1;
        if self.depth > MAX_EXPR_DEPTH {
            return Err(self.err(
                &codes::SUBST_SYNTAX,
                self.pos,
                self.pos + 1,
                format!("expression nests deeper than {MAX_EXPR_DEPTH} levels"),
            ));
        }
        self.skip_ws();
        let start = self.pos;
        let result = match self.peek() {
            Some(b'"') => {
                let s = self.string_literal()?;
                Ok(Expr {
                    kind: ExprKind::Lit(Literal::Str(s)),
                    span: self.span(start),
                })
            }
            Some(c) if c == b'-' || c.is_ascii_digit() => self.number(),
            Some(c) if is_name_start(c) => self.reference_or_call(),
            _ => Err(self.unexpected("a reference, function call or literal")),
        };
        self.depth -= 1;
        result
    }

    fn string_literal(&mut self) -> Result<String> {
        let open = self.pos;
        self.pos += 1;
        let mut out = String::new();
        loop {
            let Some(j) = memchr::memchr2(b'"', b'\\', &self.b[self.pos..]) else {
                return Err(self.err(
                    &codes::SUBST_BAD_LITERAL,
                    open,
                    self.b.len(),
                    "string literal is never closed with `\"`",
                ));
            };
            out.push_str(&self.s[self.pos..self.pos + j]);
            self.pos += j;
            if self.b[self.pos] == b'"' {
                self.pos += 1;
                return Ok(out);
            }
            // `\"` and `\\` are escapes; any other backslash is kept as is.
            match self.b.get(self.pos + 1) {
                Some(b'"') => {
                    out.push('"');
                    self.pos += 2;
                }
                Some(b'\\') => {
                    out.push('\\');
                    self.pos += 2;
                }
                _ => {
                    out.push('\\');
                    self.pos += 1;
                }
            }
        }
    }

    fn number(&mut self) -> Result<Expr> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        let int_start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if self.pos == int_start {
            return Err(self.unexpected("digits after `-`"));
        }
        let mut float = false;
        if self.peek() == Some(b'.') && self.b.get(self.pos + 1).is_some_and(u8::is_ascii_digit) {
            float = true;
            self.pos += 1;
            while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                self.pos += 1;
            }
        }
        let text = &self.s[start..self.pos];
        let lit = if float {
            text.parse().map(Literal::Float).ok()
        } else {
            text.parse().map(Literal::Int).ok()
        };
        match lit {
            Some(lit) => Ok(Expr {
                kind: ExprKind::Lit(lit),
                span: self.span(start),
            }),
            None => Err(self.err(
                &codes::SUBST_BAD_LITERAL,
                start,
                self.pos,
                format!("number `{text}` is out of range for a 64-bit integer"),
            )),
        }
    }

    /// Accessors after a reference or call: `.name`, `["name"]`, `[n]`, `[]`.
    fn accessors(&mut self) -> Result<Vec<Accessor>> {
        let mut out = Vec::new();
        while let Some(a) = self.accessor()? {
            out.push(a);
        }
        Ok(out)
    }

    /// One accessor, or `None` when the cursor is not at `.` or `[`.
    fn accessor(&mut self) -> Result<Option<Accessor>> {
        match self.peek() {
            Some(b'.') => {
                self.pos += 1;
                match self.name() {
                    Some(n) => Ok(Some(Accessor::Field(n))),
                    None => Err(self.unexpected("a field name after `.`")),
                }
            }
            Some(b'[') => {
                let open = self.pos;
                self.pos += 1;
                self.skip_ws();
                let accessor = match self.peek() {
                    Some(b']') => Accessor::Index(None, self.map.span(open, self.pos + 1)),
                    Some(b'"') => {
                        let inner = self.pos + 1;
                        let text = self.string_literal()?;
                        let bad =
                            text.is_empty() || !text.bytes().all(|c| is_name_char(c) || c == b'.');
                        if bad {
                            return Err(self.err(
                                &codes::SUBST_BAD_REFERENCE,
                                inner,
                                self.pos - 1,
                                format!("`{text}` is not a valid quoted name: use letters, digits, `_`, `-` and `.`"),
                            ));
                        }
                        Accessor::Field(Name {
                            text,
                            span: self.map.span(inner, self.pos - 1),
                        })
                    }
                    Some(c) if c.is_ascii_digit() => {
                        let ds = self.pos;
                        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                            self.pos += 1;
                        }
                        let digits = &self.s[ds..self.pos];
                        let n = digits.parse::<u64>().map_err(|_| {
                            self.err(
                                &codes::SUBST_BAD_LITERAL,
                                ds,
                                self.pos,
                                format!("index `{digits}` is out of range"),
                            )
                        })?;
                        self.skip_ws();
                        Accessor::Index(Some(n), self.map.span(open, self.pos + 1))
                    }
                    _ => return Err(self.unexpected("an index, a quoted name or `]`")),
                };
                self.skip_ws();
                if self.peek() != Some(b']') {
                    return Err(self.unexpected("`]`"));
                }
                self.pos += 1;
                Ok(Some(accessor))
            }
            _ => Ok(None),
        }
    }

    fn reference_or_call(&mut self) -> Result<Expr> {
        let start = self.pos;
        let ident = self.name().expect("caller checked the name start");
        // A call may have whitespace before its parenthesis.
        let save = self.pos;
        self.skip_ws();
        if self.peek() == Some(b'(') {
            return self.call(start, ident);
        }
        self.pos = save;
        let kind = match ident.text.as_str() {
            "true" => ExprKind::Lit(Literal::Bool(true)),
            "false" => ExprKind::Lit(Literal::Bool(false)),
            "variables" => {
                let name = self.required_name_accessor("variables")?;
                if !self.accessors()?.is_empty() {
                    return Err(self.bad_ref(
                        start,
                        "a variable has no fields or elements: variables are scalars",
                    ));
                }
                ExprKind::Variable(name)
            }
            "values" => {
                let name = self.required_name_accessor("values")?;
                ExprKind::Value(name, self.accessors()?)
            }
            "datasources" => {
                let name = self.required_name_accessor("datasources")?;
                if !matches!(self.peek(), Some(b'.' | b'[')) {
                    return Err(self.bad_ref(start, "a data source reference needs the exported field: `datasources.name.field`"));
                }
                let field = self.required_name_accessor(&format!("datasources.{}", name.text))?;
                let mut rest = self.accessors()?.into_iter();
                let index = rest.next();
                if let Some(Accessor::Field(_)) = &index {
                    return Err(self.bad_ref(
                        start,
                        "a data source field can only be followed by an index such as `[0]`",
                    ));
                }
                if rest.next().is_some() {
                    return Err(self.bad_ref(start, "a data source field can only be indexed once"));
                }
                ExprKind::DataSource { name, field, index }
            }
            "children" => {
                let name = self.required_name_accessor("children")?;
                let path = self.accessors()?;
                if path.is_empty() {
                    return Err(self.bad_ref(
                        start,
                        "a child reference needs the exported field: `children.name.field`",
                    ));
                }
                ExprKind::Child(name, path)
            }
            "resources" => {
                let name = self.required_name_accessor("resources")?;
                ExprKind::Resource {
                    name,
                    path: self.accessors()?,
                    prefixed: true,
                }
            }
            "elem" => ExprKind::Elem(self.accessors()?),
            "i" => {
                if matches!(self.peek(), Some(b'.' | b'[')) {
                    self.accessors()?;
                    return Err(self.bad_ref(start, "`i` is the element index and has no fields"));
                }
                ExprKind::ElemIndex
            }
            _ => ExprKind::Resource {
                name: ident,
                path: self.accessors()?,
                prefixed: false,
            },
        };
        Ok(Expr {
            kind,
            span: self.span(start),
        })
    }

    /// A reference of the wrong shape: the whole reference read so far.
    fn bad_ref(&self, start: usize, message: &str) -> Error {
        self.err(&codes::SUBST_BAD_REFERENCE, start, self.pos, message)
    }

    fn required_name_accessor(&mut self, after: &str) -> Result<Name> {
        let save = self.pos;
        match self.accessor() {
            Ok(Some(Accessor::Field(n))) => Ok(n),
            Ok(_) => {
                self.pos = save;
                Err(self.unexpected(&format!("a name after `{after}` (`.name` or `[\"name\"]`)")))
            }
            Err(e) => Err(e),
        }
    }

    fn call(&mut self, start: usize, name: Name) -> Result<Expr> {
        self.pos += 1; // `(`
        let mut args = Vec::new();
        loop {
            self.skip_ws();
            if self.peek() == Some(b')') {
                self.pos += 1;
                break;
            }
            // A named argument is `name = expr`; look ahead for the `=`.
            let save = self.pos;
            let mut arg_name = None;
            if let Some(n) = self.name() {
                self.skip_ws();
                if self.peek() == Some(b'=') {
                    self.pos += 1;
                    arg_name = Some(n);
                } else {
                    self.pos = save;
                }
            }
            let value = self.expr()?;
            args.push(Arg {
                name: arg_name,
                value,
            });
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b')') => {
                    self.pos += 1;
                    break;
                }
                _ => {
                    return Err(
                        self.unexpected(&format!("`,` or `)` in the call to `{}`", name.text))
                    );
                }
            }
        }
        let path = self.accessors()?;
        Ok(Expr {
            kind: ExprKind::Call { name, args, path },
            span: self.span(start),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> (Template, Vec<&'static str>) {
        let mut d = Diagnostics::default();
        let map = SpanMap::verbatim(FileId(0), 0);
        let t = parse_template(s, &map, Span::default(), &mut d);
        (t, d.items.iter().map(|d| d.code.id).collect())
    }

    fn expr(s: &str) -> ExprKind {
        let (t, d) = parse(&format!("${{{s}}}"));
        assert!(d.is_empty(), "{s}: {d:?}");
        t.single_substitution().unwrap().expr.kind.clone()
    }

    #[test]
    fn literal_text_and_escape() {
        let (t, d) = parse("plain $ text $${not} here");
        assert!(d.is_empty());
        assert_eq!(t.as_literal().unwrap(), "plain $ text ${not} here");
    }

    #[test]
    fn references() {
        assert!(matches!(expr("variables.env"), ExprKind::Variable(n) if n.text == "env"));
        assert!(matches!(expr("variables[\"a.b\"]"), ExprKind::Variable(n) if n.text == "a.b"));
        assert!(
            matches!(expr("values.cfg.buckets[0].name"), ExprKind::Value(n, p) if n.text == "cfg" && p.len() == 3)
        );
        assert!(matches!(
            expr("datasources.net.subnets[]"),
            ExprKind::DataSource {
                index: Some(Accessor::Index(None, _)),
                ..
            }
        ));
        assert!(matches!(expr("children.core.topic.arn"), ExprKind::Child(_, p) if p.len() == 2));
        assert!(matches!(
            expr("resources.fn.spec.x"),
            ExprKind::Resource { prefixed: true, .. }
        ));
        assert!(matches!(
            expr("fn.metadata.annotations[\"a.b\"]"),
            ExprKind::Resource {
                prefixed: false,
                ..
            }
        ));
        assert!(matches!(expr("elem[\"config\"].attrs[0]"), ExprKind::Elem(p) if p.len() == 3));
        assert!(matches!(expr("i"), ExprKind::ElemIndex));
        assert!(
            matches!(expr("resources.buckets[1].spec.name"), ExprKind::Resource { path, .. } if path.len() == 3)
        );
    }

    #[test]
    fn calls_and_literals() {
        let k = expr("map(variables.x, trimprefix_g(\"http://\"))[0]");
        let ExprKind::Call { name, args, path } = k else {
            panic!()
        };
        assert_eq!(name.text, "map");
        assert_eq!(args.len(), 2);
        assert_eq!(path.len(), 1);
        let k = expr("object(id = \"a\\\"b\", n = -3, f = 1.5, ok = true)");
        let ExprKind::Call { args, .. } = k else {
            panic!()
        };
        assert_eq!(args[0].name.as_ref().unwrap().text, "id");
        assert_eq!(
            args[0].value.kind,
            ExprKind::Lit(Literal::Str("a\"b".into()))
        );
        assert_eq!(args[1].value.kind, ExprKind::Lit(Literal::Int(-3)));
        assert_eq!(args[2].value.kind, ExprKind::Lit(Literal::Float(1.5)));
        assert_eq!(args[3].value.kind, ExprKind::Lit(Literal::Bool(true)));
        // Multi-line calls, as in the specification's examples.
        let k = expr("list(\n  resources.a.spec.name,\n  resources.b.spec.name\n)");
        assert!(matches!(k, ExprKind::Call { args, .. } if args.len() == 2));
        assert!(matches!(
            expr("replace(x.spec.a, \"}\", \"\")"),
            ExprKind::Call { .. }
        ));
    }

    #[test]
    fn errors_are_reported_and_parsing_continues() {
        assert_eq!(parse("${variables.a.b}").1, ["T0203"]);
        assert_eq!(parse("${datasources.net}").1, ["T0203"]);
        assert_eq!(
            parse("${} ${a b} ${variables.x.y}").1,
            ["T0205", "T0202", "T0203"]
        );
        assert_eq!(parse("${f(x ${variables.a.b}").1, ["T0202", "T0203"]);
        assert_eq!(parse("${children.core}").1, ["T0203"]);
        assert_eq!(parse("${}").1, ["T0205"]);
        assert_eq!(parse("${variables.a").1, ["T0201"]);
        assert_eq!(parse("${f(1,}").1, ["T0202"]);
        assert_eq!(parse("${99999999999999999999}").1, ["T0204"]);
        assert_eq!(parse("${\"open}").1, ["T0204"]);
        assert_eq!(
            parse("${a b} and ${c..d} and ${ok.spec.x}").1,
            ["T0202", "T0202"]
        );
        let (t, _) = parse("${a b} and ${ok.spec.x}");
        assert_eq!(t.substitutions().count(), 1);
    }

    #[test]
    fn spans_point_into_the_source() {
        let mut d = Diagnostics::default();
        let map = SpanMap::verbatim(FileId(0), 100);
        let t = parse_template("x-${variables.env}", &map, Span::default(), &mut d);
        let s = t.single_substitution().map(|s| s.span);
        assert!(s.is_none());
        let sub = t.substitutions().next().unwrap();
        assert_eq!((sub.span.start, sub.span.end), (102, 118));
        let ExprKind::Variable(n) = &sub.expr.kind else {
            panic!()
        };
        assert_eq!((n.span.start, n.span.end), (114, 117));
    }

    #[test]
    fn alignment_skips_escapes_and_indentation() {
        // Double-quoted source `"a\"${x}"` decodes to `a"${x}`.
        let raw = "\"a\\\"${x}\"";
        let map = SpanMap::new(FileId(0), "a\"${x}", StrStyle::Transformed, raw, 0);
        assert_eq!(map.span(2, 6).start, 4);
        // A block scalar: the second line's text sits after two spaces.
        let raw = "l1\n  ${x}\n";
        let map = SpanMap::new(FileId(0), "l1\n${x}\n", StrStyle::Transformed, raw, 10);
        assert_eq!(map.span(3, 7).start, 15);
    }
}

//! The `${..}` substitution language: syntax tree and parser.
//!
//! Any string in a blueprint may interleave literal text with `${..}`
//! substitutions ([`Template`]). The grammar is the specification's
//! "Substitution Grammar" with two documented additions (docs/substitutions.md):
//! `$${` writes a literal `${` (the specification has no escape), and `\\`
//! inside a string literal writes one backslash (besides the specified `\"`).
//!
//! The parser is pure and total: any input gives a tree and/or diagnostics,
//! never a panic, and every node carries the span of the text it came from.

mod parser;

pub use parser::{SpanMap, find_open, parse_expression, parse_template};

use crate::source::Span;

/// A string that may contain substitutions.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    pub parts: Vec<Part>,
    /// Span of the whole string in the source.
    pub span: Span,
    /// A substitution in it did not parse (and was reported); checks of the
    /// template's overall shape are skipped so one mistake is one report.
    pub broken: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    Lit(String),
    /// Boxed: most parts are literals, and a literal should not pay for the
    /// size of an expression tree.
    Sub(Box<Subst>),
}

/// One `${..}`.
#[derive(Clone, Debug, PartialEq)]
pub struct Subst {
    pub expr: Expr,
    /// Span of `${ .. }` including the delimiters.
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

/// A name and where it was written.
#[derive(Clone, Debug, PartialEq)]
pub struct Name {
    pub text: String,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Accessor {
    /// `.name` or `["name.with.dots"]`.
    Field(Name),
    /// `[n]`, or `[]` (`None`) for the first element.
    Index(Option<u64>, Span),
}

impl Accessor {
    pub fn span(&self) -> Span {
        match self {
            Accessor::Field(n) => n.span,
            Accessor::Index(_, s) => *s,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Literal {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    /// Set for named arguments (`object(id = "x")`).
    pub name: Option<Name>,
    pub value: Expr,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    Lit(Literal),
    /// `variables.name`
    Variable(Name),
    /// `values.name` followed by accessors.
    Value(Name, Vec<Accessor>),
    /// `datasources.name.field` with an optional index.
    DataSource {
        name: Name,
        field: Name,
        index: Option<Accessor>,
    },
    /// `children.name` followed by at least one accessor.
    Child(Name, Vec<Accessor>),
    /// `resources.name...` or a bare `name...`. A bare name without accessors
    /// may instead be a function value (`map(xs, to_upper)`); validation
    /// decides, because only it knows the resources and functions.
    Resource {
        name: Name,
        path: Vec<Accessor>,
        prefixed: bool,
    },
    /// `elem` followed by accessors.
    Elem(Vec<Accessor>),
    /// `i`
    ElemIndex,
    /// `name(args...)` followed by accessors.
    Call {
        name: Name,
        args: Vec<Arg>,
        path: Vec<Accessor>,
    },
}

impl Template {
    /// The template's only substitution when it is exactly `${..}` with
    /// nothing but whitespace around it (a YAML block scalar `|` ends with a
    /// newline, as the specification's own examples do).
    pub fn single_substitution(&self) -> Option<&Subst> {
        let mut found = None;
        for p in &self.parts {
            match p {
                Part::Sub(s) if found.is_none() => found = Some(&**s),
                Part::Sub(_) => return None,
                Part::Lit(l) if l.trim().is_empty() => {}
                Part::Lit(_) => return None,
            }
        }
        found
    }

    pub fn has_substitutions(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Sub(_)))
    }

    /// The literal text when there are no substitutions.
    pub fn as_literal(&self) -> Option<String> {
        match self.parts.as_slice() {
            [] => Some(String::new()),
            [Part::Lit(s)] => Some(s.clone()),
            _ if !self.has_substitutions() => Some(
                self.parts
                    .iter()
                    .map(|p| match p {
                        Part::Lit(s) => s.as_str(),
                        Part::Sub(_) => "",
                    })
                    .collect(),
            ),
            _ => None,
        }
    }

    pub fn substitutions(&self) -> impl Iterator<Item = &Subst> {
        self.parts.iter().filter_map(|p| match p {
            Part::Sub(s) => Some(&**s),
            Part::Lit(_) => None,
        })
    }
}

impl Expr {
    /// Calls `f` on this expression and every expression inside it, parents first.
    pub fn walk<'a>(&'a self, f: &mut impl FnMut(&'a Expr)) {
        f(self);
        if let ExprKind::Call { args, .. } = &self.kind {
            for a in args {
                a.value.walk(f);
            }
        }
    }
}

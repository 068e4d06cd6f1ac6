//! The typed blueprint model: every section of the specification, with spans.
//!
//! [`load`] turns a document tree into a [`Blueprint`], reporting structural
//! problems (wrong types, missing or unknown fields, bad names, `${..}` where
//! it is forbidden) as it goes and keeping whatever it could read, so that
//! validation afterwards finds every remaining problem in the same pass.
//! Strings where substitutions are allowed are parsed into [`Template`]s here.

mod build;

pub use build::article as article_of;
pub use build::load;

use crate::document::Key;
use crate::source::{FileId, Span};
use crate::subst::Template;

/// The only specification version this engine implements.
pub const SPEC_VERSION: &str = "2023-04-20";

#[derive(Clone, Debug, PartialEq)]
pub struct Spanned<T> {
    pub value: T,
    pub span: Span,
}

/// A value tree in which strings are templates: resource specs, metadata,
/// annotations, include variables, filter searches.
#[derive(Clone, Debug, PartialEq)]
pub struct TNode {
    pub kind: TKind,
    pub span: Span,
}

/// One step of an attribute path into a value tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathStep {
    Field(String),
    Index(usize),
}

#[derive(Clone, Debug, PartialEq)]
pub enum TKind {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Template),
    List(Vec<TNode>),
    Map(Vec<(Key, TNode)>),
}

impl TNode {
    /// Every template in the tree, depth first, in document order.
    pub fn templates<'a>(&'a self, f: &mut impl FnMut(&'a Template)) {
        match &self.kind {
            TKind::Str(t) => f(t),
            TKind::List(items) => items.iter().for_each(|i| i.templates(f)),
            TKind::Map(entries) => entries.iter().for_each(|(_, v)| v.templates(f)),
            _ => {}
        }
    }

    /// The span that best locates an attribute path inside this node: the
    /// key of the deepest field the path reaches (or the element), so a
    /// provider's diagnostic about `environment.variables.A` lands on the
    /// line where `A` is written. Stops where the path leaves the tree.
    pub fn locate(&self, path: &[PathStep]) -> Span {
        let mut node = self;
        let mut span = self.span;
        for step in path {
            let next = match (&node.kind, step) {
                (TKind::Map(entries), PathStep::Field(name)) => {
                    entries.iter().find(|(k, _)| &k.name == name).map(|(k, v)| {
                        span = k.span;
                        v
                    })
                }
                (TKind::List(items), PathStep::Index(i)) => {
                    items.get(*i).inspect(|v| span = v.span)
                }
                _ => None,
            };
            match next {
                Some(n) => node = n,
                None => break,
            }
        }
        span
    }

    pub fn type_name(&self) -> &'static str {
        match &self.kind {
            TKind::Null => "null",
            TKind::Bool(_) => "boolean",
            TKind::Int(_) => "integer",
            TKind::Float(_) => "float",
            TKind::Str(_) => "string",
            TKind::List(_) => "array",
            TKind::Map(_) => "mapping",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Blueprint {
    pub file: FileId,
    pub span: Span,
    pub version: Option<Spanned<String>>,
    pub transform: Vec<Spanned<String>>,
    pub variables: Vec<Variable>,
    pub values: Vec<ValueDef>,
    pub datasources: Vec<DataSource>,
    pub resources: Vec<Resource>,
    pub include: Vec<Include>,
    pub exports: Vec<Export>,
    pub metadata: Option<TNode>,
    /// The document or its `resources` section was not a mapping (already
    /// reported): "no resources" would only repeat that.
    pub malformed: bool,
}

/// A scalar written in a variable definition (default or allowed value).
#[derive(Clone, Debug, PartialEq)]
pub enum Scalar {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl Scalar {
    pub fn type_name(&self) -> &'static str {
        match self {
            Scalar::Str(_) => "string",
            Scalar::Int(_) => "integer",
            Scalar::Float(_) => "float",
            Scalar::Bool(_) => "boolean",
        }
    }

    pub fn render(&self) -> String {
        match self {
            Scalar::Str(s) => format!("{s:?}"),
            Scalar::Int(i) => i.to_string(),
            Scalar::Float(f) => f.to_string(),
            Scalar::Bool(b) => b.to_string(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Variable {
    pub name: Spanned<String>,
    pub ty: Option<Spanned<String>>,
    pub description: Option<Spanned<String>>,
    pub secret: bool,
    pub default: Option<Spanned<Scalar>>,
    pub allowed_values: Option<Spanned<Vec<Spanned<Scalar>>>>,
}

#[derive(Clone, Debug)]
pub struct ValueDef {
    pub name: Spanned<String>,
    pub ty: Option<Spanned<String>>,
    /// The `value` field; `None` when missing or not a string (both reported).
    pub value: Option<Template>,
    pub description: Option<Template>,
    pub secret: bool,
}

#[derive(Clone, Debug)]
pub struct DataSource {
    pub name: Spanned<String>,
    pub ty: Option<Spanned<String>>,
    pub description: Option<Template>,
    pub metadata: Metadata,
    pub filters: Vec<Filter>,
    pub exports: Vec<DataSourceExport>,
    /// Span of the `exports` key, for "exports is empty".
    pub exports_span: Option<Span>,
}

#[derive(Clone, Debug)]
pub struct Filter {
    pub span: Span,
    pub field: Option<Spanned<String>>,
    pub operator: Option<Spanned<String>>,
    pub search: Option<TNode>,
}

#[derive(Clone, Debug)]
pub struct DataSourceExport {
    pub name: Spanned<String>,
    pub ty: Option<Spanned<String>>,
    pub alias_for: Option<Spanned<String>>,
    pub description: Option<Spanned<String>>,
}

impl DataSourceExport {
    /// The field of the external resource this export reads.
    pub fn source_field(&self) -> &str {
        self.alias_for
            .as_ref()
            .map_or(&self.name.value, |a| &a.value)
    }
}

/// Metadata of a resource or data source (data sources have no labels).
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    pub display_name: Option<Template>,
    pub annotations: Vec<(Key, TNode)>,
    pub labels: Vec<(Key, Spanned<String>)>,
    pub custom: Option<TNode>,
}

#[derive(Clone, Debug)]
pub struct Resource {
    pub name: Spanned<String>,
    pub ty: Option<Spanned<String>>,
    pub description: Option<Template>,
    pub metadata: Metadata,
    pub condition: Option<Condition>,
    pub each: Option<Template>,
    /// `each` was written, even if it could not be read (so `elem` inside
    /// the resource is not reported a second time).
    pub has_each: bool,
    pub link_selector: Option<LinkSelector>,
    pub depends_on: Vec<Spanned<String>>,
    pub spec: Option<TNode>,
}

#[derive(Clone, Debug)]
pub enum Condition {
    Expr(Template),
    And(Vec<Condition>, Span),
    Or(Vec<Condition>, Span),
    Not(Box<Condition>, Span),
}

impl Condition {
    pub fn templates<'a>(&'a self, f: &mut impl FnMut(&'a Template)) {
        match self {
            Condition::Expr(t) => f(t),
            Condition::And(cs, _) | Condition::Or(cs, _) => cs.iter().for_each(|c| c.templates(f)),
            Condition::Not(c, _) => c.templates(f),
        }
    }
}

#[derive(Clone, Debug)]
pub struct LinkSelector {
    pub span: Span,
    pub by_label: Vec<(Key, Spanned<String>)>,
}

#[derive(Clone, Debug)]
pub struct Include {
    pub name: Spanned<String>,
    pub path: Option<Template>,
    pub variables: Vec<(Key, TNode)>,
    pub metadata: Option<TNode>,
    pub description: Option<Template>,
}

#[derive(Clone, Debug)]
pub struct Export {
    pub name: Spanned<String>,
    pub ty: Option<Spanned<String>>,
    pub field: Option<Spanned<String>>,
    pub description: Option<Template>,
}

impl Resource {
    /// Every template of the resource that is evaluated per element when the
    /// resource has `each` (everything but `each` itself), in document order.
    pub fn element_templates<'a>(&'a self, f: &mut impl FnMut(&'a Template)) {
        if let Some(d) = &self.description {
            f(d);
        }
        self.metadata.templates(f);
        if let Some(c) = &self.condition {
            c.templates(f);
        }
        if let Some(s) = &self.spec {
            s.templates(f);
        }
    }
}

impl Metadata {
    pub fn templates<'a>(&'a self, f: &mut impl FnMut(&'a Template)) {
        if let Some(d) = &self.display_name {
            f(d);
        }
        for (_, a) in &self.annotations {
            a.templates(f);
        }
        if let Some(c) = &self.custom {
            c.templates(f);
        }
    }
}

/// Whether `s` follows the specification's `name` rule: `[A-Za-z_][A-Za-z0-9_-]*`.
/// A name of a resource, value, data source or child blueprint: like
/// [`is_valid_name`], but dots may separate parts (`save-order-function.v1`);
/// such names are referred to with the quoted accessor (`resources["a.v1"]`).
pub fn is_valid_dotted_name(s: &str) -> bool {
    is_valid_name(s.split('.').next().unwrap_or(""))
        && s.split('.').skip(1).all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
        })
}

pub fn is_valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b[1..]
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
}

//! Evaluating templates and expressions against a scope.
//!
//! `and` and `or` are evaluated lazily here (the right side is not evaluated
//! when the left decides), so `and(false, fromjson(bad, "/x"))` is false
//! rather than an error. Reading a secret variable or value marks the scope,
//! so callers can mask whatever the evaluation produced.

use super::functions::{Env, FnError, call_in, function_value};
use super::limits::{Budget, LimitError};
use super::value::Value;
use crate::diag::{Code, Diagnostic, codes};
use crate::source::Span;
use crate::subst::{Accessor, Expr, ExprKind, Literal, Part, Template};
use indexmap::IndexMap;
use std::cell::Cell;

/// An evaluation failure, located in the source.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalError {
    pub code: &'static Code,
    pub span: Span,
    pub message: String,
}

impl EvalError {
    fn new(code: &'static Code, span: Span, message: impl Into<String>) -> EvalError {
        EvalError {
            code,
            span,
            message: message.into(),
        }
    }

    /// An evaluation limit reached at `span`.
    pub fn limit(span: Span, e: &LimitError) -> EvalError {
        EvalError::new(e.code(), span, e.to_string())
    }

    /// Whether this is an evaluation limit rather than a mistake in the blueprint.
    pub fn is_limit(&self) -> bool {
        self.code == &codes::VALUE_TOO_LARGE
            || self.code == &codes::EVALUATION_BUDGET
            || self.code == &codes::TOO_MANY_RESOURCES
    }

    pub fn into_diagnostic(self) -> Diagnostic {
        let hint = super::limits::hint(self.code);
        let d = Diagnostic::new(self.code, self.span, self.message);
        match hint {
            Some(h) => d.with_hint(h),
            None => d,
        }
    }
}

type Result<T> = std::result::Result<T, EvalError>;

/// What a resource reference reads: the evaluated spec and metadata of one
/// resource (or one element of an `each` template), and its deployed state.
#[derive(Clone, Debug)]
pub struct ResourceValue {
    pub spec: Value,
    pub metadata: Value,
    /// `None` until deployed: reads are unknown.
    pub state: Option<Value>,
    /// When the provider marked some of the state sensitive: the state with those parts
    /// replaced by `(sensitive)`, like `masked_spec`.
    pub masked_state: Option<Value>,
    /// When some field was derived from a secret: the spec with those fields
    /// replaced by `(sensitive)`. A read that differs between the two read
    /// a secret.
    pub masked_spec: Option<Value>,
    /// Likewise for the metadata, when an annotation read a secret.
    pub masked_metadata: Option<Value>,
    /// False when the resource's condition excluded it: reads are unknown.
    pub exists: bool,
}

/// A resource as references see it: indexes into [`Scope::instances`].
#[derive(Clone, Debug)]
pub enum ResourceEntry {
    Single(usize),
    Template(Vec<usize>),
    /// Not evaluated (yet), or excluded by its condition: reads are unknown.
    Pending,
}

static UNKNOWN: Value = Value::Unknown;

/// Functions beyond the core set (provider functions, answered by plugins).
pub trait ExternalFunctions {
    /// `None` when no provider has the function; `Err` is a message naming
    /// the provider.
    fn call(&self, name: &str, args: Vec<Value>) -> Option<std::result::Result<Value, String>>;
}

/// Everything a substitution can read.
pub struct Scope<'a> {
    /// Variables that have a value (supplied or default).
    pub variables: &'a IndexMap<String, Value>,
    /// Declared variables without a value, so a read can say "required".
    pub missing_variables: &'a [String],
    pub secret_variables: &'a [String],
    pub values: &'a IndexMap<String, Value>,
    pub secret_values: &'a [String],
    /// Data source exports by data source and field; absent means not
    /// fetched yet (unknown).
    pub datasources: &'a IndexMap<String, IndexMap<String, Value>>,
    /// Exports of child blueprints; absent means unknown.
    pub children: &'a IndexMap<String, Value>,
    /// Per child, the names of its exports that are sensitive.
    pub secret_children: &'a IndexMap<String, Vec<String>>,
    pub resources: &'a IndexMap<String, ResourceEntry>,
    /// The concrete resources `resources` points into.
    pub instances: &'a [ResourceValue],
    /// The current element and index inside an `each` template.
    pub elem: Option<(&'a Value, usize)>,
    pub env: &'a Env<'a>,
    /// Provider functions, when plugins are available.
    pub external: Option<&'a dyn ExternalFunctions>,
    /// Set when the evaluation read a secret.
    pub touched_secret: Cell<bool>,
    /// The evaluation's limits and running total.
    pub budget: &'a Budget,
}

impl Scope<'_> {
    /// Hides an error's message when the evaluation read a secret: function
    /// errors may quote their input.
    pub fn hide(&self, mut e: EvalError) -> EvalError {
        // A limit's message holds sizes only, never the input.
        if self.touched_secret.get() && !e.is_limit() {
            e.message =
                "evaluation failed on a value derived from a secret (details hidden)".to_owned();
        }
        e
    }

    /// The text of every scalar of the secret variables and values this scope can read (see
    /// `Evaluation::secret_texts`).
    pub fn secret_texts(&self) -> Vec<String> {
        let mut out = Vec::new();
        let vars = self.secret_variables.iter().map(|n| self.variables.get(n));
        let vals = self.secret_values.iter().map(|n| self.values.get(n));
        for v in vars.chain(vals).flatten() {
            super::blueprint::scalar_texts(v, &mut out);
        }
        out
    }

    /// [`Scope::hide`] for a result.
    pub fn guard<T>(&self, r: Result<T>) -> Result<T> {
        r.map_err(|e| self.hide(e))
    }

    /// Evaluates a template where it stands for a field: exactly one
    /// substitution yields its value unchanged, anything else a string.
    pub fn template(&self, t: &Template) -> Result<Value> {
        match t.parts.as_slice() {
            [Part::Sub(s)] => self.expr(&s.expr),
            _ => self.interpolate(t),
        }
    }

    /// Evaluates a template that must yield a whole value (`each`, typed
    /// values, conditions): whitespace around one substitution is ignored.
    pub fn whole(&self, t: &Template) -> Result<Value> {
        match t.single_substitution() {
            Some(s) => self.expr(&s.expr),
            None => self.interpolate(t),
        }
    }

    fn interpolate(&self, t: &Template) -> Result<Value> {
        let mut out = String::new();
        let mut unknown = false;
        // Checked before each part is added, so a string over the limit is never built.
        let fits = |out: &String, add: &str, span: Span| {
            self.budget
                .check_size(super::limits::string_bytes(out.len() + add.len()), || {
                    "this string".to_owned()
                })
                .map_err(|e| EvalError::limit(span, &e))
        };
        for p in &t.parts {
            match p {
                Part::Lit(s) => {
                    fits(&out, s, t.span)?;
                    out.push_str(s)
                }
                Part::Sub(s) => {
                    let v = self.expr(&s.expr)?;
                    if v.is_unknown() {
                        unknown = true;
                        continue;
                    }
                    match v.display_string() {
                        Some(text) => {
                            fits(&out, &text, t.span)?;
                            out.push_str(&text)
                        }
                        None => {
                            return Err(EvalError::new(
                                &codes::INTERPOLATE_COMPLEX,
                                s.span,
                                format!(
                                    "this substitution yields {}, which cannot be interpolated into a string",
                                    article(v.type_name())
                                ),
                            ));
                        }
                    }
                }
            }
        }
        if unknown {
            return Ok(Value::Unknown);
        }
        let v = Value::Str(out);
        self.produced(&v, t.span)?;
        Ok(v)
    }

    /// Checks and charges a value just produced at `span`.
    fn produced(&self, v: &Value, span: Span) -> Result<()> {
        self.budget
            .produced(v)
            .map_err(|e| EvalError::limit(span, &e))
    }

    pub fn expr(&self, e: &Expr) -> Result<Value> {
        let v = self.expr_unchecked(e)?;
        // A core function's result is checked and charged by the call; accessors after it
        // copy out a part of it.
        if !matches!(e.kind, ExprKind::Call { .. }) {
            self.produced(&v, e.span)?;
        }
        Ok(v)
    }

    fn expr_unchecked(&self, e: &Expr) -> Result<Value> {
        match &e.kind {
            ExprKind::Lit(l) => Ok(match l {
                Literal::Str(s) => Value::Str(s.clone()),
                Literal::Int(i) => Value::Int(*i),
                Literal::Float(f) => Value::Float(*f),
                Literal::Bool(b) => Value::Bool(*b),
            }),
            ExprKind::Variable(n) => {
                if self.secret_variables.contains(&n.text) {
                    self.touched_secret.set(true);
                }
                match self.variables.get(&n.text) {
                    Some(v) => Ok(v.clone()),
                    None if self.missing_variables.contains(&n.text) => Err(EvalError::new(
                        &codes::VARIABLE_REQUIRED,
                        n.span,
                        format!(
                            "variable `{}` has no default and no value was given",
                            n.text
                        ),
                    )),
                    None => Err(EvalError::new(
                        &codes::UNKNOWN_VARIABLE,
                        n.span,
                        format!("unknown variable `{}`", n.text),
                    )),
                }
            }
            ExprKind::Value(n, path) => {
                if self.secret_values.contains(&n.text) {
                    self.touched_secret.set(true);
                }
                let v = self.values.get(&n.text).ok_or_else(|| {
                    EvalError::new(
                        &codes::UNKNOWN_VALUE,
                        n.span,
                        format!("unknown value `{}`", n.text),
                    )
                })?;
                access(v, path, &format!("values.{}", n.text))
            }
            ExprKind::DataSource { name, field, index } => {
                let Some(fields) = self.datasources.get(&name.text) else {
                    return Ok(Value::Unknown);
                };
                let v = fields.get(&field.text).unwrap_or(&UNKNOWN);
                access(
                    v,
                    index.as_slice(),
                    &format!("datasources.{}.{}", name.text, field.text),
                )
            }
            ExprKind::Child(n, path) => match self.children.get(&n.text) {
                Some(v) => {
                    // A child's sensitive export stays sensitive in what reads it.
                    if let Some(secret) = self.secret_children.get(&n.text) {
                        let read_secret = match path.first() {
                            Some(Accessor::Field(f)) => secret.contains(&f.text),
                            _ => !secret.is_empty(),
                        };
                        if read_secret {
                            self.touched_secret.set(true);
                        }
                    }
                    access(v, path, &format!("children.{}", n.text))
                }
                None => Ok(Value::Unknown),
            },
            ExprKind::Resource {
                name,
                path,
                prefixed,
            } => {
                // A bare name is a function when one has that name (`link`
                // resolves its arguments as resources itself).
                if !prefixed
                    && path.is_empty()
                    && let Some(f) = function_value(&name.text)
                {
                    return Ok(Value::Func(f));
                }
                self.resource(e, &name.text, path)
            }
            ExprKind::Elem(path) => match self.elem {
                Some((v, _)) => access(v, path, "elem"),
                None => Err(EvalError::new(
                    &codes::ELEM_OUTSIDE_EACH,
                    e.span,
                    "`elem` is only defined inside a resource with `each`",
                )),
            },
            ExprKind::ElemIndex => match self.elem {
                Some((_, i)) => Ok(Value::Int(i as i64)),
                None => Err(EvalError::new(
                    &codes::ELEM_OUTSIDE_EACH,
                    e.span,
                    "`i` is only defined inside a resource with `each`",
                )),
            },
            ExprKind::Call { name, args, path } => {
                let v = self.call(e, &name.text, args)?;
                if path.is_empty() {
                    return Ok(v);
                }
                access(&v, path, &format!("{}(..)", name.text))
            }
        }
    }

    fn resource(&self, e: &Expr, name: &str, path: &[Accessor]) -> Result<Value> {
        let label = format!("resources.{name}");
        let (value, rest) = match self.resources.get(name) {
            None => {
                return Err(EvalError::new(
                    &codes::UNKNOWN_RESOURCE,
                    e.span,
                    format!("unknown resource `{name}`"),
                ));
            }
            Some(ResourceEntry::Pending) => return Ok(Value::Unknown),
            Some(ResourceEntry::Single(r)) => (&self.instances[*r], path),
            Some(ResourceEntry::Template(items)) => match path.first() {
                Some(Accessor::Index(i, span)) => {
                    let i = i.unwrap_or(0) as usize;
                    match items.get(i) {
                        Some(r) => (&self.instances[*r], &path[1..]),
                        None => {
                            return Err(EvalError::new(
                                &codes::EVALUATION,
                                *span,
                                format!(
                                    "{label} has {} elements; there is no element {i}",
                                    items.len()
                                ),
                            ));
                        }
                    }
                }
                _ => {
                    return Err(EvalError::new(
                        &codes::RESOURCE_INDEX,
                        e.span,
                        format!("{label} is a template with `each`: pick an element"),
                    ));
                }
            },
        };
        if !value.exists {
            return Ok(Value::Unknown);
        }
        let (section, rest) = match rest.first() {
            Some(Accessor::Field(f)) => (f.text.as_str(), &rest[1..]),
            _ => {
                return Err(EvalError::new(
                    &codes::RESOURCE_FIELD,
                    e.span,
                    format!("read {label} through .spec, .state or .metadata"),
                ));
            }
        };
        match section {
            "spec" => match access(&value.spec, rest, "") {
                Ok(read) => {
                    if let Some(masked) = &value.masked_spec
                        && access(masked, rest, "").ok().as_ref() != Some(&read)
                    {
                        self.touched_secret.set(true);
                    }
                    Ok(read)
                }
                // A top-level field the blueprint does not set may be computed by the
                // provider (`spec.id`, `spec.arn`), which reports computed fields in the
                // resource's state: unknown until deployed, then read from there. Any other
                // miss (an index out of range, a field of a string) is unknown as before.
                Err(_) if !sets_first_field(&value.spec, rest) => match &value.state {
                    None => Ok(Value::Unknown),
                    Some(state) => {
                        let read = access(state, rest, &format!("{label}.spec")).map_err(|e| {
                            EvalError::new(
                                &codes::EVALUATION,
                                e.span,
                                format!(
                                    "{}: the blueprint does not set it and the provider \
                                     computed no such field",
                                    e.message
                                ),
                            )
                        })?;
                        self.mark_secret_read(value.masked_state.as_ref(), rest, &read);
                        Ok(read)
                    }
                },
                Err(_) => Ok(Value::Unknown),
            },
            "state" => match &value.state {
                Some(s) => {
                    let read = access(s, rest, &format!("{label}.state"))?;
                    self.mark_secret_read(value.masked_state.as_ref(), rest, &read);
                    Ok(read)
                }
                None => Ok(Value::Unknown),
            },
            "metadata" => access(&value.metadata, rest, &format!("{label}.metadata")),
            other => Err(EvalError::new(
                &codes::RESOURCE_FIELD,
                e.span,
                format!("{label} has no section `{other}`"),
            )),
        }
    }

    /// Marks the scope when `read` (at `path` of a resource's state) differs from the masked
    /// copy: the provider reported it sensitive.
    fn mark_secret_read(&self, masked: Option<&Value>, path: &[Accessor], read: &Value) {
        if let Some(masked) = masked
            && access(masked, path, "").ok().as_ref() != Some(read)
        {
            self.touched_secret.set(true);
        }
    }

    fn call(&self, e: &Expr, name: &str, args: &[crate::subst::Arg]) -> Result<Value> {
        let fail = |err: FnError| match &err.limit {
            Some(limit) => EvalError::new(limit.code(), e.span, err.to_string()),
            None => EvalError::new(&codes::EVALUATION, e.span, err.to_string()),
        };
        if crate::functions::core(name).is_none() {
            // A provider function: arguments are evaluated here, the call
            // goes to the plugin that declares it.
            if let Some(external) = self.external {
                let mut values = Vec::with_capacity(args.len());
                for a in args {
                    values.push(self.expr(&a.value)?);
                }
                if values.iter().any(Value::is_unknown) {
                    return Ok(Value::Unknown);
                }
                match external.call(name, values) {
                    Some(Ok(v)) => {
                        self.produced(&v, e.span)?;
                        return Ok(v);
                    }
                    Some(Err(message)) => {
                        return Err(EvalError::new(
                            &codes::EVALUATION,
                            e.span,
                            format!("{name}: {message}"),
                        ));
                    }
                    None => {}
                }
            }
            return Err(EvalError::new(
                &codes::UNKNOWN_FUNCTION,
                e.span,
                format!("unknown function `{name}`"),
            ));
        }
        // Short-circuit: the right side is evaluated only when it matters.
        if (name == "and" || name == "or") && args.len() == 2 {
            let left = self.expr(&args[0].value)?;
            let decided = match (name, &left) {
                ("and", Value::Bool(false)) => Some(false),
                ("or", Value::Bool(true)) => Some(true),
                _ => None,
            };
            if let Some(b) = decided {
                return Ok(Value::Bool(b));
            }
            let right = self.expr(&args[1].value)?;
            return call_in(name, vec![left, right], Vec::new(), self.env, self.budget)
                .map_err(fail);
        }
        // `link` takes resources by name, whether written bare, prefixed or quoted.
        if name == "link" {
            let mut names = Vec::with_capacity(args.len());
            for a in args {
                match &a.value.kind {
                    ExprKind::Resource { name, path, .. } if path.is_empty() => {
                        names.push(Value::Str(name.text.clone()))
                    }
                    _ => names.push(self.expr(&a.value)?),
                }
            }
            return call_in(name, names, Vec::new(), self.env, self.budget).map_err(fail);
        }
        let mut positional = Vec::with_capacity(args.len());
        let mut named = Vec::new();
        for a in args {
            let v = self.expr(&a.value)?;
            match &a.name {
                Some(n) if name == "object" => named.push((n.text.clone(), v)),
                _ => positional.push(v),
            }
        }
        call_in(name, positional, named, self.env, self.budget).map_err(fail)
    }
}

/// Follows accessors and copies out only what they reach; a missing field
/// or index is an error naming the path.
/// Whether a resource's evaluated spec (a map) has the first field of `path`.
fn sets_first_field(spec: &Value, path: &[Accessor]) -> bool {
    match (spec, path.first()) {
        (Value::Map(m), Some(Accessor::Field(f))) => m.contains_key(&f.text),
        _ => true,
    }
}

fn access(v: &Value, path: &[Accessor], label: &str) -> Result<Value> {
    let mut cur = v;
    for (depth, a) in path.iter().enumerate() {
        let where_ = || describe_path(label, &path[..depth]);
        cur = match (cur, a) {
            (Value::Unknown, _) => return Ok(Value::Unknown),
            (Value::Map(m), Accessor::Field(f)) => match m.get(&f.text) {
                Some(x) => x,
                None => {
                    return Err(EvalError::new(
                        &codes::EVALUATION,
                        f.span,
                        format!("{} has no field `{}`", where_(), f.text),
                    ));
                }
            },
            (Value::List(items), Accessor::Index(i, span)) => {
                let i = i.unwrap_or(0) as usize;
                match items.get(i) {
                    Some(x) => x,
                    None => {
                        return Err(EvalError::new(
                            &codes::EVALUATION,
                            *span,
                            format!(
                                "{} has {} element{}; index {i} is out of range",
                                where_(),
                                items.len(),
                                if items.len() == 1 { "" } else { "s" }
                            ),
                        ));
                    }
                }
            }
            (other, a) => {
                let what = match a {
                    Accessor::Field(f) => format!("field `{}`", f.text),
                    Accessor::Index(..) => "an index".to_owned(),
                };
                return Err(EvalError::new(
                    &codes::EVALUATION,
                    a.span(),
                    format!(
                        "{} is {}, which has no {what}",
                        where_(),
                        article(other.type_name())
                    ),
                ));
            }
        };
    }
    Ok(cur.clone())
}

/// `values.cfg.hosts[0]`: the label and the accessors followed so far.
fn describe_path(label: &str, path: &[Accessor]) -> String {
    let mut out = label.to_owned();
    for a in path {
        match a {
            Accessor::Field(f) => {
                out.push('.');
                out.push_str(&f.text);
            }
            Accessor::Index(i, _) => out.push_str(&format!("[{}]", i.unwrap_or(0))),
        }
    }
    out
}

fn article(type_name: &str) -> String {
    crate::blueprint::article_of(type_name)
}

//! Static types of substitutions, where they are known before deploy.
//!
//! Inference is deliberately shallow: a declared variable or value type, a
//! data source export type, a literal, a function's return type. Everything
//! reached through accessors, resources, children or `elem` is `Any`, and
//! `Any` never produces a diagnostic; only a known mismatch does.

use crate::blueprint::Blueprint;
use crate::diag::{Diagnostic, Diagnostics, codes};
use crate::functions::{FunctionCatalog, Ty};
use crate::subst::{Expr, ExprKind, Literal, Part, Template};

/// A statically known type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Static {
    Any,
    String,
    Integer,
    Float,
    Boolean,
    Array,
    Object,
    Func,
}

impl Static {
    pub fn as_str(self) -> &'static str {
        match self {
            Static::Any => "any",
            Static::String => "string",
            Static::Integer => "integer",
            Static::Float => "float",
            Static::Boolean => "boolean",
            Static::Array => "array",
            Static::Object => "object",
            Static::Func => "function",
        }
    }

    /// The type a blueprint names (`string`, `array`, ...); custom variable
    /// types are option labels whose values are not known statically.
    pub fn from_declared(name: &str) -> Static {
        match name {
            "string" => Static::String,
            "integer" => Static::Integer,
            "float" => Static::Float,
            "boolean" => Static::Boolean,
            "array" => Static::Array,
            "object" => Static::Object,
            _ => Static::Any,
        }
    }

    fn from_ty(t: Ty) -> Static {
        match t {
            Ty::String => Static::String,
            Ty::Integer => Static::Integer,
            Ty::Float => Static::Float,
            Ty::Boolean => Static::Boolean,
            Ty::Array => Static::Array,
            Ty::Object => Static::Object,
            Ty::Func => Static::Func,
            Ty::Any | Ty::Number | Ty::StringOrArray | Ty::Sized | Ty::ResourceName => Static::Any,
        }
    }

    /// Whether a value of type `self` is acceptable where `want` is declared.
    /// Integers are accepted as floats.
    pub fn fits(self, want: Static) -> bool {
        self == Static::Any
            || want == Static::Any
            || self == want
            || (self == Static::Integer && want == Static::Float)
    }
}

/// Whether an argument of type `arg` may be passed for a parameter of type `param`.
fn accepts(param: Ty, arg: Static) -> bool {
    if arg == Static::Any {
        return true;
    }
    match param {
        // Function values may only go where a function is expected.
        Ty::Any => arg != Static::Func,
        Ty::Func => arg == Static::Func,
        Ty::Number => matches!(arg, Static::Integer | Static::Float),
        Ty::StringOrArray => matches!(arg, Static::String | Static::Array),
        Ty::Sized => matches!(arg, Static::String | Static::Array | Static::Object),
        Ty::ResourceName => arg == Static::String,
        Ty::Float => matches!(arg, Static::Float | Static::Integer),
        other => Static::from_ty(other) == arg,
    }
}

pub struct Typer<'a> {
    pub bp: &'a Blueprint,
    pub functions: &'a dyn FunctionCatalog,
}

impl Typer<'_> {
    /// The static type of an expression.
    pub fn infer(&self, e: &Expr) -> Static {
        match &e.kind {
            ExprKind::Lit(Literal::Str(_)) => Static::String,
            ExprKind::Lit(Literal::Int(_)) => Static::Integer,
            ExprKind::Lit(Literal::Float(_)) => Static::Float,
            ExprKind::Lit(Literal::Bool(_)) => Static::Boolean,
            ExprKind::Variable(n) => self
                .bp
                .variables
                .iter()
                .find(|v| v.name.value == n.text)
                .and_then(|v| v.ty.as_ref())
                .map_or(Static::Any, |t| Static::from_declared(&t.value)),
            ExprKind::Value(n, path) if path.is_empty() => self
                .bp
                .values
                .iter()
                .find(|v| v.name.value == n.text)
                .and_then(|v| v.ty.as_ref())
                .map_or(Static::Any, |t| Static::from_declared(&t.value)),
            ExprKind::DataSource {
                name,
                field,
                index: None,
            } => self
                .bp
                .datasources
                .iter()
                .find(|d| d.name.value == name.text)
                .and_then(|d| d.exports.iter().find(|x| x.name.value == field.text))
                .and_then(|x| x.ty.as_ref())
                .map_or(Static::Any, |t| Static::from_declared(&t.value)),
            ExprKind::ElemIndex => Static::Integer,
            ExprKind::Resource {
                name,
                path,
                prefixed: false,
            } if path.is_empty()
                && self.functions.lookup(&name.text).is_some()
                && !self.bp.resources.iter().any(|r| r.name.value == name.text) =>
            {
                Static::Func
            }
            ExprKind::Call { name, path, .. } if path.is_empty() => self
                .functions
                .lookup(&name.text)
                .map_or(Static::Any, |s| Static::from_ty(s.returns)),
            _ => Static::Any,
        }
    }

    /// The static type of a whole template: a single substitution has its
    /// expression's type; anything else is a string.
    pub fn template(&self, t: &Template) -> Static {
        match t.single_substitution() {
            Some(s) => self.infer(&s.expr),
            None => Static::String,
        }
    }

    /// Argument types of every call in an expression tree.
    pub fn check_calls(&self, e: &Expr, diags: &mut Diagnostics) {
        e.walk(&mut |x| {
            let ExprKind::Call { name, args, .. } = &x.kind else {
                return;
            };
            let Some(sig) = self.functions.lookup(&name.text) else {
                return;
            };
            if name.text == "datetime"
                && let Some(a) = args.first()
                && let ExprKind::Lit(Literal::Str(format)) = &a.value.kind
                && !crate::eval::functions::DATETIME_FORMAT_NAMES.contains(&format.as_str())
            {
                let mut d = Diagnostic::new(
                    &codes::ARGUMENT_VALUE,
                    a.value.span,
                    format!(
                        "`datetime` does not support the format \"{format}\"; it supports {}",
                        crate::eval::functions::DATETIME_FORMAT_NAMES.join(", ")
                    ),
                );
                if let Some(s) = crate::diag::did_you_mean(
                    format,
                    crate::eval::functions::DATETIME_FORMAT_NAMES.iter().copied(),
                ) {
                    d = d.with_hint(format!("did you mean \"{s}\"?"));
                }
                diags.push(d);
            }
            if let ExprKind::Call { path, .. } = &x.kind
                && let Some(first) = path.first()
                && matches!(
                    sig.returns,
                    Ty::String | Ty::Integer | Ty::Float | Ty::Boolean
                )
            {
                diags.push(
                    Diagnostic::new(
                        &codes::ACCESS_ON_SCALAR,
                        first.span(),
                        format!(
                            "`{}` returns {}, which has no fields or elements",
                            name.text,
                            crate::blueprint::article_of(sig.returns.as_str())
                        ),
                    )
                    .with_hint("use the result as it is, or a function that takes it apart (`split`, `substr`)"),
                );
            }
            for (i, a) in args.iter().enumerate() {
                // `link` takes resources by bare name, even one shared with a function.
                if name.text == "link" && matches!(a.value.kind, ExprKind::Resource { .. }) {
                    continue;
                }
                let Some(param) = sig.params.get(i).map(|p| p.ty).or(sig.variadic) else {
                    continue;
                };
                let actual = self.infer(&a.value);
                if actual == Static::Func && param != Ty::Func {
                    diags.push(
                        Diagnostic::new(
                            &codes::ARGUMENT_TYPE,
                            a.value.span,
                            format!(
                                "`{}` argument {}{}: expected {}, found a function",
                                name.text,
                                i + 1,
                                sig.params.get(i).map(|p| format!(" (`{}`)", p.name)).unwrap_or_default(),
                                param.as_str()
                            ),
                        )
                        .with_hint("functions can only be passed where a function is expected, as to `map` or `filter`"),
                    );
                } else if !accepts(param, actual) {
                    diags.push(Diagnostic::new(
                        &codes::ARGUMENT_TYPE,
                        a.value.span,
                        format!(
                            "`{}` argument {}{}: expected {}, found {}",
                            name.text,
                            i + 1,
                            sig.params
                                .get(i)
                                .map(|p| format!(" (`{}`)", p.name))
                                .unwrap_or_default(),
                            param.as_str(),
                            actual.as_str()
                        ),
                    ));
                }
            }
        });
    }

    /// Interpolating an array, object or function into a longer string is an
    /// error the specification asks to be reported.
    pub fn check_interpolation(&self, t: &Template, diags: &mut Diagnostics) {
        if t.single_substitution().is_some() {
            return;
        }
        for p in &t.parts {
            let Part::Sub(s) = p else { continue };
            let ty = self.infer(&s.expr);
            if matches!(ty, Static::Array | Static::Object | Static::Func) {
                diags.push(
                    Diagnostic::new(
                        &codes::INTERPOLATE_COMPLEX,
                        s.span,
                        format!("this substitution yields {}, which cannot be interpolated into a string", crate::blueprint::article_of(ty.as_str())),
                    )
                    .with_hint("use the substitution alone as the whole value, or pick a scalar out of it (`join(..)`, `[0]`, `.field`)"),
                );
            }
        }
    }
}

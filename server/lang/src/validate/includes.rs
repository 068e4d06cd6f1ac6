//! What an include passes, checked against the variables its child blueprint
//! declares, when the child's document is at hand (a local child file at
//! validate, any child at plan): "The value type must match the same type as
//! the variable definition in the child blueprint", and a variable the child
//! requires (no default) must be passed.

use super::types::{Static, Typer};
use crate::blueprint::{Blueprint, Include, TKind, TNode, Variable, article_of};
use crate::diag::{Diagnostic, Diagnostics, codes};
use crate::functions::FunctionCatalog;

/// The static type of what an include passes for one variable.
fn passed_type(typer: &Typer<'_>, node: &TNode) -> Static {
    match &node.kind {
        TKind::Null => Static::Any,
        TKind::Bool(_) => Static::Boolean,
        TKind::Int(_) => Static::Integer,
        TKind::Float(_) => Static::Float,
        TKind::Str(t) if t.broken => Static::Any,
        TKind::Str(t) => typer.template(t),
        TKind::List(_) => Static::Array,
        TKind::Map(_) => Static::Object,
    }
}

/// The type a child variable declares; a custom type's values are option labels (strings).
fn declared_type(v: &Variable) -> Static {
    match v.ty.as_ref().map(|t| t.value.as_str()) {
        Some(t) if t.contains('/') => Static::String,
        Some(t @ ("string" | "integer" | "float" | "boolean")) => Static::from_declared(t),
        _ => Static::Any,
    }
}

/// Checks include `inc` of `bp` against `declared`, the variables of its child document
/// `child_file`: a value whose type is known statically and differs from the declared type
/// is `T0406` at the value (integers are accepted as floats; nothing is coerced), and a
/// variable without a default that the include does not pass is `T0707` at the include.
/// Variables the child does not declare are left to the caller (`T0406` at the key).
pub fn check_include_variables(
    bp: &Blueprint,
    inc: &Include,
    child_file: &str,
    declared: &[Variable],
    functions: &dyn FunctionCatalog,
    diags: &mut Diagnostics,
) {
    let typer = Typer { bp, functions };
    let name = &inc.name.value;
    for (key, node) in &inc.variables {
        let Some(v) = declared.iter().find(|v| v.name.value == key.name) else {
            continue;
        };
        let want = declared_type(v);
        let got = passed_type(&typer, node);
        if got == Static::Func || got.fits(want) {
            continue;
        }
        let span = match &node.kind {
            TKind::Str(t) => t.single_substitution().map_or(node.span, |s| s.span),
            _ => node.span,
        };
        let ty = v.ty.as_ref().map_or("string", |t| t.value.as_str());
        let hint = match (want, got) {
            (Static::String, Static::Integer | Static::Float | Static::Boolean) => {
                "a literal must be quoted to pass a string; a substitution must yield a string"
            }
            _ => "pass a value of the type the child declares",
        };
        diags.push(
            Diagnostic::new(
                &codes::VARIABLE_INPUT,
                span,
                format!(
                    "include `{name}` passes {} for variable `{}`, which `{child_file}` declares as {ty}",
                    article_of(got.as_str()),
                    key.name
                ),
            )
            .with_hint(hint),
        );
    }
    let missing: Vec<&str> = declared
        .iter()
        .filter(|v| v.default.is_none())
        .map(|v| v.name.value.as_str())
        .filter(|n| !inc.variables.iter().any(|(k, _)| k.name == *n))
        .collect();
    if !missing.is_empty() {
        let list: Vec<String> = missing.iter().map(|n| format!("`{n}`")).collect();
        diags.push(
            Diagnostic::new(
                &codes::VARIABLE_REQUIRED,
                inc.name.span,
                format!(
                    "include `{name}` does not pass {} {}, which `{child_file}` requires (no default)",
                    if missing.len() == 1 { "variable" } else { "variables" },
                    list.join(", ")
                ),
            )
            .with_hint("add them under the include's `variables:`"),
        );
    }
}

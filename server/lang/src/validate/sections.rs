//! Per-section rules: types, formats, allowed values, shapes.

use super::Options;
use crate::blueprint::{Blueprint, Scalar, Spanned, Variable};
use crate::diag::{Diagnostic, Diagnostics, codes, did_you_mean};
use crate::source::Span;
use crate::subst::Part;

pub(super) const VARIABLE_TYPES: &[&str] = &["string", "integer", "float", "boolean"];
pub(super) const VALUE_TYPES: &[&str] =
    &["string", "integer", "float", "boolean", "array", "object"];
pub(super) const DATASOURCE_EXPORT_TYPES: &[&str] =
    &["array", "string", "integer", "float", "boolean"];
pub(super) const FILTER_OPERATORS: &[&str] = &[
    "=",
    "!=",
    "in",
    "not in",
    "has key",
    "not has key",
    "contains",
    "not contains",
    "starts with",
    "not starts with",
    "ends with",
    "not ends with",
];

pub(super) fn check(bp: &Blueprint, opts: &Options<'_>, diags: &mut Diagnostics) {
    // `resources (required)`: the 2023-04-20 specification requires the section in every
    // blueprint, included children too; an include does not stand in for it (decision 0002).
    if bp.resources.is_empty() && !bp.malformed {
        let message = if bp.include.is_empty() {
            "the blueprint has no resources"
        } else {
            "the blueprint has no resources: `resources` is required even when it includes child blueprints"
        };
        diags.push(
            Diagnostic::new(&codes::NOTHING_TO_DEPLOY, bp.span.start_point(), message)
                .with_hint("add a `resources` section with at least one resource"),
        );
    }
    for v in &bp.variables {
        variable(v, diags);
    }
    supplied_variables(bp, opts.variables, diags);
    for v in &bp.values {
        let Some(ty) = &v.ty else { continue };
        if !VALUE_TYPES.contains(&ty.value.as_str()) {
            unknown_type(&codes::VALUE_TYPE, ty, "value", VALUE_TYPES, diags);
            continue;
        }
        if let Some(t) = v.value.as_ref().filter(|t| !t.broken) {
            value_shape(&ty.value, t, &v.name.value, diags);
        }
    }
    for d in &bp.datasources {
        if let Some(ty) = &d.ty
            && !is_type_path(&ty.value, 2, usize::MAX)
        {
            diags.push(
                Diagnostic::new(
                    &codes::DATASOURCE_TYPE,
                    ty.span,
                    format!(
                        "data source type `{}` is not of the form `{{provider}}/{{type}}`",
                        ty.value
                    ),
                )
                .with_hint("for example `aws/vpc`"),
            );
        }
        for f in &d.filters {
            if let Some(op) = &f.operator
                && !FILTER_OPERATORS.contains(&op.value.as_str())
            {
                let mut diag = Diagnostic::new(
                    &codes::FILTER_OPERATOR,
                    op.span,
                    format!("unknown filter operator `{}`", op.value),
                );
                diag = match did_you_mean(&op.value, FILTER_OPERATORS.iter().copied()) {
                    Some(s) => diag.with_hint(format!("did you mean `{s}`?")),
                    None => diag.with_hint(format!("operators: {}", FILTER_OPERATORS.join(", "))),
                };
                diags.push(diag);
            }
        }
        if let Some(span) = d.exports_span
            && d.exports.is_empty()
        {
            diags.push(Diagnostic::new(
                &codes::DATASOURCE_EXPORTS_EMPTY,
                span,
                format!("data source `{}` exports no fields", d.name.value),
            ));
        }
        for x in &d.exports {
            if let Some(ty) = &x.ty
                && !DATASOURCE_EXPORT_TYPES.contains(&ty.value.as_str())
            {
                let mut diag = Diagnostic::new(
                    &codes::DATASOURCE_EXPORT_TYPE,
                    ty.span,
                    format!("`{}` is not a data source export type", ty.value),
                );
                diag = if ty.value == "object" {
                    diag.with_hint("data sources export primitives or arrays of primitives; export the nested fields with dot paths")
                } else {
                    diag.with_hint(format!(
                        "expected one of: {}",
                        DATASOURCE_EXPORT_TYPES.join(", ")
                    ))
                };
                diags.push(diag);
            }
        }
    }
    for r in &bp.resources {
        if let Some(ty) = &r.ty
            && !is_type_path(&ty.value, 2, 3)
        {
            diags.push(
                    Diagnostic::new(
                        &codes::RESOURCE_TYPE,
                        ty.span,
                        format!(
                            "resource type `{}` is not `{{provider}}/{{service}}/{{type}}` or `{{provider}}/{{type}}`",
                            ty.value
                        ),
                    )
                    .with_hint("for example `aws/lambda/function` or `celerity/handler`"),
                );
        }
        if let Some(each) = r.each.as_ref().filter(|t| !t.broken)
            && each.single_substitution().is_none()
        {
            let found = match each.substitutions().count() {
                0 => "no substitution",
                1 => "text around the substitution",
                _ => "several substitutions",
            };
            diags.push(
                    Diagnostic::new(
                        &codes::EACH_SHAPE,
                        each.span,
                        format!("`each` of resource `{}` must be exactly one `${{..}}` substitution, found {found}", r.name.value),
                    )
                    .with_hint("for example `each: ${values.buckets}`"),
                );
        }
    }
    for x in &bp.exports {
        if let Some(ty) = &x.ty
            && !VALUE_TYPES.contains(&ty.value.as_str())
        {
            unknown_type(&codes::EXPORT_TYPE, ty, "export", VALUE_TYPES, diags);
        }
    }
}

fn unknown_type(
    code: &'static crate::diag::Code,
    ty: &Spanned<String>,
    what: &str,
    allowed: &[&str],
    diags: &mut Diagnostics,
) {
    let mut d = Diagnostic::new(
        code,
        ty.span,
        format!(
            "`{}` is not {} type",
            ty.value,
            crate::blueprint::article_of(what)
        ),
    );
    d = match did_you_mean(&ty.value, allowed.iter().copied()) {
        Some(s) => d.with_hint(format!("did you mean `{s}`?")),
        None => d.with_hint(format!("expected one of: {}", allowed.join(", "))),
    };
    diags.push(d);
}

/// `a/b`, `a/b/c`: between `min` and `max` segments of `[A-Za-z0-9_-]+`.
pub(super) fn is_type_path(s: &str, min: usize, max: usize) -> bool {
    let segments: Vec<&str> = s.split('/').collect();
    (min..=max).contains(&segments.len())
        && segments.iter().all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
        })
}

fn is_custom_type(ty: &str) -> bool {
    is_type_path(ty, 2, usize::MAX)
}

/// Whether a scalar fits a variable type. Integers are accepted as floats;
/// custom types take option labels, which are strings.
fn fits(ty: &str, v: &Scalar) -> bool {
    match (ty, v) {
        ("string", Scalar::Str(_)) => true,
        ("integer", Scalar::Int(_)) => true,
        ("float", Scalar::Float(_) | Scalar::Int(_)) => true,
        ("boolean", Scalar::Bool(_)) => true,
        (t, Scalar::Str(_)) => is_custom_type(t),
        _ => false,
    }
}

fn scalar_eq(a: &Scalar, b: &Scalar) -> bool {
    match (a, b) {
        (Scalar::Int(x), Scalar::Float(y)) | (Scalar::Float(y), Scalar::Int(x)) => {
            (*x as f64) == *y
        }
        _ => a == b,
    }
}

/// A variable's default or allowed value as a message may show it.
fn show(v: &Variable, s: &Scalar) -> String {
    if v.secret {
        "(secret)".to_owned()
    } else {
        s.render()
    }
}

fn variable(v: &Variable, diags: &mut Diagnostics) {
    let Some(ty) = &v.ty else { return };
    let t = ty.value.as_str();
    if !VARIABLE_TYPES.contains(&t) && !is_custom_type(t) {
        let mut d = Diagnostic::new(
            &codes::VARIABLE_TYPE,
            ty.span,
            format!("`{t}` is not a variable type"),
        );
        d = match did_you_mean(t, VARIABLE_TYPES.iter().copied()) {
            Some(s) => d.with_hint(format!("did you mean `{s}`?")),
            None => d.with_hint(
                "expected string, integer, float, boolean or a custom type `{provider}/{type}`",
            ),
        };
        diags.push(d);
        return;
    }
    let label = if is_custom_type(t) {
        format!("{t} (an option label)")
    } else {
        t.to_owned()
    };
    if let Some(def) = &v.default
        && !fits(t, &def.value)
    {
        diags.push(
            Diagnostic::new(
                &codes::VARIABLE_DEFAULT_TYPE,
                def.span,
                format!(
                    "the default of variable `{}` must be {label}, found {} {}",
                    v.name.value,
                    def.value.type_name(),
                    show(v, &def.value)
                ),
            )
            .with_hint(if matches!(def.value, Scalar::Str(_)) {
                "remove the quotes"
            } else {
                "quote it to make it a string"
            }),
        );
    }
    if let Some(allowed) = &v.allowed_values {
        if t == "boolean" {
            diags.push(
                Diagnostic::new(
                    &codes::VARIABLE_BOOLEAN_ALLOWED,
                    allowed.span,
                    format!("boolean variable `{}` cannot have allowed values", v.name.value),
                )
                .with_hint("a boolean is already true or false; use a string with allowed values for an enumeration"),
            );
            return;
        }
        for a in &allowed.value {
            if !fits(t, &a.value) {
                diags.push(Diagnostic::new(
                    &codes::VARIABLE_ALLOWED_TYPE,
                    a.span,
                    format!(
                        "allowed value {} of variable `{}` is {}, not {label}",
                        show(v, &a.value),
                        v.name.value,
                        crate::blueprint::article_of(a.value.type_name()),
                    ),
                ));
            }
        }
        if let Some(def) = &v.default
            && !allowed
                .value
                .iter()
                .any(|a| scalar_eq(&a.value, &def.value))
        {
            let list: Vec<String> = allowed.value.iter().map(|a| show(v, &a.value)).collect();
            diags.push(
                Diagnostic::new(
                    &codes::VARIABLE_DEFAULT_NOT_ALLOWED,
                    def.span,
                    format!(
                        "the default {} of variable `{}` is not one of its allowed values",
                        show(v, &def.value),
                        v.name.value
                    ),
                )
                .with_hint(format!("allowed: {}", list.join(", "))),
            );
        }
    }
}

/// Parses a value supplied as text into the variable's type.
pub fn parse_input(ty: &str, text: &str) -> Option<Scalar> {
    match ty {
        "integer" => text.trim().parse().ok().map(Scalar::Int),
        "float" => text
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map(Scalar::Float),
        "boolean" => match text.trim() {
            "true" => Some(Scalar::Bool(true)),
            "false" => Some(Scalar::Bool(false)),
            _ => None,
        },
        _ => Some(Scalar::Str(text.to_owned())),
    }
}

fn supplied_variables(bp: &Blueprint, supplied: &[(String, String)], diags: &mut Diagnostics) {
    let at = Span::new(bp.file, 0, 0);
    for (name, text) in supplied {
        let Some(var) = bp.variables.iter().find(|v| &v.name.value == name) else {
            let mut d = Diagnostic::new(
                &codes::VARIABLE_INPUT,
                at,
                format!("--var {name}: the blueprint declares no variable `{name}`"),
            );
            if let Some(s) = did_you_mean(name, bp.variables.iter().map(|v| v.name.value.as_str()))
            {
                d = d.with_hint(format!("did you mean `{s}`?"));
            }
            diags.push(d);
            continue;
        };
        let Some(ty) = &var.ty else { continue };
        let Some(value) = parse_input(&ty.value, text) else {
            diags.push(Diagnostic::new(
                &codes::VARIABLE_INPUT,
                var.name.span,
                format!(
                    "--var {name}: `{}` is not a valid {}",
                    mask(var, text),
                    ty.value
                ),
            ));
            continue;
        };
        if let Some(allowed) = &var.allowed_values
            && !allowed.value.iter().any(|a| scalar_eq(&a.value, &value))
        {
            let list: Vec<String> = allowed.value.iter().map(|a| show(var, &a.value)).collect();
            diags.push(
                Diagnostic::new(
                    &codes::VARIABLE_INPUT,
                    var.name.span,
                    format!(
                        "--var {name}: `{}` is not one of the allowed values",
                        mask(var, text)
                    ),
                )
                .with_hint(format!("allowed: {}", list.join(", "))),
            );
        }
    }
}

/// Secret inputs never appear in messages.
fn mask<'a>(var: &Variable, text: &'a str) -> &'a str {
    if var.secret { "(secret)" } else { text }
}

/// A value of a non-string type is one substitution, or a literal of its type.
fn value_shape(ty: &str, t: &crate::subst::Template, name: &str, diags: &mut Diagnostics) {
    if ty == "string" {
        return;
    }
    if t.single_substitution().is_some() {
        return;
    }
    if t.has_substitutions() {
        diags.push(
            Diagnostic::new(
                &codes::VALUE_INTERPOLATION,
                t.span,
                format!("value `{name}` of type {ty} mixes text with substitutions; only string values interpolate"),
            )
            .with_hint(format!("make the whole value one substitution `${{..}}` yielding {}", crate::blueprint::article_of(ty))),
        );
        return;
    }
    let text: String = t
        .parts
        .iter()
        .map(|p| match p {
            Part::Lit(s) => s.as_str(),
            Part::Sub(_) => "",
        })
        .collect();
    let ok = match ty {
        "integer" | "float" | "boolean" => parse_input(ty, &text).is_some(),
        _ => false,
    };
    if !ok {
        let hint = match ty {
            "array" | "object" => format!(
                "{ty}s come from a substitution, e.g. `${{list(..)}}` or `${{jsondecode(..)}}`"
            ),
            _ => format!(
                "write {} such as {}",
                crate::blueprint::article_of(ty),
                match ty {
                    "integer" => "\"3\"",
                    "float" => "\"2.5\"",
                    _ => "\"true\"",
                }
            ),
        };
        diags.push(
            Diagnostic::new(
                &codes::VALUE_INTERPOLATION,
                t.span,
                format!("value `{name}` of type {ty} cannot be parsed from {text:?}"),
            )
            .with_hint(hint),
        );
    }
}

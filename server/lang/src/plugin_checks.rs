//! Validation that asks plugins: a provider's own resource validation and
//! custom variable type options. The pure, manifest-based checks are in
//! `validate::providers`; this module makes the calls and maps what comes
//! back onto the blueprint's source, so a provider's complaint about
//! `environment.variables.A` points at the line where `A` is written.

use crate::blueprint::{Blueprint, PathStep, Scalar, TKind, TNode};
use crate::diag::{Diagnostic, Diagnostics, Severity, codes};
use trellis_proto::plugin::v1 as pb;

/// What validation needs from the plugin host, as blocking calls. Errors are
/// messages naming the plugin (it crashed, timed out, is not installed).
pub trait PluginAccess {
    fn validate_resource(
        &self,
        resource_type: &str,
        name: &str,
        spec: pb::Value,
    ) -> Result<Vec<pb::Diagnostic>, String>;
    fn custom_variable_options(
        &self,
        variable_type: &str,
    ) -> Result<Vec<pb::CustomVariableOption>, String>;
    /// Several `validate_resource` calls, answered in order. Hosts override it to make the
    /// calls concurrently (a blueprint may have thousands of resources).
    fn validate_resources(
        &self,
        items: Vec<(String, String, pb::Value)>,
    ) -> Vec<Result<Vec<pb::Diagnostic>, String>> {
        items
            .into_iter()
            .map(|(ty, name, spec)| self.validate_resource(&ty, &name, spec))
            .collect()
    }
}

/// Runs the plugin-side checks for every resource and custom-typed variable
/// whose type a loaded provider declares (`known`).
pub fn check(
    bp: &Blueprint,
    known: &dyn Fn(&str) -> bool,
    plugins: &dyn PluginAccess,
    diags: &mut Diagnostics,
) {
    let asked: Vec<_> = bp
        .resources
        .iter()
        .filter_map(|r| match (&r.ty, &r.spec) {
            (Some(ty), Some(spec)) if known(&ty.value) => Some((r, ty, spec)),
            _ => None,
        })
        .collect();
    let answers = plugins.validate_resources(
        asked
            .iter()
            .map(|(r, ty, spec)| (ty.value.clone(), r.name.value.clone(), to_value(spec)))
            .collect(),
    );
    for ((r, ty, spec), answer) in asked.into_iter().zip(answers) {
        match answer {
            Ok(found) => {
                for d in found {
                    let steps = path_steps(d.path.as_ref());
                    let severity =
                        match pb::Severity::try_from(d.severity).unwrap_or(pb::Severity::Error) {
                            pb::Severity::Warning => Severity::Warning,
                            pb::Severity::Info => Severity::Info,
                            _ => Severity::Error,
                        };
                    let code = if d.code.is_empty() {
                        String::new()
                    } else {
                        format!(" [{}]", d.code)
                    };
                    let mut diag = Diagnostic::new(
                        &codes::PROVIDER_DIAGNOSTIC,
                        spec.locate(&steps),
                        format!(
                            "resource `{}` ({}){code}: {}",
                            r.name.value, ty.value, d.message
                        ),
                    );
                    diag.severity = severity;
                    if !d.hint.is_empty() {
                        diag.hint = Some(d.hint);
                    }
                    diags.push(diag);
                }
            }
            Err(message) => diags.push(Diagnostic::new(
                &codes::PLUGIN_UNAVAILABLE,
                ty.span,
                message,
            )),
        }
    }
    for v in &bp.variables {
        let Some(ty) = &v.ty else { continue };
        if !ty.value.contains('/') || !known(&ty.value) {
            continue;
        }
        let options = match plugins.custom_variable_options(&ty.value) {
            Ok(o) => o,
            Err(message) => {
                diags.push(Diagnostic::new(
                    &codes::PLUGIN_UNAVAILABLE,
                    ty.span,
                    message,
                ));
                continue;
            }
        };
        let labels: Vec<&str> = options.iter().map(|o| o.label.as_str()).collect();
        let mut written = Vec::new();
        if let Some(d) = &v.default {
            written.push(d);
        }
        if let Some(a) = &v.allowed_values {
            written.extend(a.value.iter());
        }
        for w in written {
            let Scalar::Str(label) = &w.value else {
                continue;
            };
            if !labels.contains(&label.as_str()) {
                let mut d = Diagnostic::new(
                    &codes::VARIABLE_OPTION,
                    w.span,
                    format!("`{label}` is not an option of variable type `{}`", ty.value),
                );
                d.hint = crate::diag::did_you_mean(label, labels.iter().copied())
                    .map(|s| format!("did you mean `{s}`?"))
                    .or_else(|| Some(format!("options: {}", labels.join(", "))));
                diags.push(d);
            }
        }
    }
}

/// A protocol attribute path as blueprint path steps (to locate it in a spec).
pub fn path_steps(path: Option<&pb::AttributePath>) -> Vec<PathStep> {
    path.map(|p| {
        p.steps
            .iter()
            .filter_map(|s| match &s.step {
                Some(pb::path_step::Step::Field(f)) => Some(PathStep::Field(f.clone())),
                Some(pb::path_step::Step::Index(i)) => Some(PathStep::Index(*i as usize)),
                None => None,
            })
            .collect()
    })
    .unwrap_or_default()
}

/// A spec as the plugin sees it before deploy: literals as written, and every
/// string with a substitution as `Unknown` (validation does not evaluate).
pub fn to_value(n: &TNode) -> pb::Value {
    use pb::value::Kind;
    let kind = match &n.kind {
        TKind::Null => Kind::Null(pb::NullValue::NullValue as i32),
        TKind::Bool(b) => Kind::Bool(*b),
        TKind::Int(i) => Kind::Int(*i),
        TKind::Float(f) => Kind::Float(*f),
        TKind::Str(t) => match t.as_literal() {
            Some(s) => Kind::String(s),
            None => Kind::Unknown(pb::Unknown {}),
        },
        TKind::List(items) => Kind::List(pb::ListValue {
            items: items.iter().map(to_value).collect(),
        }),
        TKind::Map(entries) => Kind::Map(pb::MapValue {
            entries: entries
                .iter()
                .map(|(k, v)| pb::MapEntry {
                    key: k.name.clone(),
                    value: Some(to_value(v)),
                })
                .collect(),
        }),
    };
    pb::Value {
        kind: Some(kind),
        sensitive: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::Diagnostics;
    use crate::document::{Format, parse};
    use crate::source::SourceMap;

    /// Answers like a provider that dislikes one nested field.
    struct Picky;

    impl PluginAccess for Picky {
        fn validate_resource(
            &self,
            _: &str,
            _: &str,
            spec: pb::Value,
        ) -> Result<Vec<pb::Diagnostic>, String> {
            // The substitution reaches the plugin as unknown, never as text.
            let Some(pb::value::Kind::Map(m)) = spec.kind else {
                return Err("not a map".into());
            };
            assert!(matches!(
                m.entries[1].value.as_ref().and_then(|v| v.kind.as_ref()),
                Some(pb::value::Kind::Unknown(_))
            ));
            let step = |f: &str| pb::PathStep {
                step: Some(pb::path_step::Step::Field(f.into())),
            };
            Ok(vec![pb::Diagnostic {
                severity: pb::Severity::Warning as i32,
                code: "picky.b".into(),
                message: "b is odd".into(),
                path: Some(pb::AttributePath {
                    steps: vec![step("nested"), step("b")],
                }),
                hint: String::new(),
            }])
        }

        fn custom_variable_options(
            &self,
            _: &str,
        ) -> Result<Vec<pb::CustomVariableOption>, String> {
            Ok(vec![pb::CustomVariableOption {
                label: "small".into(),
                ..Default::default()
            }])
        }
    }

    #[test]
    fn provider_findings_land_on_the_right_line() {
        let text = "version: 2023-04-20
variables:
  size:
    type: p/size
    default: smal
resources:
  r:
    type: p/thing
    spec:
      a: 1
      u: ${variables.size}
      nested:
        b: 2
";
        let mut sources = SourceMap::new();
        let file = sources.add("bp.yaml", text.to_owned());
        let mut diags = Diagnostics::default();
        let root = parse(&sources, file, Format::Yaml, &mut diags).unwrap();
        let bp = crate::blueprint::load(&root, sources.get(file), file, &mut diags);
        check(&bp, &|ty| ty.starts_with("p/"), &Picky, &mut diags);
        let found: Vec<(&str, u32, Severity)> = diags
            .items
            .iter()
            .map(|d| (d.code.id, sources.resolve(d.span).0.line, d.severity))
            .collect();
        assert_eq!(
            found,
            [
                ("T0811", 13, Severity::Warning),
                ("T0810", 5, Severity::Error)
            ]
        );
        assert!(diags.items[0].message.contains("[picky.b]: b is odd"));
    }
}

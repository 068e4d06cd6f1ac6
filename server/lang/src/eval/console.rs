//! The blueprint console behind `trellis eval`, as a library so tests and
//! the conformance corpus run exactly what the command runs.

use super::blueprint::{Evaluation, evaluate_with, resolve_variables};
use super::expr::ExternalFunctions;
use super::functions::Env;
use super::limits::{Budget, Limits};
use super::value::Value;
use crate::blueprint::{self, Blueprint, Spanned, Variable};
use crate::diag::Diagnostics;
use crate::document::{self, Format};
use crate::functions::CoreFunctions;
use crate::source::{SourceMap, Span};
use crate::subst::{SpanMap, parse_template};
use crate::validate::providers::Manifests;
use crate::validate::{self, Options};

/// What evaluating an expression gave.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Value(Value),
    /// Known only after deploy.
    Unknown,
    /// Derived from a secret: not to be shown.
    Sensitive(Value),
    /// Diagnostics explain why (see [`Console::diags`]).
    Failed,
}

/// Provider knowledge for the console: manifests (for checking calls) and a
/// way to call provider functions.
#[derive(Clone, Copy)]
pub struct Plugins<'p> {
    pub manifests: &'p Manifests,
    pub functions: &'p dyn ExternalFunctions,
}

pub struct Console<'p> {
    plugins: Option<Plugins<'p>>,
    pub sources: SourceMap,
    pub blueprint: Blueprint,
    pub evaluation: Evaluation,
    pub diags: Diagnostics,
    vars: Vec<(String, String)>,
}

impl<'p> Console<'p> {
    /// Loads, validates and evaluates a blueprint given as (name, bytes); or,
    /// without one, declares every `--var` as a string variable. Problems
    /// are in `diags`; check `ready()` before evaluating.
    pub fn new(
        blueprint: Option<(&str, Vec<u8>)>,
        vars: &[(String, String)],
        env: &Env<'_>,
        max_input: usize,
    ) -> Console<'p> {
        Console::with_plugins(blueprint, vars, env, max_input, None)
    }

    /// Like [`Console::new`], with provider functions available to `${..}`.
    pub fn with_plugins(
        blueprint: Option<(&str, Vec<u8>)>,
        vars: &[(String, String)],
        env: &Env<'_>,
        max_input: usize,
        plugins: Option<Plugins<'p>>,
    ) -> Console<'p> {
        Console::with_limits(blueprint, vars, env, max_input, plugins, Limits::default())
    }

    /// Like [`Console::with_plugins`], with the evaluation bounded by `limits`.
    pub fn with_limits(
        blueprint: Option<(&str, Vec<u8>)>,
        vars: &[(String, String)],
        env: &Env<'_>,
        max_input: usize,
        plugins: Option<Plugins<'p>>,
        limits: Limits,
    ) -> Console<'p> {
        let mut c = Console {
            plugins,
            sources: SourceMap::new(),
            blueprint: Blueprint::default(),
            evaluation: Evaluation::default(),
            diags: Diagnostics::default(),
            vars: vars.to_vec(),
        };
        let with_providers = plugins.map(|p| p.manifests.functions());
        let functions: &dyn crate::functions::FunctionCatalog = match &with_providers {
            Some(f) => f,
            None => &CoreFunctions,
        };
        let opts = Options {
            functions,
            providers: None,
            variables: vars,
            unchecked_functions: false,
        };
        let external = plugins.map(|p| p.functions);
        match blueprint {
            Some((name, bytes)) => {
                let Some(file) =
                    document::load_bytes(&mut c.sources, name, bytes, max_input, &mut c.diags)
                else {
                    return c;
                };
                let Some(root) =
                    document::parse(&c.sources, file, Format::from_path(name), &mut c.diags)
                else {
                    return c;
                };
                let src = c.sources.get(file);
                c.blueprint = blueprint::load(&root, src, file, &mut c.diags);
                // The tree is no longer needed: its memory is reused below.
                drop(root);
                let graph = validate::validate(&c.blueprint, src, &opts, &mut c.diags);
                if !c.diags.has_errors() {
                    c.evaluation = evaluate_with(
                        &c.blueprint,
                        &graph,
                        vars,
                        env,
                        external,
                        None,
                        limits,
                        &mut c.diags,
                    );
                }
            }
            None => {
                c.blueprint = vars_only_blueprint(vars);
                c.evaluation = resolve_variables(&c.blueprint, vars);
                c.evaluation.budget = Budget::new(limits);
            }
        }
        c
    }

    /// Whether the blueprint loaded without errors.
    pub fn ready(&self) -> bool {
        !self.diags.has_errors()
    }

    /// Evaluates a string that may contain `${..}` substitutions.
    pub fn eval(&mut self, expr: &str, env: &Env<'_>) -> Outcome {
        let file = self.sources.add("<expr>", expr.to_owned());
        let map = SpanMap::verbatim(file, 0);
        let mut local = Diagnostics::default();
        let t = parse_template(expr, &map, Span::new(file, 0, expr.len()), &mut local);
        if !local.has_errors() {
            let with_providers = self.plugins.map(|p| p.manifests.functions());
            let functions: &dyn crate::functions::FunctionCatalog = match &with_providers {
                Some(f) => f,
                None => &CoreFunctions,
            };
            let opts = Options {
                functions,
                providers: None,
                variables: &self.vars,
                unchecked_functions: false,
            };
            validate::check_template(&self.blueprint, &opts, &t, &mut local);
        }
        let failed = local.has_errors();
        self.diags.extend(local.items);
        if failed {
            return Outcome::Failed;
        }
        let scope = self
            .evaluation
            .scope_with(env, None, self.plugins.map(|p| p.functions));
        match scope.guard(scope.whole(&t)) {
            Ok(v) if scope.touched_secret.get() => Outcome::Sensitive(v),
            Ok(Value::Unknown) => Outcome::Unknown,
            Ok(v) => Outcome::Value(v),
            Err(e) => {
                self.diags.push(e.into_diagnostic());
                Outcome::Failed
            }
        }
    }
}

/// Without a blueprint, every `--var` is a declared string variable.
fn vars_only_blueprint(vars: &[(String, String)]) -> Blueprint {
    let mut bp = Blueprint::default();
    for (name, _) in vars {
        if bp.variables.iter().any(|v| &v.name.value == name) {
            continue;
        }
        bp.variables.push(Variable {
            name: Spanned {
                value: name.clone(),
                span: Span::default(),
            },
            ty: Some(Spanned {
                value: "string".into(),
                span: Span::default(),
            }),
            description: None,
            secret: false,
            default: None,
            allowed_values: None,
        });
    }
    bp
}

//! `trellis eval`: the blueprint console.

use crate::blueprint::{self, Blueprint, Spanned, Variable};
use crate::cli::{EvalArgs, OutputFormat, read_limited};
use crate::diag::{self, Diagnostics};
use crate::document::{self, Format};
use crate::eval::blueprint::{Evaluation, evaluate, resolve_variables};
use crate::eval::functions::Env;
use crate::eval::render::{self, SENSITIVE_TEXT};
use crate::eval::value::Value;
use crate::functions::CoreFunctions;
use crate::source::{SourceMap, Span};
use crate::subst::{SpanMap, parse_template};
use crate::validate::{self, Options};
use serde_json::json;
use std::fmt::Write as _;
use std::process::ExitCode;

pub fn run(args: &EvalArgs) -> ExitCode {
    let mut sources = SourceMap::new();
    let mut diags = Diagnostics::default();
    let opts = Options {
        functions: &CoreFunctions,
        providers: None,
        variables: &args.vars,
    };
    let cwd = std::env::current_dir()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let now_unix_nanos = match args.now {
        Some(secs) => i128::from(secs) * 1_000_000_000,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(0),
    };
    let link = |_: &str, _: &str| Value::Unknown;
    let env = Env {
        cwd: &cwd,
        now_unix_nanos,
        link: &link,
    };

    // The blueprint (or, without one, a stand-in declaring the --var names).
    let (bp, evaluation) = match &args.blueprint {
        Some(path) => {
            let bytes = match read_limited(path, args.max_input_size) {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("error: cannot read {path}: {e}");
                    return ExitCode::from(2);
                }
            };
            let Some(file) =
                document::load_bytes(&mut sources, path, bytes, args.max_input_size, &mut diags)
            else {
                return fail(args.format, &sources, diags);
            };
            let Some(root) = document::parse(&sources, file, Format::from_path(path), &mut diags)
            else {
                return fail(args.format, &sources, diags);
            };
            let src = sources.get(file);
            let bp = blueprint::load(&root, src, file, &mut diags);
            let graph = validate::validate(&bp, src, &opts, &mut diags);
            if diags.has_errors() {
                return fail(args.format, &sources, diags);
            }
            let ev = evaluate(&bp, &graph, &args.vars, &env, &mut diags);
            (bp, ev)
        }
        None => {
            let bp = vars_only_blueprint(&args.vars);
            let ev = resolve_variables(&bp, &args.vars);
            (bp, ev)
        }
    };

    let mut out = String::new();
    if args.expand {
        if diags.has_errors() {
            return fail(args.format, &sources, diags);
        }
        out.push_str(&match args.format {
            OutputFormat::Json => expansion_json(&evaluation),
            OutputFormat::Text => expansion_text(&evaluation),
        });
    }
    if let Some(expr) = &args.expr {
        let file = sources.add("<expr>", expr.clone());
        let map = SpanMap::verbatim(file, 0);
        let mut local = Diagnostics::default();
        let t = parse_template(expr, &map, Span::new(file, 0, expr.len()), &mut local);
        if !local.has_errors() {
            validate::check_template(&bp, &opts, &t, &mut local);
        }
        if local.has_errors() {
            diags.extend(local.items);
            return fail(args.format, &sources, diags);
        }
        let scope = evaluation.scope(&env, None);
        let value = match scope.whole(&t) {
            Ok(v) => v,
            Err(e) => {
                diags.push(e.into_diagnostic());
                return fail(args.format, &sources, diags);
            }
        };
        let secret = scope.touched_secret.get();
        out.push_str(&match args.format {
            OutputFormat::Json => {
                let j = if secret {
                    json!({"sensitive": true})
                } else if value.is_unknown() {
                    json!({"unknown": true})
                } else {
                    json!({"value": render::to_json(&value)})
                };
                j.to_string()
            }
            OutputFormat::Text if secret => SENSITIVE_TEXT.to_owned(),
            OutputFormat::Text => render::to_text(&value),
        });
        out.push('\n');
    }
    print!("{out}");
    ExitCode::SUCCESS
}

/// Prints diagnostics in the chosen format and exits 1.
fn fail(format: OutputFormat, sources: &SourceMap, mut diags: Diagnostics) -> ExitCode {
    diags.sort();
    match format {
        OutputFormat::Json => {
            let items: Vec<String> = diags
                .items
                .iter()
                .map(|d| diag::render_json(d, sources))
                .collect();
            println!("{{\"diagnostics\":[{}]}}", items.join(","));
        }
        OutputFormat::Text => {
            for d in &diags.items {
                println!("{}", diag::render_text(d, sources));
            }
        }
    }
    if diags.has_errors() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
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

fn expansion_json(ev: &Evaluation) -> String {
    let resources: Vec<serde_json::Value> = ev
        .resources
        .iter()
        .map(|x| {
            let exists = match &x.condition {
                None | Some(Value::Bool(true)) => json!(true),
                Some(Value::Bool(false)) => json!(false),
                _ => json!({"unknown": true}),
            };
            json!({
                "name": x.name,
                "template": x.template,
                "index": x.index,
                "type": x.ty,
                "exists": exists,
                "spec": render::to_json(&x.display_spec),
                "metadata": render::to_json(&x.metadata),
            })
        })
        .collect();
    let values: serde_json::Map<String, serde_json::Value> = ev
        .values
        .iter()
        .map(|(k, v)| {
            let shown = if ev.is_secret_value(k) {
                json!({"sensitive": true})
            } else {
                render::to_json(v)
            };
            (k.clone(), shown)
        })
        .collect();
    format!("{}\n", json!({"values": values, "resources": resources}))
}

fn expansion_text(ev: &Evaluation) -> String {
    let mut out = String::new();
    if !ev.values.is_empty() {
        out.push_str("values:\n");
        for (k, v) in &ev.values {
            let shown = if ev.is_secret_value(k) {
                SENSITIVE_TEXT.to_owned()
            } else {
                render::to_text(v)
            };
            let _ = writeln!(out, "  {k} = {}", indent(&shown, 4));
        }
    }
    let existing = ev.resources.iter().filter(|x| x.included()).count();
    let _ = writeln!(
        out,
        "resources ({existing} of {} exist):",
        ev.resources.len()
    );
    for x in &ev.resources {
        let origin = match x.index {
            Some(i) => format!("  ({}[{i}])", x.template),
            None => String::new(),
        };
        let status = match &x.condition {
            Some(Value::Bool(false)) => "  skipped: condition is false",
            Some(Value::Unknown) => "  exists if its condition holds (known after deploy)",
            _ => "",
        };
        let _ = writeln!(out, "  {}  {}{origin}{status}", x.name, x.ty);
        if !x.included() {
            continue;
        }
        let _ = writeln!(
            out,
            "    spec: {}",
            indent(&render::to_text(&x.display_spec), 4)
        );
    }
    out
}

fn indent(text: &str, by: usize) -> String {
    text.replace('\n', &format!("\n{}", " ".repeat(by)))
}

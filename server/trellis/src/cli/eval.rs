//! `trellis eval`: the blueprint console.

use crate::cli::{EvalArgs, OutputFormat, read_limited};
use crate::diag::codes;
use crate::diag::{self, Diagnostics};
use crate::eval::blueprint::Evaluation;
use crate::eval::console::{Console, Outcome, Plugins};
use crate::eval::functions::Env;
use crate::eval::render::{self, SENSITIVE_TEXT};
use crate::eval::value::Value;
use crate::source::SourceMap;
use serde_json::json;
use std::fmt::Write as _;
use std::process::ExitCode;

pub(crate) fn run(args: &EvalArgs) -> ExitCode {
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

    let blueprint = match &args.blueprint {
        Some(path) => match read_limited(path, args.max_input_size) {
            Ok(bytes) => Some((path.as_str(), bytes)),
            Err(e) => {
                eprintln!("error: cannot read {path}: {e}");
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    // Plugins are started only when the blueprint or the expression calls a
    // function the core set does not have; otherwise the first console is
    // the one used.
    let unknown_function = |c: &Console| {
        c.diags
            .items
            .iter()
            .any(|d| d.code == &codes::UNKNOWN_FUNCTION)
    };
    let limits = args.limits.limits();
    let mut probe = Console::with_limits(
        blueprint.clone(),
        &args.vars,
        &env,
        args.max_input_size,
        None,
        limits,
    );
    let mut outcome = None;
    if probe.ready()
        && let Some(expr) = &args.expr
    {
        outcome = Some(probe.eval(expr, &env));
    }
    let rt;
    let host;
    let context;
    let mut console = if unknown_function(&probe) {
        outcome = None;
        rt = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("error: cannot start the async runtime: {e}");
                return ExitCode::from(2);
            }
        };
        host = crate::plugins::PluginHost::new(args.plugins.host_config());
        context = crate::check::PluginContext::load(&host, rt.handle().clone());
        let plugins = Plugins {
            manifests: &context.manifests,
            functions: &context,
        };
        Console::with_limits(
            blueprint,
            &args.vars,
            &env,
            args.max_input_size,
            Some(plugins),
            limits,
        )
    } else {
        probe
    };
    if !console.ready() {
        return fail(args.format, &console.sources, console.diags);
    }
    let mut out = String::new();
    if args.expand {
        out.push_str(&match args.format {
            OutputFormat::Json => expansion_json(&console.evaluation),
            OutputFormat::Text => expansion_text(&console.evaluation),
        });
    }
    if let Some(expr) = &args.expr {
        let outcome = match outcome.take() {
            Some(o) => o,
            None => console.eval(expr, &env),
        };
        out.push_str(&match (outcome, args.format) {
            (Outcome::Failed, _) => return fail(args.format, &console.sources, console.diags),
            (Outcome::Sensitive(_), OutputFormat::Json) => json!({"sensitive": true}).to_string(),
            (Outcome::Unknown, OutputFormat::Json) => json!({"unknown": true}).to_string(),
            (Outcome::Value(v), OutputFormat::Json) => {
                json!({"value": render::to_json(&v)}).to_string()
            }
            (Outcome::Sensitive(_), OutputFormat::Text) => SENSITIVE_TEXT.to_owned(),
            (Outcome::Unknown, OutputFormat::Text) => render::UNKNOWN_TEXT.to_owned(),
            (Outcome::Value(v), OutputFormat::Text) => render::to_text(&v),
        });
        out.push('\n');
    }
    print!("{out}");
    // The process ends here; tearing down a large evaluation only costs time.
    std::mem::forget(console);
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
                "spec": render::to_json(ev.display_spec(x)),
                "metadata": render::to_json(ev.display_metadata(x)),
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
            indent(&render::to_text(ev.display_spec(x)), 4)
        );
    }
    out
}

fn indent(text: &str, by: usize) -> String {
    text.replace('\n', &format!("\n{}", " ".repeat(by)))
}

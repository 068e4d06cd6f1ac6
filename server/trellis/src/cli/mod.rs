//! The `trellis` command line.
//!
//! Exit codes are part of the interface CI relies on: 0 success, 1 the
//! blueprint (or operation) failed, 2 the command itself could not run
//! (bad flags, unreadable file, engine unreachable), 3 drift found (`drift`).

use crate::diag::{self, Diagnostics};
use crate::document::DEFAULT_MAX_INPUT_BYTES;
use crate::eval::limits;
use crate::functions::CoreFunctions;
use crate::source::SourceMap;
use crate::validate::Options;
use clap::{Parser, Subcommand, ValueEnum};
use std::io::Write;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "trellis",
    version,
    about = "Deploy engine for the Blueprint Specification v2023-04-20",
    long_about = "Trellis validates, plans and deploys blueprints: YAML or JSON documents of \
variables, values, data sources, resources, child blueprints and exports.\n\n\
`trellis serve` runs the engine; plan, deploy, destroy, instances, instance, events, drift, \
reconcile and cancel are its clients (--engine ADDR or TRELLIS_ENGINE).\n\n\
Exit codes: 0 success, 1 the blueprint or operation failed, 2 the command could not run \
(usage, unreadable file, engine unreachable), 3 drift found (`trellis drift`)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Check blueprints against the specification and report every problem.
    ///
    /// Reads YAML (.yaml, .yml) or JSON (.json, .jsonc; comments and trailing
    /// commas allowed). Reports all problems in one run, each with a stable
    /// code (see `trellis explain`). Exits 0 when no file has an error, 1 when
    /// one does, 2 when a file cannot be read.
    Validate(ValidateArgs),
    /// Evaluate a string with `${..}` substitutions, like a blueprint console.
    ///
    /// Without --blueprint, `${variables.x}` reads `--var x=...` (as a string).
    /// With --blueprint, the blueprint's variables, values and resource specs
    /// resolve; resource state, data sources and children print as
    /// `(known after deploy)`. --expand prints the blueprint's resources after
    /// `each` expansion and conditions. Anything derived from a secret prints
    /// as `(sensitive)`.
    ///
    /// --format json prints {"value": ...}, {"unknown": true} when the value is
    /// known only after deploy, {"sensitive": true} for a secret, or
    /// {"diagnostics": [...]} (exit 1) on error.
    Eval(EvalArgs),
    /// Describe diagnostic codes: `trellis explain T0501`, or `--all` for the
    /// whole registry as Markdown (the source of docs/diagnostics.md).
    Explain(ExplainArgs),
    /// Provider and transformer plugins: list them, call a provider function.
    Plugins(crate::cli::plugin_cmds::PluginsArgs),
    /// Run the engine daemon: the engine API over gRPC (with health and reflection), state in
    /// the data directory (SQLite) or in PostgreSQL (--state), plugins discovered next to
    /// `trellis` and in --plugin-dir.
    ///
    /// Settings come from flags, TRELLIS_* environment variables and an optional TOML file
    /// (--config), in that order of precedence; docs/serve.md lists them all. Prints
    /// `trellis engine listening on ADDR` once it accepts connections. SIGTERM or SIGINT drains:
    /// no new operations, running ones stop at a safe point within --drain-timeout (or are
    /// marked interrupted), plugins stop, exit 0.
    Serve(Box<crate::serve::ServeArgs>),
    /// Engine API tokens: `trellis token create --name N --role R --tokens-file F`
    /// (docs/auth.md).
    Token(crate::cli::token::TokenArgs),
    // Client commands (plan, deploy, destroy, instances, ...): their help is in cli/client/.
    #[command(flatten)]
    Client(crate::cli::client::ClientCommand),
}

pub mod client;
pub mod environment;
mod eval;
pub mod inputs;
pub mod plugin_check;
pub mod plugin_cmds;
pub mod token;
mod transformed;
mod yaml;

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// The text to evaluate, e.g. '${to_upper(variables.env)}'.
    #[arg(value_name = "EXPR", required_unless_present = "expand")]
    pub expr: Option<String>,
    /// A blueprint whose variables, values and resources the expression may reference.
    #[arg(long, value_name = "FILE")]
    pub blueprint: Option<String>,
    /// A variable value.
    #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_var)]
    pub vars: Vec<(String, String)>,
    /// Print the blueprint's resources after `each` expansion and conditions.
    #[arg(long, requires = "blueprint")]
    pub expand: bool,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
    /// The current time as Unix seconds, for reproducible `datetime(..)`.
    #[arg(long, value_name = "UNIX_SECONDS")]
    pub now: Option<i64>,
    /// Refuse a blueprint larger than this many bytes.
    #[arg(long, value_name = "BYTES", env = "TRELLIS_MAX_INPUT_SIZE", default_value_t = DEFAULT_MAX_INPUT_BYTES)]
    pub max_input_size: usize,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub plugins: plugin_cmds::PluginDirArgs,
}

#[derive(clap::Args, Debug)]
pub struct ValidateArgs {
    /// Blueprint files to validate.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<String>,
    /// Output format: rustc-style text, or one JSON object.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
    /// A variable value to check against its definition (type, allowed values).
    #[arg(long = "var", value_name = "NAME=VALUE", value_parser = parse_var)]
    pub vars: Vec<(String, String)>,
    #[command(flatten)]
    pub inputs: inputs::InputArgs,
    /// Skip everything that needs plugins: resource and data source types,
    /// spec schemas, provider validation, custom variable types, provider
    /// functions and `transform:`. Validation then needs no plugin installed; a call to a
    /// function that is not a core one is a warning (it may be a provider's).
    #[arg(long)]
    pub skip_provider_checks: bool,
    /// Also print each blueprint as validated after its transforms (`transform:`), every
    /// generated resource with the abstract resource it came from: YAML before the
    /// diagnostics, or `transformed` in the JSON object.
    #[arg(long, conflicts_with = "skip_provider_checks")]
    pub show_transformed: bool,
    #[command(flatten)]
    pub plugins: plugin_cmds::PluginDirArgs,
    /// Refuse inputs larger than this many bytes.
    #[arg(long, value_name = "BYTES", env = "TRELLIS_MAX_INPUT_SIZE", default_value_t = DEFAULT_MAX_INPUT_BYTES)]
    pub max_input_size: usize,
}

#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// A code (`T0501`) or name (`unknown-variable`).
    #[arg(required_unless_present = "all")]
    pub code: Option<String>,
    /// Print the whole registry as a Markdown table.
    #[arg(long)]
    pub all: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

fn parse_var(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected NAME=VALUE, got `{s}`")),
    }
}

pub fn main() -> ExitCode {
    let command = match Cli::parse().command {
        // The daemon configures its own logging (level and format are settings).
        Command::Serve(args) => return crate::serve::run(*args),
        other => other,
    };
    plugin_cmds::init_tracing();
    match command {
        Command::Validate(args) => run_validate(&args),
        Command::Eval(args) => crate::cli::eval::run(&args),
        Command::Explain(args) => run_explain(&args),
        Command::Plugins(args) => plugin_cmds::run(&args),
        Command::Token(args) => token::run(&args),
        Command::Serve(args) => crate::serve::run(*args),
        Command::Client(command) => crate::cli::client::run(command),
    }
}

/// The result of validating files: the sources (for rendering) and what was found.
pub struct Report {
    pub sources: SourceMap,
    pub diagnostics: Diagnostics,
}

impl Report {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.has_errors()
    }

    pub fn to_json(&self) -> String {
        let mut out = format!("{{\"valid\":{},\"diagnostics\":[", !self.has_errors());
        for (i, d) in self.diagnostics.items.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&diag::render_json(d, &self.sources));
        }
        out.push_str("]}");
        out
    }

    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for d in &self.diagnostics.items {
            out.push_str(&diag::render_text(d, &self.sources));
            out.push('\n');
        }
        out
    }
}

use crate::validate::validate_source_with_children;

fn run_validate(args: &ValidateArgs) -> ExitCode {
    let resolved = match inputs::resolve(&args.inputs, &args.vars) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let variables = resolved.pairs();
    let environment = resolved.environment_model();
    let opts = Options {
        functions: &CoreFunctions,
        providers: None,
        variables: &variables,
        // Only used with --skip-provider-checks: provider functions are unknown then.
        unchecked_functions: true,
    };
    let mut report = Report {
        sources: SourceMap::new(),
        diagnostics: Diagnostics::default(),
    };
    // `--show-transformed`: what was validated, per file that could be read.
    let mut shown_files: Vec<transformed::Shown> = Vec::new();
    let mut inputs = Vec::with_capacity(args.paths.len());
    for path in &args.paths {
        match read_limited(path, args.max_input_size) {
            Ok(b) => inputs.push((path, b)),
            Err(e) => {
                eprintln!("error: cannot read {path}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    // A local child file is checked against what its include passes; one that cannot be
    // read (or is too large) is left for plan to report.
    let read_child = |child: &str| read_limited(child, args.max_input_size).ok();
    if args.skip_provider_checks {
        for (path, bytes) in inputs {
            validate_source_with_children(
                &mut report.sources,
                path,
                bytes,
                &opts,
                args.max_input_size,
                &read_child,
                &mut report.diagnostics,
            );
        }
    } else {
        let rt = match tokio::runtime::Builder::new_multi_thread()
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
        let host = crate::plugins::PluginHost::new(args.plugins.host_config());
        {
            // Without an engine there are no engine settings: the environment's alone apply.
            let merged = match crate::engine::settings::merge(&Default::default(), &environment) {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            let scopes =
                crate::engine::settings::injector_scopes(&Default::default(), &environment);
            let additions = crate::check::Additions {
                injectors: &scopes,
                secret_variables: &environment.secret_variables,
            };
            let plugins = crate::check::PluginContext::load(&host, rt.handle().clone())
                .with_configs(merged.configs());
            for (path, bytes) in inputs {
                let checked = crate::check::check_source(
                    &mut report.sources,
                    path,
                    bytes,
                    &variables,
                    additions,
                    args.max_input_size,
                    &plugins,
                    &read_child,
                    &mut report.diagnostics,
                );
                if args.show_transformed
                    && let Some(shown) = checked
                        .as_ref()
                        .and_then(|c| transformed::Shown::of(&report.sources, path, c))
                {
                    shown_files.push(shown);
                }
            }
        }
        rt.block_on(host.shutdown());
    }
    let mut stdout = std::io::stdout().lock();
    let written = match args.format {
        OutputFormat::Json if args.show_transformed => {
            let mut json = report.to_json();
            json.pop(); // the closing brace
            let shown: Vec<_> = shown_files
                .iter()
                .map(transformed::Shown::to_json)
                .collect();
            writeln!(
                stdout,
                "{json},\"transformed\":{}}}",
                serde_json::Value::Array(shown)
            )
        }
        OutputFormat::Json => writeln!(stdout, "{}", report.to_json()),
        OutputFormat::Text => {
            for shown in &shown_files {
                if writeln!(stdout, "{}", shown.to_yaml()).is_err() {
                    return ExitCode::from(2);
                }
            }
            let errors = report
                .diagnostics
                .items
                .iter()
                .filter(|d| d.is_error())
                .count();
            let warnings = report.diagnostics.items.len() - errors;
            let files = args.paths.len();
            let summary = if errors > 0 {
                format!(
                    "error: validation failed: {errors} error{}, {warnings} warning{} in {files} file{}",
                    plural(errors),
                    plural(warnings),
                    plural(files)
                )
            } else {
                format!(
                    "ok: {files} file{} valid{}",
                    plural(files),
                    if warnings > 0 {
                        format!(" ({warnings} warning{})", plural(warnings))
                    } else {
                        String::new()
                    }
                )
            };
            writeln!(stdout, "{}{summary}", report.to_text())
        }
    };
    if written.is_err() {
        // stdout closed (e.g. piped into `head`): nothing more to say.
        return ExitCode::from(2);
    }
    let failed = report.has_errors();
    // The process ends here; tearing down large trees only costs time.
    std::mem::forget(report);
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// "s" unless `n` is 1.
pub(crate) fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Reads at most `limit + 1` bytes, so an enormous file (or a device) is
/// refused without being read whole.
pub(crate) fn read_limited(
    path: impl AsRef<std::path::Path>,
    limit: usize,
) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    if file.metadata()?.is_dir() {
        return Err(std::io::Error::other("is a directory"));
    }
    let mut buf = Vec::new();
    file.take(limit as u64 + 1).read_to_end(&mut buf)?;
    Ok(buf)
}

fn run_explain(args: &ExplainArgs) -> ExitCode {
    if args.all {
        print!("{}", diag::registry_markdown());
        return ExitCode::SUCCESS;
    }
    let key = args.code.as_deref().unwrap_or_default();
    match diag::lookup(key) {
        Some(c) => {
            println!(
                "{} ({}, {}): {}",
                c.id,
                c.name,
                c.severity.as_str(),
                c.summary
            );
            ExitCode::SUCCESS
        }
        None => {
            eprintln!("error: no diagnostic code `{key}`; `trellis explain --all` lists them");
            ExitCode::from(2)
        }
    }
}

/// `trellis eval`'s flags for the limits (`trellis serve` has the same settings, also in its
/// config file).
#[derive(clap::Args, Clone, Debug)]
pub struct LimitArgs {
    /// Largest string, array or object one expression may produce, in bytes (default 8 MiB).
    #[arg(long, value_name = "BYTES", env = "TRELLIS_MAX_VALUE_BYTES", default_value_t = limits::DEFAULT_MAX_VALUE_BYTES, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_value_bytes: u64,
    /// Most resources a blueprint may have after `each` expansion (default 20000).
    #[arg(long, value_name = "N", env = "TRELLIS_MAX_RESOURCES", default_value_t = limits::DEFAULT_MAX_RESOURCES, value_parser = at_least_one)]
    pub max_resources: usize,
    /// Most bytes one evaluation may produce in total, in bytes (default 256 MiB).
    #[arg(long, value_name = "BYTES", env = "TRELLIS_MAX_EVAL_BYTES", default_value_t = limits::DEFAULT_MAX_EVAL_BYTES, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_eval_bytes: u64,
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

impl LimitArgs {
    pub fn limits(&self) -> limits::Limits {
        limits::Limits {
            max_value_bytes: self.max_value_bytes,
            max_resources: self.max_resources,
            max_eval_bytes: self.max_eval_bytes,
        }
    }
}

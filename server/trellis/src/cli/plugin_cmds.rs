//! `trellis plugins`: list discovered plugins, call a provider function.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use serde_json::json;

use crate::cli::OutputFormat;
use crate::plugins::{CallOptions, HostConfig, PluginError, PluginHost, PluginKind, values};

#[derive(clap::Args, Debug)]
pub struct PluginsArgs {
    #[command(subcommand)]
    pub command: PluginsCommand,
}

#[derive(Subcommand, Debug)]
pub enum PluginsCommand {
    /// List the discovered plugins: kind, name, path, version and what they
    /// provide.
    ///
    /// Manifests come from the cache (keyed by the plugin binary's SHA-256);
    /// only plugins without a cached manifest are started. Exits 1 when a
    /// plugin cannot be read.
    List(PluginsListArgs),
    /// Call a provider function and print its result as JSON.
    ///
    /// JSON_ARGS is a JSON array of the arguments (`'["a", 1]'`); any other
    /// JSON value is a single argument. Exits 1 when the call fails (the
    /// function's error, a crash, a timeout), 2 when it cannot be made.
    Call(PluginsCallArgs),
    /// Forget the cached manifests of plugins (all, or those named) and read
    /// them again, then list the plugins as `list` does.
    ///
    /// The cache is keyed by the executable's content, so a plugin whose
    /// manifest changes while its executable does not (a script behind a
    /// launcher, while you develop it) keeps showing the old one until it is
    /// refreshed. Give the engine's --data-dir to refresh its cache; a running
    /// engine keeps the manifests it read until it restarts. Exits 1 when a
    /// plugin cannot be read, 2 when a name matches no plugin.
    Refresh(PluginsRefreshArgs),
    /// Check a plugin against the protocol: the conformance harness for
    /// plugin authors (docs/plugin-protocol.md, "Checking a plugin").
    ///
    /// Without --cases: launch and handshake (the stdout line, the nonce, the
    /// protocol version, its name, a 0600 socket), health, the manifest
    /// (schemas, computed fields not required, link types, functions), and
    /// exiting 0 with the socket removed on SIGTERM and when stdin closes.
    /// With --cases FILE (a YAML or JSON list of `{type, config?, spec,
    /// update?}`), each case runs through validate, create, read (a field that
    /// reads back differently is phantom drift), the same create again with the
    /// same idempotency key (no second resource), update, read, destroy, read
    /// (gone) and destroy again. Each finding names the RPC and the field.
    /// Exits 0 when nothing is found, 1 on any finding, 2 when the check
    /// cannot run.
    Check(super::plugin_check::PluginsCheckArgs),
}

/// Where plugins are found and where the host keeps its files; shared by
/// every command that talks to plugins.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PluginDirArgs {
    /// A directory to search for `trellis-provider-*` and
    /// `trellis-transformer-*` executables, before the directory holding
    /// `trellis` itself. Repeatable; TRELLIS_PLUGIN_DIR is a `:`-separated list.
    #[arg(
        long = "plugin-dir",
        value_name = "DIR",
        env = "TRELLIS_PLUGIN_DIR",
        value_delimiter = ':'
    )]
    pub plugin_dirs: Vec<PathBuf>,
    /// Do not search the directory holding the `trellis` executable.
    #[arg(
        long,
        env = "TRELLIS_NO_BUNDLED_PLUGINS",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub no_bundled_plugins: bool,
    /// The data directory: manifest cache in DIR/plugin-cache, plugin
    /// sockets in DIR/run. Without it: $XDG_CACHE_HOME/trellis (or
    /// ~/.cache/trellis) and $TMPDIR/trellis-<uid>.
    #[arg(long, value_name = "DIR", env = "TRELLIS_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

impl PluginDirArgs {
    pub fn host_config(&self) -> HostConfig {
        let mut config = match &self.data_dir {
            Some(dir) => HostConfig::with_data_dir(dir),
            None => HostConfig {
                cache_dir: default_cache_dir(),
                ..HostConfig::default()
            },
        };
        config.plugin_dirs = self.plugin_dirs.clone();
        config.search_exe_dir = !self.no_bundled_plugins;
        // A command line tool has nothing to wait for at exit.
        config.shutdown_grace = Duration::from_secs(2);
        config
    }
}

fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("trellis").join("plugin-cache"))
}

#[derive(clap::Args, Debug)]
pub struct PluginsRefreshArgs {
    /// Plugin names (a provider's namespace, a transformer's name); all
    /// plugins when none is given.
    #[arg(value_name = "NAME")]
    pub names: Vec<String>,
    #[command(flatten)]
    pub list: PluginsListArgs,
}

#[derive(clap::Args, Debug)]
pub struct PluginsListArgs {
    #[command(flatten)]
    pub dirs: PluginDirArgs,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
}

#[derive(clap::Args, Debug)]
pub struct PluginsCallArgs {
    /// The provider namespace, e.g. `sim`.
    pub namespace: String,
    /// The function name, e.g. `echo`.
    pub function: String,
    /// The arguments as a JSON array.
    #[arg(value_name = "JSON_ARGS")]
    pub args: Option<String>,
    #[command(flatten)]
    pub dirs: PluginDirArgs,
    /// The call's deadline in milliseconds (default: the host's default for
    /// function calls, 30 s).
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// After printing the result, keep the plugin running this long before
    /// shutting down (for tests of the engine's lifetime rules).
    #[arg(long, value_name = "MS", hide = true)]
    pub hold_ms: Option<u64>,
}

/// Logs to stderr; the level comes from TRELLIS_LOG, else RUST_LOG, else
/// `warn`. Does nothing if a subscriber is already installed.
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let spec = std::env::var("TRELLIS_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "warn".to_owned());
    let filter = EnvFilter::try_new(&spec).unwrap_or_else(|e| {
        eprintln!("warning: invalid log filter `{spec}` ({e}); using `warn`");
        EnvFilter::new("warn")
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            None
        }
    }
}

pub fn run(args: &PluginsArgs) -> ExitCode {
    let Some(rt) = runtime() else {
        return ExitCode::from(2);
    };
    match &args.command {
        PluginsCommand::List(a) => rt.block_on(list(a)),
        PluginsCommand::Call(a) => rt.block_on(call(a)),
        PluginsCommand::Refresh(a) => rt.block_on(refresh(a)),
        PluginsCommand::Check(a) => rt.block_on(super::plugin_check::run(a)),
    }
}

async fn refresh(args: &PluginsRefreshArgs) -> ExitCode {
    let host = PluginHost::new(args.list.dirs.host_config());
    let plugins = host.plugins();
    if let Some(unknown) = args
        .names
        .iter()
        .find(|n| !plugins.iter().any(|p| &p.name == *n))
    {
        eprintln!("error: no plugin named `{unknown}` (`trellis plugins list` shows them)");
        return ExitCode::from(2);
    }
    let chosen: Vec<(PluginKind, &str)> = plugins
        .iter()
        .filter(|p| args.names.is_empty() || args.names.contains(&p.name))
        .map(|p| (p.kind, p.name.as_str()))
        .collect();
    let mut failed = false;
    for ((_, name), forgotten) in chosen.iter().zip(host.forget_manifests(&chosen)) {
        if let Err(e) = forgotten {
            eprintln!("error: {name}: {e}");
            failed = true;
        }
    }
    host.shutdown().await;
    if failed {
        return ExitCode::from(1);
    }
    // Read again (each plugin is started for it) and shown.
    list(&args.list).await
}

async fn list(args: &PluginsListArgs) -> ExitCode {
    let host = PluginHost::new(args.dirs.host_config());
    let plugins = host.plugins();
    let ids: Vec<(PluginKind, &str)> = plugins.iter().map(|p| (p.kind, p.name.as_str())).collect();
    let manifests = host.manifests(&ids).await;
    let status = host.status();
    host.shutdown().await;

    let mut failed = false;
    let mut rows = Vec::new();
    for ((p, m), st) in plugins.iter().zip(&manifests).zip(&status) {
        let mut row = json!({
            "kind": p.kind.as_str(),
            "name": p.name,
            "path": p.path.display().to_string(),
            "launched": st.launches > 0,
        });
        match m {
            Ok(m) => {
                let version = m
                    .plugin
                    .as_ref()
                    .map(|i| i.version.clone())
                    .unwrap_or_default();
                row["version"] = json!(version);
                row["resource_types"] = json!(if p.kind == PluginKind::Transformer {
                    m.abstract_resource_types.len()
                } else {
                    m.resource_types.len()
                });
                row["data_source_types"] = json!(m.data_source_types.len());
                row["functions"] = json!(m.functions.len());
            }
            Err(e) => {
                failed = true;
                row["error"] = json!(e.to_string());
            }
        }
        rows.push(row);
    }
    let out = match args.format {
        OutputFormat::Json => json!({
            "plugins": rows,
            "search_dirs": host.search_dirs().iter().map(|d| d.display().to_string()).collect::<Vec<_>>(),
        })
        .to_string()
            + "\n",
        OutputFormat::Text => list_text(&rows, host.search_dirs()),
    };
    if std::io::stdout().lock().write_all(out.as_bytes()).is_err() {
        return ExitCode::from(2);
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn list_text(rows: &[serde_json::Value], dirs: &[PathBuf]) -> String {
    if rows.is_empty() {
        let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        return format!("no plugins found in: {}\n", dirs.join(", "));
    }
    let cell = |r: &serde_json::Value, k: &str| match &r[k] {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".to_owned(),
        v => v.to_string(),
    };
    let header = [
        "KIND",
        "NAME",
        "VERSION",
        "RESOURCES",
        "DATA SOURCES",
        "FUNCTIONS",
        "PATH",
    ];
    let keys = [
        "kind",
        "name",
        "version",
        "resource_types",
        "data_source_types",
        "functions",
        "path",
    ];
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| keys.iter().map(|k| cell(r, k)).collect())
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            table
                .iter()
                .map(|row| row[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(header.iter().map(|s| s.to_string()).collect());
    for (row, r) in table.into_iter().zip(rows) {
        out.push_str(&line(row));
        if let Some(e) = r["error"].as_str() {
            out.push_str(&format!("  error: {e}\n"));
        }
    }
    out
}

async fn call(args: &PluginsCallArgs) -> ExitCode {
    let call_args = match parse_args(args.args.as_deref()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: JSON_ARGS: {e}");
            return ExitCode::from(2);
        }
    };
    let host = PluginHost::new(args.dirs.host_config());
    let provider = match host.provider(&args.namespace) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = CallOptions {
        deadline: args.timeout_ms.map(Duration::from_millis),
        ..CallOptions::default()
    };
    let result = provider
        .call_function(&args.function, call_args, &opts)
        .await;
    let code = match result {
        Ok(v) => {
            let j = values::to_json(
                &v,
                values::JsonMarks {
                    mask_sensitive: true,
                },
            );
            let mut out = std::io::stdout().lock();
            if writeln!(out, "{j}").and_then(|_| out.flush()).is_err() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                PluginError::NotFound { .. } => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    };
    if let Some(ms) = args.hold_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    host.shutdown().await;
    code
}

fn parse_args(text: Option<&str>) -> Result<Vec<trellis_proto::plugin::v1::Value>, String> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    let j: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    Ok(match j {
        serde_json::Value::Array(items) => items.iter().map(values::from_json).collect(),
        other => vec![values::from_json(&other)],
    })
}

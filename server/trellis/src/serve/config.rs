//! `trellis serve` settings: command-line flags, `TRELLIS_*` environment variables and an
//! optional TOML file, merged in that order of precedence (flag > env > file > default).
//!
//! [`ServeArgs::resolve`] turns them into a validated [`ServeConfig`]; `serve::logging`
//! installs the log subscriber it describes and `serve::listen` opens its listening socket.
//! docs/serve.md is the operator's view of the same settings.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer, Unexpected, Visitor};
use tokio_rustls::rustls::pki_types::CertificateDer;

/// Where the engine listens unless told otherwise: loopback only, so a fresh install is not
/// reachable from the network.
pub(super) const DEFAULT_LISTEN: &str = "127.0.0.1:8325";
/// The data directory, relative to the working directory.
pub(super) const DEFAULT_DATA_DIR: &str = ".trellis";
pub(super) const DEFAULT_LOG_LEVEL: &str = "info";
pub(super) const DEFAULT_MAX_PARALLEL: usize = 64;
pub(super) const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
pub(super) const DEFAULT_MAX_INCLUDE_BYTES: u64 = 1024 * 1024;
pub(super) const DEFAULT_MAX_INPUT_SIZE: usize = crate::document::DEFAULT_MAX_INPUT_BYTES;
pub(super) const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
pub(super) const DEFAULT_LEASE_CHECK_INTERVAL: Duration = Duration::from_secs(5);
pub(super) const DEFAULT_STATE_MAX_CONNECTIONS: usize = 10;
pub(super) const DEFAULT_STATE_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
pub(super) const DEFAULT_EVENT_RETENTION_DAYS: u32 = 30;
/// Connections: well under the usual descriptor limit of 1024, which plugins and the state
/// store share.
pub(super) const DEFAULT_MAX_CONNECTIONS: usize = 512;
pub(super) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(5 * 60);
pub(super) const DEFAULT_HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
pub(super) const DEFAULT_HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
pub(super) const DEFAULT_TCP_KEEPALIVE: Duration = Duration::from_secs(60);

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

/// Flags of `trellis serve`. Every setting is optional here so that one not given on the
/// command line or in the environment can come from the config file.
#[derive(clap::Args, Debug, Default)]
pub struct ServeArgs {
    /// Address to listen on: `HOST:PORT` (default 127.0.0.1:8325) or `unix:/path/to.sock`.
    /// Port 0 picks a free port; the address actually bound is printed at startup.
    #[arg(long, value_name = "ADDR", env = "TRELLIS_LISTEN")]
    pub listen: Option<String>,
    /// Data directory: state database, plugin cache and sockets (default `.trellis`).
    #[arg(long, value_name = "DIR", env = "TRELLIS_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Where the state is kept: `sqlite` (default: `state.db` in the data directory) or a
    /// PostgreSQL URL, `postgres://USER@HOST:PORT/DB`. Keep the password out of it: PGPASSWORD
    /// or --state-password-file supply it.
    #[arg(long, value_name = "URL", env = "TRELLIS_STATE")]
    pub state: Option<String>,
    /// A file holding the PostgreSQL password (one line; a trailing newline is ignored).
    /// Takes precedence over PGPASSWORD and a password in the URL.
    #[arg(long, value_name = "FILE", env = "TRELLIS_STATE_PASSWORD_FILE")]
    pub state_password_file: Option<PathBuf>,
    /// With PostgreSQL state: most connections the engine opens to the database at once (one
    /// more listens for other replicas' commits); at least 1 (default 10).
    #[arg(long, value_name = "N", env = "TRELLIS_STATE_MAX_CONNECTIONS")]
    pub state_max_connections: Option<usize>,
    /// With PostgreSQL state: how long one SQL statement may run (waiting for a lock included)
    /// before it fails its call instead of hanging it: seconds or a duration like `30s`
    /// (default 30s).
    #[arg(long, value_name = "SECONDS", env = "TRELLIS_STATE_STATEMENT_TIMEOUT", value_parser = parse_duration)]
    pub state_statement_timeout: Option<Duration>,
    /// A TOML file with any of these settings (keys as the long flag names, `-` or `_`).
    /// Relative paths in it are relative to the file's directory.
    #[arg(long, value_name = "FILE", env = "TRELLIS_CONFIG")]
    pub config: Option<PathBuf>,
    /// A directory to search for plugin executables, before the directory holding `trellis`
    /// itself. Repeatable; TRELLIS_PLUGIN_DIR is a `:`-separated list.
    #[arg(
        long = "plugin-dir",
        value_name = "DIR",
        env = "TRELLIS_PLUGIN_DIR",
        value_delimiter = ':'
    )]
    pub plugin_dirs: Vec<PathBuf>,
    /// Do not search the directory holding the `trellis` executable for bundled plugins.
    #[arg(
        long,
        value_name = "BOOL",
        env = "TRELLIS_NO_BUNDLED_PLUGINS",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub no_bundled_plugins: Option<bool>,
    /// Log filter: a level (`info`, `debug`, ...) or directives like `info,trellis=debug`
    /// (default `info`).
    #[arg(long, value_name = "LEVEL", env = "TRELLIS_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// Log format on stderr (default `text`).
    #[arg(long, value_name = "FORMAT", env = "TRELLIS_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Most resource operations (create, update, destroy, read) running at once, across all
    /// deployments (default 64).
    #[arg(long, value_name = "N", env = "TRELLIS_MAX_PARALLEL")]
    pub max_parallel: Option<usize>,
    /// At shutdown, how long running operations get to reach a safe point before they are
    /// marked interrupted: seconds, or `500ms`, `30s`, `2m`, `1h` (default 30s).
    #[arg(long, value_name = "SECONDS", env = "TRELLIS_DRAIN_TIMEOUT", value_parser = parse_duration)]
    pub drain_timeout: Option<Duration>,
    /// A directory under which clients may name blueprint files on the engine host by path.
    /// Repeatable; TRELLIS_ALLOW_PATH is a `:`-separated list. Must exist. Without any, path
    /// sources are refused and blueprints must be sent inline.
    #[arg(
        long = "allow-path",
        value_name = "DIR",
        env = "TRELLIS_ALLOW_PATH",
        value_delimiter = ':'
    )]
    pub allow_paths: Vec<PathBuf>,
    /// A host from which `https://` child blueprints (includes) may be fetched. Repeatable;
    /// TRELLIS_ALLOW_INCLUDE_HOST is a comma-separated list. Without any, remote includes are
    /// refused.
    #[arg(
        long = "allow-include-host",
        value_name = "HOST",
        env = "TRELLIS_ALLOW_INCLUDE_HOST",
        value_delimiter = ','
    )]
    pub allow_include_hosts: Vec<String>,
    /// Largest child blueprint fetched over https, in bytes (default 1 MiB).
    #[arg(long, value_name = "BYTES", env = "TRELLIS_MAX_INCLUDE_BYTES")]
    pub max_include_bytes: Option<u64>,
    /// A PEM file of CA certificates trusted for `https://` includes, besides the system's
    /// (for a private CA).
    #[arg(long, value_name = "FILE", env = "TRELLIS_INCLUDE_CA_CERT")]
    pub include_ca_cert: Option<PathBuf>,
    /// The engine's TLS certificate chain (PEM): serve the engine API over TLS on TCP.
    /// Needs --tls-key.
    #[arg(long, value_name = "FILE", env = "TRELLIS_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM: PKCS#8, PKCS#1 or SEC1) of --tls-cert.
    #[arg(long, value_name = "FILE", env = "TRELLIS_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Largest blueprint or variables file accepted, in bytes (default 10 MiB).
    #[arg(long, value_name = "BYTES", env = "TRELLIS_MAX_INPUT_SIZE")]
    pub max_input_size: Option<usize>,
    /// Largest string, array or object one expression of a blueprint may produce, in bytes
    /// (default 8 MiB).
    #[arg(long, value_name = "BYTES", env = "TRELLIS_MAX_VALUE_BYTES")]
    pub max_value_bytes: Option<u64>,
    /// Most resources one blueprint may have after `each` expansion (default 20000).
    #[arg(long, value_name = "N", env = "TRELLIS_MAX_RESOURCES")]
    pub max_resources: Option<usize>,
    /// Most bytes of values evaluating one request's blueprint may produce in total
    /// (default 256 MiB).
    #[arg(long, value_name = "BYTES", env = "TRELLIS_MAX_EVAL_BYTES")]
    pub max_eval_bytes: Option<u64>,
    /// How long a deployment's lease on an instance lasts without a heartbeat before another
    /// engine may take the instance over: seconds or a duration like `45s` (default 30s).
    #[arg(long, value_name = "SECONDS", env = "TRELLIS_LEASE_TTL", value_parser = parse_duration)]
    pub lease_ttl: Option<Duration>,
    /// Days of deployment events and finished change sets to keep (default 30).
    #[arg(long, value_name = "DAYS", env = "TRELLIS_EVENT_RETENTION_DAYS")]
    pub event_retention_days: Option<u32>,
    /// Most client connections open at once; at the limit, new connections wait until one
    /// closes (default 512).
    #[arg(long, value_name = "N", env = "TRELLIS_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Close a connection that has had no request in flight for this long: a duration like
    /// `30s` or `5m`; 0 never closes idle connections (default 5m).
    #[arg(long, value_name = "SECONDS", env = "TRELLIS_IDLE_TIMEOUT", value_parser = parse_duration)]
    pub idle_timeout: Option<Duration>,
    /// How often an HTTP/2 ping checks a connection the client is silent on; 0 sends none
    /// (default 60s).
    #[arg(long, value_name = "SECONDS", env = "TRELLIS_HTTP2_KEEPALIVE_INTERVAL", value_parser = parse_duration)]
    pub http2_keepalive_interval: Option<Duration>,
    /// How long a ping may go unanswered before the connection is closed (default 20s).
    #[arg(long, value_name = "SECONDS", env = "TRELLIS_HTTP2_KEEPALIVE_TIMEOUT", value_parser = parse_duration)]
    pub http2_keepalive_timeout: Option<Duration>,
    /// TCP keepalive: probes after this long without traffic, then at this interval; 0 turns
    /// them off (default 60s).
    #[arg(long, value_name = "SECONDS", env = "TRELLIS_TCP_KEEPALIVE", value_parser = parse_duration)]
    pub tcp_keepalive: Option<Duration>,
    /// Serve Prometheus metrics over HTTP at `http://ADDR/metrics` (`HOST:PORT`; port 0 picks a
    /// free port, printed at startup). Off unless given.
    #[arg(long, value_name = "ADDR", env = "TRELLIS_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// This engine's name in the state: the owner of the operations it runs and the leases it
    /// holds. Unique among replicas sharing a PostgreSQL database, and best stable across
    /// restarts (a restarted replica then marks what it left unfinished interrupted at once).
    /// Default: the data directory (SQLite), HOSTNAME:DATA_DIR (PostgreSQL).
    #[arg(long, value_name = "NAME", env = "TRELLIS_REPLICA_NAME")]
    pub replica_name: Option<String>,
    /// With PostgreSQL state: how often this replica looks for operations whose lease expired
    /// (their replica died or froze) and marks them interrupted: seconds or a duration like
    /// `5s` (default 5s). Such an operation is noticed within lease-ttl plus this.
    #[arg(long, value_name = "SECONDS", env = "TRELLIS_LEASE_CHECK_INTERVAL", value_parser = parse_duration)]
    pub lease_check_interval: Option<Duration>,
    /// Serve without authentication on a non-loopback address (no `[auth]` in the config
    /// file). Anyone who can reach the port can deploy and read secrets; a warning is logged
    /// at every start. Only a flag: no environment variable or config key turns it on.
    #[arg(long)]
    pub insecure_no_auth: bool,
}

/// The settings of a running engine, validated, with every path absolute.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub listen: Listen,
    pub data_dir: PathBuf,
    /// The state store (`--state`).
    pub state: StateLocation,
    /// `--state-max-connections` (PostgreSQL).
    pub state_max_connections: usize,
    /// `--state-statement-timeout` (PostgreSQL).
    pub state_statement_timeout: Duration,
    pub plugin_dirs: Vec<PathBuf>,
    /// Search the directory holding the `trellis` executable for plugins.
    pub bundled_plugins: bool,
    /// An `EnvFilter` spec, already checked.
    pub log_level: String,
    pub log_format: LogFormat,
    pub max_parallel: usize,
    pub drain_timeout: Duration,
    /// Canonical, existing directories; empty means blueprint paths are refused.
    pub allowed_roots: Vec<PathBuf>,
    /// Lower-case host names (optionally `host:port`); empty means remote includes are refused.
    pub include_hosts: Vec<String>,
    pub max_include_bytes: u64,
    /// Extra roots trusted for `https://` includes (`--include-ca-cert`).
    pub include_ca_certs: Vec<CertificateDer<'static>>,
    /// Serve the engine API over TLS (TCP only).
    pub tls: Option<TlsIdentity>,
    pub max_input_size: usize,
    /// Bounds on evaluation (`max-value-bytes`, `max-resources`, `max-eval-bytes`).
    pub eval_limits: crate::eval::limits::Limits,
    pub lease_ttl: Duration,
    pub event_retention: Duration,
    /// Connection limit, idle timeout and keepalive (docs/serve.md, "Connections").
    pub connections: ConnectionSettings,
    /// Provider configuration and property injectors (docs/configuration.md), secrets read.
    pub settings: crate::engine::settings::EngineSettings,
    /// `[auth]`: who may call the engine API (docs/auth.md); `None` lets everyone.
    pub auth: Option<AuthSettings>,
    /// `--insecure-no-auth`: no `[auth]`, on purpose, whatever the address.
    pub insecure_no_auth: bool,
    /// `--metrics-listen`: where `/metrics` is served over HTTP; `None`: not served.
    pub metrics_listen: Option<SocketAddr>,
    /// `--replica-name`, or its default: who owns this engine's operations and leases.
    pub replica_name: String,
    /// `--lease-check-interval`: how often expired leases of other replicas are looked for.
    pub lease_check_interval: Duration,
}

/// The `[auth]` table, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthSettings {
    /// The tokens file (absolute): hashed tokens, their roles and instance patterns.
    pub tokens_file: PathBuf,
    /// Serve gRPC reflection without a token (default: a token of any role is needed).
    pub open_reflection: bool,
}

/// `[auth]` as written in the config file.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileAuth {
    #[serde(alias = "tokens_file")]
    tokens_file: PathBuf,
    #[serde(default, alias = "open_reflection")]
    open_reflection: bool,
}

/// How the engine treats client connections. `None` turns a timer off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionSettings {
    pub max_connections: usize,
    pub idle_timeout: Option<Duration>,
    pub http2_keepalive_interval: Option<Duration>,
    pub http2_keepalive_timeout: Duration,
    pub tcp_keepalive: Option<Duration>,
}

/// The engine's TLS certificate chain and key, read and checked (they parse and match).
#[derive(Clone)]
pub struct TlsIdentity {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl fmt::Debug for TlsIdentity {
    /// Paths only: never the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsIdentity")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// Where the engine keeps its state.
#[derive(Clone, PartialEq, Eq)]
pub enum StateLocation {
    /// `state.db` in the data directory.
    Sqlite,
    /// A PostgreSQL database.
    Postgres {
        url: String,
        /// From `--state-password-file` or PGPASSWORD; `None`: the URL's, if any.
        password: Option<String>,
    },
}

impl StateLocation {
    /// What to show: the URL with its password redacted.
    pub fn display(&self) -> String {
        match self {
            StateLocation::Sqlite => "sqlite".to_owned(),
            StateLocation::Postgres { url, .. } => crate::state::postgres::redact_url(url),
        }
    }
}

impl fmt::Debug for StateLocation {
    /// Never the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateLocation::Sqlite => f.write_str("Sqlite"),
            StateLocation::Postgres { password, .. } => f
                .debug_struct("Postgres")
                .field("url", &self.display())
                .field("password", &password.as_ref().map(|_| "<redacted>"))
                .finish(),
        }
    }
}

/// Where the engine accepts connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    Tcp(SocketAddr),
    /// An absolute socket path.
    Unix(PathBuf),
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Tcp(addr) => write!(f, "{addr}"),
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The config file's contents. Keys are the long flag names; snake_case is accepted too
/// because that is what people write in TOML by habit.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileSettings {
    listen: Option<String>,
    #[serde(alias = "data_dir")]
    data_dir: Option<PathBuf>,
    state: Option<String>,
    #[serde(alias = "state_password_file")]
    state_password_file: Option<PathBuf>,
    #[serde(alias = "state_max_connections")]
    state_max_connections: Option<usize>,
    #[serde(alias = "state_statement_timeout")]
    state_statement_timeout: Option<FileDuration>,
    #[serde(alias = "plugin_dir")]
    plugin_dir: Option<Vec<PathBuf>>,
    #[serde(alias = "no_bundled_plugins")]
    no_bundled_plugins: Option<bool>,
    #[serde(alias = "log_level")]
    log_level: Option<String>,
    #[serde(alias = "log_format")]
    log_format: Option<LogFormat>,
    #[serde(alias = "max_parallel")]
    max_parallel: Option<usize>,
    #[serde(alias = "drain_timeout")]
    drain_timeout: Option<FileDuration>,
    #[serde(alias = "allow_path")]
    allow_path: Option<Vec<PathBuf>>,
    #[serde(alias = "allow_include_host")]
    allow_include_host: Option<Vec<String>>,
    #[serde(alias = "max_include_bytes")]
    max_include_bytes: Option<u64>,
    #[serde(alias = "include_ca_cert")]
    include_ca_cert: Option<PathBuf>,
    #[serde(alias = "tls_cert")]
    tls_cert: Option<PathBuf>,
    #[serde(alias = "tls_key")]
    tls_key: Option<PathBuf>,
    #[serde(alias = "max_input_size")]
    max_input_size: Option<usize>,
    #[serde(alias = "max_value_bytes")]
    max_value_bytes: Option<u64>,
    #[serde(alias = "max_resources")]
    max_resources: Option<usize>,
    #[serde(alias = "max_eval_bytes")]
    max_eval_bytes: Option<u64>,
    #[serde(alias = "lease_ttl")]
    lease_ttl: Option<FileDuration>,
    #[serde(alias = "event_retention_days")]
    event_retention_days: Option<u32>,
    #[serde(alias = "max_connections")]
    max_connections: Option<usize>,
    #[serde(alias = "idle_timeout")]
    idle_timeout: Option<FileDuration>,
    #[serde(alias = "http2_keepalive_interval")]
    http2_keepalive_interval: Option<FileDuration>,
    #[serde(alias = "http2_keepalive_timeout")]
    http2_keepalive_timeout: Option<FileDuration>,
    #[serde(alias = "tcp_keepalive")]
    tcp_keepalive: Option<FileDuration>,
    #[serde(alias = "metrics_listen")]
    metrics_listen: Option<String>,
    #[serde(alias = "replica_name")]
    replica_name: Option<String>,
    #[serde(alias = "lease_check_interval")]
    lease_check_interval: Option<FileDuration>,
    /// `[providers.<namespace>]`: provider configuration (serve/providers.rs).
    providers: Option<toml::Table>,
    /// `[injectors."<type>"]`: property injectors.
    injectors: Option<toml::Table>,
    /// `[auth]`: tokens and roles (serve/auth.rs).
    auth: Option<FileAuth>,
}

/// A duration in the file: an integer number of seconds or a string such as `"2m"`.
#[derive(Debug)]
struct FileDuration(Duration);

impl<'de> serde::Deserialize<'de> for FileDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = FileDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("seconds, or a string like \"30s\", \"2m\" or \"500ms\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<FileDuration, E> {
                Ok(FileDuration(Duration::from_secs(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<FileDuration, E> {
                u64::try_from(v)
                    .map(|secs| FileDuration(Duration::from_secs(secs)))
                    .map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<FileDuration, E> {
                parse_duration(v).map(FileDuration).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A loaded config file: where relative paths in it start from, and how errors name it.
struct ConfigFile {
    path: PathBuf,
    dir: PathBuf,
}

/// Where a setting's value came from, for relative paths and error messages.
#[derive(Clone, Copy)]
enum Origin<'a> {
    /// A flag or its environment variable (clap has merged them): relative to the cwd.
    Arg,
    File(&'a ConfigFile),
    Default,
}

impl Origin<'_> {
    fn base<'p>(&'p self, cwd: &'p Path) -> &'p Path {
        match self {
            Origin::File(file) => &file.dir,
            Origin::Arg | Origin::Default => cwd,
        }
    }

    /// An error about setting `name` (its long flag name) from this origin.
    fn error(&self, name: &str, why: impl fmt::Display) -> String {
        match self {
            Origin::Arg => {
                let env = name.to_ascii_uppercase().replace('-', "_");
                format!("--{name} (or TRELLIS_{env}): {why}")
            }
            Origin::File(file) => format!("`{name}` in {}: {why}", file.path.display()),
            Origin::Default => format!("default {name}: {why}"),
        }
    }
}

/// The flag/env value if set, else the file's; `file_value` is only ever `Some` with a file.
fn layer<'a, T>(
    arg: Option<T>,
    file_value: Option<T>,
    file: Option<&'a ConfigFile>,
) -> Option<(T, Origin<'a>)> {
    arg.map(|v| (v, Origin::Arg))
        .or_else(|| file_value.zip(file).map(|(v, f)| (v, Origin::File(f))))
}

/// Like [`layer`] with a default for when neither gives a value.
fn layer_or<'a, T>(
    arg: Option<T>,
    file_value: Option<T>,
    file: Option<&'a ConfigFile>,
    default: T,
) -> (T, Origin<'a>) {
    layer(arg, file_value, file).unwrap_or((default, Origin::Default))
}

/// A repeatable flag counts as unset when given no values, so the file's list applies.
fn non_empty<T>(values: Vec<T>) -> Option<Vec<T>> {
    (!values.is_empty()).then_some(values)
}

impl ServeArgs {
    /// Merges flags/env, the config file and defaults, and validates the result.
    pub fn resolve(self) -> Result<ServeConfig, String> {
        let cwd = std::env::current_dir()
            .map_err(|e| format!("cannot read the working directory: {e}"))?;
        let (settings, file) = match &self.config {
            Some(path) => {
                let (settings, file) = load_file(&absolute(&cwd, path))?;
                (settings, Some(file))
            }
            None => (FileSettings::default(), None),
        };
        let file = file.as_ref();
        let engine_settings = match file {
            Some(f) => super::providers::read(
                settings.providers.clone(),
                settings.injectors.clone(),
                &f.path,
                &f.dir,
                &|name| std::env::var(name).ok(),
            )?,
            None => Default::default(),
        };

        let listen = match layer(self.listen, settings.listen, file) {
            Some((text, origin)) => {
                parse_listen(&text, origin.base(&cwd)).map_err(|e| origin.error("listen", e))?
            }
            None => Listen::Tcp(DEFAULT_LISTEN.parse().expect("valid default address")),
        };

        let metrics_listen = match layer(self.metrics_listen, settings.metrics_listen, file) {
            Some((text, origin)) => Some(
                parse_metrics_listen(&text, origin.base(&cwd))
                    .map_err(|e| origin.error("metrics-listen", e))?,
            ),
            None => None,
        };

        let (data_dir, origin) = layer_or(
            self.data_dir,
            settings.data_dir,
            file,
            DEFAULT_DATA_DIR.into(),
        );
        let data_dir = path_setting(&data_dir, origin, &cwd, "data-dir")?;

        let password_file = layer(self.state_password_file, settings.state_password_file, file)
            .map(|(path, origin)| (absolute(origin.base(&cwd), &path), origin));
        let state = match layer(self.state, settings.state, file) {
            Some((text, origin)) => state_location(
                text.trim(),
                origin,
                password_file,
                std::env::var("PGPASSWORD").ok(),
            )?,
            None => match password_file {
                Some((_, origin)) => {
                    return Err(origin.error(
                        "state-password-file",
                        "given without a PostgreSQL --state to use it for",
                    ));
                }
                None => StateLocation::Sqlite,
            },
        };
        let postgres_only = |origin: Origin<'_>, key: &str| match state {
            StateLocation::Sqlite => {
                Err(origin.error(key, "given without a PostgreSQL --state to use it for"))
            }
            StateLocation::Postgres { .. } => Ok(()),
        };
        let (state_max_connections, origin) = layer_or(
            self.state_max_connections,
            settings.state_max_connections,
            file,
            DEFAULT_STATE_MAX_CONNECTIONS,
        );
        if !matches!(origin, Origin::Default) {
            postgres_only(origin, "state-max-connections")?;
        }
        at_least_one(
            state_max_connections as u64,
            origin,
            "state-max-connections",
        )?;
        let (state_statement_timeout, origin) = layer_or(
            self.state_statement_timeout,
            settings.state_statement_timeout.map(|d| d.0),
            file,
            DEFAULT_STATE_STATEMENT_TIMEOUT,
        );
        if !matches!(origin, Origin::Default) {
            postgres_only(origin, "state-statement-timeout")?;
        }
        if state_statement_timeout < Duration::from_millis(1) {
            return Err(origin.error("state-statement-timeout", "must be at least 1ms"));
        }

        let plugin_dirs = match layer(non_empty(self.plugin_dirs), settings.plugin_dir, file) {
            Some((dirs, origin)) => dirs
                .iter()
                .map(|dir| path_setting(dir, origin, &cwd, "plugin-dir"))
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };

        let (no_bundled, _) = layer_or(
            self.no_bundled_plugins,
            settings.no_bundled_plugins,
            file,
            false,
        );

        let (log_level, origin) = layer_or(
            self.log_level,
            settings.log_level,
            file,
            DEFAULT_LOG_LEVEL.to_owned(),
        );
        let log_level = log_level.trim().to_owned();
        check_log_filter(&log_level).map_err(|e| origin.error("log-level", e))?;

        let (log_format, _) = layer_or(self.log_format, settings.log_format, file, LogFormat::Text);

        let (max_parallel, origin) = layer_or(
            self.max_parallel,
            settings.max_parallel,
            file,
            DEFAULT_MAX_PARALLEL,
        );
        at_least_one(max_parallel as u64, origin, "max-parallel")?;

        let (drain_timeout, _) = layer_or(
            self.drain_timeout,
            settings.drain_timeout.map(|d| d.0),
            file,
            DEFAULT_DRAIN_TIMEOUT,
        );

        let allowed_roots = match layer(non_empty(self.allow_paths), settings.allow_path, file) {
            Some((roots, origin)) => roots
                .iter()
                .map(|root| allowed_root(root, origin, &cwd))
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };

        let include_hosts = match layer(
            non_empty(self.allow_include_hosts),
            settings.allow_include_host,
            file,
        ) {
            Some((hosts, origin)) => hosts
                .iter()
                .map(|host| include_host(host).map_err(|e| origin.error("allow-include-host", e)))
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };

        let (max_include_bytes, origin) = layer_or(
            self.max_include_bytes,
            settings.max_include_bytes,
            file,
            DEFAULT_MAX_INCLUDE_BYTES,
        );
        at_least_one(max_include_bytes, origin, "max-include-bytes")?;

        let include_ca_certs = match layer(self.include_ca_cert, settings.include_ca_cert, file) {
            Some((path, origin)) => {
                let path = path_setting(&path, origin, &cwd, "include-ca-cert")?;
                crate::engine::tls::read_certificates(&path)
                    .map_err(|e| origin.error("include-ca-cert", e))?
            }
            None => Vec::new(),
        };

        let tls = match (
            layer(self.tls_cert, settings.tls_cert, file),
            layer(self.tls_key, settings.tls_key, file),
        ) {
            (None, None) => None,
            (Some((_, origin)), None) => {
                return Err(origin.error(
                    "tls-cert",
                    "needs --tls-key (TRELLIS_TLS_KEY, `tls-key`) too: the certificate's private key",
                ));
            }
            (None, Some((_, origin))) => {
                return Err(origin.error(
                    "tls-key",
                    "needs --tls-cert (TRELLIS_TLS_CERT, `tls-cert`) too: the certificate it belongs to",
                ));
            }
            (Some((cert, cert_origin)), Some((key, key_origin))) => Some(tls_identity(
                path_setting(&cert, cert_origin, &cwd, "tls-cert")?,
                cert_origin,
                path_setting(&key, key_origin, &cwd, "tls-key")?,
                key_origin,
            )?),
        };

        let (max_input_size, origin) = layer_or(
            self.max_input_size,
            settings.max_input_size,
            file,
            DEFAULT_MAX_INPUT_SIZE,
        );
        at_least_one(max_input_size as u64, origin, "max-input-size")?;

        let eval_limits = {
            use crate::eval::limits as l;
            let (max_value_bytes, origin) = layer_or(
                self.max_value_bytes,
                settings.max_value_bytes,
                file,
                l::DEFAULT_MAX_VALUE_BYTES,
            );
            at_least_one(max_value_bytes, origin, "max-value-bytes")?;
            let (max_resources, origin) = layer_or(
                self.max_resources,
                settings.max_resources,
                file,
                l::DEFAULT_MAX_RESOURCES,
            );
            at_least_one(max_resources as u64, origin, "max-resources")?;
            let (max_eval_bytes, origin) = layer_or(
                self.max_eval_bytes,
                settings.max_eval_bytes,
                file,
                l::DEFAULT_MAX_EVAL_BYTES,
            );
            at_least_one(max_eval_bytes, origin, "max-eval-bytes")?;
            l::Limits {
                max_value_bytes,
                max_resources,
                max_eval_bytes,
            }
        };

        let (lease_ttl, origin) = layer_or(
            self.lease_ttl,
            settings.lease_ttl.map(|d| d.0),
            file,
            DEFAULT_LEASE_TTL,
        );
        if lease_ttl.is_zero() {
            return Err(origin.error("lease-ttl", "must be longer than 0"));
        }
        let (lease_check_interval, origin) = layer_or(
            self.lease_check_interval,
            settings.lease_check_interval.map(|d| d.0),
            file,
            DEFAULT_LEASE_CHECK_INTERVAL,
        );
        if lease_check_interval.is_zero() {
            return Err(origin.error("lease-check-interval", "must be longer than 0"));
        }
        let replica_name = match layer(self.replica_name, settings.replica_name, file) {
            Some((name, origin)) => {
                check_replica_name(&name).map_err(|e| origin.error("replica-name", e))?;
                name
            }
            None => default_replica_name(&state, &data_dir),
        };

        let (retention_days, origin) = layer_or(
            self.event_retention_days,
            settings.event_retention_days,
            file,
            DEFAULT_EVENT_RETENTION_DAYS,
        );
        at_least_one(retention_days.into(), origin, "event-retention-days")?;

        let (max_connections, origin) = layer_or(
            self.max_connections,
            settings.max_connections,
            file,
            DEFAULT_MAX_CONNECTIONS,
        );
        at_least_one(max_connections as u64, origin, "max-connections")?;
        // 0 turns a timer off.
        let timer = |d: Duration| (!d.is_zero()).then_some(d);
        let (idle_timeout, _) = layer_or(
            self.idle_timeout,
            settings.idle_timeout.map(|d| d.0),
            file,
            DEFAULT_IDLE_TIMEOUT,
        );
        let (http2_keepalive_interval, _) = layer_or(
            self.http2_keepalive_interval,
            settings.http2_keepalive_interval.map(|d| d.0),
            file,
            DEFAULT_HTTP2_KEEPALIVE_INTERVAL,
        );
        let (http2_keepalive_timeout, origin) = layer_or(
            self.http2_keepalive_timeout,
            settings.http2_keepalive_timeout.map(|d| d.0),
            file,
            DEFAULT_HTTP2_KEEPALIVE_TIMEOUT,
        );
        if http2_keepalive_timeout.is_zero() {
            return Err(origin.error("http2-keepalive-timeout", "must be longer than 0"));
        }
        let (tcp_keepalive, origin) = layer_or(
            self.tcp_keepalive,
            settings.tcp_keepalive.map(|d| d.0),
            file,
            DEFAULT_TCP_KEEPALIVE,
        );
        if !tcp_keepalive.is_zero() && tcp_keepalive < Duration::from_secs(1) {
            return Err(origin.error("tcp-keepalive", "must be 0 (off) or at least 1s"));
        }
        let connections = ConnectionSettings {
            max_connections,
            idle_timeout: timer(idle_timeout),
            http2_keepalive_interval: timer(http2_keepalive_interval),
            http2_keepalive_timeout,
            tcp_keepalive: timer(tcp_keepalive),
        };

        // The tokens file is read (and checked) when the engine starts; here only where.
        let auth = match (settings.auth, file) {
            (Some(a), Some(f)) => Some(AuthSettings {
                tokens_file: absolute(&f.dir, &a.tokens_file),
                open_reflection: a.open_reflection,
            }),
            _ => None,
        };
        if self.insecure_no_auth && auth.is_some() {
            return Err(
                "--insecure-no-auth: the config file has an `[auth]` table; remove one of the two"
                    .to_owned(),
            );
        }
        if let Listen::Tcp(addr) = &listen
            && !addr.ip().is_loopback()
            && auth.is_none()
            && !self.insecure_no_auth
        {
            return Err(format!(
                "refusing to listen on {addr} without authentication: anyone who can reach it \
                 could deploy and read secrets. Add `[auth] tokens_file = \"...\"` to the \
                 config file (docs/auth.md), listen on a loopback address or a Unix socket, or \
                 pass --insecure-no-auth"
            ));
        }

        Ok(ServeConfig {
            auth,
            insecure_no_auth: self.insecure_no_auth,
            metrics_listen,
            settings: engine_settings,
            listen,
            data_dir,
            state,
            state_max_connections,
            state_statement_timeout,
            plugin_dirs,
            bundled_plugins: !no_bundled,
            log_level,
            log_format,
            max_parallel,
            drain_timeout,
            allowed_roots,
            include_hosts,
            max_include_bytes,
            include_ca_certs,
            tls,
            max_input_size,
            eval_limits,
            lease_ttl,
            event_retention: DAY * retention_days,
            connections,
            replica_name,
            lease_check_interval,
        })
    }
}

/// A replica name is printed in logs and stored with every operation: printable, one line.
fn check_replica_name(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > 200 {
        return Err("must be at most 200 bytes".into());
    }
    if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!("{name:?} holds whitespace or control characters"));
    }
    Ok(())
}

/// SQLite admits one engine per data directory, which names it (as it always has). Replicas
/// on PostgreSQL may share a data directory path on different machines: the host name tells
/// them apart.
fn default_replica_name(state: &StateLocation, data_dir: &Path) -> String {
    match state {
        StateLocation::Sqlite => data_dir.display().to_string(),
        StateLocation::Postgres { .. } => format!("{}:{}", host_name(), data_dir.display()),
    }
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that much.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..end]) {
        Ok(name) if rc == 0 && !name.is_empty() => name.to_owned(),
        _ => "localhost".to_owned(),
    }
}

/// `--state`: `sqlite`, or a PostgreSQL URL and where its password comes from (the file, else
/// PGPASSWORD, else the URL itself). Messages show the URL redacted.
fn state_location(
    text: &str,
    origin: Origin<'_>,
    password_file: Option<(PathBuf, Origin<'_>)>,
    env_password: Option<String>,
) -> Result<StateLocation, String> {
    if text.eq_ignore_ascii_case("sqlite") {
        if let Some((_, file_origin)) = password_file {
            let origin = file_origin;
            return Err(origin.error(
                "state-password-file",
                "given, but the state is in SQLite, which has no password",
            ));
        }
        return Ok(StateLocation::Sqlite);
    }
    if !(text.starts_with("postgres://") || text.starts_with("postgresql://")) {
        return Err(origin.error(
            "state",
            format!(
                "`{}` is neither `sqlite` nor a PostgreSQL URL (postgres://USER@HOST:PORT/DB)",
                crate::state::postgres::redact_url(text)
            ),
        ));
    }
    let password = match password_file {
        Some((path, file_origin)) => {
            let origin = file_origin;
            let text = std::fs::read_to_string(&path).map_err(|e| {
                origin.error(
                    "state-password-file",
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            let password = text.trim_end_matches(['\n', '\r']).to_owned();
            if password.is_empty() {
                return Err(origin.error(
                    "state-password-file",
                    format!("{} is empty", path.display()),
                ));
            }
            Some(password)
        }
        None => env_password.filter(|p| !p.is_empty()),
    };
    Ok(StateLocation::Postgres {
        url: text.to_owned(),
        password,
    })
}

fn load_file(path: &Path) -> Result<(FileSettings, ConfigFile), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    let settings = toml::from_str(&text).map_err(|e| toml_error(path, &text, &e))?;
    let file = ConfigFile {
        path: path.to_owned(),
        dir: path.parent().unwrap_or(Path::new("/")).to_owned(),
    };
    Ok((settings, file))
}

/// One line: `FILE:LINE:COL: message: `offending line``. toml's own rendering spans several
/// lines, and its message alone does not name the key of a wrongly typed value.
fn toml_error(path: &Path, text: &str, err: &toml::de::Error) -> String {
    let message = without_aliases(err.message());
    let location = err
        .span()
        .filter(|span| *span != (0..0))
        .and_then(|span| text.get(..span.start))
        .map(|before| {
            let line = before.matches('\n').count() + 1;
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            let column = before[line_start..].chars().count() + 1;
            let line_text = text[line_start..].lines().next().unwrap_or("").trim();
            (line, column, line_text)
        });
    match location {
        Some((line, column, line_text)) if !line_text.is_empty() => format!(
            "{}:{line}:{column}: {message}: `{line_text}`",
            path.display(),
        ),
        Some((line, column, _)) => format!("{}:{line}:{column}: {message}", path.display()),
        None => format!("{}: {message}", path.display()),
    }
}

/// serde lists every accepted key for an unknown one, snake_case aliases too; the kebab-case
/// names are enough.
fn without_aliases(message: &str) -> String {
    match message.split_once(", expected one of ") {
        Some((head, keys)) if head.starts_with("unknown field") => {
            let keys: Vec<&str> = keys.split(", ").filter(|key| !key.contains('_')).collect();
            format!("{head}, expected one of {}", keys.join(", "))
        }
        _ => message.to_owned(),
    }
}

/// `base.join(path)`, made absolute and tidied (`.` and doubled `/` removed, `..` kept: the
/// path need not exist, so symlinks cannot be resolved).
fn absolute(base: &Path, path: &Path) -> PathBuf {
    let joined = base.join(path);
    std::path::absolute(&joined).unwrap_or(joined)
}

fn path_setting(path: &Path, origin: Origin, cwd: &Path, name: &str) -> Result<PathBuf, String> {
    if path.as_os_str().is_empty() {
        return Err(origin.error(name, "the path is empty"));
    }
    Ok(absolute(origin.base(cwd), path))
}

fn allowed_root(root: &Path, origin: Origin, cwd: &Path) -> Result<PathBuf, String> {
    let path = path_setting(root, origin, cwd, "allow-path")?;
    // Canonical, so that the containment check on client paths compares like with like.
    let canonical = path
        .canonicalize()
        .map_err(|e| origin.error("allow-path", format_args!("{}: {e}", path.display())))?;
    if !canonical.is_dir() {
        return Err(origin.error(
            "allow-path",
            format_args!("{} is not a directory", path.display()),
        ));
    }
    Ok(canonical)
}

fn at_least_one(value: u64, origin: Origin, name: &str) -> Result<(), String> {
    if value == 0 {
        return Err(origin.error(name, "must be at least 1, got 0"));
    }
    Ok(())
}

fn check_log_filter(spec: &str) -> Result<(), String> {
    if spec.is_empty() {
        return Err("the filter is empty (try `info`)".to_owned());
    }
    tracing_subscriber::EnvFilter::try_new(spec)
        .map(drop)
        .map_err(|e| format!("`{spec}` is not a log filter: {e}"))
}

/// Reads the engine's certificate chain and key and checks that a TLS server can use them:
/// both parse, and the key is the certificate's.
fn tls_identity(
    cert: PathBuf,
    cert_origin: Origin,
    key: PathBuf,
    key_origin: Origin,
) -> Result<TlsIdentity, String> {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::PrivateKeyDer;
    use tokio_rustls::rustls::pki_types::pem::PemObject;

    let cert_pem = std::fs::read(&cert)
        .map_err(|e| cert_origin.error("tls-cert", format_args!("{}: {e}", cert.display())))?;
    let key_pem = std::fs::read(&key)
        .map_err(|e| key_origin.error("tls-key", format_args!("{}: {e}", key.display())))?;
    let chain = crate::engine::tls::certificates_from_pem(&cert_pem)
        .map_err(|e| cert_origin.error("tls-cert", format_args!("{}: {e}", cert.display())))?;
    let private_key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        key_origin.error(
            "tls-key",
            format_args!("{}: no PEM private key in it ({e})", key.display()),
        )
    })?;
    rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS: {e}"))?
    .with_no_client_auth()
    .with_single_cert(chain, private_key)
    .map_err(|e| {
        key_origin.error(
            "tls-key",
            format_args!("{} cannot serve {}: {e}", key.display(), cert.display()),
        )
    })?;
    Ok(TlsIdentity {
        cert,
        key,
        cert_pem,
        key_pem,
    })
}

/// A host allowed for remote includes: a bare name, optionally with a port, lower-cased
/// because host names compare case-insensitively.
fn include_host(host: &str) -> Result<String, String> {
    let host = host.trim();
    if host.is_empty() {
        return Err("the host name is empty".to_owned());
    }
    if host.contains("://")
        || host.contains(['/', '?', '#', '@'])
        || host.contains(char::is_whitespace)
    {
        return Err(format!(
            "`{host}` is not a host name (give just the host, like `raw.githubusercontent.com`)"
        ));
    }
    Ok(host.to_ascii_lowercase())
}

/// `HOST:PORT` (an IP literal, or a name resolved now, first address) or `unix:PATH`.
fn parse_listen(text: &str, base: &Path) -> Result<Listen, String> {
    let text = text.trim();
    if let Some(path) = text.strip_prefix("unix:") {
        if path.is_empty() {
            return Err("the socket path after `unix:` is missing".to_owned());
        }
        return Ok(Listen::Unix(absolute(base, Path::new(path))));
    }
    // An IP literal needs no resolver.
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(Listen::Tcp(addr));
    }
    let expected = "expected HOST:PORT (like 127.0.0.1:8325) or unix:/path/to.sock";
    match text.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .map(Listen::Tcp)
            .ok_or_else(|| format!("`{text}` resolves to no address")),
        Err(e) => Err(format!("`{text}`: {e}; {expected}")),
    }
}

/// `HOST:PORT` only: Prometheus scrapes over TCP.
fn parse_metrics_listen(text: &str, base: &Path) -> Result<SocketAddr, String> {
    match parse_listen(text, base)? {
        Listen::Tcp(addr) => Ok(addr),
        Listen::Unix(_) => Err(format!(
            "`{}`: expected HOST:PORT (like 127.0.0.1:9325); metrics are served over TCP",
            text.trim()
        )),
    }
}

/// A duration: a whole number with an optional unit, `ms`, `s` (the default), `m` or `h`.
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let invalid =
        || format!("`{text}` is not a duration (expected seconds, or like 500ms, 30s, 2m, 1h)");
    if digits.is_empty() {
        return Err(invalid());
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is too long a duration"))?;
    let scaled = |factor: u64| {
        n.checked_mul(factor)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("`{text}` is too long a duration"))
    };
    match unit.trim_start() {
        "" | "s" => Ok(Duration::from_secs(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => scaled(60),
        "h" => scaled(60 * 60),
        _ => Err(invalid()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::listen::{Bound, bind};
    use crate::serve::logging::init_logging;
    use crate::test_dir::TestDir;
    use clap::Parser;
    use std::io;
    use tokio::net::UnixStream;

    fn write_config(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("trellis.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn with_config(path: &Path) -> ServeArgs {
        ServeArgs {
            config: Some(path.to_owned()),
            ..ServeArgs::default()
        }
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    #[test]
    fn defaults() {
        let config = ServeArgs::default().resolve().unwrap();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            config.listen,
            Listen::Tcp("127.0.0.1:8325".parse().unwrap())
        );
        assert_eq!(config.listen.to_string(), "127.0.0.1:8325");
        assert_eq!(config.data_dir, cwd.join(".trellis"));
        assert!(config.plugin_dirs.is_empty());
        assert!(config.bundled_plugins);
        assert_eq!(config.log_level, "info");
        assert_eq!(config.log_format, LogFormat::Text);
        assert_eq!(config.max_parallel, 64);
        assert_eq!(config.drain_timeout, Duration::from_secs(30));
        assert!(config.allowed_roots.is_empty());
        assert!(config.include_hosts.is_empty());
        assert_eq!(config.max_include_bytes, 1 << 20);
        assert_eq!(
            config.max_input_size,
            crate::document::DEFAULT_MAX_INPUT_BYTES
        );
        assert_eq!(config.lease_ttl, Duration::from_secs(30));
        assert_eq!(config.event_retention, Duration::from_secs(30 * 86_400));
        assert_eq!(config.state, StateLocation::Sqlite);
    }

    #[test]
    fn state_location_and_its_password() {
        let dir = TestDir::new("state");
        std::fs::write(dir.join("pw"), "s3cr3t\n").unwrap();
        let path = write_config(
            &dir,
            "state = \"postgres://app@db:5432/trellis\"\nstate-password-file = \"pw\"\n",
        );
        let config = with_config(&path).resolve().unwrap();
        assert_eq!(
            config.state,
            StateLocation::Postgres {
                url: "postgres://app@db:5432/trellis".into(),
                password: Some("s3cr3t".into()),
            }
        );
        let shown = format!("{:?}", config.state);
        assert!(!shown.contains("s3cr3t"), "{shown}");

        // A password in the URL is kept for the driver but never shown.
        let config = ServeArgs {
            state: Some("postgresql://app:hunter2@db/trellis".into()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(config.state.display(), "postgresql://app:***@db/trellis");
        assert!(!format!("{:?}", config.state).contains("hunter2"));
        assert_eq!(
            ServeArgs {
                state: Some("SQLite".into()),
                ..ServeArgs::default()
            }
            .resolve()
            .unwrap()
            .state,
            StateLocation::Sqlite
        );

        let err = resolve_err(ServeArgs {
            state: Some("mysql://app:hunter2@db/x".into()),
            ..ServeArgs::default()
        });
        assert!(err.starts_with("--state (or TRELLIS_STATE): "), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        let err = resolve_err(ServeArgs {
            state: Some("postgres://app@db/x".into()),
            state_password_file: Some(dir.join("missing")),
            ..ServeArgs::default()
        });
        assert!(err.starts_with("--state-password-file"), "{err}");
        let err = resolve_err(ServeArgs {
            state_password_file: Some(dir.join("pw")),
            ..ServeArgs::default()
        });
        assert!(err.contains("without a PostgreSQL --state"), "{err}");
    }

    #[test]
    fn state_password_from_the_environment() {
        let origin = Origin::Arg;
        let from_env = state_location("postgres://app@db/x", origin, None, Some("pw".into()));
        assert_eq!(
            from_env.unwrap(),
            StateLocation::Postgres {
                url: "postgres://app@db/x".into(),
                password: Some("pw".into()),
            }
        );
    }

    #[test]
    fn flags_override_file_and_file_overrides_defaults() {
        let dir = TestDir::new("config");
        let path = write_config(
            &dir,
            r#"
listen = "127.0.0.1:9000"
max-parallel = 4
log_format = "json"          # snake_case works too
drain-timeout = "2m"
lease-ttl = 45
no-bundled-plugins = true
allow-include-host = ["Raw.GitHubUserContent.com"]
max-include-bytes = 2048
max-input-size = 4096
event-retention-days = 7
log-level = "warn,trellis=debug"
"#,
        );
        let args = ServeArgs {
            max_parallel: Some(8),
            drain_timeout: Some(Duration::from_millis(500)),
            ..with_config(&path)
        };
        let config = args.resolve().unwrap();
        assert_eq!(config.max_parallel, 8);
        assert_eq!(config.drain_timeout, Duration::from_millis(500));
        assert_eq!(config.listen.to_string(), "127.0.0.1:9000");
        assert_eq!(config.log_format, LogFormat::Json);
        assert_eq!(config.lease_ttl, Duration::from_secs(45));
        assert!(!config.bundled_plugins);
        assert_eq!(config.include_hosts, ["raw.githubusercontent.com"]);
        assert_eq!(config.max_include_bytes, 2048);
        assert_eq!(config.max_input_size, 4096);
        assert_eq!(config.event_retention, Duration::from_secs(7 * 86_400));
        assert_eq!(config.log_level, "warn,trellis=debug");

        // An explicit `--no-bundled-plugins=false` beats the file.
        let args = ServeArgs {
            no_bundled_plugins: Some(false),
            allow_include_hosts: vec!["example.com".into()],
            ..with_config(&path)
        };
        let config = args.resolve().unwrap();
        assert!(config.bundled_plugins);
        assert_eq!(config.include_hosts, ["example.com"]);
    }

    #[test]
    fn relative_paths_follow_their_source() {
        let dir = TestDir::new("config");
        std::fs::create_dir(dir.join("blueprints")).unwrap();
        let path = write_config(
            &dir,
            r#"
data-dir = "state"
plugin-dir = ["plugins", "/opt/trellis/plugins"]
allow-path = ["./blueprints"]
listen = "unix:run/engine.sock"
"#,
        );
        let config = with_config(&path).resolve().unwrap();
        assert_eq!(config.data_dir, dir.join("state"));
        assert_eq!(
            config.plugin_dirs,
            [dir.join("plugins"), PathBuf::from("/opt/trellis/plugins")]
        );
        assert_eq!(
            config.allowed_roots,
            [dir.join("blueprints").canonicalize().unwrap()]
        );
        assert_eq!(config.listen, Listen::Unix(dir.join("run/engine.sock")));
        assert_eq!(
            config.listen.to_string(),
            format!("unix:{}", dir.join("run/engine.sock").display())
        );

        // From flags or the environment, relative to the working directory.
        let cwd = std::env::current_dir().unwrap();
        let args = ServeArgs {
            data_dir: Some("./here".into()),
            plugin_dirs: vec!["p".into()],
            listen: Some("unix:e.sock".into()),
            ..with_config(&path)
        };
        let config = args.resolve().unwrap();
        assert_eq!(config.data_dir, cwd.join("here"));
        assert_eq!(config.plugin_dirs, [cwd.join("p")]);
        assert_eq!(config.listen, Listen::Unix(cwd.join("e.sock")));
    }

    #[test]
    fn listen_addresses() {
        let base = Path::new("/srv");
        assert_eq!(
            parse_listen("[::1]:0", base).unwrap(),
            Listen::Tcp("[::1]:0".parse().unwrap())
        );
        assert!(matches!(
            parse_listen("localhost:8325", base).unwrap(),
            Listen::Tcp(addr) if addr.port() == 8325 && addr.ip().is_loopback()
        ));
        assert_eq!(
            parse_listen("unix:/run/trellis.sock", base).unwrap(),
            Listen::Unix("/run/trellis.sock".into())
        );
        assert_eq!(
            parse_listen("unix:///run/trellis.sock", base).unwrap(),
            Listen::Unix("/run/trellis.sock".into())
        );
        assert!(parse_listen("unix:", base).unwrap_err().contains("missing"));
        assert!(parse_listen("localhost", base).is_err());
        assert!(parse_listen("127.0.0.1:99999", base).is_err());
    }

    #[track_caller]
    #[test]
    fn replica_and_pool_settings() {
        let dir = TestDir::new("replicas");
        // Defaults: SQLite names the engine by its data directory; PostgreSQL adds the host.
        let sqlite = ServeArgs::default().resolve().unwrap();
        assert_eq!(sqlite.replica_name, sqlite.data_dir.display().to_string());
        assert_eq!(sqlite.lease_check_interval, Duration::from_secs(5));
        let pg = ServeArgs {
            state: Some("postgres://app@db/x".into()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert!(
            pg.replica_name
                .ends_with(&format!(":{}", pg.data_dir.display())),
            "{}",
            pg.replica_name
        );
        assert_eq!(
            (pg.state_max_connections, pg.state_statement_timeout),
            (10, Duration::from_secs(30))
        );

        let path = write_config(
            &dir,
            "state = \"postgres://app@db/x\"\nreplica-name = \"engine-a\"\n\
             lease-check-interval = \"750ms\"\nstate-max-connections = 4\n\
             state-statement-timeout = \"5s\"\n",
        );
        let config = with_config(&path).resolve().unwrap();
        assert_eq!(config.replica_name, "engine-a");
        assert_eq!(config.lease_check_interval, Duration::from_millis(750));
        assert_eq!(config.state_max_connections, 4);
        assert_eq!(config.state_statement_timeout, Duration::from_secs(5));

        let err = resolve_err(ServeArgs {
            replica_name: Some("two words".into()),
            ..ServeArgs::default()
        });
        assert!(err.starts_with("--replica-name"), "{err}");
        let err = resolve_err(ServeArgs {
            lease_check_interval: Some(Duration::ZERO),
            ..ServeArgs::default()
        });
        assert!(err.starts_with("--lease-check-interval"), "{err}");
        // Pool settings mean nothing to SQLite: saying so beats ignoring them.
        let err = resolve_err(ServeArgs {
            state_max_connections: Some(4),
            ..ServeArgs::default()
        });
        assert!(err.contains("without a PostgreSQL --state"), "{err}");
        let err = resolve_err(ServeArgs {
            state: Some("postgres://app@db/x".into()),
            state_max_connections: Some(0),
            ..ServeArgs::default()
        });
        assert!(err.starts_with("--state-max-connections"), "{err}");
    }

    fn resolve_err(args: ServeArgs) -> String {
        args.resolve().expect_err("should be refused")
    }

    #[test]
    fn file_errors_name_the_file_and_the_key() {
        let dir = TestDir::new("config");
        let path = write_config(&dir, "listen = \"127.0.0.1:1\"\nmax-paralel = 3\n");
        let err = resolve_err(with_config(&path));
        assert!(
            err.starts_with(&format!("{}:2:1: ", path.display())),
            "{err}"
        );
        assert!(err.contains("unknown field `max-paralel`"), "{err}");
        assert!(
            err.contains("`max-parallel`") && !err.contains("`max_parallel`"),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");

        let path = write_config(&dir, "max-parallel = \"many\"\n");
        let err = resolve_err(with_config(&path));
        assert!(err.contains("trellis.toml:1:16: "), "{err}");
        assert!(err.contains("`max-parallel = \"many\"`"), "{err}");

        let path = write_config(&dir, "drain-timeout = \"soon\"\n");
        let err = resolve_err(with_config(&path));
        assert!(err.contains("`soon` is not a duration"), "{err}");
        assert!(err.contains("drain-timeout"), "{err}");

        let path = write_config(&dir, "lease-ttl = -5\n");
        assert!(resolve_err(with_config(&path)).contains("lease-ttl"));

        let path = write_config(&dir, "max-parallel = 0\n");
        let err = resolve_err(with_config(&path));
        assert_eq!(
            err,
            format!(
                "`max-parallel` in {}: must be at least 1, got 0",
                path.display()
            )
        );

        let path = write_config(&dir, "listen = \"nowhere\"\n");
        let err = resolve_err(with_config(&path));
        assert!(err.starts_with("`listen` in "), "{err}");

        let path = write_config(&dir, "allow-path = [\"missing\"]\n");
        let err = resolve_err(with_config(&path));
        assert!(err.starts_with("`allow-path` in "), "{err}");
        assert!(
            err.contains(&dir.join("missing").display().to_string()),
            "{err}"
        );

        let missing = dir.join("nope.toml");
        let err = resolve_err(with_config(&missing));
        assert!(err.contains("cannot read config file"), "{err}");
    }

    #[test]
    fn metrics_listen_is_off_unless_given_and_tcp_only() {
        assert_eq!(ServeArgs::default().resolve().unwrap().metrics_listen, None);
        let dir = TestDir::new("metrics-listen");
        let path = write_config(&dir, "metrics-listen = \"127.0.0.1:9325\"\n");
        let config = with_config(&path).resolve().unwrap();
        assert_eq!(
            config.metrics_listen,
            Some("127.0.0.1:9325".parse().unwrap())
        );
        // The flag (or its environment variable) beats the file.
        let config = ServeArgs {
            metrics_listen: Some("127.0.0.1:0".into()),
            ..with_config(&path)
        }
        .resolve()
        .unwrap();
        assert_eq!(config.metrics_listen, Some("127.0.0.1:0".parse().unwrap()));
        let path = write_config(&dir, "metrics_listen = \"unix:m.sock\"\n");
        let err = resolve_err(with_config(&path));
        assert!(
            err.starts_with("`metrics-listen` in ") && err.contains("expected HOST:PORT"),
            "{err}"
        );
    }

    #[test]
    fn flag_errors_name_the_flag_and_env() {
        let err = resolve_err(ServeArgs {
            max_parallel: Some(0),
            ..ServeArgs::default()
        });
        assert_eq!(
            err,
            "--max-parallel (or TRELLIS_MAX_PARALLEL): must be at least 1, got 0"
        );
        let err = resolve_err(ServeArgs {
            listen: Some("127.0.0.1".into()),
            ..ServeArgs::default()
        });
        assert!(err.starts_with("--listen (or TRELLIS_LISTEN): "), "{err}");
        let err = resolve_err(ServeArgs {
            log_level: Some("trellis=loud".into()),
            ..ServeArgs::default()
        });
        assert!(
            err.starts_with("--log-level (or TRELLIS_LOG_LEVEL): "),
            "{err}"
        );
        let err = resolve_err(ServeArgs {
            allow_include_hosts: vec!["https://example.com/x".into()],
            ..ServeArgs::default()
        });
        assert!(err.contains("not a host name"), "{err}");
        let err = resolve_err(ServeArgs {
            lease_ttl: Some(Duration::ZERO),
            ..ServeArgs::default()
        });
        assert!(err.starts_with("--lease-ttl"), "{err}");
    }

    #[test]
    fn command_line_parsing() {
        let cli = Cli::try_parse_from([
            "serve",
            "--listen=127.0.0.1:0",
            "--plugin-dir",
            "a:b",
            "--plugin-dir=c",
            "--no-bundled-plugins",
            "--drain-timeout",
            "500ms",
            "--log-format",
            "json",
            "--allow-include-host",
            "a.example,b.example",
        ])
        .unwrap();
        let args = cli.serve;
        assert_eq!(
            args.plugin_dirs,
            [Path::new("a"), Path::new("b"), Path::new("c")]
        );
        assert_eq!(args.no_bundled_plugins, Some(true));
        assert_eq!(args.drain_timeout, Some(Duration::from_millis(500)));
        assert_eq!(args.log_format, Some(LogFormat::Json));
        assert_eq!(args.allow_include_hosts, ["a.example", "b.example"]);

        let cli = Cli::try_parse_from(["serve", "--no-bundled-plugins=false"]).unwrap();
        assert_eq!(cli.serve.no_bundled_plugins, Some(false));
        assert!(Cli::try_parse_from(["serve", "--drain-timeout", "3x"]).is_err());
    }

    #[test]
    fn evaluation_limits() {
        use crate::eval::limits::Limits;
        assert_eq!(
            ServeArgs::default().resolve().unwrap().eval_limits,
            Limits::default()
        );
        let dir = TestDir::new("config-eval-limits");
        let path = write_config(
            &dir,
            "max-value-bytes = 1024\nmax_resources = 50\nmax-eval-bytes = 65536\n",
        );
        assert_eq!(
            with_config(&path).resolve().unwrap().eval_limits,
            Limits {
                max_value_bytes: 1024,
                max_resources: 50,
                max_eval_bytes: 65536,
            }
        );
        // A flag (or its environment variable) wins over the file.
        let cli = Cli::try_parse_from([
            "serve",
            "--max-resources",
            "7",
            "--config",
            path.to_str().unwrap(),
        ])
        .unwrap();
        let merged = cli.serve.resolve().unwrap().eval_limits;
        assert_eq!((merged.max_resources, merged.max_value_bytes), (7, 1024));
        let err = resolve_err(ServeArgs {
            max_eval_bytes: Some(0),
            ..ServeArgs::default()
        });
        assert_eq!(
            err,
            "--max-eval-bytes (or TRELLIS_MAX_EVAL_BYTES): must be at least 1, got 0"
        );
    }

    #[test]
    fn durations() {
        let ok = |text: &str| parse_duration(text).unwrap();
        assert_eq!(ok("30"), Duration::from_secs(30));
        assert_eq!(ok("30s"), Duration::from_secs(30));
        assert_eq!(ok("2m"), Duration::from_secs(120));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok(" 0 "), Duration::ZERO);
        assert_eq!(ok("5 s"), Duration::from_secs(5));
        for bad in ["", "s", "-1", "1.5s", "3d", "30sec", "99999999999999999999"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_duration(&format!("{}h", u64::MAX / 60)).is_err());
    }

    #[test]
    fn logging_refuses_a_bad_filter() {
        // Only the failing path: installing the global subscriber here would make every other
        // test in this binary log to stderr.
        let mut config = ServeArgs::default().resolve().unwrap();
        config.log_level = "trellis=loud".into();
        let err = init_logging(&config).unwrap_err();
        assert!(err.contains("not a log filter"), "{err}");
    }

    #[test]
    fn connection_settings() {
        let defaults = ServeArgs::default().resolve().unwrap().connections;
        assert_eq!(
            defaults,
            ConnectionSettings {
                max_connections: 512,
                idle_timeout: Some(Duration::from_secs(300)),
                http2_keepalive_interval: Some(Duration::from_secs(60)),
                http2_keepalive_timeout: Duration::from_secs(20),
                tcp_keepalive: Some(Duration::from_secs(60)),
            }
        );
        let dir = TestDir::new("config-connections");
        let path = write_config(
            &dir,
            "max-connections = 8\nidle_timeout = \"90s\"\nhttp2-keepalive-interval = 0\n\
             http2-keepalive-timeout = 5\ntcp-keepalive = \"0\"\n",
        );
        let from_file = with_config(&path).resolve().unwrap().connections;
        assert_eq!(
            from_file,
            ConnectionSettings {
                max_connections: 8,
                idle_timeout: Some(Duration::from_secs(90)),
                http2_keepalive_interval: None,
                http2_keepalive_timeout: Duration::from_secs(5),
                tcp_keepalive: None,
            }
        );
        // A flag (or its environment variable) wins over the file.
        let cli = Cli::try_parse_from([
            "serve",
            "--max-connections",
            "3",
            "--idle-timeout",
            "0",
            "--config",
            path.to_str().unwrap(),
        ])
        .unwrap();
        let merged = cli.serve.resolve().unwrap().connections;
        assert_eq!(merged.max_connections, 3);
        assert_eq!(merged.idle_timeout, None);
        assert_eq!(merged.http2_keepalive_timeout, Duration::from_secs(5));

        let err = resolve_err(ServeArgs {
            max_connections: Some(0),
            ..ServeArgs::default()
        });
        assert_eq!(
            err,
            "--max-connections (or TRELLIS_MAX_CONNECTIONS): must be at least 1, got 0"
        );
        let err = resolve_err(ServeArgs {
            http2_keepalive_timeout: Some(Duration::ZERO),
            ..ServeArgs::default()
        });
        assert!(err.starts_with("--http2-keepalive-timeout"), "{err}");
        let err = resolve_err(ServeArgs {
            tcp_keepalive: Some(Duration::from_millis(500)),
            ..ServeArgs::default()
        });
        assert!(err.contains("at least 1s"), "{err}");
    }

    /// Checks the engine's gRPC plumbing end to end: tonic serves health on our
    /// [`Incoming`], and a client reaches it.
    async fn serve_health_and_check(
        bound: Bound,
        channel: impl AsyncFnOnce() -> tonic::transport::Channel,
    ) {
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
        let (_reporter, service) = tonic_health::server::health_reporter();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(bound.into_incoming(), async {
                    let _ = stopped.await;
                }),
        );
        let reply = HealthClient::new(channel().await)
            .check(HealthCheckRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.status(), ServingStatus::Serving);
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn bind_tcp_port_zero() {
        let bound = bind(&Listen::Tcp("127.0.0.1:0".parse().unwrap()))
            .await
            .unwrap();
        let Listen::Tcp(addr) = bound.listen() else {
            panic!("not tcp")
        };
        assert_ne!(addr.port(), 0);
        assert_eq!(bound.display(), format!("127.0.0.1:{}", addr.port()));
        serve_health_and_check(bound, async || {
            tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap()
        })
        .await;
    }

    #[tokio::test]
    async fn bind_unix_socket() {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let dir = TestDir::new("config");
        let path = dir.join("sub/e.sock");
        let listen = Listen::Unix(path.clone());

        // Not a socket: left alone.
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "data").unwrap();
        let err = bind(&listen).await.unwrap_err();
        assert!(err.to_string().contains("is not a socket"), "{err}");
        std::fs::remove_file(&path).unwrap();

        // A stale socket (nobody listening) is replaced.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let bound = bind(&listen).await.unwrap();
        assert_eq!(bound.display(), format!("unix:{}", path.display()));
        let meta = std::fs::metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);

        // A live one is not.
        let err = bind(&listen).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");

        let socket = path.clone();
        serve_health_and_check(bound, async move || {
            tonic::transport::Endpoint::from_static("http://engine.invalid")
                .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                    let socket = socket.clone();
                    async move {
                        let stream = UnixStream::connect(socket).await?;
                        Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                }))
                .await
                .unwrap()
        })
        .await;
    }

    #[test]
    fn auth_table_and_the_secure_default() {
        let dir = TestDir::new("config");
        let path = write_config(
            &dir,
            "listen = \"0.0.0.0:0\"\n[auth]\ntokens_file = \"tokens.toml\"\nopen-reflection = true\n",
        );
        let config = with_config(&path).resolve().unwrap();
        assert_eq!(
            config.auth,
            Some(AuthSettings {
                tokens_file: dir.join("tokens.toml"),
                open_reflection: true,
            })
        );
        // Without `[auth]`, a non-loopback address is refused unless asked for on purpose.
        let err = resolve_err(ServeArgs {
            listen: Some("0.0.0.0:0".into()),
            ..ServeArgs::default()
        });
        assert!(
            err.contains("refusing to listen on 0.0.0.0:0 without authentication"),
            "{err}"
        );
        assert!(err.contains("--insecure-no-auth"), "{err}");
        let config = ServeArgs {
            listen: Some("0.0.0.0:0".into()),
            insecure_no_auth: true,
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert!(config.auth.is_none() && config.insecure_no_auth);
        // Loopback and Unix sockets need neither.
        for listen in ["127.0.0.1:0", "[::1]:0", "unix:/tmp/x.sock"] {
            let config = ServeArgs {
                listen: Some(listen.into()),
                ..ServeArgs::default()
            }
            .resolve()
            .unwrap();
            assert!(config.auth.is_none());
        }
        let err = resolve_err(ServeArgs {
            insecure_no_auth: true,
            ..with_config(&path)
        });
        assert!(err.contains("[auth]"), "{err}");
        let bad = write_config(&dir, "[auth]\ntokens-file = \"t\"\ntoken = \"x\"\n");
        assert!(resolve_err(with_config(&bad)).contains("token"));
    }
}

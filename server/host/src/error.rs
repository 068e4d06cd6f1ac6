//! Errors of the plugin host. Every message names the plugin.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use trellis_proto::plugin::v1 as pb;

use super::discovery::PluginKind;

/// How a plugin process ended.
#[derive(Clone, Debug)]
pub struct ExitInfo {
    pub pid: u32,
    /// `exit code 3`, `killed by signal 9 (SIGKILL)`.
    pub status: String,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The last lines the plugin wrote to stderr (oldest first).
    pub stderr_tail: Vec<String>,
    /// The engine asked it to stop (shutdown), so this is not a crash.
    pub expected: bool,
}

/// An application error from a plugin (the `error` field of a response),
/// after the retries the plugin's retry policy allows.
#[derive(Clone, Debug)]
pub struct AppError {
    pub plugin: String,
    /// The RPC, e.g. `CallFunction(echo)`.
    pub call: String,
    pub attempts: u32,
    pub error: pb::Error,
    /// For ApplyResource: the external id reported with the error (something
    /// was created before the failure).
    pub external_id: Option<String>,
    /// For ApplyResource: the state reported with the error.
    pub state: Option<pb::Value>,
}

impl AppError {
    pub fn class(&self) -> pb::ErrorClass {
        pb::ErrorClass::try_from(self.error.error_class).unwrap_or(pb::ErrorClass::Unspecified)
    }
}

#[derive(Clone, Debug)]
pub enum PluginError {
    /// No plugin of that kind and name was discovered.
    NotFound {
        kind: PluginKind,
        name: String,
        searched: Vec<PathBuf>,
    },
    /// The plugin could not be started, did not print its handshake line in
    /// time, or failed the Handshake call.
    Launch {
        plugin: String,
        path: PathBuf,
        reason: String,
        /// Set when the process had exited when the launch failed.
        exit: Option<String>,
        stderr_tail: Vec<String>,
    },
    /// The plugin process exited while a call was in flight (or before it
    /// could be answered).
    Crashed {
        plugin: String,
        call: String,
        exit: Box<ExitInfo>,
    },
    /// Too many crashes in the breaker window: calls fail fast until the
    /// breaker half-opens.
    CircuitOpen {
        plugin: String,
        crashes: usize,
        window: Duration,
        retry_in: Duration,
        last_error: String,
    },
    /// The plugin crashed recently and its restart backoff outlasts the
    /// call's deadline.
    Restarting {
        plugin: String,
        retry_in: Duration,
        last_error: String,
    },
    DeadlineExceeded {
        plugin: String,
        call: String,
        deadline: Duration,
    },
    /// A gRPC failure that is not a crash (e.g. UNIMPLEMENTED, a refused
    /// connection while the process lives).
    Transport {
        plugin: String,
        call: String,
        code: tonic::Code,
        message: String,
    },
    /// The plugin broke the protocol (wrong name, missing result, ...).
    Protocol {
        plugin: String,
        call: String,
        message: String,
    },
    Application(Box<AppError>),
    /// The host is shutting down and starts no plugin.
    ShutDown {
        plugin: String,
    },
    /// A local I/O failure (socket directory, cache).
    Io {
        plugin: String,
        context: String,
    },
}

impl PluginError {
    /// The plugin (provider namespace or transformer name) the error is about.
    pub fn plugin(&self) -> &str {
        match self {
            PluginError::NotFound { name, .. } => name,
            PluginError::Launch { plugin, .. }
            | PluginError::Crashed { plugin, .. }
            | PluginError::CircuitOpen { plugin, .. }
            | PluginError::Restarting { plugin, .. }
            | PluginError::DeadlineExceeded { plugin, .. }
            | PluginError::Transport { plugin, .. }
            | PluginError::Protocol { plugin, .. }
            | PluginError::ShutDown { plugin }
            | PluginError::Io { plugin, .. } => plugin,
            PluginError::Application(e) => &e.plugin,
        }
    }

    /// The application error class, for [`PluginError::Application`].
    pub fn class(&self) -> Option<pb::ErrorClass> {
        match self {
            PluginError::Application(e) => Some(e.class()),
            _ => None,
        }
    }

    /// Stable short name of the variant, for JSON output and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            PluginError::NotFound { .. } => "not_found",
            PluginError::Launch { .. } => "launch",
            PluginError::Crashed { .. } => "crashed",
            PluginError::CircuitOpen { .. } => "circuit_open",
            PluginError::Restarting { .. } => "restarting",
            PluginError::DeadlineExceeded { .. } => "deadline_exceeded",
            PluginError::Transport { .. } => "transport",
            PluginError::Protocol { .. } => "protocol",
            PluginError::Application(_) => "application",
            PluginError::ShutDown { .. } => "shut_down",
            PluginError::Io { .. } => "io",
        }
    }
}

fn write_tail(f: &mut fmt::Formatter<'_>, tail: &[String]) -> fmt::Result {
    if tail.is_empty() {
        return write!(f, "; no stderr output");
    }
    write!(f, "; last stderr lines:")?;
    for line in tail {
        write!(f, "\n  | {line}")?;
    }
    Ok(())
}

pub(crate) fn class_name(class: i32) -> &'static str {
    match pb::ErrorClass::try_from(class).unwrap_or(pb::ErrorClass::Unspecified) {
        pb::ErrorClass::Unspecified => "UNSPECIFIED",
        pb::ErrorClass::Transient => "TRANSIENT",
        pb::ErrorClass::BadInput => "BAD_INPUT",
        pb::ErrorClass::Conflict => "CONFLICT",
        pb::ErrorClass::NotFound => "NOT_FOUND",
        pb::ErrorClass::Permission => "PERMISSION",
        pb::ErrorClass::Internal => "INTERNAL",
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginError::NotFound {
                kind,
                name,
                searched,
            } => {
                write!(
                    f,
                    "no {kind} plugin `{name}`: no executable `{}` in ",
                    kind.file_name(name)
                )?;
                if searched.is_empty() {
                    write!(f, "any plugin directory (none configured)")
                } else {
                    let dirs: Vec<String> =
                        searched.iter().map(|d| d.display().to_string()).collect();
                    write!(f, "{}", dirs.join(", "))
                }
            }
            PluginError::Launch {
                plugin,
                path,
                reason,
                exit,
                stderr_tail,
            } => {
                write!(
                    f,
                    "plugin `{plugin}` ({}) failed to start: {reason}",
                    path.display()
                )?;
                if let Some(exit) = exit {
                    write!(f, " ({exit})")?;
                }
                write_tail(f, stderr_tail)
            }
            PluginError::Crashed { plugin, call, exit } => {
                write!(
                    f,
                    "plugin `{plugin}` (pid {}) exited during {call}: {}",
                    exit.pid, exit.status
                )?;
                write_tail(f, &exit.stderr_tail)
            }
            PluginError::CircuitOpen {
                plugin,
                crashes,
                window,
                retry_in,
                last_error,
            } => write!(
                f,
                "plugin `{plugin}` is disabled after {crashes} failures in a row or within {}s (circuit breaker open; \
                 next attempt allowed in {:.1}s); last failure: {last_error}",
                window.as_secs(),
                retry_in.as_secs_f64()
            ),
            PluginError::Restarting {
                plugin,
                retry_in,
                last_error,
            } => write!(
                f,
                "plugin `{plugin}` is restarting after a failure (next start in {:.1}s, after the \
                 call's deadline); last failure: {last_error}",
                retry_in.as_secs_f64()
            ),
            PluginError::DeadlineExceeded {
                plugin,
                call,
                deadline,
            } => write!(
                f,
                "plugin `{plugin}`: {call} did not finish within its deadline of {:.3}s",
                deadline.as_secs_f64()
            ),
            PluginError::Transport {
                plugin,
                call,
                code,
                message,
            } => write!(f, "plugin `{plugin}`: {call} failed: {code:?}: {message}"),
            PluginError::Protocol {
                plugin,
                call,
                message,
            } => write!(
                f,
                "plugin `{plugin}` broke the plugin protocol in {call}: {message}"
            ),
            PluginError::Application(e) => {
                write!(
                    f,
                    "plugin `{}`: {} failed with {}: {}",
                    e.plugin,
                    e.call,
                    class_name(e.error.error_class),
                    e.error.message
                )?;
                if e.attempts > 1 {
                    write!(f, " (after {} attempts)", e.attempts)?;
                }
                Ok(())
            }
            PluginError::ShutDown { plugin } => {
                write!(
                    f,
                    "plugin `{plugin}`: stopped by the engine (shutting down)"
                )
            }
            PluginError::Io { plugin, context } => write!(f, "plugin `{plugin}`: {context}"),
        }
    }
}

impl std::error::Error for PluginError {}

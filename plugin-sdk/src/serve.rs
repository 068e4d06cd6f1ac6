//! `serve_provider` and `serve_transformer`: LAUNCH and LIFETIME of the
//! plugin protocol (see the header of proto/trellis/plugin/v1/plugin.proto).

use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;

use crate::error::Result;
use crate::provider::Provider;
use crate::service::{Services, provider_services, transformer_services};
use crate::transformer::Transformer;

/// The plugin protocol version this SDK speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// How long in-flight calls may run after SIGTERM before they are cancelled.
const TERM_GRACE: Duration = Duration::from_secs(10);
/// How long cancelled calls (or, after stdin closed, any call) get to return.
const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// Unix socket paths are limited to about 108 bytes.
const MAX_SOCKET_PATH: usize = 100;

const ENV_NONCE: &str = "TRELLIS_PLUGIN_NONCE";
const ENV_VERSIONS: &str = "TRELLIS_PLUGIN_PROTOCOL_VERSIONS";
const ENV_SOCKET_DIR: &str = "TRELLIS_PLUGIN_SOCKET_DIR";
/// Log filter (tracing-subscriber `EnvFilter` syntax); `info` by default.
const ENV_LOG: &str = "TRELLIS_PLUGIN_LOG";

/// Runs a provider plugin until the engine lets it go. Call it from `main`:
///
/// ```no_run
/// # use trellis_plugin_sdk::prelude::*;
/// # struct MyProvider;
/// # impl Provider for MyProvider { fn namespace(&self) -> &str { "my" } }
/// fn main() -> std::process::ExitCode {
///     trellis_plugin_sdk::serve_provider(MyProvider)
/// }
/// ```
///
/// It reads `TRELLIS_PLUGIN_NONCE`, `TRELLIS_PLUGIN_PROTOCOL_VERSIONS` and
/// `TRELLIS_PLUGIN_SOCKET_DIR`, listens on a Unix socket in that directory,
/// serves Plugin, Provider and grpc.health.v1, prints
/// `TRELLIS_PLUGIN|1|unix|<socket>` and serves until stdin reaches
/// end-of-file (the engine is gone: calls are cancelled) or SIGTERM/SIGINT
/// (no new calls; in-flight calls get 10 s, or until stdin closes, then are
/// cancelled). Exit codes:
/// 0 after a shutdown, 1 when the plugin cannot start, 2 when run by hand
/// without the environment.
pub fn serve_provider<P: Provider>(provider: P) -> ExitCode {
    let about = format!("provider `{}` {}", provider.namespace(), provider.version());
    serve(about, move |nonce| provider_services(provider, nonce))
}

/// Runs a transformer plugin; see [`serve_provider`].
pub fn serve_transformer<T: Transformer>(transformer: T) -> ExitCode {
    let about = format!(
        "transformer `{}` {}",
        transformer.name(),
        transformer.version()
    );
    serve(about, move |nonce| transformer_services(transformer, nonce))
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env(ENV_LOG).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .without_time();
    // Launched by the engine: one JSON object a line, which the engine turns into its own
    // structured fields (docs/plugin-protocol.md, "Logs"); by hand: plain lines for a person.
    // The engine adds the time and the plugin's name either way.
    let _ = if std::env::var_os(ENV_NONCE).is_some() {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
    } else {
        builder.with_target(false).try_init()
    };
}

struct Launch {
    nonce: String,
    socket_dir: PathBuf,
}

enum LaunchError {
    /// Not started by the engine.
    ByHand,
    Bad(String),
}

fn read_launch_env() -> std::result::Result<Launch, LaunchError> {
    let nonce = std::env::var(ENV_NONCE).ok().filter(|n| !n.is_empty());
    let dir = std::env::var_os(ENV_SOCKET_DIR).filter(|d| !d.is_empty());
    let (nonce, dir) = match (nonce, dir) {
        (Some(n), Some(d)) => (n, PathBuf::from(d)),
        (None, None) => return Err(LaunchError::ByHand),
        (None, _) => return Err(LaunchError::Bad(format!("{ENV_NONCE} is not set"))),
        (_, None) => return Err(LaunchError::Bad(format!("{ENV_SOCKET_DIR} is not set"))),
    };
    // Absent means the engine speaks version 1 only.
    let versions = std::env::var(ENV_VERSIONS).unwrap_or_else(|_| PROTOCOL_VERSION.to_string());
    let speaks = versions
        .split(',')
        .any(|v| v.trim().parse::<u32>().ok() == Some(PROTOCOL_VERSION));
    if !speaks {
        return Err(LaunchError::Bad(format!(
            "the engine speaks protocol versions `{versions}`; this plugin speaks {PROTOCOL_VERSION}"
        )));
    }
    Ok(Launch {
        nonce,
        socket_dir: dir,
    })
}

fn serve(about: String, build: impl FnOnce(String) -> Result<Services>) -> ExitCode {
    let launch = match read_launch_env() {
        Ok(l) => l,
        Err(LaunchError::ByHand) => {
            eprintln!(
                "This is a Trellis plugin ({about}).\n\
                 It is started by the Trellis engine, which sets {ENV_NONCE}, {ENV_VERSIONS}\n\
                 and {ENV_SOCKET_DIR}, and then talks to it over a Unix socket.\n\
                 Install it where the engine looks for plugins instead of running it by hand."
            );
            return ExitCode::from(2);
        }
        Err(LaunchError::Bad(msg)) => {
            eprintln!("plugin launch failed: {msg}");
            return ExitCode::from(1);
        }
    };
    init_logging();
    let services = match build(launch.nonce.clone()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("the plugin's declaration is invalid: {}", e.message);
            return ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(run(services, launch.socket_dir));
    // Do not wait for callbacks that ignored cancellation.
    runtime.shutdown_timeout(Duration::from_millis(200));
    code
}

fn socket_path(dir: &Path, name: &str) -> std::result::Result<PathBuf, String> {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    let candidates = [
        dir.join(format!("{clean}-{}.sock", std::process::id())),
        dir.join("p.sock"),
    ];
    candidates
        .into_iter()
        .find(|p| p.as_os_str().len() <= MAX_SOCKET_PATH)
        .ok_or_else(|| {
            format!(
                "{ENV_SOCKET_DIR} ({}) is too long for a Unix socket path",
                dir.display()
            )
        })
}

fn bind(path: &Path) -> std::io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    StdinClosed,
    Signal(&'static str),
}

/// Completes when stdin reaches end-of-file (read on a plain thread, so a
/// blocked read never holds up the runtime's shutdown).
fn stdin_closed() -> oneshot::Receiver<()> {
    let (tx, rx) = oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("trellis-stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 1024];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = tx.send(());
        });
    if let Err(e) = spawned {
        tracing::error!("cannot watch stdin: {e}");
    }
    rx
}

/// Completes when stdin reaches end-of-file; never if it cannot be watched,
/// or once it has already completed (a finished receiver must not be polled
/// again).
async fn engine_gone(stdin: &mut Option<oneshot::Receiver<()>>) {
    if let Some(rx) = stdin.as_mut() {
        let closed = rx.await.is_ok();
        *stdin = None;
        if closed {
            return;
        }
    }
    std::future::pending::<()>().await;
}

/// SIGTERM and SIGINT, caught from the moment this is made: before the handshake line, so a
/// signal the engine sends as soon as it has read the line is a graceful stop, not a kill.
struct Signals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn catch() -> Signals {
        Signals {
            term: signal(SignalKind::terminate()).ok(),
            int: signal(SignalKind::interrupt()).ok(),
        }
    }
}

async fn stop_requested(stdin: &mut Option<oneshot::Receiver<()>>, signals: &mut Signals) -> Stop {
    let Signals { term, int } = signals;
    let term_fut = async {
        match term.as_mut() {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    let int_fut = async {
        match int.as_mut() {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = engine_gone(stdin) => Stop::StdinClosed,
        () = term_fut => Stop::Signal("SIGTERM"),
        () = int_fut => Stop::Signal("SIGINT"),
    }
}

async fn run(services: Services, dir: PathBuf) -> ExitCode {
    let path = match socket_path(&dir, &services.name) {
        Ok(p) => p,
        Err(msg) => {
            tracing::error!("{msg}");
            return ExitCode::from(1);
        }
    };
    let listener = match bind(&path) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("cannot listen on {}: {e}", path.display());
            return ExitCode::from(1);
        }
    };
    let mut builder = tonic::transport::Server::builder();
    let (router, health) = services.router(&mut builder).await;
    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    // The engine may be any gRPC client: gRPC's C core sends the socket path as authority.
    let incoming = trellis_proto::unix_conn::incoming(listener);
    let server = router.serve_with_incoming_shutdown(incoming, async {
        let _ = shutdown_rx.await;
    });
    tokio::pin!(server);

    let mut signals = Signals::catch();
    {
        let mut out = std::io::stdout().lock();
        let line = format!("TRELLIS_PLUGIN|{PROTOCOL_VERSION}|unix|{}", path.display());
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            tracing::error!("cannot write the handshake line to stdout");
            let _ = std::fs::remove_file(&path);
            return ExitCode::from(1);
        }
    }
    tracing::info!(socket = %path.display(), "serving");

    let mut stdin = Some(stdin_closed());
    let stop = tokio::select! {
        r = &mut server => {
            // The server stopped on its own: a transport failure.
            let _ = std::fs::remove_file(&path);
            return match r {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("the server failed: {e}");
                    ExitCode::from(1)
                }
            };
        }
        s = stop_requested(&mut stdin, &mut signals) => s,
    };
    let calls = services.calls.clone();
    tracing::info!(in_flight = calls.in_flight(), "shutting down ({stop:?})");
    services.set_not_serving(&health).await;
    let _ = shutdown_tx.send(());
    // Whether the remaining calls are cancelled, and why.
    let cancel = match stop {
        Stop::StdinClosed => Some(false),
        Stop::Signal(_) => {
            // In-flight calls may finish, unless the engine goes away
            // meanwhile: the engine's own shutdown closes stdin and signals
            // at once, and either may arrive first.
            tokio::select! {
                r = tokio::time::timeout(TERM_GRACE, &mut server) => r.is_err().then_some(true),
                () = engine_gone(&mut stdin) => Some(false),
            }
        }
    };
    if let Some(grace_over) = cancel {
        let in_flight = calls.in_flight();
        if grace_over {
            tracing::warn!(
                in_flight,
                "calls still running after the grace; cancelling calls"
            );
        } else if in_flight > 0 {
            tracing::info!(in_flight, "the engine is gone; cancelling calls");
        }
        calls.cancel_all();
        if tokio::time::timeout(CANCEL_GRACE, &mut server)
            .await
            .is_err()
        {
            tracing::warn!("calls ignored cancellation; exiting anyway");
        }
    }
    let _ = std::fs::remove_file(&path);
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths_fit() {
        let p = socket_path(Path::new("/tmp/x"), "my provider/ä").unwrap_or_default();
        let s = p.to_string_lossy().into_owned();
        assert!(s.starts_with("/tmp/x/my_provider__-"), "{s}");
        assert!(s.ends_with(".sock"));
        let long = "/tmp/".to_owned() + &"d".repeat(88);
        let p = socket_path(Path::new(&long), "name").unwrap_or_default();
        assert!(p.ends_with("p.sock"));
        assert!(socket_path(Path::new(&"/x".repeat(60)), "n").is_err());
    }
}

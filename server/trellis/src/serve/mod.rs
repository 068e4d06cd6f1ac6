//! `trellis serve`: the engine daemon. Opens the state store in the data directory (one engine
//! per directory), recovers operations a previous run left unfinished, serves the engine API
//! with gRPC health and reflection (over TLS on TCP with `--tls-cert`/`--tls-key`), and on
//! SIGTERM/SIGINT drains: no new mutations, running operations stop at a safe point within the
//! drain timeout (or are marked interrupted), plugins are stopped, exit 0.

mod api;
pub mod auth;
mod config;
mod conns;
mod decode_status;
mod listen;
mod logging;
mod metrics;
mod providers;
mod status_body;
mod trace;

pub(crate) use trace::REQUEST_ID_HEADER;

use std::process::ExitCode;
use std::sync::Arc;

pub use config::ServeArgs;
use config::{ServeConfig, StateLocation};
use listen::Bound;

use tonic::transport::{Identity, ServerTlsConfig};

use crate::engine::provision::{PluginProvisioner, StoreLookup as PluginLookup};
use crate::engine::remote::RemoteIncludes;
use crate::engine::settings;
use crate::engine::{Engine, EngineConfig};
use crate::plugins::{HostConfig, PluginHost};
use crate::state::{PostgresOptions, PostgresStore, RetentionPolicy, SqliteStore, StateStore};

/// How long connections may take to close after the drain.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// A client that connects must finish its TLS handshake within this time.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A clock this far from the database server's is worth a warning at startup.
const CLOCK_SKEW_WARNING: std::time::Duration = std::time::Duration::from_secs(1);

/// Opens the state store `--state` names: SQLite in the data directory (locked for the
/// engine's life) or PostgreSQL (migrated at connect). Messages show the URL redacted.
async fn open_state(config: &ServeConfig) -> Result<Arc<dyn StateStore>, String> {
    match &config.state {
        StateLocation::Sqlite => {
            let data_dir = config.data_dir.clone();
            let store = tokio::task::spawn_blocking(move || SqliteStore::open(&data_dir))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("state store: {e}"))?;
            Ok(Arc::new(store))
        }
        StateLocation::Postgres { url, password } => {
            let options = PostgresOptions {
                password: password.clone(),
                max_connections: config.state_max_connections,
                statement_timeout: config.state_statement_timeout,
                ..PostgresOptions::default()
            };
            let store = PostgresStore::connect(url, options)
                .await
                .map_err(|e| format!("state store ({}): {e}", config.state.display()))?;
            // Replicas compare lease expiry with their own clocks (docs/state.md, "Replicas").
            match store.clock_skew().await {
                Ok(skew) if skew.unsigned_abs() > CLOCK_SKEW_WARNING.as_millis() as u64 => {
                    tracing::warn!(skew_ms = skew, lease_ttl = ?config.lease_ttl,
                        "this machine's clock differs from the database server's: replicas judge lease expiry by their own clocks, so keep them in sync (NTP)")
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "could not compare clocks with the database server")
                }
            }
            Ok(Arc::new(store))
        }
    }
}

pub fn run(args: ServeArgs) -> ExitCode {
    let config = match args.resolve() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = logging::init_logging(&config) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("trellis")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = rt.block_on(serve(config));
    // An operation still running past the drain timeout is already marked interrupted, and
    // its thread may wait for calls whose tasks stop with the runtime: dropping the runtime
    // would wait for that thread for ever, so the engine stops waiting after a moment.
    rt.shutdown_timeout(RUNTIME_STOP_GRACE);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// How long blocking work may go on once the server has stopped (see [`run`]).
const RUNTIME_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

async fn serve(config: ServeConfig) -> Result<(), String> {
    // Who may call (docs/auth.md): the tokens file is read before anything else starts, so a
    // mistake in it stops the engine at once.
    let tokens = match &config.auth {
        Some(auth) => {
            let store = auth::TokenStore::open(auth.tokens_file.clone())?;
            tracing::info!(tokens_file = %auth.tokens_file.display(), tokens = store.len(), "authentication on: bearer tokens");
            // Registered now, before the engine says it listens: a SIGHUP from then on
            // reloads, never kills.
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
                Ok(hup) => {
                    tokio::spawn(reload_tokens_on_sighup(store.clone(), hup));
                }
                Err(e) => tracing::warn!(
                    "cannot handle SIGHUP ({e}): the tokens file is read only at startup"
                ),
            }
            Some(store)
        }
        None => {
            if config.insecure_no_auth {
                tracing::warn!(listen = %config.listen, "--insecure-no-auth: the engine API is served WITHOUT authentication; anyone who can reach this address can deploy, destroy and read secrets");
            }
            None
        }
    };
    let store = open_state(&config).await?;

    let mut host_config = HostConfig::with_data_dir(&config.data_dir);
    host_config.plugin_dirs = config.plugin_dirs.clone();
    host_config.search_exe_dir = config.bundled_plugins;
    let host = Arc::new(PluginHost::new(host_config));
    // Plugins may read resources of the instance a call of theirs is for (Host.LookupResource).
    host.set_state_lookup(Arc::new(PluginLookup(store.clone())));

    let cwd = std::env::current_dir().map_err(|e| format!("working directory: {e}"))?;
    // Provider settings are checked before the engine accepts anything: a typo in a key is a
    // startup error, not a failed deploy later. The local provider, when installed, is
    // confined to the working directory unless the config gives it another root.
    let mut settings = config.settings.clone();
    if host.provider("local").is_ok() {
        providers::confine_local(&mut settings, &cwd);
    }
    // The engine's own secrets (credentials in `[providers]`) are cut out of provider messages
    // and plugin logs for as long as it runs, its startup check included.
    let _settings_secrets = crate::redact::hold(settings.secret_texts());
    providers::check(&settings, &host).await?;
    // Calls made without a request's settings (a plugin calling another's function through
    // the host) carry the engine's.
    host.set_default_configs(
        settings::merge(&settings, &Default::default())
            .map(|m| m.configs().to_map())
            .unwrap_or_default(),
    );
    let remote_includes = RemoteIncludes::new(
        config.include_hosts.clone(),
        config.max_include_bytes,
        &config.include_ca_certs,
    )
    .map_err(|e| format!("remote includes (--allow-include-host): {e}"))?;
    // Local assets a request carries are kept beside the state, by digest (docs/assets.md).
    let assets = crate::engine::assets::Store::new(config.data_dir.join("assets"))
        .shared_through(store.clone());
    let engine = Engine::new(
        store.clone(),
        host.clone(),
        Arc::new(PluginProvisioner {
            host: host.clone(),
            assets: assets.clone(),
        }),
        EngineConfig {
            owner: format!("trellis@{}", config.replica_name),
            max_parallel: config.max_parallel,
            lease_ttl: config.lease_ttl,
            max_input_size: config.max_input_size,
            eval_limits: config.eval_limits,
            allowed_roots: config.allowed_roots.clone(),
            remote_includes,
            cwd,
            settings,
            assets,
        },
        tokio::runtime::Handle::current(),
    );
    if !config.include_hosts.is_empty() {
        tracing::info!(hosts = ?config.include_hosts, max_bytes = config.max_include_bytes, "https:// includes are fetched from these hosts");
    }
    let interrupted = engine.recover().await.map_err(|e| e.to_string())?;
    for op in &interrupted {
        tracing::warn!(operation = %op.id, instance = %op.instance_id, "operation from a previous run marked interrupted");
    }
    // Replicas on one database: each looks for operations another one left behind (it died or
    // froze past its lease) and marks them interrupted. One engine per SQLite file needs none.
    let _takeover = matches!(config.state, StateLocation::Postgres { .. }).then(|| {
        let engine = engine.clone();
        let every = config.lease_check_interval;
        spawn_lease_checks(engine, every).drop_guard()
    });
    let _retention = crate::state::spawn_retention(
        store.clone(),
        RetentionPolicy {
            events_older_than: config.event_retention,
            change_sets_older_than: config.event_retention,
            ..RetentionPolicy::default()
        },
        std::time::Duration::from_secs(3600),
    );

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<trellis_proto::engine::v1::engine_server::EngineServer<api::EngineApi>>()
        .await;
    // Both versions: grpcurl speaks v1, grpcio-reflection and many other tools v1alpha.
    let reflection = reflection_builder()
        .build_v1()
        .map_err(|e| format!("reflection: {e}"))?;
    let reflection_v1alpha = reflection_builder()
        .build_v1alpha()
        .map_err(|e| format!("reflection: {e}"))?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let engine_service = trellis_proto::engine::v1::engine_server::EngineServer::new(
        api::EngineApi::new(engine.clone(), shutdown.clone()),
    )
    // A plan request may carry local assets besides its documents (docs/assets.md).
    .max_decoding_message_size(
        config
            .max_input_size
            .saturating_add(crate::engine::assets::MAX_REQUEST_BYTES)
            .saturating_add(1 << 20),
    );

    let bound = listen::bind(&config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    // TLS on TCP only: a Unix socket is protected by its file permissions.
    let tls = match (&config.tls, &bound) {
        (Some(tls), Bound::Tcp(..)) => Some(tls),
        (Some(tls), Bound::Unix(..)) => {
            tracing::warn!(cert = %tls.cert.display(), "TLS is not used on a Unix socket: --tls-cert and --tls-key are ignored");
            None
        }
        (None, _) => None,
    };
    let address = match tls {
        Some(_) => format!("https://{}", bound.display()),
        None => bound.display(),
    };
    if let Some(addr) = config.metrics_listen {
        let listener = metrics::bind(addr).await?;
        let bound = listener.local_addr().map_err(|e| format!("metrics: {e}"))?;
        if !addr.ip().is_loopback() {
            tracing::warn!(address = %bound, "metrics are served on a non-loopback address without authentication: they hold no secrets but show the engine's activity (docs/serve.md, \"Metrics\")");
        }
        metrics::serve(listener);
        // Printed before the engine's line, which tests read last.
        println!("trellis metrics listening on http://{bound}");
    }
    // Tests and scripts read this line to learn the address (port 0 picks a free one).
    println!("trellis engine listening on {address}");
    tracing::info!(address = %address, data_dir = %config.data_dir.display(), state = %config.state.display(), "engine started");

    let signal_engine = engine.clone();
    let signal_shutdown = shutdown.clone();
    let drain_timeout = config.drain_timeout;
    let health = health_reporter.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!(timeout = ?drain_timeout, "shutdown requested: draining");
        health
            .set_not_serving::<trellis_proto::engine::v1::engine_server::EngineServer<api::EngineApi>>()
            .await;
        health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        signal_engine.drain(drain_timeout).await;
        signal_shutdown.cancel();
    });

    let conn_settings = config.connections;
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(conn_settings.http2_keepalive_interval)
        .http2_keepalive_timeout(Some(conn_settings.http2_keepalive_timeout))
        .layer(trace::TraceLayer)
        // Outside auth and the status fix: counts refusals, and the codes clients see.
        .layer(metrics::RpcMetricsLayer)
        .layer(conns::ActivityLayer)
        .layer(tower::util::MapResponseLayer::new(
            decode_status::fix_response,
        ))
        // Inside the request's span, so its decisions are logged with the request id.
        .layer(auth::AuthLayer::new(
            tokens,
            config.auth.as_ref().is_some_and(|a| a.open_reflection),
        ));
    if let Some(tls) = tls {
        builder = builder
            .tls_config(
                ServerTlsConfig::new()
                    .identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem))
                    .timeout(TLS_HANDSHAKE_TIMEOUT),
            )
            .map_err(|e| format!("TLS ({}): {e}", tls.cert.display()))?;
    }
    let router = builder
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(engine_service);
    let unix_socket = match &bound {
        Bound::Unix(_, path) => Some(path.clone()),
        Bound::Tcp(..) => None,
    };
    let incoming = conns::Limited::new(
        bound.into_incoming(),
        conns::ConnLimits {
            max_connections: conn_settings.max_connections,
            idle_timeout: conn_settings.idle_timeout,
            tcp_keepalive: conn_settings.tcp_keepalive,
        },
    );
    let server = router.serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned());
    // A graceful HTTP/2 close waits for each client to answer; a client that never does (hung,
    // or its process stopped) must not keep the engine from exiting.
    let grace = async {
        shutdown.cancelled().await;
        tokio::time::sleep(CLOSE_GRACE).await;
    };
    let result = tokio::select! {
        r = server => r,
        _ = grace => {
            tracing::warn!(grace = ?CLOSE_GRACE, "clients did not close their connections in time; stopping anyway");
            Ok(())
        }
    };
    if let Some(path) = unix_socket {
        let _ = std::fs::remove_file(path);
    }
    host.shutdown().await;
    tracing::info!("engine stopped");
    result.map_err(|e| format!("server: {e}"))
}

/// The services this server answers, and only those, as reflection lists them.
const SERVED_SERVICES: [&str; 4] = [
    trellis_proto::engine::v1::engine_server::SERVICE_NAME,
    tonic_health::pb::health_server::SERVICE_NAME,
    tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME,
    tonic_reflection::pb::v1alpha::server_reflection_server::SERVICE_NAME,
];

/// A reflection service builder (one per version: the builder is consumed). The descriptor
/// set also holds the plugin protocol's services, which the engine does not serve: naming
/// the served ones keeps those out of the list, while every type stays resolvable.
/// Calls [`Engine::take_over_expired`] every `every` until the returned token is cancelled.
/// A failed check (the database briefly away) is logged and tried again at the next tick.
fn spawn_lease_checks(
    engine: Arc<Engine>,
    every: std::time::Duration,
) -> tokio_util::sync::CancellationToken {
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = stop.clone();
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stopped.cancelled() => return,
                _ = ticks.tick() => {}
            }
            if engine.is_draining() {
                return;
            }
            if let Err(e) = engine.take_over_expired().await {
                tracing::warn!(error = %e, "could not check for expired leases; retrying");
            }
        }
    });
    stop
}

fn reflection_builder() -> tonic_reflection::server::Builder<'static> {
    let builder = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(trellis_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        // Each version's builder adds only its own reflection file; both are served.
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET);
    SERVED_SERVICES
        .iter()
        .fold(builder, |b, name| b.with_service_name(*name))
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the engine can still be stopped by a kill; never exit early.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Reads the tokens file again on each SIGHUP; a file with a mistake leaves the tokens in
/// force (and says why).
async fn reload_tokens_on_sighup(
    store: Arc<auth::TokenStore>,
    mut hup: tokio::signal::unix::Signal,
) {
    while hup.recv().await.is_some() {
        match store.reload() {
            Ok(n) => {
                tracing::info!(tokens_file = %store.path().display(), tokens = n, "tokens reloaded")
            }
            Err(e) => tracing::error!("tokens not reloaded, the previous ones stay in force: {e}"),
        }
    }
}

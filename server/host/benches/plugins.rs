//! Plugin host benchmarks (not run by `cargo test`; figures go to
//! BENCHMARKS.md, never into assertions):
//!
//! 1. cold start to ready: spawn → handshake line → connect → Handshake
//!    verified, over ~50 launches of the sim provider;
//! 2. one unary call (sim `echo`) through the host's ProviderClient versus a
//!    bare tonic call over a Unix socket to another sim process;
//! 3. 100 concurrent calls to one plugin through the host.
//!
//! ```sh
//! cargo build --release -p trellis-provider-sim
//! cargo bench -p trellis --bench plugins
//! ```
//! TRELLIS_BENCH_SIM overrides the sim binary (default: next to the bench
//! executable's profile dir, i.e. target/release/trellis-provider-sim).
//!
//! For profiling one path alone, `BENCH_ONLY=host|bare|barectx` makes 20,000
//! sequential calls of that kind and prints µs per call, e.g. under
//! `perf stat -e task-clock target/release/deps/plugins-<hash>`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::io::AsyncBufReadExt;
use trellis_host::{CallOptions, HostConfig, PluginHost, PluginKind, values};
use trellis_proto::plugin::v1 as pb;
use trellis_proto::plugin::v1::plugin_client::PluginClient;
use trellis_proto::plugin::v1::provider_client::ProviderClient;

fn sim_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("TRELLIS_BENCH_SIM") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .map(|d| d.join("trellis-provider-sim"))
        .expect("target dir")
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Bare {
    child: tokio::process::Child,
    client: ProviderClient<tonic::transport::Channel>,
    dir: PathBuf,
}

/// A sim process started by hand, and a plain tonic client to it: the
/// baseline for the host's call path.
async fn bare_sim(sim: &Path, root: &Path) -> Bare {
    let dir = root.join("bare");
    std::fs::create_dir_all(&dir).expect("dir");
    let mut child = tokio::process::Command::new(sim)
        .env("TRELLIS_PLUGIN_NONCE", "bench")
        .env("TRELLIS_PLUGIN_PROTOCOL_VERSIONS", "1")
        .env("TRELLIS_PLUGIN_SOCKET_DIR", &dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn sim");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let path = loop {
        let line = lines
            .next_line()
            .await
            .expect("read")
            .expect("handshake line");
        if let Some(p) = line.strip_prefix("TRELLIS_PLUGIN|1|unix|") {
            break PathBuf::from(p);
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let channel = tonic::transport::Endpoint::from_static("http://bare.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .expect("connect");
    PluginClient::new(channel.clone())
        .handshake(pb::HandshakeRequest {
            nonce: "bench".into(),
            protocol_versions: vec![1],
            host_address: String::new(),
            host_token: String::new(),
            ..Default::default()
        })
        .await
        .expect("handshake");
    Bare {
        child,
        client: ProviderClient::new(channel),
        dir,
    }
}

fn echo_req() -> pb::CallFunctionRequest {
    pb::CallFunctionRequest {
        context: None,
        name: "echo".into(),
        args: vec![values::string("ping")],
    }
}

/// The bare call carrying what the host sends: a CallContext with a
/// deadline and the gRPC timeout header.
fn echo_req_with_context(n: u64) -> tonic::Request<pb::CallFunctionRequest> {
    let deadline = std::time::SystemTime::now() + Duration::from_secs(30);
    let ms = deadline
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let mut req = tonic::Request::new(pb::CallFunctionRequest {
        context: Some(pb::CallContext {
            call_id: format!("bench-{n}"),
            provider_config: None,
            instance_id: String::new(),
            idempotency_key: format!("key-{n}"),
            deadline_unix_ms: ms,
            local_assets: Default::default(),
            request_id: String::new(),
        }),
        name: "echo".into(),
        args: vec![values::string("ping")],
    });
    req.set_timeout(Duration::from_secs(30));
    req
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo test --benches` lists targets with --list: nothing to run.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let sim = sim_binary();
    assert!(
        sim.exists(),
        "{} missing: cargo build --release -p trellis-provider-sim",
        sim.display()
    );
    let root = std::env::temp_dir().join(format!("trellis-bench-{}", std::process::id()));
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).expect("dir");
    let _ = std::fs::remove_file(plugins.join("trellis-provider-sim"));
    std::os::unix::fs::symlink(&sim, plugins.join("trellis-provider-sim")).expect("link");
    let config = HostConfig {
        plugin_dirs: vec![plugins.clone()],
        search_exe_dir: false,
        runtime_dir: Some(root.join("run")),
        cache_dir: Some(root.join("cache")),
        ..HostConfig::default()
    };
    let host = PluginHost::new(config);
    let provider = host.provider("sim").expect("sim");

    // 1. Cold start to ready.
    let launches = 50;
    provider.start().await.expect("warm-up start");
    host.stop(PluginKind::Provider, "sim").await.expect("stop");
    let mut starts = Vec::with_capacity(launches);
    for _ in 0..launches {
        let t = Instant::now();
        provider.start().await.expect("start");
        starts.push(t.elapsed());
        host.stop(PluginKind::Provider, "sim").await.expect("stop");
    }
    starts.sort();

    // 2. One unary call: host vs bare, in alternating blocks.
    provider.start().await.expect("start");
    #[allow(unused_mut)]
    let mut bare = bare_sim(&sim, &root).await;
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        let t = Instant::now();
        for _ in 0..20000 {
            if only == "host" {
                provider
                    .call_function(
                        "echo",
                        vec![values::string("ping")],
                        &CallOptions::default(),
                    )
                    .await
                    .expect("echo");
            } else if only == "barectx" {
                bare.client
                    .call_function(echo_req_with_context(1))
                    .await
                    .expect("bare echo");
            } else {
                bare.client
                    .call_function(echo_req())
                    .await
                    .expect("bare echo");
            }
        }
        println!(
            "{only}: {:.1} µs/call",
            t.elapsed().as_secs_f64() * 1e6 / 20000.0
        );
        host.shutdown().await;
        drop(bare.client);
        let _ = bare.child.kill().await;
        let _ = std::fs::remove_dir_all(&root);
        return;
    }
    let opts = CallOptions::default();
    let arg = || vec![values::string("ping")];
    for _ in 0..500 {
        provider
            .call_function("echo", arg(), &opts)
            .await
            .expect("echo");
        bare.client
            .call_function(echo_req())
            .await
            .expect("bare echo");
    }
    let (mut via_host, mut via_bare, mut via_bare_ctx) = (Vec::new(), Vec::new(), Vec::new());
    let mut n = 0u64;
    for _ in 0..10 {
        for _ in 0..500 {
            n += 1;
            let t = Instant::now();
            bare.client
                .call_function(echo_req_with_context(n))
                .await
                .expect("bare echo");
            via_bare_ctx.push(t.elapsed());
        }
        for _ in 0..500 {
            let t = Instant::now();
            provider
                .call_function("echo", arg(), &opts)
                .await
                .expect("echo");
            via_host.push(t.elapsed());
        }
        for _ in 0..500 {
            let t = Instant::now();
            bare.client
                .call_function(echo_req())
                .await
                .expect("bare echo");
            via_bare.push(t.elapsed());
        }
    }
    via_host.sort();
    via_bare.sort();
    via_bare_ctx.sort();

    // 3. 100 concurrent calls, repeated.
    let rounds = 30;
    let mut totals = Vec::new();
    let mut per_call = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let calls = (0..100).map(|_| {
            let p = provider.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                p.call_function(
                    "echo",
                    vec![values::string("ping")],
                    &CallOptions::default(),
                )
                .await
                .expect("echo");
                t.elapsed()
            })
        });
        let lat = futures_util::future::join_all(calls).await;
        totals.push(t.elapsed());
        per_call.extend(lat.into_iter().map(|r| r.expect("join")));
    }
    totals.sort();
    per_call.sort();

    host.shutdown().await;
    drop(bare.client);
    let _ = bare.child.kill().await;
    let _ = std::fs::remove_dir_all(&bare.dir);
    let _ = std::fs::remove_dir_all(&root);

    let ratio = pct(&via_host, 0.5).as_secs_f64() / pct(&via_bare, 0.5).as_secs_f64();
    println!("| measurement | n | p50 | p95 |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| cold start to ready (spawn → Handshake verified) | {launches} | {:.2} ms | {:.2} ms |",
        ms(pct(&starts, 0.5)),
        ms(pct(&starts, 0.95))
    );
    println!(
        "| unary `echo` through the host (ProviderClient) | {} | {:.1} µs | {:.1} µs |",
        via_host.len(),
        us(pct(&via_host, 0.5)),
        us(pct(&via_host, 0.95))
    );
    println!(
        "| unary `echo`, bare tonic client on a Unix socket | {} | {:.1} µs | {:.1} µs |",
        via_bare.len(),
        us(pct(&via_bare, 0.5)),
        us(pct(&via_bare, 0.95))
    );
    println!(
        "| unary `echo`, bare tonic client + CallContext deadline + grpc-timeout | {} | {:.1} µs | {:.1} µs |",
        via_bare_ctx.len(),
        us(pct(&via_bare_ctx, 0.5)),
        us(pct(&via_bare_ctx, 0.95))
    );
    println!(
        "| 100 concurrent `echo` through the host: total per batch | {rounds} | {:.2} ms | {:.2} ms |",
        ms(pct(&totals, 0.5)),
        ms(pct(&totals, 0.95))
    );
    println!(
        "| 100 concurrent `echo` through the host: per call | {} | {:.2} ms | {:.2} ms |",
        per_call.len(),
        ms(pct(&per_call, 0.5)),
        ms(pct(&per_call, 0.95))
    );
    println!();
    let ratio_ctx = pct(&via_host, 0.5).as_secs_f64() / pct(&via_bare_ctx, 0.5).as_secs_f64();
    println!(
        "host / bare (p50): {ratio:.2}; host / bare with the same context (p50): {ratio_ctx:.2}"
    );
}

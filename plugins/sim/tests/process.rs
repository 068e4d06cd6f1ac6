//! The `trellis-provider-sim` binary as the engine runs it: a real process
//! with the launch environment, the handshake line on stdout, gRPC over the
//! Unix socket, and LIFETIME (stdin end-of-file, SIGTERM, crashOn).

use std::io::{BufRead as _, BufReader, Read as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use trellis_plugin_sdk::Value;
use trellis_plugin_sdk::proto as pb;
use trellis_plugin_sdk::proto::plugin_client::PluginClient;
use trellis_plugin_sdk::proto::provider_client::ProviderClient;
use trellis_plugin_sdk::testing::connect_unix;

const BIN: &str = env!("CARGO_BIN_EXE_trellis-provider-sim");
const NONCE: &str = "process-test-nonce";

struct Plugin {
    child: Child,
    stdin: Option<ChildStdin>,
    dir: PathBuf,
    socket: PathBuf,
    stderr: mpsc::Receiver<String>,
}

impl Plugin {
    fn spawn(test: &str) -> Plugin {
        let dir = std::env::temp_dir().join(format!("trellis-sim-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("socket dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let mut child = Command::new(BIN)
            .env("TRELLIS_PLUGIN_NONCE", NONCE)
            .env("TRELLIS_PLUGIN_PROTOCOL_VERSIONS", "1")
            .env("TRELLIS_PLUGIN_SOCKET_DIR", &dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the plugin");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        // Read both pipes on threads so the plugin never blocks on them.
        let (line_tx, line_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = line_tx.send(line);
            }
        });
        let (err_tx, err_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut all = String::new();
            let _ = BufReader::new(stderr).read_to_string(&mut all);
            let _ = err_tx.send(all);
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let socket = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = line_rx
                .recv_timeout(left)
                .expect("the handshake line within 60 s");
            // Lines before the handshake line are allowed (banners).
            if let Some(rest) = line.strip_prefix("TRELLIS_PLUGIN|") {
                let parts: Vec<&str> = rest.split('|').collect();
                assert_eq!(parts.len(), 3, "{line}");
                assert_eq!((parts[0], parts[1]), ("1", "unix"), "{line}");
                break PathBuf::from(parts[2]);
            }
        };
        assert!(
            socket.starts_with(&dir),
            "the socket is inside the socket dir: {}",
            socket.display()
        );
        Plugin {
            child,
            stdin,
            dir,
            socket,
            stderr: err_rx,
        }
    }

    async fn channel(&self) -> Channel {
        connect_unix(&self.socket)
            .await
            .expect("connect to the plugin socket")
    }

    /// Waits for the exit without blocking the runtime (the gRPC client's
    /// connection task must keep running to see the server's GOAWAY).
    async fn wait(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                panic!("the plugin did not exit within {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn stderr(&self) -> String {
        self.stderr
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_default()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn context(call_id: &str) -> Option<pb::CallContext> {
    Some(pb::CallContext {
        call_id: call_id.to_owned(),
        ..Default::default()
    })
}

fn apply(name: &str, spec: serde_json::Value, call_id: &str) -> pb::ApplyResourceRequest {
    pb::ApplyResourceRequest {
        context: context(call_id),
        current: None,
        resource_type: "sim/resource".into(),
        resource_name: name.into(),
        desired_spec: Some(Value::from(spec).to_proto()),
    }
}

/// The ApplyResult at the end of an ApplyResource stream.
async fn apply_result(
    client: &mut ProviderClient<Channel>,
    req: pb::ApplyResourceRequest,
) -> Result<pb::ApplyResult, tonic::Status> {
    let stream = client.apply_resource(req).await?.into_inner();
    finish(stream).await
}

/// Starts a slow apply and returns once the sim has reported progress, that
/// is once the call is running in the plugin.
async fn in_flight(
    client: &mut ProviderClient<Channel>,
    req: pb::ApplyResourceRequest,
) -> tonic::Streaming<pb::ApplyResourceEvent> {
    let mut stream = client
        .apply_resource(req)
        .await
        .expect("apply")
        .into_inner();
    let first = stream.message().await.expect("apply stream");
    assert!(
        matches!(
            first.as_ref().and_then(|e| e.event.as_ref()),
            Some(pb::apply_resource_event::Event::Progress(_))
        ),
        "{first:?}"
    );
    stream
}

async fn finish(
    mut stream: tonic::Streaming<pb::ApplyResourceEvent>,
) -> Result<pb::ApplyResult, tonic::Status> {
    while let Some(ev) = stream.message().await? {
        if let Some(pb::apply_resource_event::Event::Result(r)) = ev.event {
            return Ok(r);
        }
    }
    Err(tonic::Status::unknown("the stream ended without a result"))
}

fn handshake(nonce: &str) -> pb::HandshakeRequest {
    pb::HandshakeRequest {
        nonce: nonce.into(),
        protocol_versions: vec![1],
        host_address: "unix:/nonexistent".into(),
        host_token: "t".into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn handshake_manifest_call_and_exit_on_stdin_eof() {
    let mut p = Plugin::spawn("eof");
    let channel = p.channel().await;
    let mut plugin = PluginClient::new(channel.clone());

    let refused = plugin
        .handshake(handshake("wrong"))
        .await
        .err()
        .map(|s| s.code());
    assert_eq!(refused, Some(tonic::Code::FailedPrecondition));
    let hs = plugin
        .handshake(handshake(NONCE))
        .await
        .expect("handshake")
        .into_inner();
    assert_eq!(hs.protocol_version, 1);
    assert_eq!(hs.plugin.map(|i| i.name), Some("sim".to_owned()));

    let m = plugin
        .get_manifest(pb::GetManifestRequest {})
        .await
        .expect("manifest")
        .into_inner();
    assert_eq!(
        m.resource_types.first().map(|r| r.r#type.as_str()),
        Some("sim/resource")
    );

    let mut provider = ProviderClient::new(channel);
    let echo = provider
        .call_function(pb::CallFunctionRequest {
            context: context("c1"),
            name: "echo".into(),
            args: vec![Value::from("ping").to_proto()],
        })
        .await
        .expect("echo")
        .into_inner();
    assert_eq!(echo.result.map(Value::from), Some(Value::from("ping")));
    let r = apply_result(
        &mut provider,
        apply("r", serde_json::json!({"payload": 1}), "c2"),
    )
    .await
    .expect("apply");
    assert!(
        r.error.is_none() && r.external_id.starts_with("sim-"),
        "{r:?}"
    );

    // The engine goes away: its end of stdin closes.
    drop(p.stdin.take());
    let status = p.wait(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0));
    assert!(!p.socket.exists(), "the socket is removed");
}

#[tokio::test]
async fn sigterm_lets_in_flight_calls_finish() {
    let mut p = Plugin::spawn("term");
    // The engine keeps an idle connection open; shutdown must not wait on it.
    let mut idle = PluginClient::new(p.channel().await);
    idle.get_manifest(pb::GetManifestRequest {})
        .await
        .expect("manifest");
    let mut provider = ProviderClient::new(p.channel().await);
    // Long enough to be still running when SIGTERM lands on a loaded machine.
    let slow = apply("slow", serde_json::json!({"latencyMs": 6000}), "slow-1");
    let call = tokio::spawn(finish(in_flight(&mut provider, slow).await));
    let killed = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let r = call
        .await
        .expect("join")
        .expect("the in-flight call completes");
    assert!(r.error.is_none(), "{r:?}");
    let status = p.wait(Duration::from_secs(60)).await;
    drop(idle);
    assert_eq!(status.code(), Some(0));
    assert!(!p.socket.exists(), "the socket is removed");
    // The call finished by itself during the grace: it was neither cancelled
    // nor held up by the idle connection.
    // Launched as the engine launches it, the plugin logs JSON lines.
    let stderr = p.stderr();
    assert!(
        stderr
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|v| v["message"] == "shutting down (Signal(\"SIGTERM\"))" && v["in_flight"] == 1),
        "{stderr}"
    );
    assert!(!stderr.contains("cancelling calls"), "{stderr}");
}

/// The engine's shutdown closes stdin and sends SIGTERM together; when the
/// signal lands first, the end-of-file that follows still cancels the calls
/// at once instead of waiting out the SIGTERM grace.
#[tokio::test]
async fn stdin_closing_after_sigterm_cancels_in_flight_calls() {
    let mut p = Plugin::spawn("term-then-eof");
    let mut health = HealthClient::new(p.channel().await);
    let mut provider = ProviderClient::new(p.channel().await);
    let slow = apply("slow", serde_json::json!({"latencyMs": 600_000}), "slow-2");
    let call = tokio::spawn(finish(in_flight(&mut provider, slow).await));
    // A stream opened before the signal keeps running through the shutdown
    // and reports NOT_SERVING once SIGTERM has been handled.
    let mut watch = health
        .watch(HealthCheckRequest::default())
        .await
        .expect("health watch")
        .into_inner();
    let first = watch.message().await.expect("health").expect("a status");
    assert_eq!(first.status(), ServingStatus::Serving);
    let killed = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    loop {
        let next = watch.message().await.expect("health").expect("a status");
        if next.status() == ServingStatus::NotServing {
            break;
        }
    }
    drop(watch);
    drop(p.stdin.take());
    let status = p.wait(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0));
    let stderr = p.stderr();
    assert!(stderr.contains("the engine is gone"), "{stderr}");
    assert!(!stderr.contains("calls still running"), "{stderr}");
    let r = call.await.expect("join");
    assert!(
        r.as_ref().map_or(true, |r| r.error.is_some()),
        "the call was cancelled: {r:?}"
    );
}

#[tokio::test]
async fn crash_on_exits_abruptly_mid_call() {
    let mut p = Plugin::spawn("crash");
    let mut provider = ProviderClient::new(p.channel().await);
    let crash = apply("boom", serde_json::json!({"crashOn": "create"}), "crash-1");
    let r = apply_result(&mut provider, crash).await;
    assert!(r.is_err(), "the call fails at the transport level: {r:?}");
    let status = p.wait(Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(101));
    let stderr = p.stderr();
    assert!(
        stderr.contains("crashOn=create for resource `boom`"),
        "{stderr}"
    );
}

#[test]
fn run_by_hand_explains_and_exits_2() {
    let out = Command::new(BIN)
        .env_remove("TRELLIS_PLUGIN_NONCE")
        .env_remove("TRELLIS_PLUGIN_SOCKET_DIR")
        .env_remove("TRELLIS_PLUGIN_PROTOCOL_VERSIONS")
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Trellis plugin") && stderr.contains("TRELLIS_PLUGIN_NONCE"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn an_unsupported_protocol_version_is_refused_at_launch() {
    let dir = std::env::temp_dir().join(format!("trellis-sim-version-{}", std::process::id()));
    let out = Command::new(BIN)
        .env("TRELLIS_PLUGIN_NONCE", NONCE)
        .env("TRELLIS_PLUGIN_PROTOCOL_VERSIONS", "2,3")
        .env("TRELLIS_PLUGIN_SOCKET_DIR", &dir)
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("protocol versions"));
    assert!(!Path::new(&dir).exists());
}

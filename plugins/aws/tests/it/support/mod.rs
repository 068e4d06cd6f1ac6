//! moto (an AWS emulator, from PyPI) for the provider's tests: one server per test
//! binary on a free loopback port, and boto3 as a second client to check what the
//! provider did. Tests name their resources uniquely, so they share the server.
//!
//! Without moto installed (`pip install "moto[server]" boto3`) the tests say so and
//! pass, as the interop tests do; `.ci/run` installs it and sets TRELLIS_REQUIRE_MOTO,
//! which turns a missing moto into a failure.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use trellis_plugin_sdk::testing::Harness;
use trellis_plugin_sdk::{ResourceState, Value};
use trellis_provider_aws::AwsProvider;

pub struct Moto {
    pub endpoint: String,
    // Held for the process's life: the server exits when its stdin closes.
    _child: Mutex<Child>,
}

fn support_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/support")
}

fn installed() -> bool {
    Command::new("python3")
        .args(["-c", "import moto.server, boto3"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The shared server, or None (after saying why) when moto is not installed.
pub fn moto() -> Option<&'static Moto> {
    static MOTO: OnceLock<Option<Moto>> = OnceLock::new();
    MOTO.get_or_init(|| {
        if !installed() {
            assert!(
                std::env::var_os("TRELLIS_REQUIRE_MOTO").is_none(),
                "moto is required (TRELLIS_REQUIRE_MOTO) but `import moto.server, boto3` fails: pip install \"moto[server]\" boto3"
            );
            eprintln!("skipped: moto is not installed (pip install -r plugins/aws/tests/requirements.txt)");
            return None;
        }
        // The provider runs in this process and takes credentials from the standard
        // chain, as it would anywhere; moto accepts any. Set once, before any client exists.
        // SAFETY: runs once, first thing in every test that uses moto, before the test
        // starts threads that read the environment.
        unsafe {
            std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
            std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
            std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut child = Command::new("python3")
            .arg(support_dir().join("moto_server.py"))
            .arg(port.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("moto says ready");
        assert_eq!(line.trim(), "ready", "moto did not start");
        Some(Moto {
            endpoint: format!("http://127.0.0.1:{port}"),
            _child: Mutex::new(child),
        })
    })
    .as_ref()
}

/// A name no other test (or run against this server) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The provider config that points every service at `moto`.
pub fn config(moto: &Moto) -> Value {
    Value::map()
        .with("region", "us-east-1")
        .with("endpoint", moto.endpoint.as_str())
}

/// The provider in this process, behind its real gRPC services, configured for moto.
pub async fn harness(moto: &Moto) -> Harness {
    Harness::provider(AwsProvider::default())
        .await
        .expect("harness")
        .with_config(config(moto))
}

/// One boto3 call: the response, or `Err(error code)`.
pub fn boto(
    moto: &Moto,
    service: &str,
    operation: &str,
    params: serde_json::Value,
) -> Result<serde_json::Value, String> {
    let out = Command::new("python3")
        .arg(support_dir().join("boto.py"))
        .args([&moto.endpoint, service, operation, &params.to_string()])
        .output()
        .expect("python3 runs");
    let body: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "boto {service} {operation}: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    if out.status.success() {
        Ok(body)
    } else {
        Err(body["Error"]["Code"].as_str().unwrap_or("?").to_owned())
    }
}

/// A resource as the engine would send it for update, read or destroy.
pub fn current(ty: &str, name: &str, applied: &ResourceState, spec: Value) -> ResourceState {
    ResourceState {
        resource_type: ty.to_owned(),
        name: name.to_owned(),
        external_id: applied.external_id.clone(),
        spec,
        state: applied.state.clone(),
    }
}

//! moto (an AWS emulator, from PyPI) for tests: one server per test binary on a free
//! loopback port, and boto3 as a second client to check what the provider did. Tests name
//! their resources uniquely, so they share the server. Also used by the engine's end-to-end
//! tests (server/trellis/tests/it/aws_e2e.rs), so it depends on nothing of the provider.
//!
//! Without moto installed the tests say so and pass, as the interop tests do; `.ci/run`
//! installs it (plugins/aws/tests/requirements.txt) and sets TRELLIS_REQUIRE_MOTO, which
//! turns a missing moto into a failure.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

// Embedded, so the scripts are found whichever crate's tests include this file.
const MOTO_SERVER_PY: &str = include_str!("moto_server.py");
const BOTO_PY: &str = include_str!("boto.py");

/// The credentials moto is called with (it accepts any).
pub const CREDENTIALS: [(&str, &str); 3] = [
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
];

pub struct Moto {
    pub endpoint: String,
    // Held for the process's life: the server exits when its stdin closes.
    _child: Mutex<Child>,
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
            for (k, v) in CREDENTIALS {
                std::env::set_var(k, v);
            }
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut child = Command::new("python3")
            .args(["-c", MOTO_SERVER_PY])
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

/// One boto3 call: the response, or `Err(error code)`.
pub fn boto(
    moto: &Moto,
    service: &str,
    operation: &str,
    params: serde_json::Value,
) -> Result<serde_json::Value, String> {
    let out = Command::new("python3")
        .args(["-c", BOTO_PY])
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

const FAULT_PROXY_PY: &str = include_str!("fault_proxy.py");

/// A proxy in front of moto that answers chosen operations with throttling, 5xx or delays
/// (fault_proxy.py); everything else goes through. Stops when dropped.
pub struct FaultProxy {
    pub endpoint: String,
    child: Child,
}

impl FaultProxy {
    pub fn start(moto: &Moto) -> FaultProxy {
        let upstream = moto.endpoint.rsplit(':').next().expect("moto's port");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut child = Command::new("python3")
            .args(["-c", FAULT_PROXY_PY, &port.to_string(), upstream])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the proxy says ready");
        assert_eq!(line.trim(), "ready", "the fault proxy did not start");
        FaultProxy {
            endpoint: format!("http://127.0.0.1:{port}"),
            child,
        }
    }

    fn post(&self, path: &str, body: &str) -> String {
        let port = self.endpoint.rsplit(':').next().expect("port");
        let mut s = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).expect("proxy");
        use std::io::{Read, Write};
        let method = if body.is_empty() { "GET" } else { "POST" };
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        out.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default()
    }

    /// The next `times` calls of `operation` fail with `status` and the AWS error `code`.
    pub fn fail(&self, operation: &str, status: u16, code: &str, times: u32) {
        self.post(
            "/__faults",
            &serde_json::json!({"operation": operation, "status": status, "code": code, "times": times}).to_string(),
        );
    }

    /// The next `times` calls of `operation` reach moto after `seconds`.
    pub fn delay(&self, operation: &str, seconds: f64, times: u32) {
        self.post(
            "/__faults",
            &serde_json::json!({"operation": operation, "status": 0, "delay": seconds, "times": times}).to_string(),
        );
    }

    /// Calls of `operation` seen so far.
    pub fn calls(&self, operation: &str) -> u64 {
        let body = self.post("/__calls", "");
        serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v[operation].as_u64())
            .unwrap_or(0)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! The harness of the end-to-end tests: a real `trellis serve` on a free port with its own data
//! directory and the real bundled plugins, driven by the real `trellis` CLI.
#![allow(dead_code)]

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::plugins_common::workspace_binary;

/// The provider plugins every end-to-end engine gets.
const PROVIDERS: [&str; 2] = ["trellis-provider-local", "trellis-provider-sim"];

/// `root/plugins`, holding links to the workspace's provider binaries.
pub(crate) fn plugin_dir(root: &Path) -> PathBuf {
    let dir = root.join("plugins");
    std::fs::create_dir_all(&dir).unwrap();
    for bin in PROVIDERS {
        let path = workspace_binary(bin, bin, "TRELLIS_TEST_NONE");
        let link = dir.join(bin);
        if !link.exists() {
            std::os::unix::fs::symlink(path, link).unwrap();
        }
    }
    dir
}

/// How to start an engine: state and plugins under `root`; the working directory (what `local`
/// paths are relative to, and where the CLI runs) `root` unless set.
pub(crate) struct EngineBuilder {
    root: PathBuf,
    cwd: PathBuf,
    listen: String,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    capture_stderr: bool,
    tmpfs_bytes: Option<u64>,
}

/// Whether this machine lets a test mount a tmpfs in a private mount namespace (root, or a
/// user namespace with mount rights).
pub(crate) fn private_tmpfs_available() -> bool {
    Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl EngineBuilder {
    /// The data directory on a tmpfs of `bytes`, mounted in a mount namespace of the engine's
    /// own (`unshare -m`): a real disk that can be filled. From outside it is reached through
    /// [`Engine::data_seen_by_engine`]. Needs [`private_tmpfs_available`].
    pub(crate) fn data_on_tmpfs(mut self, bytes: u64) -> Self {
        self.tmpfs_bytes = Some(bytes);
        self
    }

    /// `--listen` (default `127.0.0.1:0`, a free port); `unix:PATH` for a Unix socket.
    pub(crate) fn listen(mut self, addr: &str) -> Self {
        self.listen = addr.to_owned();
        self
    }

    /// `--allow-path DIR` (canonical, as the engine stores its roots).
    pub(crate) fn allow_path(self, dir: &Path) -> Self {
        let dir = dir.canonicalize().expect("an allowed root that exists");
        self.args(&[std::ffi::OsStr::new("--allow-path"), dir.as_os_str()])
    }

    /// Keeps what the engine writes to stderr (its logs) for [`Engine::stop`], instead of
    /// passing it through to the test's output.
    pub(crate) fn capture_stderr(mut self) -> Self {
        self.capture_stderr = true;
        self
    }

    pub(crate) fn cwd(mut self, cwd: &Path) -> Self {
        self.cwd = cwd.to_path_buf();
        self
    }

    /// Extra `trellis serve` arguments.
    pub(crate) fn args<S: AsRef<std::ffi::OsStr>>(mut self, args: &[S]) -> Self {
        self.args
            .extend(args.iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    pub(crate) fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Self {
        self.env.push((key.into(), value.as_ref().to_os_string()));
        self
    }

    pub(crate) fn start(self) -> Engine {
        let plugins = plugin_dir(&self.root);
        let data = self.root.join("data");
        let mut command = match self.tmpfs_bytes {
            None => Command::new(env!("CARGO_BIN_EXE_trellis")),
            Some(bytes) => {
                std::fs::create_dir_all(&data).unwrap();
                // The shell mounts, then becomes the engine (same pid).
                let mut c = Command::new("unshare");
                c.args(["-m", "sh", "-c"])
                    .arg(format!(
                        "mount -t tmpfs -o size={bytes} tmpfs \"$1\" && shift && exec \"$@\""
                    ))
                    .arg("sh")
                    .arg(&data)
                    .arg(env!("CARGO_BIN_EXE_trellis"));
                c
            }
        };
        let mut child = command
            .arg("serve")
            .args(["--listen", &self.listen, "--no-bundled-plugins"])
            .arg("--plugin-dir")
            .arg(&plugins)
            .arg("--data-dir")
            .arg(&data)
            .args(&self.args)
            .current_dir(&self.cwd)
            .env("TRELLIS_LOG_LEVEL", "warn")
            .env_remove("TRELLIS_LOG_FORMAT")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(if self.capture_stderr {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .spawn()
            .expect("start trellis serve");
        // Read on a thread of its own, so a chatty engine never blocks on a full pipe.
        let stderr = child.stderr.take().map(|mut err| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = std::io::Read::read_to_string(&mut err, &mut s);
                s
            })
        });
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut metrics = None;
        let addr = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    // `--metrics-listen`: printed before the engine's line.
                    if let Some(a) = line.strip_prefix("trellis metrics listening on http://") {
                        metrics = Some(a.trim().to_owned());
                    }
                    if let Some(a) = line.strip_prefix("trellis engine listening on ") {
                        break a.trim().to_owned();
                    }
                }
                _ => {
                    let _ = child.wait();
                    let logs = stderr.map(|t| t.join().unwrap()).unwrap_or_default();
                    panic!("trellis serve exited before listening\n{logs}");
                }
            }
        };
        // Keep draining stdout so the engine never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Engine {
            child,
            addr,
            metrics,
            cwd: self.cwd,
            plugins,
            data,
            stderr,
        }
    }
}

/// A running engine; killed on drop.
pub(crate) struct Engine {
    child: Child,
    /// As the engine printed it: `127.0.0.1:PORT`, or `https://127.0.0.1:PORT` with TLS.
    pub addr: String,
    /// With `--metrics-listen`: the metrics address as the engine printed it (`127.0.0.1:PORT`).
    pub metrics: Option<String>,
    /// Where the engine and the CLI run.
    pub cwd: PathBuf,
    pub plugins: PathBuf,
    pub data: PathBuf,
    /// With [`EngineBuilder::capture_stderr`]: the reader of the engine's stderr.
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Engine {
    pub(crate) fn builder(root: &Path) -> EngineBuilder {
        EngineBuilder {
            root: root.to_path_buf(),
            cwd: root.to_path_buf(),
            listen: "127.0.0.1:0".to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            capture_stderr: false,
            tmpfs_bytes: None,
        }
    }

    pub(crate) fn start(root: &Path) -> Engine {
        Engine::builder(root).start()
    }

    /// The data directory as the engine's mount namespace has it (see
    /// [`EngineBuilder::data_on_tmpfs`]).
    pub(crate) fn data_seen_by_engine(&self) -> PathBuf {
        let inside = self.data.strip_prefix("/").unwrap_or(&self.data);
        PathBuf::from(format!("/proc/{}/root", self.child.id())).join(inside)
    }

    /// The engine's process id (to signal it).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn port(&self) -> &str {
        self.addr.rsplit(':').next().unwrap()
    }

    /// A client command against this engine.
    pub(crate) fn cli(&self, args: &[&str]) -> Output {
        self.cli_at(&self.addr, args)
    }

    /// A client command against `engine` (another spelling of this engine's address), with no
    /// CA certificate from the environment.
    pub(crate) fn cli_at(&self, engine: &str, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_trellis"))
            .args(args)
            .args(["--engine", engine])
            .current_dir(&self.cwd)
            .env_remove("TRELLIS_CA_CERT")
            .output()
            .expect("run trellis")
    }

    /// A client command with `--format json`: its exit code and its output, parsed.
    pub(crate) fn json(&self, args: &[&str]) -> (i32, Value) {
        let mut all = args.to_vec();
        all.extend(["--format", "json"]);
        let out = self.cli(&all);
        let code = out.status.code().unwrap_or(-1);
        let text = String::from_utf8_lossy(&out.stdout);
        let v = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
            panic!(
                "{args:?}: not JSON ({e}); exit {code}\nstdout: {text}\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (code, v)
    }

    /// `trellis instance NAME --format json`, which must succeed.
    pub(crate) fn instance(&self, name: &str) -> Value {
        let (code, v) = self.json(&["instance", name]);
        assert_eq!(code, 0, "{v}");
        v
    }

    /// The kinds and payloads of an instance's events, in order.
    pub(crate) fn events(&self, instance: &str) -> Vec<(String, Value)> {
        let out = self.cli(&["events", "--instance", instance, "--format", "json"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                (v["kind"].as_str().unwrap().to_owned(), v["payload"].clone())
            })
            .collect()
    }

    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait (up to 30 s) for the exit; its code.
    pub(crate) fn terminate(&mut self) -> Option<i32> {
        self.terminate_within(Duration::from_secs(30))
    }

    /// SIGTERM, then wait up to `limit` (a hang bound) for the exit; its code.
    pub(crate) fn terminate_within(&mut self, limit: Duration) -> Option<i32> {
        // SAFETY: signalling a child process we own and have not reaped.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Engine {
    /// SIGTERM, then the exit code and (with [`EngineBuilder::capture_stderr`]) everything the
    /// engine wrote to stderr.
    pub(crate) fn stop(mut self) -> (Option<i32>, String) {
        let code = self.terminate();
        let logs = self
            .stderr
            .take()
            .map(|t| t.join().unwrap())
            .unwrap_or_default();
        (code, logs)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub(crate) fn write(path: &Path, text: &str) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

pub(crate) fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A command's stderr, as text.
pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The `KEY=value` lines of an env file, by key, in file order (quotes around a value dropped).
pub(crate) fn env_entries(path: &Path) -> Vec<(String, String)> {
    read(path)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or((l, ""));
            (k.to_owned(), v.trim_matches('\'').to_owned())
        })
        .collect()
}

/// The keys of an env file, in file order.
pub(crate) fn env_keys(path: &Path) -> Vec<String> {
    env_entries(path).into_iter().map(|(k, _)| k).collect()
}

/// `(name, action)` of each entry of a JSON list of planned changes (a change set's or a
/// child's `resources`).
pub(crate) fn actions(list: &Value) -> Vec<(String, String)> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list of changes: {list}"))
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_owned(),
                r["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// `(a->b, action)` of each planned link of a plan's JSON.
pub(crate) fn link_actions(plan: &Value) -> Vec<(String, String)> {
    plan["changeSet"]["links"]
        .as_array()
        .unwrap_or_else(|| panic!("no links in {plan}"))
        .iter()
        .map(|l| {
            (
                format!(
                    "{}->{}",
                    l["resourceA"].as_str().unwrap(),
                    l["resourceB"].as_str().unwrap()
                ),
                l["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Owned pairs, to compare with [`actions`] and [`link_actions`].
pub(crate) fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

/// After a restart that followed a kill or an unfinished drain: the operation `op` and its
/// instance are INTERRUPTED (by the API and in the instance's events), and `trellis drift`
/// names each create left unfinished (CREATING) as UNRESOLVED, exiting 3 when there is one.
/// The instance as `trellis instance` shows it, and how many of its resources are CREATING.
pub(crate) fn assert_interrupted(engine: &Engine, op: &str, instance: &str) -> (Value, usize) {
    use trellis_proto::engine::v1 as api;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let status = rt.block_on(async {
        let Ok(mut client) = trellis::cli::client::connect(&engine.addr).await else {
            panic!("cannot connect to {}", engine.addr)
        };
        client
            .get_operation(api::GetOperationRequest {
                operation_id: op.to_owned(),
            })
            .await
            .unwrap()
            .into_inner()
            .status
    });
    assert_eq!(
        api::OperationStatus::try_from(status),
        Ok(api::OperationStatus::Interrupted)
    );
    assert!(
        engine
            .events(instance)
            .iter()
            .any(|(kind, p)| kind == "operation.interrupted" && p["operation"] == op),
        "no operation.interrupted event for {op}"
    );
    let inst = engine.instance(instance);
    assert_eq!(inst["status"], "INTERRUPTED", "{inst}");
    let creating = inst["resources"]
        .as_object()
        .unwrap()
        .values()
        .filter(|r| r["status"] == "CREATING")
        .count();
    let (code, drift) = engine.json(&["drift", "--instance", instance]);
    let unresolved = drift["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "UNRESOLVED")
        .count();
    assert_eq!(unresolved, creating, "{drift}");
    assert_eq!(code, if creating > 0 { 3 } else { 0 }, "{drift}");
    (inst, creating)
}

/// The planned new value of field `path` (`spec.content`) of the `index`th resource change in
/// a plan's JSON; `None` when that field does not change.
pub(crate) fn planned_new(plan: &Value, index: usize, path: &str) -> Option<Value> {
    plan["changeSet"]["resources"][index]["fields"]
        .as_array()?
        .iter()
        .find(|f| f["path"] == path)
        .map(|f| f["new"].clone())
}

/// How long to wait for progress a test needs (a bound on a hang, never on speed).
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// A runtime for tests that talk gRPC to an engine themselves.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// An engine API client on `addr`.
pub(crate) async fn client(
    addr: &str,
) -> trellis_proto::engine::v1::engine_client::EngineClient<tonic::transport::Channel> {
    match trellis::cli::client::connect(addr).await {
        Ok(c) => c,
        Err(_) => panic!("cannot connect to {addr}"),
    }
}

/// Starts a client command (`args`, with `--format json`) in the background against `engine`
/// and returns once `instance` has an event of `kind` (a call in flight, typically). The caller
/// waits for the child.
#[allow(clippy::zombie_processes)]
pub(crate) fn cli_in_background(
    engine: &Engine,
    args: &[&str],
    instance: &str,
    kind: &str,
) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(args)
        .args(["--format", "json", "--engine", &engine.addr])
        .current_dir(&engine.cwd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let limit = Instant::now() + PATIENCE;
    loop {
        let out = engine.cli(&["events", "--instance", instance, "--format", "json"]);
        if String::from_utf8_lossy(&out.stdout).contains(kind) {
            return child;
        }
        if Instant::now() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("no {kind} event on {instance}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a command wrote, stdout then stderr.
pub(crate) fn all_output(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

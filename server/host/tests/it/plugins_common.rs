//! Helpers shared by the plugin host tests: temporary directories, fixture
//! plugins (shell scripts) and the real `trellis-provider-sim` binary.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use trellis_host::HostConfig;

/// A directory removed on drop. Short paths: sockets live below it.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tph-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    pub(crate) fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes an executable shell script.
pub(crate) fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    std::fs::create_dir_all(dir).expect("create plugin dir");
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// The workspace's target directory (`.../target/debug`), from the test
/// executable's path (`target/debug/deps/<test>`).
fn target_profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .expect("target dir")
}

/// A workspace binary, built with `cargo build -p <package>` (a no-op when
/// up to date) into this test's target directory. `env_override` names an
/// environment variable that points at a prebuilt binary instead. With
/// `TRELLIS_TEST_PREBUILT=1` (CI, right after `cargo test --workspace` built every
/// binary) one already in the target directory is taken as it is: `cargo build -p`
/// resolves dependency features per package and would compile much of the
/// workspace again.
pub(crate) fn workspace_binary(package: &str, bin: &str, env_override: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env_override) {
        return PathBuf::from(p);
    }
    let target = target_profile_dir();
    if std::env::var_os("TRELLIS_TEST_PREBUILT").is_some_and(|v| v == "1") {
        let built = target.join(bin);
        if built.exists() {
            return built;
        }
    }
    // Crates live in `server/<crate>/`.
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut args = vec!["build", "-q", "-p", package];
    if target.file_name().is_some_and(|n| n == "release") {
        args.push("--release");
    }
    let status = Command::new(env!("CARGO"))
        .args(&args)
        .current_dir(&workspace)
        .env("CARGO_TARGET_DIR", target.parent().expect("target root"))
        .status()
        .expect("run cargo build");
    assert!(status.success(), "cargo build -p {package} failed");
    let path = target.join(bin);
    assert!(path.exists(), "{} missing after the build", path.display());
    path
}

/// The real sim provider (`TRELLIS_TEST_SIM` overrides).
pub(crate) fn sim_binary() -> PathBuf {
    static SIM: OnceLock<PathBuf> = OnceLock::new();
    SIM.get_or_init(|| {
        workspace_binary(
            "trellis-provider-sim",
            "trellis-provider-sim",
            "TRELLIS_TEST_SIM",
        )
    })
    .clone()
}

/// A plugin directory holding a symlink `trellis-provider-sim` to the sim.
pub(crate) fn sim_dir(root: &TempDir) -> PathBuf {
    let dir = root.join("plugins");
    std::fs::create_dir_all(&dir).expect("plugin dir");
    std::os::unix::fs::symlink(sim_binary(), dir.join("trellis-provider-sim"))
        .expect("symlink sim");
    dir
}

/// A host configuration confined to `root`: plugins only from `plugin_dir`,
/// sockets in `root/run`, cache in `root/cache`, short timeouts.
pub(crate) fn config(root: &TempDir, plugin_dir: &Path) -> HostConfig {
    HostConfig {
        plugin_dirs: vec![plugin_dir.to_path_buf()],
        search_exe_dir: false,
        runtime_dir: Some(root.join("run")),
        cache_dir: Some(root.join("cache")),
        // A bound on a hang: a starved machine may take seconds to start a plugin.
        launch_timeout: Duration::from_secs(60),
        shutdown_grace: Duration::from_secs(3),
        ..HostConfig::default()
    }
}

/// Entries left in a directory (none if it does not exist).
pub(crate) fn entries(dir: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(Result::ok).map(|e| e.path()).collect(),
        Err(_) => Vec::new(),
    }
}

/// (pid, state) of every process whose parent is `ppid`.
pub(crate) fn children_of(ppid: u32) -> Vec<(u32, char)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.filter_map(Result::ok) {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may contain spaces, so split after ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let parent = fields.next().and_then(|s| s.parse::<u32>().ok());
        if parent == Some(ppid) {
            out.push((pid, state));
        }
    }
    out
}

/// The process state letter, or `None` once the pid is gone.
pub(crate) fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().next()?.chars().next()
}

/// True when the process is gone or a zombie (it has exited).
pub(crate) fn has_exited(pid: u32) -> bool {
    matches!(proc_state(pid), None | Some('Z') | Some('X'))
}

pub(crate) fn kill(pid: u32, sig: i32) {
    // SAFETY: plain syscall.
    unsafe { libc::kill(pid as i32, sig) };
}

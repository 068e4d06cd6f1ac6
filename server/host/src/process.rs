//! Plugin processes: spawning (with the parent-death signal), waiting for
//! exit without reaping, signalling, reaping, private socket directories and
//! the stderr ring buffer.
//!
//! Invariants:
//! - A child is reaped only while holding its `state` lock, and signals are
//!   sent only under the same lock before it is reaped, so a signal can
//!   never reach a recycled pid.
//! - Each plugin leads its own process group (`setpgid(0, 0)`); the group is
//!   killed when the plugin exits or is killed, so helpers a plugin (or a
//!   shell-script plugin) started do not linger. This happens while the
//!   leader is still an unreaped zombie, which pins the group id.
//! - Children are forked from one long-lived thread, because Linux ties
//!   `PR_SET_PDEATHSIG` to the thread that forked the child: a worker thread
//!   that exits would otherwise kill its plugins.

use std::collections::VecDeque;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use trellis_ids::random_hex;

/// Lines kept from a plugin's stderr for error messages.
pub const STDERR_TAIL_LINES: usize = 20;
/// Longest line kept from a plugin's stdout or stderr.
pub(crate) const MAX_LINE_BYTES: usize = 16 * 1024;
/// Longest stderr line kept in the tail.
const TAIL_LINE_BYTES: usize = 1024;
/// Longest socket directory path; leaves room for `/<name>.sock` within the
/// 108-byte `sun_path`.
pub(crate) const MAX_SOCKET_DIR_LEN: usize = 80;

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent data (every
    // critical section is a few assignments), so poisoning is ignored.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The last lines of a plugin's stderr.
#[derive(Default)]
pub(crate) struct StderrTail {
    lines: Mutex<VecDeque<String>>,
}

impl StderrTail {
    pub(crate) fn push(&self, line: &str) {
        let mut line = line.to_owned();
        if line.len() > TAIL_LINE_BYTES {
            let mut cut = TAIL_LINE_BYTES;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push('…');
        }
        let mut lines = lock(&self.lines);
        if lines.len() == STDERR_TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    pub(crate) fn snapshot(&self) -> Vec<String> {
        lock(&self.lines).iter().cloned().collect()
    }
}

struct SpawnRequest {
    command: Command,
    reply: oneshot::Sender<std::io::Result<Child>>,
}

/// The thread every plugin is forked from (see the module invariants).
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        let started = std::thread::Builder::new()
            .name("trellis-plugin-spawner".into())
            .spawn(move || {
                for mut req in rx {
                    let _ = req.reply.send(req.command.spawn());
                }
            });
        if let Err(e) = started {
            tracing::error!(error = %e, "cannot start the plugin spawner thread");
        }
        Mutex::new(tx)
    })
}

/// Starts `path` with the protocol's environment and piped stdio.
pub(crate) async fn spawn(path: &Path, env: &[(&str, &str)]) -> std::io::Result<Child> {
    let mut cmd = Command::new(path);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    // SAFETY: getpid is async-signal-safe; it runs before fork.
    let parent = unsafe { libc::getpid() };
    // SAFETY: only async-signal-safe calls (setpgid, prctl, getppid, _exit)
    // run between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setpgid(0, 0);
            #[cfg(target_os = "linux")]
            {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent died between fork and prctl: no signal would come.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
            }
            Ok(())
        });
    }
    let (reply, rx) = oneshot::channel();
    let sent = lock(spawner())
        .send(SpawnRequest {
            command: cmd,
            reply,
        })
        .is_ok();
    if !sent {
        return Err(std::io::Error::other("the plugin spawner thread is gone"));
    }
    rx.await
        .unwrap_or_else(|_| Err(std::io::Error::other("the plugin spawner thread is gone")))
}

struct ProcState {
    child: Child,
    status: Option<ExitStatus>,
    stdin: Option<ChildStdin>,
}

/// A running (or exited, not yet cleaned up) plugin process.
pub(crate) struct Process {
    pub pid: u32,
    state: Mutex<ProcState>,
    pub socket_dir: PathBuf,
    dir_removed: AtomicBool,
    pub tail: StderrTail,
    /// Why the engine killed it, if it did (shown with the exit status).
    kill_reason: Mutex<Option<String>>,
}

impl Process {
    pub(crate) fn new(mut child: Child, socket_dir: PathBuf) -> Process {
        let stdin = child.stdin.take();
        Process {
            pid: child.id(),
            state: Mutex::new(ProcState {
                child,
                status: None,
                stdin,
            }),
            socket_dir,
            dir_removed: AtomicBool::new(false),
            tail: StderrTail::default(),
            kill_reason: Mutex::new(None),
        }
    }

    /// Takes the pipes (once).
    pub(crate) fn take_pipes(
        &self,
    ) -> (
        Option<std::process::ChildStdout>,
        Option<std::process::ChildStderr>,
    ) {
        let mut st = lock(&self.state);
        (st.child.stdout.take(), st.child.stderr.take())
    }

    /// Sends `sig` to the plugin if it has not been reaped.
    pub(crate) fn signal(&self, sig: libc::c_int) {
        let st = lock(&self.state);
        if st.status.is_none() {
            // SAFETY: plain syscall; the pid is pinned until reaped under this lock.
            unsafe { libc::kill(self.pid as libc::pid_t, sig) };
        }
    }

    /// Sends `sig` to the plugin's whole process group if not reaped.
    pub(crate) fn signal_group(&self, sig: libc::c_int) {
        let st = lock(&self.state);
        if st.status.is_none() {
            // SAFETY: as above; the group id is the unreaped leader's pid.
            unsafe {
                libc::kill(-(self.pid as libc::pid_t), sig);
                libc::kill(self.pid as libc::pid_t, sig);
            }
        }
    }

    /// Kills the process group, recording why.
    pub(crate) fn kill_because(&self, reason: String) {
        *lock(&self.kill_reason) = Some(reason);
        self.signal_group(libc::SIGKILL);
    }

    pub(crate) fn kill_reason(&self) -> Option<String> {
        lock(&self.kill_reason).clone()
    }

    /// Closes the plugin's stdin (the protocol's "engine is gone" signal).
    pub(crate) fn close_stdin(&self) {
        lock(&self.state).stdin.take();
    }

    /// True once the process has exited (a zombie or reaped), without reaping it.
    pub(crate) fn has_exited(&self) -> bool {
        let st = lock(&self.state);
        if st.status.is_some() {
            return true;
        }
        // SAFETY: waitid with WNOWAIT only inspects; siginfo is plain data.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(
                libc::P_PID,
                self.pid,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            );
            if r != 0 {
                // ECHILD: not our child any more (already reaped).
                return std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD);
            }
            info.si_pid() != 0
        }
    }

    /// After the process exited: kills what is left of its process group,
    /// then reaps it. Returns the exit status.
    pub(crate) fn reap_exited(&self) -> Option<ExitStatus> {
        let mut st = lock(&self.state);
        if let Some(s) = st.status {
            return Some(s);
        }
        // SAFETY: the leader is an unreaped zombie, so the group id is ours.
        unsafe { libc::kill(-(self.pid as libc::pid_t), libc::SIGKILL) };
        match st.child.try_wait() {
            Ok(Some(s)) => {
                st.status = Some(s);
                st.stdin.take();
                Some(s)
            }
            _ => None,
        }
    }

    /// Last resort, blocking: SIGKILL the group and reap. Used when the host
    /// is dropped without a graceful shutdown.
    pub(crate) fn kill_and_reap_blocking(&self) {
        let mut st = lock(&self.state);
        if st.status.is_none() {
            // SAFETY: not reaped, so the pid and group id are ours.
            unsafe {
                libc::kill(-(self.pid as libc::pid_t), libc::SIGKILL);
                libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
            }
            st.stdin.take();
            if let Ok(s) = st.child.wait() {
                st.status = Some(s);
            }
        }
        drop(st);
        self.remove_socket_dir();
    }

    pub(crate) fn remove_socket_dir(&self) {
        if !self.dir_removed.swap(true, Ordering::AcqRel)
            && let Err(e) = std::fs::remove_dir_all(&self.socket_dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.socket_dir.display(), error = %e, "cannot remove plugin socket directory");
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Normally already reaped by the supervisor task; this covers a
        // runtime that went away with the task.
        self.kill_and_reap_blocking();
    }
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: plain syscall; on success it returns a new fd we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Resolves when the process has exited (without reaping it). Uses a pidfd
/// (Linux 5.3+) and falls back to polling every 20 ms.
pub(crate) async fn wait_for_exit(proc: &Process) {
    if let Some(fd) = pidfd_open(proc.pid) {
        // SAFETY: `fd` is an open pidfd owned by the AsyncFd for its whole life.
        let registered =
            unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
        if let Ok(afd) = registered {
            loop {
                if proc.has_exited() {
                    return;
                }
                match afd.readable().await {
                    Ok(mut guard) => {
                        if proc.has_exited() {
                            return;
                        }
                        guard.clear_ready();
                    }
                    Err(_) => break,
                }
            }
        }
    }
    while !proc.has_exited() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Creates `dir` (and parents) if needed, then checks it is a directory
/// owned by us and not accessible to others.
pub(crate) fn ensure_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no failure mode.
    let uid = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != uid {
        return Err(std::io::Error::other(format!(
            "{} is not a directory owned by uid {uid}",
            dir.display()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    }
    Ok(())
}

/// A fresh, private (0700) directory `<parent>/<prefix>-<random>`.
pub(crate) fn fresh_private_dir(parent: &Path, prefix: &str) -> std::io::Result<PathBuf> {
    ensure_private_dir(parent)?;
    for _ in 0..16 {
        let dir = parent.join(format!("{prefix}-{}", random_hex(8)));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(
        "cannot create a unique socket directory",
    ))
}

/// The runtime directory to use: the configured one if its socket paths
/// fit in `sun_path`, else `$TMPDIR/trellis-<uid>`.
pub(crate) fn resolve_runtime_dir(configured: Option<&Path>) -> PathBuf {
    // SAFETY: geteuid has no failure mode.
    let uid = unsafe { libc::geteuid() };
    let fallback = std::env::temp_dir().join(format!("trellis-{uid}"));
    match configured {
        Some(dir) => {
            let abs = if dir.is_absolute() {
                dir.to_path_buf()
            } else {
                std::env::current_dir()
                    .map(|c| c.join(dir))
                    .unwrap_or_else(|_| dir.to_path_buf())
            };
            // `<dir>/p-<16 hex>` must stay within MAX_SOCKET_DIR_LEN.
            if abs.as_os_str().len() + 19 <= MAX_SOCKET_DIR_LEN {
                abs
            } else {
                tracing::warn!(
                    dir = %abs.display(),
                    fallback = %fallback.display(),
                    "runtime directory path too long for Unix sockets; using the fallback"
                );
                fallback
            }
        }
        None => fallback,
    }
}

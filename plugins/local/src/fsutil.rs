//! File-system helpers: atomic writes, modes, hashing, directory locks, and
//! running blocking work off the async runtime.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use trellis_plugin_sdk::prelude::*;

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Runs blocking file-system work on tokio's blocking pool.
pub async fn blocking<T, F>(f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| PluginError::internal(format!("a file-system task failed: {e}")))?
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

/// SHA-256 and size of a file, streamed.
pub fn hash_file(path: &Path) -> io::Result<(String, u64)> {
    let mut f = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((hex(&hasher.finalize()), size))
}

/// Parses a mode written in octal: three or four digits (`"755"`, `"0755"`).
pub fn parse_mode(s: &str) -> Option<u32> {
    if !(3..=4).contains(&s.len()) || !s.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return None;
    }
    u32::from_str_radix(s, 8).ok()
}

/// A mode as four octal digits: `0644`.
pub fn format_mode(mode: u32) -> String {
    format!("{:04o}", mode & 0o7777)
}

/// The permission bits of a file.
pub fn mode_of(meta: &fs::Metadata) -> u32 {
    meta.permissions().mode() & 0o7777
}

/// Writes `bytes` to `path` atomically: a temporary file in the same
/// directory, written, chmod-ed to `mode` (not subject to the umask) and
/// fsync-ed, then renamed over `path`; the directory is fsync-ed after.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{}` has no parent directory", path.display()),
        )
    })?;
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".trellis-tmp-{}-{n}", std::process::id()));
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(dir);
    Ok(())
}

/// Makes a directory's entries durable (best effort: some file systems do
/// not support fsync on directories).
pub fn sync_dir(dir: &Path) {
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        tracing::debug!("fsync of directory {} failed: {e}", dir.display());
    }
}

/// How long to wait for another writer of the same directory.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// An exclusive `flock` on a directory, held until dropped. It serialises
/// read-modify-write cycles of files in that directory across threads and
/// processes (each lock is its own open file description).
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Waits for the lock, polling so that a cancelled call stops waiting.
    pub fn acquire(dir: &Path, cancelled: &dyn Fn() -> bool) -> Result<DirLock> {
        let file = File::open(dir).context(format!("opening `{}` to lock it", dir.display()))?;
        let started = Instant::now();
        loop {
            // SAFETY: flock on a file descriptor we own; no memory is involved.
            let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if r == 0 {
                return Ok(DirLock { _file: file });
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => {}
                _ => {
                    return Err(
                        PluginError::from(e).context(format!("locking `{}`", dir.display()))
                    );
                }
            }
            if cancelled() {
                return Err(PluginError::cancelled());
            }
            if started.elapsed() > LOCK_WAIT {
                return Err(PluginError::transient(format!(
                    "`{}` stayed locked by another writer for {}s",
                    dir.display(),
                    LOCK_WAIT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(parse_mode("0755"), Some(0o755));
        assert_eq!(parse_mode("644"), Some(0o644));
        assert_eq!(parse_mode("4755"), Some(0o4755));
        assert_eq!(parse_mode("0855"), None);
        assert_eq!(parse_mode("75"), None);
        assert_eq!(parse_mode("00755"), None);
        assert_eq!(parse_mode("-755"), None);
        assert_eq!(format_mode(0o644), "0644");
    }

    #[test]
    fn sha256_vectors() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}

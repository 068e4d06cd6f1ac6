//! Small helpers: random tokens, hex, exit statuses, bounded line reading.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// `len` random bytes as lowercase hex. Uses getrandom(2); if the kernel
/// refuses, falls back to /dev/urandom, and as a last resort to a SHA-256 of
/// the clock, pid and a counter (unique, though not secret).
pub(crate) fn random_hex(len: usize) -> String {
    let mut buf = vec![0u8; len];
    if !fill_random(&mut buf) {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut h = Sha256::new();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        h.update(now.to_le_bytes());
        h.update(std::process::id().to_le_bytes());
        h.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        let digest = h.finalize();
        for (i, b) in buf.iter_mut().enumerate() {
            *b = digest[i % digest.len()];
        }
    }
    hex(&buf)
}

fn fill_random(buf: &mut [u8]) -> bool {
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`.
        let n =
            unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), buf.len() - filled, 0) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return fill_from_urandom(buf);
        }
        filled += n as usize;
    }
    true
}

fn fill_from_urandom(buf: &mut [u8]) -> bool {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .is_ok()
}

/// A process-unique id: a random per-process prefix and a counter (no
/// syscall per id). Unique across processes and restarts, not secret.
pub(crate) fn unique_id() -> String {
    static PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let prefix = PREFIX.get_or_init(|| random_hex(8));
    format!("{prefix}-{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// `exit code 3` or `killed by signal 9 (SIGKILL)`.
pub fn describe_exit(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        format!("exit code {code}")
    } else if let Some(sig) = status.signal() {
        let core = if status.core_dumped() {
            ", core dumped"
        } else {
            ""
        };
        format!("killed by signal {sig} ({}{core})", signal_name(sig))
    } else {
        format!("{status}")
    }
}

pub(crate) fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => "signal",
    }
}

/// Reads one line of at most `max` bytes (the rest of a longer line is
/// dropped and the line marked with `…`). `None` at end of input. Invalid
/// UTF-8 is replaced, a trailing `\r` removed.
pub(crate) async fn read_line_bounded<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> std::io::Result<Option<String>> {
    let mut line = Vec::new();
    let mut truncated = false;
    let mut saw_any = false;
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            if !saw_any {
                return Ok(None);
            }
            break;
        }
        saw_any = true;
        let (chunk, used, done) = match memchr::memchr(b'\n', buf) {
            Some(i) => (&buf[..i], i + 1, true),
            None => (buf, buf.len(), false),
        };
        let room = max.saturating_sub(line.len());
        if chunk.len() > room {
            line.extend_from_slice(&chunk[..room]);
            truncated = true;
        } else {
            line.extend_from_slice(chunk);
        }
        reader.consume(used);
        if done {
            break;
        }
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    let mut s = String::from_utf8_lossy(&line).into_owned();
    if truncated {
        s.push('…');
    }
    Ok(Some(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_tokens_are_hex_and_differ() {
        let a = random_hex(16);
        let b = random_hex(16);
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn exit_descriptions() {
        assert_eq!(describe_exit(ExitStatus::from_raw(3 << 8)), "exit code 3");
        assert_eq!(
            describe_exit(ExitStatus::from_raw(9)),
            "killed by signal 9 (SIGKILL)"
        );
    }

    #[tokio::test]
    async fn bounded_lines() {
        let data: &[u8] = b"short\r\nthis line is too long\nlast";
        let mut r = tokio::io::BufReader::with_capacity(4, data);
        assert_eq!(
            read_line_bounded(&mut r, 8).await.ok().flatten().as_deref(),
            Some("short")
        );
        assert_eq!(
            read_line_bounded(&mut r, 8).await.ok().flatten().as_deref(),
            Some("this lin…")
        );
        assert_eq!(
            read_line_bounded(&mut r, 8).await.ok().flatten().as_deref(),
            Some("last")
        );
        assert_eq!(read_line_bounded(&mut r, 8).await.ok().flatten(), None);
    }
}

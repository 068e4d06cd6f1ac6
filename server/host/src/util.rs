//! Small helpers: exit statuses, bounded line reading (tokens and digests: `trellis_ids`).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

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

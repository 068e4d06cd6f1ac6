//! Identifiers, secret tokens and digests: one scheme for each, used by every crate.
//!
//! - [`new_id`]: `<prefix>_<32 hex digits>`, time-ordered, for records (instances, change
//!   sets, operations, leases, requests) and calls. Unique, not secret.
//! - [`random_hex`]: secret tokens from the kernel's random source (plugin tokens, nonces).
//! - [`digest`]: SHA-256 over a list of byte strings, each framed by its length, for what
//!   identifies a request or a plan's inputs; [`sha256_hex`] and [`hash_file`] for single
//!   blobs (plugin binaries, tokens at rest).

use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

/// A new identifier `<prefix>_<32 hex digits>`: the time in milliseconds (so ids sort roughly by
/// creation in logs) and 80 random bits. Randomness comes from std's per-process random hash
/// keys (no system call per id), which is plenty for ids and lease tokens (fencing relies on
/// epochs, not on secrecy); secrets use [`random_hex`].
pub fn new_id(prefix: &str) -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};

    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // Read once: `getpid` is a system call, and the engine makes an id per provider call.
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let pid = *PID.get_or_init(std::process::id);
    let random = |salt: u64| {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(n);
        h.write_u64(salt);
        h.write_u32(pid);
        h.finish()
    };
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let (a, b) = (random(1), random(2));
    format!(
        "{prefix}_{:012x}{:04x}{:016x}",
        millis & 0xffff_ffff_ffff,
        a & 0xffff,
        b
    )
}

/// `len` random bytes as lowercase hex. Uses getrandom(2); if the kernel
/// refuses, falls back to /dev/urandom, and as a last resort to a SHA-256 of
/// the clock, pid and a counter (unique, though not secret).
pub fn random_hex(len: usize) -> String {
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

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// sha256 over `parts`, each framed by its length so no two lists collide.
pub fn digest<T: AsRef<[u8]>>(parts: &[T]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        let p = p.as_ref();
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex(&h.finalize())
}

/// SHA-256 of a file, streamed.
pub fn hash_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_prefixed_hex_and_unique() {
        let id = new_id("op");
        assert!(id.starts_with("op_") && id.len() == 3 + 32, "{id}");
        assert!(id[3..].bytes().all(|b| b.is_ascii_hexdigit()));
        let ids: std::collections::HashSet<_> = (0..1000).map(|_| new_id("x")).collect();
        assert_eq!(ids.len(), 1000);
    }

    #[test]
    fn random_tokens_are_hex_and_differ() {
        let (a, b) = (random_hex(16), random_hex(16));
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn digests_frame_their_parts() {
        assert_ne!(digest(&["ab", "c"]), digest(&["a", "bc"]));
        assert_eq!(digest(&["x"]), digest(&[b"x".as_slice()]));
        assert_eq!(digest::<&str>(&[]).len(), 64);
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

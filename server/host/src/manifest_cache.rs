//! The on-disk manifest cache.
//!
//! Layout under the cache directory:
//! - `manifests/v1/<sha256 of the plugin binary>.pb`: the encoded `Manifest`
//!   the binary returned from GetManifest (protocol version 1);
//! - `fingerprints/<sha256 of the binary's path>`: `dev ino size mtime_ns
//!   ctime_ns sha256`, so a binary that has not changed is not hashed again
//!   by every command (ctime cannot be set back by a user, so a rewritten
//!   file never matches an old fingerprint).
//!
//! Files are written to a temporary name and renamed into place, so readers
//! never see a partial file; an unreadable or undecodable entry is a miss.
//! A cached manifest is used only when its plugin kind and name match the
//! binary's file name.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use prost::Message;
use trellis_proto::plugin::v1 as pb;

use super::discovery::PluginBinary;
use trellis_ids::{hash_file, random_hex, sha256_hex};

/// What identifies a file's content cheaply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Fingerprint {
    pub(crate) fn of(path: &Path) -> std::io::Result<Fingerprint> {
        let m = std::fs::metadata(path)?;
        Ok(Fingerprint {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        })
    }

    fn line(&self, sha: &str) -> String {
        format!(
            "{} {} {} {} {} {sha}\n",
            self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns
        )
    }
}

#[derive(Clone, Debug)]
pub(crate) struct ManifestCache {
    dir: PathBuf,
}

impl ManifestCache {
    pub(crate) fn new(dir: PathBuf) -> ManifestCache {
        ManifestCache { dir }
    }

    fn manifest_path(&self, sha: &str) -> PathBuf {
        self.dir
            .join("manifests")
            .join("v1")
            .join(format!("{sha}.pb"))
    }

    fn fingerprint_path(&self, binary: &Path) -> PathBuf {
        self.dir
            .join("fingerprints")
            .join(sha256_hex(binary.as_os_str().as_encoded_bytes()))
    }

    /// The binary's SHA-256, from the fingerprint file when the binary is
    /// unchanged, else computed (and the fingerprint stored).
    pub(crate) fn binary_hash(&self, binary: &Path) -> std::io::Result<(Fingerprint, String)> {
        let fp = Fingerprint::of(binary)?;
        let fp_path = self.fingerprint_path(binary);
        if let Ok(text) = std::fs::read_to_string(&fp_path)
            && let Some(sha) = text.strip_prefix(fp.line("").trim_end())
        {
            let sha = sha.trim();
            if sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Ok((fp, sha.to_owned()));
            }
        }
        let sha = hash_file(binary)?;
        // Hashing took time: only record the fingerprint if the file did not
        // change meanwhile.
        if Fingerprint::of(binary).ok().as_ref() == Some(&fp)
            && let Err(e) = write_atomic(&fp_path, fp.line(&sha).as_bytes())
        {
            tracing::debug!(error = %e, "cannot write plugin fingerprint");
        }
        Ok((fp, sha))
    }

    pub(crate) fn load(&self, sha: &str, binary: &PluginBinary) -> Option<pb::Manifest> {
        let bytes = std::fs::read(self.manifest_path(sha)).ok()?;
        let manifest = pb::Manifest::decode(bytes.as_slice()).ok()?;
        let info = manifest.plugin.as_ref()?;
        (info.name == binary.name && info.kind == binary.kind.to_proto() as i32).then_some(manifest)
    }

    pub(crate) fn store(&self, sha: &str, manifest: &pb::Manifest) -> std::io::Result<()> {
        write_atomic(&self.manifest_path(sha), &manifest.encode_to_vec())
    }

    /// Drops what is cached for `binary` (its manifest and fingerprint), so the next use asks
    /// the plugin again. For a plugin whose manifest changes while its executable does not (a
    /// script behind a launcher). Whether a manifest was cached.
    pub(crate) fn forget(&self, binary: &Path) -> std::io::Result<bool> {
        let sha = hash_file(binary)?;
        let removed = match std::fs::remove_file(self.manifest_path(&sha)) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        match std::fs::remove_file(self.fingerprint_path(binary)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(removed)
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let parent = path
        .parent()
        .ok_or_else(|| std::io::Error::other("cache path has no parent"))?;
    std::fs::create_dir_all(parent)?;
    let tmp = parent.join(format!(".tmp-{}", random_hex(8)));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

//! `trellis backup FILE`: the engine's state, copied while it runs, written to a local file.
//!
//! FILE appears whole or not at all: the copy is received into a temporary file beside it
//! (owner-only: state holds secret values), checked against the SHA-256 the engine sends last,
//! flushed to disk and renamed over FILE.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde_json::json;
use trellis_proto::engine::v1 as pb;

use super::{Client, EngineArgs, Failure, emit, emit_json};
use crate::cli::OutputFormat;

#[derive(clap::Args, Debug)]
pub struct BackupArgs {
    /// Where to write the copy (replaced if it exists). Restore it as `state.db` in a data
    /// directory (docs/state.md).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Removes the temporary file unless the copy was kept.
struct Partial(Option<PathBuf>);

impl Drop for Partial {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn write_failed(path: &Path, e: std::io::Error) -> Failure {
    Failure::new(2, "OUTPUT", format!("cannot write {}: {e}", path.display()))
}

pub(super) async fn backup(client: &mut Client, args: &BackupArgs) -> Result<u8, Failure> {
    let target = &args.file;
    let Some(name) = target.file_name() else {
        return Err(Failure::usage(format!(
            "{} is not a file name",
            target.display()
        )));
    };
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        trellis_ids::random_hex(6)
    ));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| write_failed(&tmp, e))?;
    let mut partial = Partial(Some(tmp.clone()));

    let mut stream = match client.api.backup(pb::BackupRequest {}).await {
        Ok(r) => r.into_inner(),
        Err(s) => return Err(client.fail(s)),
    };
    let (mut written, mut total, mut sha256) = (0u64, 0u64, String::new());
    loop {
        match stream.message().await {
            Ok(Some(chunk)) => {
                file.write_all(&chunk.data)
                    .map_err(|e| write_failed(&tmp, e))?;
                written += chunk.data.len() as u64;
                total = chunk.total_bytes;
                if !chunk.sha256.is_empty() {
                    sha256 = chunk.sha256;
                }
            }
            Ok(None) => break,
            Err(s) => return Err(client.fail(s)),
        }
    }
    file.sync_all().map_err(|e| write_failed(&tmp, e))?;
    drop(file);
    // What is on disk is what gets checked: a short write or a damaged transfer never
    // replaces FILE.
    let got = trellis_ids::hash_file(&tmp).map_err(|e| write_failed(&tmp, e))?;
    if sha256.is_empty() || written != total || got != sha256 {
        return Err(Failure::new(
            1,
            "DATA_LOSS",
            format!(
                "the backup did not arrive whole ({written} of {total} bytes, sha256 {got}, \
                 the engine's {}): {} was left as it was; try again",
                if sha256.is_empty() {
                    "missing"
                } else {
                    &sha256
                },
                target.display()
            ),
        ));
    }
    std::fs::rename(&tmp, target).map_err(|e| write_failed(target, e))?;
    partial.0 = None;
    // The rename is durable once the directory is.
    if let Ok(d) = File::open(&dir) {
        let _ = d.sync_all();
    }
    match args.engine.format {
        OutputFormat::Json => emit_json(&json!({
            "backup": { "file": target.display().to_string(), "bytes": written, "sha256": sha256 }
        }))?,
        OutputFormat::Text => emit(&format!(
            "backed up the engine's state to {} ({written} bytes, sha256 {sha256})\n",
            target.display()
        ))?,
    }
    Ok(0)
}

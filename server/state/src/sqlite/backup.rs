//! A consistent copy of `state.db` while the engine runs, with SQLite's online backup API.
//!
//! The copy is made from a read connection of its own: under WAL a reader never blocks the
//! writer, so deploys go on while it runs. The read transaction is opened before the first
//! step and held to the last, so every step copies pages of one snapshot (SQLite would
//! otherwise restart a backup whose source changed between steps, possibly forever on a busy
//! engine). The copy goes to a temporary file in the data directory (owner-only: state can hold
//! secrets), which is unlinked as soon as it is open for reading: nothing is left behind when
//! the reader drops it, and one left by a crash mid-copy is removed at the next start.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use rusqlite::Connection;

use super::{Inner, open_connection};
use crate::error::{Result, StateError};

/// Temporary backup files in the data directory: `state.db.backup-<id>.tmp`.
const PREFIX: &str = "state.db.backup-";
const SUFFIX: &str = ".tmp";
/// Pages copied per step; between steps SQLite lets go of the source's mutex, so other
/// connections of this process are not held up by a large copy.
const PAGES_PER_STEP: i32 = 256;

/// A finished copy of the state: an open file (already unlinked) at offset 0.
#[derive(Debug)]
pub struct StateBackup {
    pub file: File,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, lowercase hex, for the receiver to check what it got.
    pub sha256: String,
}

fn io(path: &Path, e: std::io::Error) -> StateError {
    StateError::Io(format!("{}: {e}", path.display()))
}

/// Removes temporary backup files a crash left in `dir` (called at open, under the lock).
pub(super) fn remove_leftovers(dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io(dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(PREFIX) && name.ends_with(SUFFIX) {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(|e| io(&path, e))?;
            tracing::info!(file = %path.display(), "removed an unfinished state backup");
        }
    }
    Ok(())
}

/// Copies the database (blocking: run it on the blocking pool).
pub(super) fn copy(inner: &Inner) -> Result<StateBackup> {
    let dir = inner
        .db_path
        .parent()
        .ok_or_else(|| StateError::Io("the state database has no directory".into()))?;
    let tmp = dir.join(format!("{PREFIX}{}{SUFFIX}", trellis_ids::random_hex(8)));
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io(&tmp, e))?;
    let result = copy_into(inner, &tmp).and_then(|()| {
        let sha256 = trellis_ids::hash_file(&tmp).map_err(|e| io(&tmp, e))?;
        let file = File::open(&tmp).map_err(|e| io(&tmp, e))?;
        let size = file.metadata().map_err(|e| io(&tmp, e))?.len();
        Ok(StateBackup { file, size, sha256 })
    });
    // Open or failed, the name goes now; an open file stays readable until dropped.
    let removed = std::fs::remove_file(&tmp).map_err(|e| io(&tmp, e));
    let backup = result?;
    removed?;
    Ok(backup)
}

fn copy_into(inner: &Inner, tmp: &Path) -> Result<()> {
    let src = open_connection(&inner.db_path, inner.options.busy_timeout)?;
    src.pragma_update(None, "query_only", true)?;
    // Pin the snapshot: reading a row opens the read transaction `BEGIN` defers.
    src.execute_batch("BEGIN")?;
    src.query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| {
        r.get::<_, i64>(0)
    })?;
    {
        let mut dst = Connection::open(tmp)?;
        {
            let backup = rusqlite::backup::Backup::new(&src, &mut dst)?;
            backup.run_to_completion(PAGES_PER_STEP, std::time::Duration::ZERO, None)?;
        }
        // A database restored from the copy must not depend on a journal beside it: the
        // copy keeps the source's WAL flag, so fold any WAL content into the file and close
        // it (closing the last connection removes its -wal and -shm).
        dst.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        dst.close().map_err(|(_, e)| StateError::from(e))?;
    }
    src.execute_batch("COMMIT")?;
    // The -wal/-shm of the copy are gone with its last connection; make sure of it, since the
    // directory is the engine's.
    for side in ["-wal", "-shm"] {
        let mut p = tmp.as_os_str().to_owned();
        p.push(side);
        let _ = std::fs::remove_file(Path::new(&p));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::{SqliteStore, StateStore};

    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Dir {
            let p = std::env::temp_dir().join(format!(
                "trellis-backup-{tag}-{}-{}",
                std::process::id(),
                trellis_ids::random_hex(4)
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Writes the copy as `state.db` of a new data directory and opens a store on it.
    fn restore(backup: super::StateBackup, tag: &str) -> (Dir, SqliteStore) {
        let dir = Dir::new(tag);
        let mut file = backup.file;
        let mut out = std::fs::File::create(dir.0.join("state.db")).unwrap();
        let n = std::io::copy(&mut file, &mut out).unwrap();
        assert_eq!(n, backup.size);
        assert_eq!(
            trellis_ids::hash_file(&dir.0.join("state.db")).unwrap(),
            backup.sha256
        );
        let store = SqliteStore::open(&dir.0).unwrap();
        (dir, store)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_backup_taken_during_writes_is_one_consistent_state() {
        let dir = Dir::new("src");
        let store = SqliteStore::open(&dir.0).unwrap();
        for i in 0..20 {
            store.create_instance(&format!("before-{i}")).await.unwrap();
        }
        // Writes go on while the copy is made: it holds a prefix of them, whole ones only.
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    store.create_instance(&format!("during-{n}")).await.unwrap();
                    n += 1;
                }
                n
            })
        };
        let backup = store.backup().await.unwrap();
        stop.store(true, Ordering::SeqCst);
        let written = writer.await.unwrap();
        // Nothing of the copy is left in the data directory.
        let names: Vec<String> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.contains("backup")), "{names:?}");
        assert_eq!(
            backup.file.metadata().unwrap().permissions().mode() & 0o777,
            0o600
        );

        let (_restored_dir, restored) = restore(backup, "dst");
        let listed = restored.list_instances().await.unwrap();
        let during: Vec<&str> = listed
            .iter()
            .map(|i| i.name.as_str())
            .filter(|n| n.starts_with("during-"))
            .collect();
        assert_eq!(listed.len(), 20 + during.len());
        assert!(during.len() <= written);
        // A prefix: during-0 .. during-(k-1), in order, none missing.
        for (k, name) in during.iter().enumerate() {
            assert_eq!(*name, format!("during-{k}"));
        }
        // Each instance came with its event (one transaction each).
        for inst in &listed {
            let events = restored.events_since(&inst.id, 0, 10).await.unwrap();
            assert_eq!(events.len(), 1, "{}", inst.name);
        }
        // The restored store takes writes.
        restored.create_instance("after").await.unwrap();
    }

    #[test]
    fn leftovers_of_a_crashed_backup_are_removed_at_open() {
        let dir = Dir::new("left");
        let left = dir.0.join("state.db.backup-0123abcd.tmp");
        std::fs::write(&left, b"partial").unwrap();
        let other = dir.0.join("notes.tmp");
        std::fs::write(&other, b"mine").unwrap();
        let _store = SqliteStore::open(&dir.0).unwrap();
        assert!(!left.exists());
        assert!(other.exists());
    }
}

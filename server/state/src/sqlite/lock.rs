//! One engine per data directory: an exclusive `flock` on the data directory itself, held for
//! the store's life, plus `<data dir>/engine.lock`, which names the holder's pid.
//!
//! SQLite would let two processes share `state.db`, but two engines would each believe they
//! own every lease they hold in memory and would interrupt each other's operations at start.
//! The advisory lock makes the second engine fail at open with the holder's pid, instead.
//! The lock is on the directory, not on a file in it: a file can be deleted while the engine
//! runs (the next engine would then lock a fresh file of the same name), a directory that
//! holds files cannot. `engine.lock` is still locked too, so an older engine, which locks only
//! that file, and this one exclude each other. `flock` (not `fcntl`) because it belongs to the
//! open file description, so it is released exactly when the store closes it (or the process
//! dies), and it is independent of SQLite's own `fcntl` locks on the database files, which it
//! never touches. Both descriptors are close-on-exec, so plugin processes the engine spawns
//! never inherit them.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::{Result, StateError};

pub const LOCK_FILE: &str = "engine.lock";

#[derive(Debug)]
pub(crate) struct DataDirLock {
    file: File,
    path: PathBuf,
    /// The data directory, opened read-only and locked.
    _dir: File,
}

/// An exclusive lock without waiting (`flock(LOCK_EX | LOCK_NB)` on Linux): `Ok(false)` when
/// another open file holds it.
fn try_flock(file: &File) -> io::Result<bool> {
    match file.try_lock() {
        Ok(()) => Ok(true),
        Err(std::fs::TryLockError::WouldBlock) => Ok(false),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

impl DataDirLock {
    pub(crate) fn acquire(data_dir: &Path) -> Result<Self> {
        let path = data_dir.join(LOCK_FILE);
        let locked = || StateError::DataDirLocked {
            // Best effort: the holder may be between truncating and writing its pid, or the
            // file may have been deleted.
            pid: std::fs::read_to_string(&path)
                .ok()
                .and_then(|text| text.trim().parse().ok()),
            lock_file: path.clone(),
        };
        // `File::open` opens read-only and close-on-exec; a directory opens that way too.
        let dir = File::open(data_dir)
            .map_err(|e| StateError::Io(format!("{}: {e}", data_dir.display())))?;
        if !try_flock(&dir)
            .map_err(|e| StateError::Io(format!("lock {}: {e}", data_dir.display())))?
        {
            return Err(locked());
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false) // the holder's pid is in it until we hold the lock
            .mode(0o600)
            .open(&path)
            .map_err(|e| StateError::Io(format!("{}: {e}", path.display())))?;
        if !try_flock(&file).map_err(|e| StateError::Io(format!("lock {}: {e}", path.display())))? {
            return Err(locked());
        }
        // Ours now: record who holds it, for the error message of the next contender.
        let write_pid = |file: &mut File| -> io::Result<()> {
            file.set_len(0)?;
            file.seek(SeekFrom::Start(0))?;
            writeln!(file, "{}", std::process::id())?;
            file.flush()
        };
        write_pid(&mut file).map_err(|e| StateError::Io(format!("{}: {e}", path.display())))?;
        Ok(DataDirLock {
            file,
            path,
            _dir: dir,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DataDirLock {
    fn drop(&mut self) {
        // Clear the pid while still holding the lock; closing the file releases the lock.
        let _ = self.file.set_len(0);
    }
}

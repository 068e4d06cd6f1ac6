//! One engine per data directory: an exclusive `flock` on `<data dir>/engine.lock`, held for
//! the store's life.
//!
//! SQLite would let two processes share `state.db`, but two engines would each believe they
//! own every lease they hold in memory and would interrupt each other's operations at start.
//! The advisory lock makes the second engine fail at open with the holder's pid, instead.
//! `flock` (not `fcntl`) because it belongs to the open file, so it is released exactly when
//! the store closes the file (or the process dies), and it does not interfere with SQLite's own
//! `fcntl` locks on the database files. The file is opened close-on-exec, so plugin processes
//! the engine spawns never inherit it.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::state::error::{Result, StateError};

pub const LOCK_FILE: &str = "engine.lock";

#[derive(Debug)]
pub(crate) struct DataDirLock {
    file: File,
    path: PathBuf,
}

impl DataDirLock {
    pub(crate) fn acquire(data_dir: &Path) -> Result<Self> {
        let path = data_dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false) // the holder's pid is in it until we hold the lock
            .mode(0o600)
            .open(&path)
            .map_err(|e| StateError::Io(format!("{}: {e}", path.display())))?;
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut text = String::new();
                // Best effort: the holder may be between truncating and writing its pid.
                let _ = file.read_to_string(&mut text);
                return Err(StateError::DataDirLocked {
                    pid: text.trim().parse().ok(),
                    lock_file: path,
                });
            }
            return Err(StateError::Io(format!("lock {}: {err}", path.display())));
        }
        // Ours now: record who holds it, for the error message of the next contender.
        let write_pid = |file: &mut File| -> io::Result<()> {
            file.set_len(0)?;
            file.seek(SeekFrom::Start(0))?;
            writeln!(file, "{}", std::process::id())?;
            file.flush()
        };
        write_pid(&mut file).map_err(|e| StateError::Io(format!("{}: {e}", path.display())))?;
        Ok(DataDirLock { file, path })
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

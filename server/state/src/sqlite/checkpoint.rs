//! WAL checkpoints on a thread of their own.
//!
//! SQLite's automatic checkpoint runs inside the COMMIT that takes the WAL past 1,000 pages, on
//! the committing connection: here that is the one writer, so every unit queued behind that
//! commit waited for ~1,000 pages to be copied into `state.db` and fsynced (2-12 ms each, about
//! 25 times in a 10,000-resource deploy and destroy; see BENCHMARKS.md). Instead the writer's WAL
//! hook nudges this thread, which checkpoints on its own connection. WAL lets a checkpoint and
//! a writer run at once (they take different locks), so commits no longer wait for one.
//!
//! A PASSIVE checkpoint copies what no reader still needs and never blocks; the WAL restarts
//! from its beginning at the first write after a checkpoint that copied everything. If writes
//! outrun it, the next commit past the threshold nudges again and the rest is copied then; a
//! WAL four times the threshold is checkpointed by the writer itself.

use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use rusqlite::wal::CheckpointMode;

use super::open_connection;
use crate::Result;

/// WAL pages after a commit at which a checkpoint is asked for (SQLite's own default).
pub(super) const THRESHOLD_PAGES: i32 = 1000;
/// WAL pages at which the writer checkpoints itself, as SQLite would: the WAL restarts only
/// when a checkpoint has copied all of it before the next write begins, which a thread chasing
/// a writer that never pauses may not manage.
pub(super) const WRITER_PAGES: i32 = 4 * THRESHOLD_PAGES;

enum Msg {
    Nudge,
    Stop,
}

/// The checkpointing thread. Dropping it stops the thread after a checkpoint in progress.
pub(super) struct Checkpointer {
    stop: SyncSender<Msg>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Opens the thread's connection and installs the nudge as `writer`'s WAL hook (which also
    /// turns SQLite's automatic checkpoint off for that connection).
    pub(super) fn start(
        writer: &mut Connection,
        db_path: &Path,
        busy_timeout: Duration,
    ) -> Result<Self> {
        let conn = open_connection(db_path, busy_timeout)?;
        // A checkpoint fsyncs the WAL before copying and state.db after, as the writer's would.
        conn.pragma_update(None, "synchronous", "FULL")?;
        let (nudge, nudged) = std::sync::mpsc::sync_channel::<Msg>(1);
        let stop = nudge.clone();
        writer.wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages: i32| {
            if pages >= WRITER_PAGES {
                // Busy when the thread is mid-checkpoint: it copies, the next commit retries.
                // Never an error: the commit has happened, and an error here would report it
                // as failed.
                match timed(|| wal.checkpoint_v2(CheckpointMode::PASSIVE)) {
                    Ok(_) => crate::metrics::writer_checkpointed(),
                    Err(e) => {
                        tracing::debug!(error = %e, pages, "WAL checkpoint by the writer skipped")
                    }
                }
            } else if pages >= THRESHOLD_PAGES {
                // Full: a nudge is already waiting, which covers this commit too. Gone: the
                // store is closing, and the last connection to close checkpoints.
                let _ = nudge.try_send(Msg::Nudge);
            }
            Ok(())
        }))?;
        let thread = std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn({
                let db = db_path.display().to_string();
                move || run(conn, nudged, &db)
            })
            .map_err(|e| crate::StateError::Io(format!("checkpoint thread: {e}")))?;
        Ok(Checkpointer {
            stop,
            thread: Some(thread),
        })
    }
}

fn run(conn: Connection, nudged: Receiver<Msg>, db: &str) {
    while let Ok(Msg::Nudge) = nudged.recv() {
        match timed(|| conn.wal_checkpoint_v2(None::<&str>, CheckpointMode::PASSIVE)) {
            // `log` pages in the WAL, `done` of them now in state.db.
            Ok((log, done)) => tracing::debug!(db, log, done, "WAL checkpoint"),
            // The next nudge tries again; the WAL grows meanwhile, nothing is lost.
            Err(e) => tracing::warn!(db, error = %e, "WAL checkpoint failed"),
        }
    }
}

/// Runs a checkpoint, timing those that ran for /metrics.
fn timed<T>(checkpoint: impl FnOnce() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    let started = Instant::now();
    let done = checkpoint()?;
    crate::metrics::checkpoint_took(started.elapsed());
    Ok(done)
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            // Waits for room only while the thread finishes a checkpoint and takes the nudge.
            let _ = self.stop.send(Msg::Stop);
            let _ = thread.join();
        }
    }
}

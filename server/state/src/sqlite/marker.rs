//! `<data dir>/state.marker`: the data directory remembers that it has state, and how much.
//!
//! Without it, a data directory whose `state.db` was deleted, truncated or replaced by an
//! empty file would open as a brand-new store, and the engine would start with no instances
//! while their resources still exist. The marker is written when the store is first created
//! and holds the store's id (also kept in the database, table `store_meta`) and the number of
//! write transactions committed so far (`store_meta.commits`, incremented by every commit).
//! At open, a marker with a missing or empty database, a database without its schema, another
//! store's database, or one with fewer commits than the marker recorded, is refused.
//!
//! The last case is how a lost WAL shows: SQLite keeps recent commits in `state.db-wal` until
//! a checkpoint copies them into `state.db`, and a database opened without that file silently
//! lacks them. The count is rewritten in place after every commit (one `pwrite`, no fsync:
//! group commit already amortizes the database's fsync, and this one would double it). So the
//! marker never runs ahead of what was durably committed, and after a power loss it may lag
//! behind, which the check allows; it catches a lost WAL whenever the marker's last update
//! reached the disk, which is always the case after a process crash (the page cache survives)
//! and not guaranteed after a power loss.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Result, StateError};

pub const MARKER_FILE: &str = "state.marker";

const MAGIC: &str = "trellis-state-marker";
const VERSION: &str = "v1";

/// What a marker file says.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Recorded {
    pub store_id: String,
    pub commits: u64,
}

/// One fixed-length line, so an update overwrites the previous one exactly.
fn line(store_id: &str, commits: u64) -> String {
    format!("{MAGIC} {VERSION} store={store_id} commits={commits:020}\n")
}

/// The marker in `path`, if there is one.
pub(crate) fn read(path: &Path) -> Result<Option<Recorded>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StateError::Io(format!("{}: {e}", path.display()))),
    };
    parse(&text).map(Some).ok_or_else(|| {
        StateError::Corrupt(format!(
            "{} is not a state marker this engine can read; if state.db is the state you \
             mean to keep, remove {0} and start again (a new one is written)",
            path.display()
        ))
    })
}

fn parse(text: &str) -> Option<Recorded> {
    let mut words = text.split_whitespace();
    if words.next()? != MAGIC || words.next()? != VERSION {
        return None;
    }
    let store_id = words.next()?.strip_prefix("store=")?;
    let commits = words.next()?.strip_prefix("commits=")?.parse().ok()?;
    let valid_id = !store_id.is_empty() && store_id.bytes().all(|b| b.is_ascii_alphanumeric());
    (valid_id && words.next().is_none()).then(|| Recorded {
        store_id: store_id.to_owned(),
        commits,
    })
}

/// The open marker of a running store.
#[derive(Debug)]
pub(crate) struct Marker {
    file: File,
    path: PathBuf,
    store_id: String,
}

impl Marker {
    /// Writes the marker durably (a temporary file, fsynced, renamed over `path`, and the
    /// directory fsynced), so a crash leaves the old marker or the new one, never a torn one.
    pub(crate) fn write(path: &Path, store_id: &str, commits: u64) -> Result<Marker> {
        let io =
            |what: &Path, e: std::io::Error| StateError::Io(format!("{}: {e}", what.display()));
        let tmp = path.with_extension("marker.tmp");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io(&tmp, e))?;
        file.write_all(line(store_id, commits).as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| io(path, e))?;
        if let Some(dir) = path.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io(dir, e))?;
        }
        Ok(Marker {
            file,
            path: path.to_owned(),
            store_id: store_id.to_owned(),
        })
    }

    /// Records `commits` after a commit (see the module docs for why without fsync). A
    /// failure is logged, not returned: the commit itself is durable, and a lagging marker
    /// only weakens the next start's check.
    pub(crate) fn record(&self, commits: u64) {
        if let Err(e) = self
            .file
            .write_all_at(line(&self.store_id, commits).as_bytes(), 0)
        {
            tracing::warn!(file = %self.path.display(), error = %e, "cannot update the state marker");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_back_and_keep_their_length() {
        let a = line("abc123", 0);
        let b = line("abc123", u64::MAX);
        assert_eq!(a.len(), b.len());
        assert_eq!(
            parse(&b),
            Some(Recorded {
                store_id: "abc123".into(),
                commits: u64::MAX
            })
        );
        for bad in [
            "",
            "trellis-state-marker v2 store=a commits=1",
            "trellis-state-marker v1 store= commits=1",
            "trellis-state-marker v1 store=a/b commits=1",
            "trellis-state-marker v1 store=a commits=x",
            "trellis-state-marker v1 store=a commits=1 more",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}

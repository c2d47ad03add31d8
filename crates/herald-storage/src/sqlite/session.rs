//! Session lock files: how one process proves to the others that it is alive.
//!
//! Each open [`super::SqliteStorage`] owns `sessions/<id>.lock`, with `<id>`
//! 32 random hex digits, and holds an exclusive OS lock on it for its whole
//! life. The OS releases that lock when the process exits, however it exits
//! (kill -9 included), so "the file is missing, or it can be locked" proves
//! that its owner is gone.
//!
//! The file is created under a temporary name, locked, and only then renamed
//! to `<id>.lock` (a rename keeps the open file and its lock), so no process
//! ever sees an unlocked `<id>.lock` of a live session. That is what makes
//! deleting unlocked `*.lock` files safe.
//!
//! Locks are `std::fs::File::try_lock` (on Linux `flock(2)`): they conflict
//! between separate opens of the file also inside one process, so two
//! storages in one process behave like two processes.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Suffix of a live (or stale) session lock file.
const LOCK_SUFFIX: &str = ".lock";
/// Suffix of a lock file that is not yet locked and renamed.
const NEW_SUFFIX: &str = ".lock.new";
/// A `.lock.new` file older than this is a leftover of a crash between
/// creation and rename; younger ones may belong to a process starting now.
const STALE_NEW_FILE_AGE: Duration = Duration::from_secs(3600);

/// The lock file of this process's session; deleted and unlocked on drop.
pub(super) struct SessionLock {
    id: String,
    path: PathBuf,
    // Kept open: closing the file releases the lock.
    _file: File,
}

impl SessionLock {
    /// Creates and locks `<sessions_dir>/<random id>.lock`. `sessions_dir`
    /// must exist.
    pub(super) fn create(sessions_dir: &Path) -> io::Result<Self> {
        let id = format!("{:032x}", rand::random::<u128>());
        let new_path = sessions_dir.join(format!("{id}{NEW_SUFFIX}"));
        let path = sessions_dir.join(format!("{id}{LOCK_SUFFIX}"));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&new_path)?;
        if let Err(e) = file.try_lock().map_err(io::Error::from) {
            let _ = fs::remove_file(&new_path);
            return Err(e);
        }
        // For people looking at the directory: which process owns the session.
        writeln!(file, "pid {}", std::process::id())?;
        fs::rename(&new_path, &path)?;
        Ok(Self {
            id,
            path,
            _file: file,
        })
    }

    /// The session id: 32 lowercase hex digits.
    pub(super) fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for SessionLock {
    fn drop(&mut self) {
        // Delete while still locked; the lock goes with the file handle.
        if let Err(e) = fs::remove_file(&self.path) {
            tracing::warn!(session = %self.id, error = %e, "could not delete the session lock file");
        }
    }
}

/// `true` when `id` has the shape of a session id (so it is safe in a path).
fn is_session_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether the process of session `id` is provably gone: its lock file is
/// missing, or it can be locked. A gone session's file is deleted.
///
/// Anything uncertain (a malformed id, an I/O error other than "not found")
/// counts as alive: a wrong "alive" only delays a takeover until expiry, a
/// wrong "gone" would cut a live holder off.
pub(super) fn is_gone(sessions_dir: &Path, id: &str) -> bool {
    if !is_session_id(id) {
        return false;
    }
    let path = sessions_dir.join(format!("{id}{LOCK_SUFFIX}"));
    let file = match OpenOptions::new().read(true).write(true).open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return true,
        Err(e) => {
            tracing::warn!(session = %id, error = %e, "could not open a session lock file");
            return false;
        }
    };
    match file.try_lock() {
        Ok(()) => {
            // Delete while we hold the lock, then unlock by closing.
            let _ = fs::remove_file(&path);
            true
        }
        Err(TryLockError::WouldBlock) => false,
        Err(TryLockError::Error(e)) => {
            tracing::warn!(session = %id, error = %e, "could not test a session lock file");
            false
        }
    }
}

/// Deletes the lock files of sessions whose process is gone, except `own`.
/// Errors are logged and otherwise ignored: this is housekeeping.
pub(super) fn sweep(sessions_dir: &Path, own: &str) {
    let entries = match fs::read_dir(sessions_dir) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(error = %e, "could not list the sessions directory");
            return;
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(id) = name.strip_suffix(LOCK_SUFFIX) {
            if id != own && is_gone(sessions_dir, id) {
                tracing::debug!(session = %id, "deleted the lock file of a gone session");
            }
        } else if name.ends_with(NEW_SUFFIX) {
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_some_and(|age| age > STALE_NEW_FILE_AGE);
            if old {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_session_is_not_gone_and_dropped_one_is() {
        let dir = tempfile::tempdir().unwrap();
        let a = SessionLock::create(dir.path()).unwrap();
        assert!(is_session_id(a.id()));
        assert!(!is_gone(dir.path(), a.id()));
        let id = a.id().to_owned();
        drop(a);
        assert!(is_gone(dir.path(), &id));
        assert!(!is_gone(dir.path(), "../../etc/passwd"));
    }

    #[test]
    fn sweep_deletes_unlocked_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let live = SessionLock::create(dir.path()).unwrap();
        let stale = dir.path().join(format!("{:032x}.lock", 7));
        fs::write(&stale, "pid 1\n").unwrap();
        sweep(dir.path(), "0");
        assert!(!stale.exists());
        assert!(dir.path().join(format!("{}.lock", live.id())).exists());
    }
}

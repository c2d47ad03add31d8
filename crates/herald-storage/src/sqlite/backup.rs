//! Backup and restore of the embedded database (`herald backup`,
//! `herald restore`; docs/operations.md, "Backups").
//!
//! A backup is SQLite's `VACUUM INTO` (sqlite.org, "VACUUM", "VACUUM
//! INTO"): one consistent snapshot of `herald.db` as of one read
//! transaction, taken on a read-only connection while nodes serve (in WAL
//! mode readers never block the writer, nor it them), written to a
//! temporary file beside the target, checked with `PRAGMA
//! integrity_check`, and renamed into place.
//!
//! A restore puts a backup in place of `herald.db` while no node runs on
//! the data directory, and makes the restored history tell itself apart
//! from the one clients may have seen since the backup: a new epoch seed
//! (every channel gets a new epoch, so a Centrifugo client's recovery
//! across the restore is refused instead of silently reusing offsets),
//! and a writer lease that is released, with its fencing token moved
//! [`TOKEN_JUMP`] past the backup's, so no token handed out before the
//! restore is ever handed out again. The database it replaces is kept
//! beside it, renamed.

use std::fs::{self, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags};

use super::{DATABASE_FILE, SESSIONS_DIR};
use crate::error::{Error, Result};

/// How far a restore moves the writer lease's fencing token past the
/// backup's: more acquisitions than a database sees in its life (one a
/// second for 30 years is under 10^9), so the restored lease never hands
/// out a token that a node was given after the backup was taken.
pub const TOKEN_JUMP: i64 = 1 << 40;

/// What a backup or a restore found in the database it copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupSummary {
    /// The schema version (the newest migration applied).
    pub schema_version: i64,
    /// Channels with at least one message.
    pub channels: i64,
    /// Messages stored.
    pub messages: i64,
    /// Size of the copy, bytes.
    pub bytes: u64,
}

fn io(operation: &'static str, path: &Path, error: std::io::Error) -> Error {
    Error::io(operation, path, error)
}

/// Writes a consistent copy of `<data_dir>/herald.db` to `target`, while
/// nodes may serve.
///
/// # Errors
/// [`Error::Io`] when the database file is missing or `target` exists
/// (it is never overwritten); [`Error::Sqlite`] when the copy fails or
/// does not pass `PRAGMA integrity_check`.
pub fn backup(data_dir: &Path, target: &Path) -> Result<BackupSummary> {
    let db = data_dir.join(DATABASE_FILE);
    if !db.is_file() {
        return Err(io(
            "find the database to back up",
            &db,
            std::io::ErrorKind::NotFound.into(),
        ));
    }
    if target.exists() {
        return Err(io(
            "write the backup (it is never overwritten) to",
            target,
            std::io::ErrorKind::AlreadyExists.into(),
        ));
    }
    let tmp = sibling(target, "partial");
    let _ = fs::remove_file(&tmp);
    let copied = (|| {
        let source = Connection::open_with_flags(
            &db,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        source.busy_timeout(std::time::Duration::from_secs(10))?;
        let tmp_text = tmp
            .to_str()
            .ok_or_else(|| io("name", &tmp, std::io::ErrorKind::InvalidInput.into()))?;
        source.execute("VACUUM INTO ?1", [tmp_text])?;
        summary(&tmp)
    })();
    match copied {
        Ok(summary) => {
            fs::rename(&tmp, target).map_err(|e| io("rename the backup to", target, e))?;
            Ok(summary)
        }
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Puts the backup `backup` in place of `<data_dir>/herald.db` (see the
/// module docs); the database it replaces, if any, is renamed to
/// `herald.db.replaced-<ms since the epoch>` (with its `-wal`), and
/// `-shm` files are removed. Returns the backup's summary and the path
/// of the replaced database.
///
/// # Errors
/// [`Error::Io`] when a node runs on `data_dir` (a session lock file is
/// held) or a file cannot be copied or renamed; [`Error::Sqlite`] when the
/// backup is not a Herald database that passes `PRAGMA integrity_check`.
pub fn restore(backup: &Path, data_dir: &Path) -> Result<(BackupSummary, Option<PathBuf>)> {
    if let Some(running) = running_session(data_dir)? {
        return Err(io(
            "restore while a node runs (stop every node on this data directory first); its \
             session lock is",
            &running,
            std::io::ErrorKind::WouldBlock.into(),
        ));
    }
    let db = data_dir.join(DATABASE_FILE);
    let tmp = sibling(&db, "restoring");
    let _ = fs::remove_file(&tmp);
    fs::copy(backup, &tmp).map_err(|e| io("copy the backup", backup, e))?;
    let prepared = (|| {
        let summary = summary(&tmp)?;
        let conn = Connection::open(&tmp)?;
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE;
             UPDATE epoch_seed SET seed = lower(hex(randomblob(16))) WHERE id = 1;
             DELETE FROM channel_epochs;
             UPDATE storage_leases SET holder = NULL, holder_url = NULL, holder_session = NULL,
                 token = token + {TOKEN_JUMP}, expires_at_ms = 0;
             COMMIT;"
        ))?;
        Ok(summary)
    })();
    let summary = match prepared {
        Ok(summary) => summary,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let replaced = if db.exists() {
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let aside = sibling(&db, &format!("replaced-{stamp}"));
        fs::rename(&db, &aside).map_err(|e| io("move the replaced database to", &aside, e))?;
        let wal = data_dir.join(format!("{DATABASE_FILE}-wal"));
        if wal.exists() {
            let wal_aside = PathBuf::from(format!("{}-wal", aside.display()));
            fs::rename(&wal, &wal_aside).map_err(|e| io("move the replaced WAL to", &wal, e))?;
        }
        Some(aside)
    } else {
        None
    };
    let _ = fs::remove_file(data_dir.join(format!("{DATABASE_FILE}-shm")));
    fs::rename(&tmp, &db).map_err(|e| io("put the restored database at", &db, e))?;
    Ok((summary, replaced))
}

/// `path` with `.<suffix>` appended to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{suffix}"));
    path.with_file_name(name)
}

/// The lock file of a session whose process still runs on `data_dir`, if
/// any (a lock that cannot be taken; docs/storage.md, "Sessions").
fn running_session(data_dir: &Path) -> Result<Option<PathBuf>> {
    let dir = data_dir.join(SESSIONS_DIR);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("list the sessions of", &dir, e)),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(file) = OpenOptions::new().read(true).write(true).open(&path) else {
            continue;
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(Some(path)),
            Err(TryLockError::Error(e)) => return Err(io("test the session lock", &path, e)),
        }
    }
    Ok(None)
}

/// Checks the database file at `path` and counts what it holds.
fn summary(path: &Path) -> Result<BackupSummary> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let check: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    if check != "ok" {
        return Err(Error::Sqlite(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CORRUPT),
            Some(format!("integrity_check: {check}")),
        )));
    }
    let schema_version = conn.query_row(
        "SELECT max(version) FROM refinery_schema_history",
        [],
        |r| r.get(0),
    )?;
    let (channels, messages) = conn.query_row(
        "SELECT (SELECT count(*) FROM channels), (SELECT count(*) FROM messages)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let bytes = fs::metadata(path)
        .map_err(|e| io("read the size of", path, e))?
        .len();
    Ok(BackupSummary {
        schema_version,
        channels,
        messages,
        bytes,
    })
}

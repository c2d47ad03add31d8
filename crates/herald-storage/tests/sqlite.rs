//! Facts of the SQLite backend that the shared conformance suite cannot
//! state: durability settings, the file layout, session locks (HolderGone)
//! and concurrent opens. A second `SqliteStorage` on the same directory
//! stands for a second process.

use herald_storage::ChangeFeedReader;
use herald_storage::MessageLog;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use herald_core::{ChannelName, FencingToken, Lease, DEFAULT_LEASE_NAME};
use herald_storage::sqlite::{SqliteOptions, SqliteStorage, DATABASE_FILE, SESSIONS_DIR};
use herald_storage::testing::{candidate, msg};
use herald_storage::{Acquire, Error, LeaseStore, Storage, TakeoverReason};
use rusqlite::Connection;

async fn open(dir: &Path) -> SqliteStorage {
    SqliteStorage::open(dir, SqliteOptions::default())
        .await
        .unwrap()
}

async fn acquire(storage: &SqliteStorage, node: &str, ttl: Duration) -> (Lease, TakeoverReason) {
    match storage.acquire(&candidate(node), ttl).await.unwrap() {
        Acquire::Acquired { lease, reason } => (lease, reason),
        Acquire::Held(info) => panic!("{node} expected to acquire, held: {info:?}"),
    }
}

/// The schema versions applied to the database in `dir`, in order.
fn applied_migrations(dir: &Path) -> Vec<i64> {
    raw(dir)
        .prepare("SELECT version FROM refinery_schema_history ORDER BY version")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn raw(dir: &Path) -> Connection {
    let conn = Connection::open(dir.join(DATABASE_FILE)).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn
}

fn session_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(dir.join(SESSIONS_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn data_survives_drop_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("nested/data");
    let storage = open(&data_dir).await;
    let (lease, _) = acquire(&storage, "node-a", MINUTE).await;
    storage
        .append(&lease, &[msg("keep", r#"{"v": 1.0e10}"#), msg("keep", "2")])
        .await
        .unwrap();
    drop(storage);

    let storage = open(&data_dir).await;
    let page = storage
        .read(&ChannelName::new("keep").unwrap(), 0, 10)
        .await
        .unwrap();
    assert_eq!(page.head, 2);
    assert_eq!(page.messages[0].data.to_json_text(), r#"{"v": 1.0e10}"#);
    let info = storage
        .lease_info(DEFAULT_LEASE_NAME)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.token, FencingToken(1));
    // The token survives too: the next acquisition continues from it.
    let (lease, reason) = acquire(&storage, "node-a", MINUTE).await;
    assert_eq!(reason, TakeoverReason::HolderGone);
    assert_eq!(lease.token, FencingToken(2));
    let out = storage.append(&lease, &[msg("keep", "3")]).await.unwrap();
    assert_eq!(out[0].offset, 3);
}

#[tokio::test]
async fn wal_and_synchronous_full_are_in_force() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions {
        readers: 2,
        busy_timeout: Duration::from_millis(1234),
        renew_statement_timeout: Duration::from_millis(2345),
    };
    let storage = SqliteStorage::open(dir.path(), options).await.unwrap();
    let pragmas = storage.pragmas().await.unwrap();
    for (role, p) in [
        ("writer", &pragmas.writer),
        ("renewal", &pragmas.renewal),
        ("reader", &pragmas.reader),
    ] {
        assert_eq!(p.journal_mode, "wal", "{role}");
        assert_eq!(p.synchronous, 2, "{role}: synchronous must be FULL (2)");
    }
    assert_eq!(pragmas.writer.busy_timeout_ms, 1234);
    assert_eq!(pragmas.reader.busy_timeout_ms, 1234);
    assert_eq!(pragmas.renewal.busy_timeout_ms, 2345);
    assert!(pragmas.reader.query_only);
    assert!(!pragmas.writer.query_only);

    // WAL is a property of the file: any other connection sees it.
    let mode: String = raw(dir.path())
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn stored_token_column_holds_the_writers_token() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path()).await;
    let b = open(dir.path()).await;
    let (first, _) = acquire(&a, "node-a", MINUTE).await;
    a.append(&first, &[msg("t", "1"), msg("u", "1")])
        .await
        .unwrap();
    a.release(&first).await.unwrap();
    let (second, _) = acquire(&b, "node-b", MINUTE).await;
    b.append(&second, &[msg("t", "2")]).await.unwrap();

    let rows: Vec<(String, i64, i64)> = raw(dir.path())
        .prepare(r#"SELECT channel, "offset", token FROM messages ORDER BY id"#)
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let want = [("t", 1, 1), ("u", 1, 1), ("t", 2, 2)].map(|(c, o, t)| (c.to_owned(), o, t));
    assert_eq!(rows, want);
}

#[tokio::test]
async fn dropped_holder_is_gone_and_taken_over_before_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path()).await;
    let b = open(dir.path()).await;
    let a_session = a.session_id().to_owned();
    let (lease, _) = acquire(&a, "node-a", MINUTE).await;
    a.append(&lease, &[msg("x", "1")]).await.unwrap();
    assert_eq!(session_files(dir.path()).len(), 2);
    drop(a);

    let before = b.lease_info(DEFAULT_LEASE_NAME).await.unwrap().unwrap();
    assert!(before.expires_in_ms > 50_000, "not expired: {before:?}");
    let (taken, reason) = acquire(&b, "node-b", MINUTE).await;
    assert_eq!(reason, TakeoverReason::HolderGone);
    assert_eq!(taken.token, FencingToken(2));
    assert_eq!(
        session_files(dir.path()),
        [format!("{}.lock", b.session_id())]
    );
    assert!(!session_files(dir.path()).contains(&format!("{a_session}.lock")));

    // The old lease is fenced off.
    match b.append(&lease, &[msg("x", "2")]).await {
        Err(Error::LeaseLost { .. }) => {}
        other => panic!("expected LeaseLost, got {other:?}"),
    }
}

#[tokio::test]
async fn holder_with_live_session_is_not_gone() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path()).await;
    let b = open(dir.path()).await;
    let (lease, _) = acquire(&a, "node-a", MINUTE).await;

    match b.acquire(&candidate("node-b"), MINUTE).await.unwrap() {
        Acquire::Held(info) => {
            assert_eq!(info.holder.as_deref(), Some("node-a"));
            assert_eq!(info.token, lease.token);
        }
        other => panic!("expected Held, got {other:?}"),
    }
    // Our own session is never considered gone either.
    assert!(matches!(
        a.acquire(&candidate("node-c"), MINUTE).await.unwrap(),
        Acquire::Held(_)
    ));
    assert_eq!(session_files(dir.path()).len(), 2);
}

#[tokio::test]
async fn session_file_is_locked_while_open_and_removed_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let storage = open(dir.path()).await;
    let id = storage.session_id().to_owned();
    assert_eq!(id.len(), 32);
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
    let path = dir.path().join(SESSIONS_DIR).join(format!("{id}.lock"));
    let probe = std::fs::File::open(&path).unwrap();
    assert!(matches!(
        probe.try_lock(),
        Err(std::fs::TryLockError::WouldBlock)
    ));
    drop(storage);
    assert!(!path.exists());
    drop(probe);

    // A stale file of a crashed process is swept at the next open.
    let stale = dir
        .path()
        .join(SESSIONS_DIR)
        .join(format!("{:032x}.lock", 5));
    std::fs::write(&stale, "pid 0\n").unwrap();
    let storage = open(dir.path()).await;
    assert!(!stale.exists());
    assert_eq!(
        session_files(dir.path()),
        [format!("{}.lock", storage.session_id())]
    );
}

/// Many opens of one new directory at the same instant, each on its own
/// thread and runtime (as separate processes would): all succeed and the
/// migration is applied exactly once.
#[test]
fn concurrent_opens_all_migrate_fine() {
    const ROUNDS: usize = 30;
    const OPENS: usize = 12;
    for _ in 0..ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        let barrier = Arc::new(Barrier::new(OPENS));
        let threads: Vec<_> = (0..OPENS)
            .map(|_| {
                let barrier = Arc::clone(&barrier);
                let path = dir.path().to_path_buf();
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    barrier.wait();
                    rt.block_on(async {
                        let options = SqliteOptions {
                            readers: 1,
                            ..SqliteOptions::default()
                        };
                        let storage = SqliteStorage::open(&path, options).await?;
                        storage.ping().await
                    })
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap().expect("concurrent open");
        }
        let applied = applied_migrations(dir.path());
        // Each migration once (2: the idempotency digest; 3: retention;
        // 4: channel epochs; 5: presence; 6: message tags; 7: channel deletions and node reports;
        // 8: the nodes' channels; 9: the epoch seed; 10: recorded takeovers;
        // 11: streams; 12: the takeover timeline and the console's node
        // report columns; 13: stream producers' last append; 14: who released a
        // lease).
        assert_eq!(applied, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
    }
}

#[tokio::test]
async fn write_lock_held_elsewhere_makes_append_unavailable_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions {
        busy_timeout: Duration::from_millis(200),
        ..SqliteOptions::default()
    };
    let storage = SqliteStorage::open(dir.path(), options).await.unwrap();
    let (lease, _) = acquire(&storage, "node-a", MINUTE).await;

    let blocker = raw(dir.path());
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    match storage.append(&lease, &[msg("x", "1")]).await {
        Err(Error::Unavailable { .. }) => {}
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(150));
    blocker.execute_batch("ROLLBACK").unwrap();

    let out = storage.append(&lease, &[msg("x", "1")]).await.unwrap();
    assert_eq!(out[0].offset, 1);
}

/// A renewal blocked on the write lock settles with an error within its
/// statement timeout (+ slack), and a later attempt succeeds once the lock
/// is gone.
#[tokio::test]
async fn blocked_renewal_settles_within_timeout_then_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions {
        renew_statement_timeout: Duration::from_millis(300),
        ..SqliteOptions::default()
    };
    let storage = SqliteStorage::open(dir.path(), options).await.unwrap();
    let (lease, _) = acquire(&storage, "node-a", MINUTE).await;

    let blocker = raw(dir.path());
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    match storage.renew(&lease, MINUTE).await {
        Err(Error::Unavailable { .. }) => {}
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert!(waited < Duration::from_millis(1300), "{waited:?}");
    blocker.execute_batch("ROLLBACK").unwrap();

    storage.renew(&lease, MINUTE).await.unwrap();
}

/// A renewal that waited for the write lock past the lease's expiry is
/// LeaseLost and extends nothing: the expiry is judged after the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_waiting_past_expiry_does_not_extend() {
    let dir = tempfile::tempdir().unwrap();
    let storage = open(dir.path()).await;
    let (lease, _) = acquire(&storage, "node-a", Duration::from_millis(300)).await;

    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let path = dir.path().to_path_buf();
    let holder = std::thread::spawn(move || {
        let conn = raw(&path);
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        locked_tx.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(800));
        conn.execute_batch("COMMIT").unwrap();
    });
    locked_rx.recv().unwrap();
    let info = storage
        .lease_info(DEFAULT_LEASE_NAME)
        .await
        .unwrap()
        .unwrap();
    assert!(
        info.expires_in_ms > 0,
        "must still be valid when the renewal starts: {info:?}"
    );

    let started = Instant::now();
    match storage.renew(&lease, MINUTE).await {
        Err(Error::LeaseLost { token, .. }) => assert_eq!(token, lease.token),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "the renewal did not wait"
    );
    holder.join().unwrap();
    let info = storage
        .lease_info(DEFAULT_LEASE_NAME)
        .await
        .unwrap()
        .unwrap();
    assert!(
        info.expires_in_ms <= 0,
        "expired lease was extended: {info:?}"
    );
}

/// The schema is as documented: the lease's time columns are in no index
/// (so no unique index), and the partial unique index on idempotency keys
/// exists.
#[tokio::test]
async fn schema_has_the_documented_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let _storage = open(dir.path()).await;
    let conn = raw(dir.path());
    let lease_index_columns: Vec<String> = conn
        .prepare(
            "SELECT ii.name FROM pragma_index_list('storage_leases') il, \
             pragma_index_info(il.name) ii",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(lease_index_columns, ["name"]);
    let (unique, partial): (bool, bool) = conn
        .query_row(
            "SELECT \"unique\", partial FROM pragma_index_list('messages') \
             WHERE name = 'messages_idempotency_key'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(unique && partial);
}

/// SQLite has no push notices of commits: followers poll `changes_since`.
#[tokio::test]
async fn sqlite_has_no_change_notices() {
    let dir = tempfile::tempdir().unwrap();
    let storage = open(dir.path()).await;
    assert!(storage.watch_changes().is_none());
}

/// A data dir that is a file is refused once, with the operation and the
/// absolute path, and nothing is created next to it.
#[tokio::test]
async fn a_data_dir_that_is_a_file_is_refused_naming_its_absolute_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let e = SqliteStorage::open(&file, SqliteOptions::default())
        .await
        .unwrap_err();
    let Error::Io {
        operation, path, ..
    } = &e
    else {
        panic!("not an Io error: {e:?}");
    };
    assert_eq!(*operation, "use the data directory");
    assert!(path.is_absolute(), "{path:?}");
    assert_eq!(path, &file);
    let text = e.to_string();
    assert_eq!(
        text,
        format!(
            "cannot use the data directory {}: it exists and is not a directory",
            file.display()
        )
    );
    // Printed once: the OS error is not also the error's source.
    assert!(std::error::Error::source(&e).is_none());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

/// A standby's acquire over a live holder takes no write lock: while
/// another connection holds the database's write lock (a write in flight),
/// the standby is answered `Held` instead of waiting for that lock (and,
/// once it had it, stalling the holder's writes and renewals in turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_declines_a_live_lease_without_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let holder = open(dir.path()).await;
    let (lease, _) = acquire(&holder, "node-a", MINUTE).await;
    let standby = open(dir.path()).await;
    let blocker = raw(dir.path());
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    match standby.acquire(&candidate("node-b"), MINUTE).await {
        Ok(Acquire::Held(info)) => {
            assert_eq!(info.holder.as_deref(), Some("node-a"));
            assert_eq!(info.token, lease.token);
        }
        other => panic!("expected Held without the write lock, got {other:?}"),
    }
    blocker.execute_batch("ROLLBACK").unwrap();
    holder.renew(&lease, MINUTE).await.unwrap();
}

/// A key stored before schema version 2 has no digest: it answers the
/// original message whatever is published with it, as every key did then;
/// the migration keeps such rows as they were.
#[tokio::test]
async fn a_key_stored_without_a_digest_matches_any_message() {
    let dir = tempfile::tempdir().unwrap();
    let storage = open(dir.path()).await;
    let (lease, _) = acquire(&storage, "node-a", MINUTE).await;
    let keyed = |data: &str| herald_storage::testing::keyed("c", data, "old-key");
    storage.append(&lease, &[keyed("1")]).await.unwrap();
    // What a row written by schema version 1 looks like.
    let updated = raw(dir.path())
        .execute("UPDATE messages SET idempotency_digest = NULL", [])
        .unwrap();
    assert_eq!(updated, 1);
    let out = storage.append(&lease, &[keyed("2")]).await.unwrap();
    assert!(out[0].duplicate);
    assert_eq!(out[0].offset, 1);
    let versions = applied_migrations(dir.path());
    assert_eq!(versions, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
}

/// A new database is in incremental auto-vacuum mode, and a trim returns
/// the pages it freed to the file system (the file shrinks).
#[tokio::test]
async fn trimming_returns_free_pages_of_a_new_database() {
    let dir = tempfile::tempdir().unwrap();
    let storage = open(dir.path()).await;
    let conn = raw(dir.path());
    let mode: i64 = conn
        .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, 2, "auto_vacuum=INCREMENTAL");
    let (lease, _) = acquire(&storage, "node-a", MINUTE).await;
    let big = format!("\"{}\"", "x".repeat(8000));
    let batch: Vec<_> = (0..100).map(|_| msg("big", &big)).collect();
    storage.append(&lease, &batch).await.unwrap();
    let pages = |conn: &Connection| -> i64 {
        conn.query_row("PRAGMA page_count", [], |r| r.get(0))
            .unwrap()
    };
    let before = pages(&conn);
    let limits = herald_storage::TrimLimits {
        max_messages: Some(0),
        ..herald_storage::TrimLimits::default()
    };
    let trimmed = storage
        .trim(&lease, &ChannelName::new("big").unwrap(), &limits, 500)
        .await
        .unwrap();
    assert_eq!(trimmed.messages, 100);
    let after = pages(&conn);
    // 100 messages of 8 KB are about 200 pages of 4 KiB.
    assert!(after + 150 < before, "pages before {before}, after {after}");
}

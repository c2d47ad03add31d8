//! Change notices on PostgreSQL (`Storage::watch_changes`, LISTEN/NOTIFY):
//! a commit on one node is announced to the others; a write that rolls
//! back is not; a recorded deletion is announced, a refused one is not; a
//! listener whose connection is ended reconnects and says `Resync`. Cluster
//! events (`Storage::send_cluster_event`) reach the other nodes, not the
//! sender, also after a reconnect; one too large is refused. Every test runs on a fresh database of the test cluster
//! (`HERALD_TEST_DATABASE_URL`); a second `PostgresStorage` on it stands
//! for a second node.

use herald_storage::ChangeFeedReader;
use herald_storage::ClusterView;
use herald_storage::MessageLog;
use std::time::Duration;

use herald_core::Lease;
use herald_storage::postgres::{PostgresOptions, PostgresStorage};
use herald_storage::testing::{candidate, keyed, msg, TestDatabase};
use herald_storage::{Acquire, ChangeSignal, ClusterEvent, Deletion, Error, LeaseStore};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::broadcast::Receiver;
use tokio_postgres::Client;

/// Longest a test waits for a notice that must come.
const WAIT_LIMIT: Duration = Duration::from_secs(15);
/// How long a test listens for a notice that must not come.
const QUIET: Duration = Duration::from_millis(500);

async fn node(url: &str) -> PostgresStorage {
    PostgresStorage::connect(url, PostgresOptions::default())
        .await
        .unwrap()
}

async fn acquire(storage: &PostgresStorage, node: &str, ttl: Duration) -> Lease {
    match storage.acquire(&candidate(node), ttl).await.unwrap() {
        Acquire::Acquired { lease, .. } => lease,
        Acquire::Held(info) => panic!("{node} expected to acquire, held: {info:?}"),
    }
}

/// The next `Committed` notice, skipping `Resync`; fails after
/// [`WAIT_LIMIT`].
async fn next_committed(rx: &mut Receiver<ChangeSignal>) -> (String, u64, u64, i64) {
    let wait = async {
        loop {
            match rx.recv().await {
                Ok(ChangeSignal::Committed {
                    channel,
                    from,
                    to,
                    committed_at_ms,
                }) => return (channel.as_str().to_owned(), from, to, committed_at_ms),
                Ok(ChangeSignal::Resync) => {}
                Ok(other) => panic!("expected a commit notice, got {other:?}"),
                Err(e) => panic!("the receiver failed: {e}"),
            }
        }
    };
    tokio::time::timeout(WAIT_LIMIT, wait)
        .await
        .expect("no change notice in time")
}

/// The next `Deleted` notice, skipping `Resync`; fails after
/// [`WAIT_LIMIT`].
async fn next_deleted(rx: &mut Receiver<ChangeSignal>) -> Deletion {
    let wait = async {
        loop {
            match rx.recv().await {
                Ok(ChangeSignal::Deleted(deletion)) => return deletion,
                Ok(ChangeSignal::Resync) => {}
                Ok(other) => panic!("expected a deletion notice, got {other:?}"),
                Err(e) => panic!("the receiver failed: {e}"),
            }
        }
    };
    tokio::time::timeout(WAIT_LIMIT, wait)
        .await
        .expect("no deletion notice in time")
}

/// Asserts that no notice at all arrives for [`QUIET`].
async fn assert_quiet(rx: &mut Receiver<ChangeSignal>) {
    match tokio::time::timeout(QUIET, rx.recv()).await {
        Err(_) => {}
        Ok(got) => panic!("expected no notice, got {got:?}"),
    }
}

/// Ends the backends `pids` (`pg_terminate_backend`, PostgreSQL docs,
/// "Server Signaling Functions").
async fn terminate(monitor: &Client, pids: &[i32]) {
    for pid in pids {
        monitor
            .execute("SELECT pg_terminate_backend($1)", &[pid])
            .await
            .unwrap();
    }
}

/// Backend pids of this database's sessions named `application`.
async fn backends(monitor: &Client, application: &str) -> Vec<i32> {
    monitor
        .query(
            "SELECT pid FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = $1 ORDER BY pid",
            &[&application],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The database clock in ms since the Unix epoch.
async fn db_now_ms(monitor: &Client) -> i64 {
    monitor
        .query_one(
            "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// A batch written by one node is announced to another node's receiver:
/// one notice per channel with the range of new offsets and the database
/// clock at commit; duplicates announce nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_on_one_node_is_announced_to_another() {
    let db = TestDatabase::create().await;
    let writer = node(db.url()).await;
    let follower = node(db.url()).await;
    let monitor = db.raw_client().await;
    let mut rx = follower
        .watch_changes()
        .expect("postgres has change notices");
    let mut own = writer.watch_changes().unwrap();
    let lease = acquire(&writer, "a", Duration::from_secs(60)).await;

    let before = db_now_ms(&monitor).await;
    let appended = writer
        .append(
            &lease,
            &[
                msg("room:a", "1"),
                msg("room.b", "2"),
                keyed("room:a", "3", "k"),
                msg("room:a", "4"),
            ],
        )
        .await
        .unwrap();
    let after = db_now_ms(&monitor).await;
    let mut notices = vec![next_committed(&mut rx).await, next_committed(&mut rx).await];
    let mut heard = notices.clone();
    notices.sort();
    assert_eq!(
        notices
            .iter()
            .map(|(c, f, t, _)| (c.as_str(), *f, *t))
            .collect::<Vec<_>>(),
        [("room.b", 1, 1), ("room:a", 1, 3)]
    );
    for (_, _, _, at) in &notices {
        assert!(
            *at >= appended[0].published_at_ms && (before..=after).contains(at),
            "committed_at_ms {at} not within [{before}, {after}]"
        );
    }
    assert_quiet(&mut rx).await;

    // Only a duplicate: nothing new, nothing announced.
    let again = writer
        .append(&lease, &[keyed("room:a", "3", "k")])
        .await
        .unwrap();
    assert!(again[0].duplicate);
    assert_quiet(&mut rx).await;

    // A duplicate and a new message: only the new one.
    writer
        .append(&lease, &[keyed("room:a", "3", "k"), msg("room:a", "5")])
        .await
        .unwrap();
    let last = next_committed(&mut rx).await;
    assert_eq!((last.0.as_str(), last.1, last.2), ("room:a", 4, 4));
    heard.push(last);

    // The writer's own storage hears the same notices, in the same order.
    let mut own_heard = Vec::new();
    for _ in 0..heard.len() {
        own_heard.push(next_committed(&mut own).await);
    }
    assert_eq!(own_heard, heard);
}

/// A fenced write that rolls back announces nothing: not when the lease is
/// lost (refused before anything is written), and not when the commit
/// itself fails after the notices were queued (a deferred constraint
/// trigger refuses it at `COMMIT`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolled_back_write_is_not_announced() {
    let db = TestDatabase::create().await;
    let old = node(db.url()).await;
    let new = node(db.url()).await;
    let follower = node(db.url()).await;
    let monitor = db.raw_client().await;
    monitor
        .batch_execute(
            "CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF NEW.data = '\"boom\"' THEN RAISE EXCEPTION 'boom refused'; END IF; \
             RETURN NULL; END $$; \
             CREATE CONSTRAINT TRIGGER refuse_boom AFTER INSERT ON messages \
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_boom();",
        )
        .await
        .unwrap();
    let mut rx = follower.watch_changes().unwrap();

    // The commit fails after the inserts and notices: nothing is announced.
    let stale = acquire(&old, "old", Duration::from_millis(1_500)).await;
    let refused = old
        .append(&stale, &[msg("doomed", "1"), msg("doomed", "\"boom\"")])
        .await;
    assert!(
        matches!(refused, Err(Error::Postgres(_))),
        "expected the commit to fail, got {refused:?}"
    );

    // The lease expires; the old holder's write is refused as lease lost.
    let lease = loop {
        match new
            .acquire(&candidate("new"), Duration::from_secs(60))
            .await
        {
            Ok(Acquire::Acquired { lease, .. }) => break lease,
            Ok(Acquire::Held(_)) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("acquire failed: {e}"),
        }
    };
    let lost = old.append(&stale, &[msg("lost", "1")]).await;
    assert!(
        matches!(lost, Err(Error::LeaseLost { .. })),
        "expected LeaseLost, got {lost:?}"
    );
    assert_quiet(&mut rx).await;

    // The next notice is the first committed write.
    new.append(&lease, &[msg("kept", "1")]).await.unwrap();
    let (ch, from, to, _) = next_committed(&mut rx).await;
    assert_eq!((ch.as_str(), from, to), ("kept", 1, 1));
    let stored: i64 = monitor
        .query_one("SELECT count(*) FROM messages", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 1);
}

/// When the listening connection is ended, the listener reconnects (a new
/// backend named `herald-listen`), receivers get `Resync`, and later
/// commits are announced again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_listener_reconnects_and_asks_for_a_resync() {
    let db = TestDatabase::create().await;
    let writer = node(db.url()).await;
    let monitor = db.raw_client().await;
    let lease = acquire(&writer, "a", Duration::from_secs(60)).await;
    let follower = node(db.url()).await;
    let mut rx = follower.watch_changes().unwrap();

    let before = backends(&monitor, "herald-listen").await;
    assert_eq!(before.len(), 2, "one listener per storage: {before:?}");
    terminate(&monitor, &before).await;
    let resync = async {
        match rx.recv().await {
            Ok(ChangeSignal::Resync) => {}
            Ok(other) => panic!("expected Resync, got {other:?}"),
            Err(RecvError::Lagged(n)) => panic!("lagged by {n}"),
            Err(RecvError::Closed) => panic!("the listener stopped"),
        }
    };
    tokio::time::timeout(WAIT_LIMIT, resync)
        .await
        .expect("no Resync after the listening connection was ended");
    // Each storage's listener reconnects on its own backoff: wait until both
    // are back, on new backends.
    let deadline = tokio::time::Instant::now() + WAIT_LIMIT;
    loop {
        let after = backends(&monitor, "herald-listen").await;
        if after.len() == 2 && after.iter().all(|pid| !before.contains(pid)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "listeners did not come back: {before:?} -> {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    writer.append(&lease, &[msg("again", "1")]).await.unwrap();
    let (ch, from, to, _) = next_committed(&mut rx).await;
    assert_eq!((ch.as_str(), from, to), ("again", 1, 1));
}

/// The listener ends with the last handle of its storage: its backend goes
/// away and receivers see the channel closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_ends_with_the_storage() {
    let db = TestDatabase::create().await;
    let monitor = db.raw_client().await;
    let storage = node(db.url()).await;
    let clone = storage.clone();
    let mut rx = storage.watch_changes().unwrap();
    drop(storage);
    assert_eq!(backends(&monitor, "herald-listen").await.len(), 1);
    drop(clone);
    let closed = async {
        loop {
            if let Err(RecvError::Closed) = rx.recv().await {
                return;
            }
        }
    };
    tokio::time::timeout(WAIT_LIMIT, closed)
        .await
        .expect("the receiver never closed");
    let gone = async {
        while !(backends(&monitor, "herald-listen").await.is_empty()
            && backends(&monitor, "herald-liveness").await.is_empty())
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(WAIT_LIMIT, gone)
        .await
        .expect("the listener and liveness sessions outlived the storage");
}

/// A deletion recorded on one node is announced to another node's receiver
/// at its commit, with its number and head; one refused for a lost lease
/// is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recorded_deletion_is_announced_and_a_refused_one_is_not() {
    let db = TestDatabase::create().await;
    let writer = node(db.url()).await;
    let follower = node(db.url()).await;
    let mut rx = follower.watch_changes().unwrap();
    let lease = acquire(&writer, "a", Duration::from_secs(60)).await;
    writer
        .append(&lease, &[msg("room:a", "1"), msg("room:a", "2")])
        .await
        .unwrap();
    next_committed(&mut rx).await;

    let room = herald_core::ChannelName::new("room:a").unwrap();
    let number = writer.record_deletion(&lease, &room, 2).await.unwrap();
    let heard = next_deleted(&mut rx).await;
    assert_eq!(
        heard,
        Deletion {
            channel: room.clone(),
            head: 2,
            number,
        }
    );

    writer.release(&lease).await.unwrap();
    acquire(&follower, "b", Duration::from_secs(60)).await;
    let refused = writer.record_deletion(&lease, &room, 2).await;
    assert!(
        matches!(refused, Err(Error::LeaseLost { .. })),
        "expected LeaseLost, got {refused:?}"
    );
    assert_quiet(&mut rx).await;
}

/// The next cluster event, within [`WAIT_LIMIT`].
async fn next_event(rx: &mut Receiver<ClusterEvent>) -> ClusterEvent {
    tokio::time::timeout(WAIT_LIMIT, rx.recv())
        .await
        .expect("no cluster event in time")
        .expect("an open receiver")
}

/// A cluster event sent by one node reaches every other node, not the
/// sender; one too large for a notification is refused and sends
/// nothing; after the listening connection is ended, events reach the
/// node again once it has reconnected.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_events_reach_the_other_nodes() {
    let db = TestDatabase::create().await;
    let monitor = db.raw_client().await;
    let a = node(db.url()).await;
    let b = node(db.url()).await;
    let c = node(db.url()).await;
    let mut at_a = a
        .watch_cluster_events()
        .expect("postgres has cluster events");
    let mut at_b = b.watch_cluster_events().unwrap();
    let mut at_c = c.watch_cluster_events().unwrap();

    let unsubscribe = ClusterEvent::Unsubscribe {
        user: "ann".to_owned(),
        channel: herald_core::ChannelName::new("news:a").unwrap(),
    };
    a.send_cluster_event(&unsubscribe).await.unwrap();
    assert_eq!(next_event(&mut at_b).await, unsubscribe);
    assert_eq!(next_event(&mut at_c).await, unsubscribe);
    let disconnect = ClusterEvent::Disconnect {
        user: "bob".to_owned(),
        code: 3503,
    };
    b.send_cluster_event(&disconnect).await.unwrap();
    assert_eq!(next_event(&mut at_a).await, disconnect);
    assert_eq!(next_event(&mut at_c).await, disconnect);

    let huge = ClusterEvent::Disconnect {
        user: "u".repeat(8000),
        code: 3503,
    };
    let refused = a.send_cluster_event(&huge).await;
    assert!(
        matches!(refused, Err(Error::ClusterEventTooLarge { .. })),
        "expected ClusterEventTooLarge, got {refused:?}"
    );
    // Nothing more: not the huge one, and no node heard its own.
    for rx in [&mut at_a, &mut at_b, &mut at_c] {
        match tokio::time::timeout(QUIET, rx.recv()).await {
            Err(_) => {}
            Ok(got) => panic!("expected no event, got {got:?}"),
        }
    }

    // The listening connection of `b` ends; once a new one listens (its
    // `Resync`), events reach `b` again.
    let mut b_changes = b.watch_changes().unwrap();
    let before = backends(&monitor, "herald-listen").await;
    terminate(&monitor, &before).await;
    let resync = async {
        loop {
            if let Ok(ChangeSignal::Resync) = b_changes.recv().await {
                return;
            }
        }
    };
    tokio::time::timeout(WAIT_LIMIT, resync)
        .await
        .expect("no Resync after the listening connection was ended");
    a.send_cluster_event(&unsubscribe).await.unwrap();
    assert_eq!(next_event(&mut at_b).await, unsubscribe);
}

/// Scans of the `messages` table so far, as PostgreSQL's statistics show
/// them: (sequential, by index). Each backend reports its counts when it
/// goes idle, at most once a second, and within 10 s (PostgreSQL
/// documentation, "The Cumulative Statistics System").
async fn message_scans(monitor: &Client) -> (i64, i64) {
    monitor
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    let row = monitor
        .query_one(
            "SELECT seq_scan, COALESCE(idx_scan, 0) FROM pg_stat_user_tables \
             WHERE relname = 'messages'",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Messages inserted into `messages` so far, as the statistics show them.
async fn messages_inserted(monitor: &Client) -> i64 {
    monitor
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    monitor
        .query_one(
            "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'messages'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// `changes_since` reads only the messages after its cursor, by the index
/// on `id`, whatever the statistics say and however often it runs, and
/// reports every channel that moved, also when more messages moved than
/// one of its scans reads. Without statistics (autovacuum off here, as
/// on a new table it has not analyzed yet), a plan for `id > $1` alone
/// scanned the whole table, so a standby's every poll cost as much as the
/// messages stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_since_reads_by_index_whatever_the_statistics() {
    const STORED: i64 = 200_000;
    // More than the five custom plans PostgreSQL makes before it weighs a
    // generic one.
    const CALLS: i64 = 20;
    let db = TestDatabase::create().await;
    let writer = node(db.url()).await;
    let follower = node(db.url()).await;
    let monitor = db.raw_client().await;
    monitor
        .batch_execute("ALTER TABLE messages SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    let lease = acquire(&writer, "a", Duration::from_secs(60)).await;
    let channels: Vec<String> = (0..64).map(|c| format!("c{c}")).collect();
    let data = format!("\"{}\"", "x".repeat(198));
    for start in (0..STORED).step_by(1000) {
        let batch: Vec<_> = (start..start + 1000)
            .map(|i| msg(&channels[usize::try_from(i % 64).unwrap()], &data))
            .collect();
        writer.append(&lease, &batch).await.unwrap();
    }
    // From the start: every channel, the cursor at the last message.
    let all = follower.changes_since(0).await.unwrap();
    assert_eq!(all.changed.len(), 64);
    assert!(
        all.changed.iter().all(|c| c.head == 3125),
        "{:?}",
        all.changed
    );
    assert_eq!(all.cursor, u64::try_from(STORED).unwrap());

    writer.append(&lease, &[msg("c0", "1")]).await.unwrap();
    // Every insert counted: the writer's backends have reported, so the
    // scans counted from here are the follower's.
    let settled = tokio::time::timeout(WAIT_LIMIT, async {
        while messages_inserted(&monitor).await < STORED + 1 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    settled.await.expect("the inserts were never counted");
    let (seq_before, idx_before) = message_scans(&monitor).await;

    for _ in 0..CALLS {
        let feed = follower.changes_since(all.cursor).await.unwrap();
        assert_eq!(feed.changed.len(), 1, "one channel moved: {feed:?}");
        assert_eq!(feed.cursor, all.cursor + 1);
    }
    // Each call scanned the table once, one way or the other; wait until
    // the follower's backend has reported them.
    let counted = tokio::time::timeout(WAIT_LIMIT, async {
        loop {
            let (seq, idx) = message_scans(&monitor).await;
            if (seq - seq_before) + (idx - idx_before) >= CALLS {
                return (seq, idx);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let (seq, idx) = counted.await.expect("the scans were never counted");
    assert_eq!(
        seq - seq_before,
        0,
        "changes_since scanned the whole messages table ({} index scans)",
        idx - idx_before
    );
}

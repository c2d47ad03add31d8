//! The writer lease on PostgreSQL: the lock modes, timeouts and connections
//! the shared conformance suite cannot state. Every test runs on a fresh
//! database of the test cluster (`HERALD_TEST_DATABASE_URL`). A second
//! `PostgresStorage` on the same database stands for a second node; a raw
//! client (`TestDatabase::raw_client`) stands for "another session" that
//! holds row locks; a second raw client watches `pg_stat_activity`.
//!
//! "Promptly" means well under the statement timeout of the storage under
//! test, so that a renewal that waited for the lock it must not wait for
//! fails the bound by a wide margin.

use herald_storage::MessageLog;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_core::{Candidate, ChannelName, FencingToken, Lease};
use herald_storage::postgres::{PostgresOptions, PostgresStorage};
use herald_storage::testing::{self, candidate, msg, TestDatabase};
use herald_storage::{Acquire, Error, LeaseStore, Storage, TakeoverReason};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};

const LEASE: &str = "writer";
const MINUTE: Duration = Duration::from_secs(60);
/// What "promptly" allows for a renewal that must not wait for anything.
const PROMPT: Duration = Duration::from_millis(500);
/// Longest any wait for a condition in these tests polls before failing.
const WAIT_LIMIT: Duration = Duration::from_secs(15);

fn named(lease_name: &str, node: &str) -> Candidate {
    Candidate {
        lease_name: lease_name.to_owned(),
        ..candidate(node)
    }
}

/// Options for these tests: a writer statement timeout long enough that a
/// blocked fenced write stays blocked while a test looks at it.
fn options() -> PostgresOptions {
    PostgresOptions {
        statement_timeout: Duration::from_secs(20),
        idle_in_transaction_timeout: Duration::from_secs(20),
        renew_statement_timeout: Duration::from_secs(3),
        acquire_lock_timeout: Duration::from_secs(10),
        pool_wait_timeout: Duration::from_secs(20),
        ..PostgresOptions::default()
    }
}

async fn node(url: &str, options: PostgresOptions) -> PostgresStorage {
    PostgresStorage::connect(url, options).await.unwrap()
}

async fn acquire(
    storage: &PostgresStorage,
    c: &Candidate,
    ttl: Duration,
) -> (Lease, TakeoverReason) {
    match storage.acquire(c, ttl).await.unwrap() {
        Acquire::Acquired { lease, reason } => (lease, reason),
        Acquire::Held(info) => panic!("{} expected to acquire, held: {info:?}", c.node_id),
    }
}

fn assert_lost<T: std::fmt::Debug>(result: Result<T, Error>, lease: &Lease) {
    match result {
        Err(Error::LeaseLost { name, token }) => {
            assert_eq!(name, lease.name);
            assert_eq!(token, lease.token);
        }
        other => panic!(
            "expected LeaseLost for token {}, got {other:?}",
            lease.token
        ),
    }
}

/// Opens a transaction on `raw` that locks `channel`'s row FOR UPDATE.
async fn lock_channel(raw: &Client, channel: &str) {
    raw.batch_execute("BEGIN").await.unwrap();
    let locked = raw
        .query(
            "SELECT 1 FROM channels WHERE name = $1 FOR UPDATE",
            &[&channel],
        )
        .await
        .unwrap();
    assert_eq!(locked.len(), 1, "channel {channel} must exist to be locked");
}

/// Opens a transaction on `raw` that locks the lease row FOR UPDATE without
/// changing it.
async fn lock_lease_row(raw: &Client) {
    raw.batch_execute("BEGIN").await.unwrap();
    let locked = raw
        .query(
            "SELECT 1 FROM storage_leases WHERE name = $1 FOR UPDATE",
            &[&LEASE],
        )
        .await
        .unwrap();
    assert_eq!(locked.len(), 1);
}

/// Waits until `n` sessions named `application` wait for a heavyweight
/// lock (a row lock wait shows as a wait for the locker's transaction or
/// for the tuple; an advisory lock wait as `advisory`).
async fn wait_for_lock_waiters(monitor: &Client, application: &str, n: i64) {
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        let waiting: i64 = monitor
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name = $1 \
                 AND wait_event_type = 'Lock'",
                &[&application],
            )
            .await
            .unwrap()
            .get(0);
        if waiting >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} sessions of {application} never waited for a lock ({waiting} did)"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls until the lease has expired on the database clock.
async fn wait_expired(storage: &PostgresStorage) {
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        let info = storage.lease_info(LEASE).await.unwrap().unwrap();
        if info.expires_in_ms <= 0 {
            return;
        }
        assert!(Instant::now() < deadline, "lease never expired: {info:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `expires_at` of the lease as microseconds since the epoch, read by a
/// raw client.
async fn expires_at_us(raw: &Client) -> i64 {
    raw.query_one(
        "SELECT (extract(epoch FROM expires_at) * 1000000)::bigint FROM storage_leases WHERE name = $1",
        &[&LEASE],
    )
    .await
    .unwrap()
    .get(0)
}

/// `(channel, offset, token)` of every message, in id (commit) order.
async fn stored_messages(raw: &Client) -> Vec<(String, i64, i64)> {
    raw.query(
        "SELECT channel, \"offset\", token FROM messages ORDER BY id",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

/// A TCP proxy to the test server that can turn the connections open so
/// far into black holes (nothing forwarded in either direction, no close
/// passed on), as a network partition or a frozen server would. Connections
/// opened later pass normally.
struct Proxy {
    addr: SocketAddr,
    frozen_flags: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let frozen_flags: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (flags, pumps) = (Arc::clone(&frozen_flags), Arc::clone(&tasks));
        let accept = tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let Ok(up) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let frozen = Arc::new(AtomicBool::new(false));
                flags.lock().unwrap().push(Arc::clone(&frozen));
                let (down_read, down_write) = down.into_split();
                let (up_read, up_write) = up.into_split();
                let mut pumps = pumps.lock().unwrap();
                pumps.push(tokio::spawn(pump(down_read, up_write, Arc::clone(&frozen))));
                pumps.push(tokio::spawn(pump(up_read, down_write, frozen)));
            }
        });
        tasks.lock().unwrap().push(accept);
        Proxy {
            addr,
            frozen_flags,
            tasks,
        }
    }

    /// Black-holes every connection opened so far.
    fn freeze_existing(&self) {
        for flag in self.frozen_flags.lock().unwrap().iter() {
            flag.store(true, Ordering::SeqCst);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, frozen: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let read = from.read(&mut buf).await;
        if frozen.load(Ordering::SeqCst) {
            // Swallow this and everything after, including a close.
            std::future::pending::<()>().await;
        }
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}

/// Design test 1: a renewal completes promptly while a fenced write holds
/// the lease row (FOR KEY SHARE) and waits on a channel row lock held by
/// another session.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renewal_is_prompt_while_a_fenced_write_waits_on_a_channel_lock() {
    let db = TestDatabase::create().await;
    let storage = node(db.url(), options()).await;
    let (lease, _) = acquire(&storage, &candidate("node-a"), MINUTE).await;
    storage.append(&lease, &[msg("busy", "1")]).await.unwrap();
    // Opens the renewal connection: the bound below is about locks.
    storage.renew(&lease, MINUTE).await.unwrap();
    let raw = db.raw_client().await;
    let monitor = db.raw_client().await;

    lock_channel(&raw, "busy").await;
    let writer = {
        let (storage, lease) = (storage.clone(), lease.clone());
        tokio::spawn(async move { storage.append(&lease, &[msg("busy", "2")]).await })
    };
    wait_for_lock_waiters(&monitor, "herald", 1).await;
    let before = expires_at_us(&monitor).await;

    let started = Instant::now();
    let renewed = storage.renew(&lease, MINUTE).await;
    let took = started.elapsed();
    assert!(
        renewed.is_ok(),
        "renewal failed after {took:?}: {renewed:?}"
    );
    assert!(
        took < PROMPT,
        "renewal took {took:?} behind a fenced write, bound {PROMPT:?}"
    );
    assert!(
        expires_at_us(&monitor).await > before,
        "the lease was not extended"
    );
    assert!(
        !writer.is_finished(),
        "the fenced write should still be waiting"
    );

    raw.batch_execute("COMMIT").await.unwrap();
    let out = writer.await.unwrap().unwrap();
    assert_eq!(out[0].offset, 2);
}

/// Design test 2: a renewal completes promptly while every pool connection
/// is taken by fenced writes queued on locks (one on the channel row lock,
/// the others on the lease's advisory lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renewal_is_prompt_while_writers_hold_every_pool_connection() {
    const POOL: usize = 4;
    let db = TestDatabase::create().await;
    let storage = node(
        db.url(),
        PostgresOptions {
            pool_size: POOL,
            ..options()
        },
    )
    .await;
    let (lease, _) = acquire(&storage, &candidate("node-a"), MINUTE).await;
    storage.append(&lease, &[msg("busy", "0")]).await.unwrap();
    storage.renew(&lease, MINUTE).await.unwrap();
    let raw = db.raw_client().await;
    let monitor = db.raw_client().await;

    lock_channel(&raw, "busy").await;
    let writers: Vec<_> = (0..POOL)
        .map(|i| {
            let (storage, lease) = (storage.clone(), lease.clone());
            tokio::spawn(
                async move { storage.append(&lease, &[msg("busy", &i.to_string())]).await },
            )
        })
        .collect();
    wait_for_lock_waiters(&monitor, "herald", POOL as i64).await;
    // The premise: the pool has no connection left.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), storage.ping())
            .await
            .is_err(),
        "the pool still had a free connection"
    );

    let started = Instant::now();
    let renewed =
        tokio::time::timeout(Duration::from_secs(10), storage.renew(&lease, MINUTE)).await;
    let took = started.elapsed();
    assert!(
        matches!(renewed, Ok(Ok(()))),
        "renewal failed after {took:?}: {renewed:?}"
    );
    assert!(
        took < PROMPT,
        "renewal took {took:?} with the pool full, bound {PROMPT:?}"
    );

    raw.batch_execute("COMMIT").await.unwrap();
    let mut offsets = Vec::new();
    for writer in writers {
        offsets.push(writer.await.unwrap().unwrap()[0].offset);
    }
    offsets.sort_unstable();
    assert_eq!(offsets, (2..=POOL as u64 + 1).collect::<Vec<_>>());
}

/// Design test 3, the server answers: a renewal blocked on the lease row
/// (another session holds it FOR UPDATE) settles with an error within the
/// renewal statement timeout + 1 s + slack, and a later attempt succeeds
/// once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renewal_blocked_on_the_lease_row_settles_in_time() {
    let renew_timeout = Duration::from_millis(500);
    let bound = renew_timeout + Duration::from_secs(1) + Duration::from_millis(300);
    let db = TestDatabase::create().await;
    let storage = node(
        db.url(),
        PostgresOptions {
            renew_statement_timeout: renew_timeout,
            ..options()
        },
    )
    .await;
    let (lease, _) = acquire(&storage, &candidate("node-a"), MINUTE).await;
    let raw = db.raw_client().await;

    lock_lease_row(&raw).await;
    let started = Instant::now();
    let blocked = storage.renew(&lease, MINUTE).await;
    let took = started.elapsed();
    assert!(
        matches!(blocked, Err(Error::Unavailable { .. })),
        "expected Unavailable, got {blocked:?} after {took:?}"
    );
    assert!(took >= renew_timeout, "settled before it waited: {took:?}");
    assert!(took < bound, "renewal took {took:?}, bound {bound:?}");

    raw.batch_execute("COMMIT").await.unwrap();
    let started = Instant::now();
    storage.renew(&lease, MINUTE).await.unwrap();
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
}

/// Design test 3, the answer never comes: a renewal blocked on the lease
/// row whose connection then goes silent (the server's statement-timeout
/// error is lost, as in a partition) is abandoned by the client within the
/// renewal statement timeout + 1 s + slack; once the lock is gone the next
/// attempt succeeds at once on a fresh connection, not blocked by the hung
/// one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_renewal_is_abandoned_and_the_next_attempt_uses_a_fresh_connection() {
    let renew_timeout = Duration::from_millis(500);
    let bound = renew_timeout + Duration::from_secs(1) + Duration::from_millis(300);
    let db = TestDatabase::create().await;
    let direct = node(db.url(), options()).await;
    let (lease, _) = acquire(&direct, &candidate("node-a"), MINUTE).await;
    let proxy = Proxy::start(db.server_addr()).await;
    let proxied = node(
        &db.url_via(proxy.addr),
        PostgresOptions {
            renew_statement_timeout: renew_timeout,
            ..options()
        },
    )
    .await;
    proxied.renew(&lease, MINUTE).await.unwrap();
    let raw = db.raw_client().await;
    let monitor = db.raw_client().await;

    lock_lease_row(&raw).await;
    let started = Instant::now();
    let attempt = {
        let (proxied, lease) = (proxied.clone(), lease.clone());
        tokio::spawn(async move { proxied.renew(&lease, MINUTE).await })
    };
    wait_for_lock_waiters(&monitor, "herald-renewal", 1).await;
    proxy.freeze_existing();

    let settled = tokio::time::timeout(Duration::from_secs(10), attempt).await;
    let took = started.elapsed();
    let Ok(settled) = settled else {
        panic!("renewal took over {took:?} without settling, bound {bound:?}");
    };
    let settled = settled.unwrap();
    assert!(
        matches!(settled, Err(Error::Unavailable { .. })),
        "expected Unavailable, got {settled:?} after {took:?}"
    );
    assert!(
        took >= renew_timeout + Duration::from_secs(1) - Duration::from_millis(50),
        "settled at {took:?}, before the client-side limit: the answer was not lost"
    );
    assert!(took < bound, "renewal took {took:?}, bound {bound:?}");

    raw.batch_execute("COMMIT").await.unwrap();
    let started = Instant::now();
    let next = tokio::time::timeout(Duration::from_secs(10), proxied.renew(&lease, MINUTE)).await;
    let took = started.elapsed();
    assert!(matches!(next, Ok(Ok(()))), "{next:?} after {took:?}");
    assert!(
        took < PROMPT,
        "the next renewal took {took:?}, bound {PROMPT:?}"
    );
}

/// Design test 4: takeover safety. Node A's fenced write is in flight
/// (blocked on a channel row lock) when A's lease expires; node B's acquire
/// waits for that write to end; the write, whose lease expired while it
/// waited, is refused by its last fencing check and commits nothing; B then
/// acquires with token + 1; A's next fenced write fails as lease lost; and
/// every stored message carries the token that held the lease when it
/// committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn takeover_waits_for_the_fenced_write_in_flight() {
    let db = TestDatabase::create().await;
    let a = node(db.url(), options()).await;
    let b = node(db.url(), options()).await;
    let raw = db.raw_client().await;
    let monitor = db.raw_client().await;

    let (old, _) = acquire(&a, &candidate("node-a"), Duration::from_secs(1)).await;
    a.append(&old, &[msg("log", "1")]).await.unwrap();
    lock_channel(&raw, "log").await;
    let in_flight = {
        let (a, old) = (a.clone(), old.clone());
        tokio::spawn(async move { a.append(&old, &[msg("log", "2")]).await })
    };
    wait_for_lock_waiters(&monitor, "herald", 1).await;
    wait_expired(&b).await;

    // Right after B's acquire returns, B's task looks at what is committed.
    let observer = db.raw_client().await;
    let takeover = {
        let b = b.clone();
        tokio::spawn(async move {
            let out = b.acquire(&candidate("node-b"), MINUTE).await;
            (out, stored_messages(&observer).await)
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !takeover.is_finished(),
        "B's acquire returned while A's fenced write was still in flight: {:?}",
        takeover.await.unwrap().0
    );
    assert!(!in_flight.is_finished());

    raw.batch_execute("COMMIT").await.unwrap();
    // Its lease expired while it waited: refused before COMMIT.
    assert_lost(in_flight.await.unwrap(), &old);
    let (taken, committed_before_takeover) = takeover.await.unwrap();
    let (new, reason) = match taken.unwrap() {
        Acquire::Acquired { lease, reason } => (lease, reason),
        Acquire::Held(info) => panic!("B should take over the expired lease: {info:?}"),
    };
    assert_eq!(reason, TakeoverReason::Expired);
    assert_eq!(new.token, FencingToken(old.token.0 + 1));
    let t_old = old.token.0 as i64;
    assert_eq!(
        committed_before_takeover,
        [("log".to_owned(), 1, t_old)],
        "the refused write left a message behind"
    );

    assert_lost(a.append(&old, &[msg("log", "\"late\"")]).await, &old);
    let appended = b.append(&new, &[msg("log", "3")]).await.unwrap();
    assert_eq!(appended[0].offset, 2, "the refused write used no offset");

    let t_new = new.token.0 as i64;
    assert_eq!(
        stored_messages(&monitor).await,
        [("log", 1, t_old), ("log", 2, t_new)].map(|(c, o, t)| (c.to_owned(), o, t))
    );
}

/// Design test 5: a renewal never extends an expired lease, also after a
/// lock wait that outlasted the expiry: another session holds the lease row
/// FOR UPDATE past the expiry without changing it, then commits; the
/// renewal that waited is lease lost and `expires_at` is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renewal_after_a_lock_wait_past_expiry_is_lost() {
    let db = TestDatabase::create().await;
    let storage = node(
        db.url(),
        PostgresOptions {
            renew_statement_timeout: Duration::from_secs(10),
            ..options()
        },
    )
    .await;
    let (lease, _) = acquire(&storage, &candidate("node-a"), Duration::from_secs(1)).await;
    let raw = db.raw_client().await;
    let monitor = db.raw_client().await;

    lock_lease_row(&raw).await;
    let left = storage
        .lease_info(LEASE)
        .await
        .unwrap()
        .unwrap()
        .expires_in_ms;
    assert!(
        left > 300,
        "the renewal must start well before expiry ({left} ms left)"
    );
    let renewal = {
        let (storage, lease) = (storage.clone(), lease.clone());
        tokio::spawn(async move { storage.renew(&lease, MINUTE).await })
    };
    wait_for_lock_waiters(&monitor, "herald-renewal", 1).await;
    let before = expires_at_us(&monitor).await;
    wait_expired(&storage).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    raw.batch_execute("COMMIT").await.unwrap();

    let result = renewal.await.unwrap();
    let after = expires_at_us(&monitor).await;
    assert_eq!(
        after, before,
        "a renewal extended an expired lease: {result:?}"
    );
    assert_lost(result, &lease);
    let info = storage.lease_info(LEASE).await.unwrap().unwrap();
    assert!(info.expires_in_ms <= 0, "{info:?}");
}

/// Two nodes acquiring at the same instant elect exactly one holder, both
/// on a lease row that does not exist yet and on a released one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn simultaneous_acquires_elect_exactly_one_holder() {
    const ROUNDS: usize = 20;
    let db = TestDatabase::create().await;
    let nodes = [
        node(db.url(), options()).await,
        node(db.url(), options()).await,
    ];

    let race = |lease_name: String| {
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let tasks: Vec<_> = nodes
            .iter()
            .enumerate()
            .map(|(i, storage)| {
                let (storage, barrier) = (storage.clone(), Arc::clone(&barrier));
                let c = named(&lease_name, &format!("node-{i}"));
                tokio::spawn(async move {
                    barrier.wait().await;
                    storage.acquire(&c, MINUTE).await.unwrap()
                })
            })
            .collect();
        async move {
            let mut won = Vec::new();
            for task in tasks {
                if let Acquire::Acquired { lease, reason } = task.await.unwrap() {
                    won.push((lease, reason));
                }
            }
            assert_eq!(won.len(), 1, "lease {lease_name}: {won:?}");
            won.pop().unwrap()
        }
    };

    for round in 0..ROUNDS {
        let name = format!("fresh-{round}");
        let (lease, reason) = race(name.clone()).await;
        assert_eq!(reason, TakeoverReason::Fresh);
        assert_eq!(lease.token, FencingToken(1));
        let info = nodes[0].lease_info(&name).await.unwrap().unwrap();
        assert_eq!(info.holder.as_deref(), Some(lease.holder.as_str()));
    }
    let mut last = 0;
    for round in 0..ROUNDS {
        let (lease, reason) = race(LEASE.to_owned()).await;
        let expected = if round == 0 {
            TakeoverReason::Fresh
        } else {
            TakeoverReason::Released
        };
        assert_eq!(reason, expected, "round {round}");
        assert_eq!(lease.token, FencingToken(last + 1), "round {round}");
        last = lease.token.0;
        let winner = nodes
            .iter()
            .zip(["node-0", "node-1"])
            .find(|(_, id)| *id == lease.holder)
            .map(|(n, _)| n)
            .unwrap();
        winner.release(&lease).await.unwrap();
    }
}

/// The fencing token grows by exactly one on every acquisition, over
/// acquire, release and expiry rounds of two nodes (the same node
/// re-acquiring included), and never otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fencing_token_only_grows_over_acquire_release_and_expiry() {
    let db = TestDatabase::create().await;
    let nodes = [
        node(db.url(), options()).await,
        node(db.url(), options()).await,
    ];
    let short = Duration::from_millis(150);
    // (node, how the round ends)
    let rounds = [
        (0, "release"),
        (0, "expire"),
        (1, "expire"),
        (1, "release"),
        (0, "release"),
        (1, "expire"),
        (0, "expire"),
        (0, "release"),
    ];
    let mut last = 0;
    let mut ended_by = None;
    for (round, &(i, end)) in rounds.iter().enumerate() {
        let c = candidate(&format!("node-{i}"));
        let (lease, reason) = acquire(&nodes[i], &c, short).await;
        let expected = match ended_by {
            None => TakeoverReason::Fresh,
            Some("release") => TakeoverReason::Released,
            Some(_) => TakeoverReason::Expired,
        };
        assert_eq!(reason, expected, "round {round}");
        assert_eq!(lease.token, FencingToken(last + 1), "round {round}");
        last = lease.token.0;

        let other = 1 - i;
        match nodes[other]
            .acquire(&candidate(&format!("node-{other}")), short)
            .await
            .unwrap()
        {
            Acquire::Held(info) => assert_eq!(info.token, lease.token, "round {round}"),
            acquired => panic!("round {round}: the lease was free: {acquired:?}"),
        }
        if end == "release" {
            nodes[i].release(&lease).await.unwrap();
        } else {
            wait_expired(&nodes[i]).await;
        }
        let info = nodes[other].lease_info(LEASE).await.unwrap().unwrap();
        assert_eq!(
            info.token, lease.token,
            "round {round}: ending changed the token"
        );
        ended_by = Some(end);
    }
}

/// Several nodes connecting to a new database at the same time migrate it
/// exactly once; connecting again later applies nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_run_once_when_nodes_connect_at_once() {
    const NODES: usize = 8;
    let db = TestDatabase::create().await;
    let url: Arc<str> = Arc::from(db.url());
    let barrier = Arc::new(tokio::sync::Barrier::new(NODES));
    let connects: Vec<_> = (0..NODES)
        .map(|_| {
            let (url, barrier) = (Arc::clone(&url), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                PostgresStorage::connect(&url, PostgresOptions::default()).await
            })
        })
        .collect();
    let mut nodes = Vec::new();
    for connect in connects {
        nodes.push(connect.await.unwrap().expect("concurrent connect"));
    }
    let again = node(db.url(), PostgresOptions::default()).await;

    let raw = db.raw_client().await;
    let versions: Vec<i32> = raw
        .query(
            "SELECT version FROM refinery_schema_history ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // Each migration once (2: the idempotency digest; 3: retention;
    // 4: channel epochs; 5: presence; 6: message tags; 7: channel deletions and node reports;
    // 8: the nodes' channels; 9: the epoch seed; 10: recorded takeovers;
    // 11: streams; 12: the takeover timeline and the console's node
    // report columns; 13: stream producers' last append; 14: who released a
    // lease).
    assert_eq!(versions, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
    let (lease, _) = acquire(&nodes[3], &candidate("node-3"), MINUTE).await;
    nodes[5].append(&lease, &[msg("m", "1")]).await.unwrap();
    assert_eq!(
        again
            .read(&ChannelName::new("m").unwrap(), 0, 10)
            .await
            .unwrap()
            .head,
        1
    );
}

/// An acquire that cannot get the lease row within its lock timeout fails
/// as unavailable (SQLSTATE 55P03), and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acquire_gives_up_after_its_lock_timeout() {
    let lock_timeout = Duration::from_millis(300);
    let db = TestDatabase::create().await;
    let a = node(db.url(), options()).await;
    let b = node(
        db.url(),
        PostgresOptions {
            acquire_lock_timeout: lock_timeout,
            ..options()
        },
    )
    .await;
    let (lease, _) = acquire(&a, &candidate("node-a"), Duration::from_millis(100)).await;
    wait_expired(&a).await;
    let raw = db.raw_client().await;

    lock_lease_row(&raw).await;
    let started = Instant::now();
    let result = b.acquire(&candidate("node-b"), MINUTE).await;
    let took = started.elapsed();
    match &result {
        Err(Error::Unavailable { message, .. }) => assert!(message.contains("55P03"), "{message}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(
        took >= lock_timeout && took < lock_timeout + PROMPT,
        "{took:?}"
    );

    raw.batch_execute("COMMIT").await.unwrap();
    let (new, reason) = acquire(&b, &candidate("node-b"), MINUTE).await;
    assert_eq!(reason, TakeoverReason::Expired);
    assert_eq!(new.token, FencingToken(lease.token.0 + 1));
}

/// A continuous stream of fenced writes by the old holder does not keep a
/// takeover out for long: once the lease expires the holder's writes fail,
/// the next acquire gets the row, and no write with the old token commits
/// after the first write with the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn takeover_gets_in_under_a_continuous_stream_of_fenced_writes() {
    const WRITERS: usize = 4;
    let ttl = Duration::from_secs(1);
    let db = TestDatabase::create().await;
    let a = node(db.url(), options()).await;
    let b = node(
        db.url(),
        PostgresOptions {
            acquire_lock_timeout: Duration::from_millis(200),
            ..options()
        },
    )
    .await;
    let (old, _) = acquire(&a, &candidate("node-a"), ttl).await;
    let started = Instant::now();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (a, old) = (a.clone(), old.clone());
            tokio::spawn(async move {
                let mut committed = 0u32;
                loop {
                    match a.append(&old, &[msg("stream", &w.to_string())]).await {
                        Ok(_) => committed += 1,
                        Err(Error::LeaseLost { .. }) => return committed,
                        Err(e) => panic!("writer {w}: {e}"),
                    }
                }
            })
        })
        .collect();

    let new = loop {
        match b.acquire(&candidate("node-b"), MINUTE).await {
            Ok(Acquire::Acquired { lease, .. }) => break lease,
            Ok(Acquire::Held(_)) | Err(Error::Unavailable { .. }) => {}
            Err(e) => panic!("acquire: {e}"),
        }
        assert!(
            started.elapsed() < ttl + Duration::from_secs(5),
            "no takeover {:?} after the stream started",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    b.append(&new, &[msg("stream", "\"new\"")]).await.unwrap();
    let mut committed = 0;
    for writer in writers {
        committed += writer.await.unwrap();
    }
    assert!(committed > 0, "the stream wrote nothing");

    let raw = db.raw_client().await;
    let tokens: Vec<i64> = stored_messages(&raw)
        .await
        .into_iter()
        .map(|m| m.2)
        .collect();
    let first_new = tokens
        .iter()
        .position(|&t| t == new.token.0 as i64)
        .expect("the new holder's write");
    assert!(
        tokens[..first_new].iter().all(|&t| t == old.token.0 as i64)
            && tokens[first_new..].iter().all(|&t| t == new.token.0 as i64),
        "tokens out of commit order: {tokens:?}"
    );
}

/// A writer frozen in the middle of its transaction (its connection goes
/// silent) does not block a takeover forever: the server's statement and
/// idle-in-transaction timeouts end its session and free the lease row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_writer_does_not_block_a_takeover_forever() {
    let db = TestDatabase::create().await;
    let proxy = Proxy::start(db.server_addr()).await;
    let a = node(
        &db.url_via(proxy.addr),
        PostgresOptions {
            statement_timeout: Duration::from_millis(500),
            idle_in_transaction_timeout: Duration::from_millis(500),
            ..options()
        },
    )
    .await;
    let b = node(db.url(), options()).await;
    let (old, _) = acquire(&a, &candidate("node-a"), Duration::from_secs(1)).await;
    a.append(&old, &[msg("f", "1")]).await.unwrap();
    let raw = db.raw_client().await;
    let monitor = db.raw_client().await;

    lock_channel(&raw, "f").await;
    let frozen_write = {
        let (a, old) = (a.clone(), old.clone());
        tokio::spawn(async move { a.append(&old, &[msg("f", "2")]).await })
    };
    wait_for_lock_waiters(&monitor, "herald", 1).await;
    proxy.freeze_existing();
    raw.batch_execute("COMMIT").await.unwrap();
    wait_expired(&b).await;

    let started = Instant::now();
    let new = loop {
        match b.acquire(&candidate("node-b"), MINUTE).await {
            Ok(Acquire::Acquired { lease, .. }) => break lease,
            Ok(Acquire::Held(info)) => panic!("the lease expired, yet: {info:?}"),
            Err(Error::Unavailable { .. }) => {}
            Err(e) => panic!("acquire: {e}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "takeover blocked"
        );
    };
    assert_eq!(new.token, FencingToken(old.token.0 + 1));
    frozen_write.abort();
    let stored = stored_messages(&monitor).await;
    assert_eq!(stored, [("f".to_owned(), 1, old.token.0 as i64)]);
}

/// Every kind of connection runs with the session settings of the options.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_have_their_session_settings() {
    let db = TestDatabase::create().await;
    let storage = node(
        db.url(),
        PostgresOptions {
            statement_timeout: Duration::from_millis(4_000),
            idle_in_transaction_timeout: Duration::from_millis(3_000),
            renew_statement_timeout: Duration::from_millis(2_000),
            client_connection_check_interval: Duration::from_millis(700),
            ..PostgresOptions::default()
        },
    )
    .await;
    let settings = storage.session_settings().await.unwrap();
    assert_eq!(settings.pool.statement_timeout, "4s");
    assert_eq!(settings.pool.idle_in_transaction_session_timeout, "3s");
    assert_eq!(settings.pool.application_name, "herald");
    assert_eq!(settings.renewal.statement_timeout, "2s");
    assert_eq!(settings.renewal.idle_in_transaction_session_timeout, "3s");
    assert_eq!(settings.renewal.client_connection_check_interval, "700ms");
    assert_eq!(settings.renewal.application_name, "herald-renewal");
}

/// The schema keeps the renewal's columns out of every unique index (so a
/// renewal locks FOR NO KEY UPDATE and never waits for a fenced write),
/// stores message data as text, and compares names by their bytes.
#[tokio::test]
async fn schema_keeps_renewal_columns_out_of_unique_indexes() {
    let db = TestDatabase::create().await;
    let _storage = node(db.url(), PostgresOptions::default()).await;
    let raw = db.raw_client().await;
    let keyed: Vec<String> = raw
        .query(
            "SELECT a.attname::text FROM pg_index i \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
             WHERE i.indrelid = 'storage_leases'::regclass AND i.indisunique ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(keyed, ["name"]);
    let columns: Vec<(String, String, Option<String>)> = raw
        .query(
            "SELECT table_name::text || '.' || column_name::text, data_type::text, \
             collation_name::text FROM information_schema.columns \
             WHERE (table_name, column_name) IN (('storage_leases', 'name'), \
             ('channels', 'name'), ('messages', 'channel'), ('messages', 'data')) ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let want = [
        ("channels.name", "text", Some("C")),
        ("messages.channel", "text", Some("C")),
        ("messages.data", "text", None),
        ("storage_leases.name", "text", Some("C")),
    ]
    .map(|(c, t, k)| (c.to_owned(), t.to_owned(), k.map(str::to_owned)));
    assert_eq!(columns, want);
}

/// A server that cannot be reached is unavailable, within the connect
/// timeout.
#[tokio::test]
async fn unreachable_server_is_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let started = Instant::now();
    let result = PostgresStorage::connect(
        &format!("postgres://herald:secret-password@127.0.0.1:{port}/x"),
        PostgresOptions {
            connect_timeout: Duration::from_secs(2),
            ..PostgresOptions::default()
        },
    )
    .await;
    match result {
        Err(Error::Unavailable { message, .. }) => {
            assert!(!message.contains("secret-password"), "{message}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(4));
}

/// The backend pid of the liveness session that holds `storage`'s session
/// lock, if one holds it now (an advisory lock on one `bigint` key shows
/// in `pg_locks` as `classid` = high 32 bits, `objid` = low 32 bits,
/// `objsubid` = 1).
async fn liveness_holder(monitor: &Client, storage: &PostgresStorage) -> Option<i32> {
    key_holder(monitor, storage.session_key()).await
}

/// The backend pid of the liveness session that holds `storage`'s twin
/// session lock (its second liveness connection), if one holds it now.
async fn twin_holder(monitor: &Client, storage: &PostgresStorage) -> Option<i32> {
    key_holder(monitor, storage.twin_session_key()).await
}

/// The backend pid of the `herald-liveness` session that holds the
/// advisory lock of `key`, if one holds it now.
async fn key_holder(monitor: &Client, key: i64) -> Option<i32> {
    let key = key as u64;
    let (high, low) = ((key >> 32) as i64, (key & 0xffff_ffff) as i64);
    monitor
        .query_opt(
            "SELECT l.pid FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
             AND l.classid::bigint = $1 AND l.objid::bigint = $2 \
             AND a.application_name = 'herald-liveness' \
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&high, &low],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

/// Backend pids of this database's sessions named `application`.
async fn backends(monitor: &Client, application: &str) -> Vec<i32> {
    monitor
        .query(
            "SELECT pid FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = $1",
            &[&application],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Asserts that `standby`'s acquire answers `Held` by `holder`, several
/// times over `span`.
async fn assert_held_for(standby: &PostgresStorage, holder: &str, span: Duration) {
    let until = Instant::now() + span;
    loop {
        match standby
            .acquire(&candidate("standby"), MINUTE)
            .await
            .unwrap()
        {
            Acquire::Held(info) => assert_eq!(info.holder.as_deref(), Some(holder)),
            other => panic!("a live holder must be Held, got {other:?}"),
        }
        if Instant::now() >= until {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A live holder is never found gone: its liveness session holds its key,
/// the lease records that key, and a standby's acquire answers `Held`
/// again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_live_holder_is_never_found_gone() {
    let db = TestDatabase::create().await;
    let holder = node(db.url(), options()).await;
    let standby = node(db.url(), options()).await;
    let monitor = db.raw_client().await;
    assert_ne!(holder.session_key(), standby.session_key());
    assert!(liveness_holder(&monitor, &holder).await.is_some());
    assert!(liveness_holder(&monitor, &standby).await.is_some());

    let (lease, _) = acquire(&holder, &candidate("holder"), MINUTE).await;
    let recorded: Option<String> = monitor
        .query_one(
            "SELECT holder_session FROM storage_leases WHERE name = $1",
            &[&LEASE],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded, Some(holder.session_key().to_string()));
    assert_held_for(&standby, "holder", Duration::from_secs(2)).await;
    // The probe's transaction-level lock went with its transaction.
    assert!(liveness_holder(&monitor, &holder).await.is_some());
    holder.renew(&lease, MINUTE).await.unwrap();
    holder.append(&lease, &[msg("c", "1")]).await.unwrap();
}

/// A renewal connection that dies (here: its backend is terminated) does
/// not make its live holder look gone: the standby still gets `Held`, and
/// the holder renews again on a fresh connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_renewal_connection_does_not_make_the_holder_look_gone() {
    let db = TestDatabase::create().await;
    let holder = node(db.url(), options()).await;
    let standby = node(db.url(), options()).await;
    let monitor = db.raw_client().await;
    let (lease, _) = acquire(&holder, &candidate("holder"), MINUTE).await;
    holder.renew(&lease, MINUTE).await.unwrap();
    let renewal = backends(&monitor, "herald-renewal").await;
    assert_eq!(renewal.len(), 1, "{renewal:?}");
    let terminated: bool = monitor
        .query_one("SELECT pg_terminate_backend($1)", &[&renewal[0]])
        .await
        .unwrap()
        .get(0);
    assert!(terminated);

    assert_held_for(&standby, "holder", Duration::from_secs(2)).await;
    // The first attempt may find its connection closed; a later one opens
    // a fresh connection and succeeds.
    let deadline = Instant::now() + WAIT_LIMIT;
    while let Err(e) = holder.renew(&lease, MINUTE).await {
        assert!(Instant::now() < deadline, "renewal never recovered: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_held_for(&standby, "holder", Duration::from_millis(500)).await;
}

/// A live holder whose liveness connection is ended reconnects and takes
/// its session key again (on a new backend); the standby then gets `Held`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_liveness_connection_takes_its_key_again() {
    let db = TestDatabase::create().await;
    let holder = node(db.url(), options()).await;
    let standby = node(db.url(), options()).await;
    let monitor = db.raw_client().await;
    let (lease, _) = acquire(&holder, &candidate("holder"), MINUTE).await;
    let first = liveness_holder(&monitor, &holder).await.expect("key held");
    monitor
        .execute("SELECT pg_terminate_backend($1)", &[&first])
        .await
        .unwrap();

    let deadline = Instant::now() + WAIT_LIMIT;
    let second = loop {
        match liveness_holder(&monitor, &holder).await {
            Some(pid) if pid != first => break pid,
            _ => {
                assert!(Instant::now() < deadline, "the key was never taken again");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_ne!(first, second);
    assert_held_for(&standby, "holder", Duration::from_secs(1)).await;
    holder.renew(&lease, MINUTE).await.unwrap();
}

/// One of a live holder's two liveness sessions ended on its own (a DBA's
/// `pg_terminate_backend`): no standby finds the holder gone, neither its
/// acquire nor its takeover watch, and the holder takes the lock back on
/// a new session. Only when both sessions end does a standby take over,
/// at once, with `HolderGone`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_ended_liveness_session_is_not_a_takeover() {
    let db = TestDatabase::create().await;
    let holder = node(db.url(), options()).await;
    let standby = Arc::new(node(db.url(), options()).await);
    let monitor = db.raw_client().await;
    let (lease, _) = acquire(&holder, &candidate("holder"), MINUTE).await;
    let info = match standby
        .acquire(&candidate("standby"), MINUTE)
        .await
        .unwrap()
    {
        Acquire::Held(info) => info,
        other => panic!("a live holder must be Held, got {other:?}"),
    };
    // The standby's takeover watch waits on the holder's locks.
    let watching = Arc::clone(&standby);
    let held = info.clone();
    let mut hint = tokio::spawn(async move { watching.takeover_hint(&held).await });

    let first = liveness_holder(&monitor, &holder).await.expect("key held");
    monitor
        .execute("SELECT pg_terminate_backend($1, 5000)", &[&first])
        .await
        .unwrap();
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        match liveness_holder(&monitor, &holder).await {
            Some(pid) if pid != first => break,
            _ => {
                assert!(Instant::now() < deadline, "the key was never taken again");
                // Meanwhile the twin keeps the holder alive.
                match standby
                    .acquire(&candidate("standby"), MINUTE)
                    .await
                    .unwrap()
                {
                    Acquire::Held(info) => assert_eq!(info.holder.as_deref(), Some("holder")),
                    other => panic!("one ended session made a takeover: {other:?}"),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert_held_for(&standby, "holder", Duration::from_millis(500)).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut hint)
            .await
            .is_err(),
        "the takeover hint fired while the holder lived"
    );
    holder.renew(&lease, MINUTE).await.unwrap();

    // Both sessions end (as when the process dies): a takeover at once.
    let sessions = [
        liveness_holder(&monitor, &holder).await.expect("key held"),
        twin_holder(&monitor, &holder).await.expect("twin held"),
    ];
    for pid in sessions {
        monitor
            .execute("SELECT pg_terminate_backend($1, 5000)", &[&pid])
            .await
            .unwrap();
    }
    within_limit(&mut hint).await;
    match standby
        .acquire(&candidate("standby"), MINUTE)
        .await
        .unwrap()
    {
        Acquire::Acquired { reason, .. } => assert_eq!(reason, TakeoverReason::HolderGone),
        // The holder may have taken a lock back in between: it lives.
        Acquire::Held(info) => {
            assert_eq!(info.holder.as_deref(), Some("holder"));
            assert!(
                liveness_holder(&monitor, &holder).await.is_some()
                    || twin_holder(&monitor, &holder).await.is_some(),
                "held, but both of the holder's sessions are gone"
            );
        }
    }
}

/// Waits for `hint` to resolve within [`WAIT_LIMIT`].
async fn within_limit(hint: &mut tokio::task::JoinHandle<()>) {
    tokio::time::timeout(WAIT_LIMIT, hint)
        .await
        .expect("the takeover hint fired")
        .unwrap();
}

/// A holder whose storage is dropped is found gone at once: the standby
/// takes over with `HolderGone` long before the 60 s lease expires, and
/// the old lease's writes are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_holder_is_taken_over_at_once() {
    let db = TestDatabase::create().await;
    let holder = node(db.url(), options()).await;
    let standby = node(db.url(), options()).await;
    let (old, _) = acquire(&holder, &candidate("holder"), MINUTE).await;
    holder.append(&old, &[msg("c", "1")]).await.unwrap();
    drop(holder);

    let started = Instant::now();
    let (new, reason) = loop {
        match standby
            .acquire(&candidate("standby"), MINUTE)
            .await
            .unwrap()
        {
            Acquire::Acquired { lease, reason } => break (lease, reason),
            Acquire::Held(info) => {
                assert!(started.elapsed() < Duration::from_secs(5), "{info:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(reason, TakeoverReason::HolderGone);
    assert_eq!(new.token, FencingToken(old.token.0 + 1));
    let other = node(db.url(), options()).await;
    assert_lost(other.append(&old, &[msg("c", "2")]).await, &old);
    standby.append(&new, &[msg("c", "3")]).await.unwrap();
}

/// A node acquires only while its liveness session holds its key. With its
/// liveness connection ended and unable to come back (the database takes
/// no new connections), acquire fails with `Unavailable` and leaves the
/// lease alone, instead of taking a lease that any standby would find
/// "holder gone" at once; once the key is taken again, acquire succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_acquire_without_the_liveness_lock() {
    let db = TestDatabase::create().await;
    let storage = node(db.url(), options()).await;
    let monitor = db.raw_client().await;
    // A database cannot refuse connections to itself: ask from another.
    let (admin, connection) = tokio_postgres::connect(&testing::cluster_url(), NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let allow = |on: bool| format!("ALTER DATABASE {} ALLOW_CONNECTIONS {on}", db.name());
    admin.batch_execute(&allow(false)).await.unwrap();
    let first = liveness_holder(&monitor, &storage).await.expect("key held");
    let twin = twin_holder(&monitor, &storage).await.expect("twin held");
    for pid in [first, twin] {
        monitor
            .execute("SELECT pg_terminate_backend($1, 5000)", &[&pid])
            .await
            .unwrap();
    }
    assert_eq!(liveness_holder(&monitor, &storage).await, None);
    assert_eq!(twin_holder(&monitor, &storage).await, None);

    match storage.acquire(&candidate("a"), MINUTE).await {
        Err(Error::Unavailable { message, .. }) => {
            assert!(message.contains("liveness"), "{message}")
        }
        other => panic!("acquired without the liveness lock: {other:?}"),
    }
    assert_eq!(storage.lease_info(LEASE).await.unwrap(), None);

    admin.batch_execute(&allow(true)).await.unwrap();
    let deadline = Instant::now() + WAIT_LIMIT;
    while liveness_holder(&monitor, &storage).await.is_none() {
        assert!(Instant::now() < deadline, "the key was never taken again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    acquire(&storage, &candidate("a"), MINUTE).await;
}

/// A standby's acquire over a live holder takes no lock on the lease row.
/// While a fenced write holds the row `FOR KEY SHARE` (here another
/// session, as a write in flight does), the standby is answered `Held`
/// instead of queueing a `FOR UPDATE` behind it, which would stall every
/// later fenced write and renewal of the holder behind the standby (and,
/// were the standby frozen there, for as long as it stayed frozen).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_declines_a_live_lease_without_locking_its_row() {
    let db = TestDatabase::create().await;
    let holder = node(db.url(), options()).await;
    let standby = node(db.url(), options()).await;
    let (lease, _) = acquire(&holder, &candidate("holder"), MINUTE).await;
    let raw = db.raw_client().await;
    raw.batch_execute(&format!(
        "BEGIN; SELECT 1 FROM storage_leases WHERE name = '{LEASE}' FOR KEY SHARE"
    ))
    .await
    .unwrap();
    match standby.acquire(&candidate("standby"), MINUTE).await {
        Ok(Acquire::Held(info)) => {
            assert_eq!(info.holder.as_deref(), Some("holder"));
            assert_eq!(info.token, lease.token);
        }
        other => panic!("expected Held without a row lock, got {other:?}"),
    }
    raw.batch_execute("ROLLBACK").await.unwrap();
    holder.renew(&lease, MINUTE).await.unwrap();
}

/// A fenced write that passed its first fencing check but then waited on a
/// channel's row lock until after its lease expired is refused: the check
/// is made again, on the database clock, as the decision to commit, so
/// nothing is stored and nothing acknowledged after expiry. A batch that
/// waited without the lease expiring commits, with `published_at` read at
/// that last check (after the wait), not before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fenced_write_that_outlives_its_lease_is_refused() {
    let db = TestDatabase::create().await;
    let storage = node(db.url(), options()).await;
    let raw = db.raw_client().await;
    let monitor = db.raw_client().await;

    // Waits shorter than the lease: committed, stamped after the wait.
    let (lease, _) = acquire(&storage, &candidate("a"), MINUTE).await;
    storage.append(&lease, &[msg("c", "1")]).await.unwrap();
    lock_channel(&raw, "c").await;
    let waiting = {
        let (storage, lease) = (storage.clone(), lease.clone());
        tokio::spawn(async move { storage.append(&lease, &[msg("c", "2")]).await })
    };
    wait_for_lock_waiters(&monitor, "herald", 1).await;
    let unlocked_at_ms: i64 = raw
        .query_one(
            "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    raw.batch_execute("COMMIT").await.unwrap();
    let appended = waiting.await.unwrap().unwrap();
    assert_eq!(appended[0].offset, 2);
    assert!(
        appended[0].published_at_ms >= unlocked_at_ms,
        "published_at {} is from before the wait ended ({unlocked_at_ms})",
        appended[0].published_at_ms
    );

    // A wait past the expiry: refused, nothing stored.
    storage.release(&lease).await.unwrap();
    let (short, _) = acquire(&storage, &candidate("a"), Duration::from_secs(2)).await;
    lock_channel(&raw, "c").await;
    let waiting = {
        let (storage, short) = (storage.clone(), short.clone());
        tokio::spawn(async move { storage.append(&short, &[msg("c", "3")]).await })
    };
    wait_for_lock_waiters(&monitor, "herald", 1).await;
    wait_expired(&storage).await;
    raw.batch_execute("COMMIT").await.unwrap();
    assert_lost(waiting.await.unwrap(), &short);
    let offsets: Vec<i64> = stored_messages(&monitor)
        .await
        .into_iter()
        .map(|(_, offset, _)| offset)
        .collect();
    assert_eq!(offsets, vec![1, 2], "the late batch was stored");
}

/// The acquire of `standby`, which must find `holder`'s lease held.
async fn held_by_other(standby: &PostgresStorage, c: &Candidate) -> herald_core::LeaseInfo {
    match standby.acquire(c, MINUTE).await.unwrap() {
        Acquire::Held(info) => info,
        Acquire::Acquired { lease, .. } => panic!("{} acquired {lease:?}", c.node_id),
    }
}

/// A standby waiting on its takeover hint learns of the holder's death
/// soon after its sessions end: its takeover watch is seen asking about
/// the holder's session locks (`pg_stat_activity`). (The hint's outcome
/// on both backends, for death and for release, is in the conformance
/// suite.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_takeover_hint_fires_when_the_holder_dies() {
    let db = TestDatabase::create().await;
    let w = standby_watching(&db).await;
    // The hint stays pending while the holder lives.
    assert!(!w.waiting.is_finished());

    drop(w.holder);
    tokio::time::timeout(MINUTE, w.waiting)
        .await
        .expect("the hint fires when the holder's session ends")
        .unwrap();
    let (new, reason) = acquire(&w.standby, &candidate("standby"), MINUTE).await;
    assert_eq!(reason, TakeoverReason::HolderGone);
    assert_eq!(new.token, FencingToken(w.lease.token.0 + 1));
}

/// A holder and a standby on one database, the standby waiting on its
/// takeover hint, with a monitor session.
struct Watching {
    holder: PostgresStorage,
    /// The holder's lease.
    lease: Lease,
    standby: PostgresStorage,
    /// The standby's pending `takeover_hint`.
    waiting: JoinHandle<()>,
    monitor: Client,
}

/// Starts a holder and a standby on `db` and returns once the standby's
/// takeover watch is seen asking about the holder's session locks.
async fn standby_watching(db: &TestDatabase) -> Watching {
    let holder = node(db.url(), options()).await;
    let standby = node(db.url(), options()).await;
    let (lease, _) = acquire(&holder, &candidate("holder"), MINUTE).await;
    let info = held_by_other(&standby, &candidate("standby")).await;
    let waiting = {
        let standby = standby.clone();
        tokio::spawn(async move { standby.takeover_hint(&info).await })
    };
    let monitor = db.raw_client().await;
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        let asking: i64 = monitor
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name = 'herald-watch' \
                 AND query LIKE '%pg_try_advisory_xact_lock%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if asking > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the takeover watch never asked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Watching {
        holder,
        lease,
        standby,
        waiting,
        monitor,
    }
}

/// The snapshot (`backend_xmin`) of this database's takeover watch
/// session; `None` while it holds none (between two of its questions).
async fn watch_xmin(monitor: &Client) -> Option<i64> {
    monitor
        .query_opt(
            "SELECT backend_xmin::text::bigint FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = 'herald-watch' \
             AND backend_xmin IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

/// A standby's takeover watch keeps no snapshot while the holder lives.
/// A statement that waits for a lock keeps its snapshot, and the oldest
/// snapshot of the database bounds what `VACUUM` and page pruning may
/// remove: a blocking wait for the holder's whole life kept every row
/// version the holder made meanwhile (its channel heads, its renewals),
/// and the tables bloated for as long as a standby watched. Over a second
/// of the watch's questions, no snapshot it holds is older than a
/// transaction that ended before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_takeover_watch_does_not_hold_back_vacuum() {
    let db = TestDatabase::create().await;
    let w = standby_watching(&db).await;
    let monitor = &w.monitor;
    // The 32-bit transaction id, as `backend_xmin` shows it.
    let ended: i64 = monitor
        .query_one("SELECT (txid_current() % 4294967296)::bigint", &[])
        .await
        .unwrap()
        .get(0);
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        if let Some(xmin) = watch_xmin(monitor).await {
            assert!(
                xmin > ended,
                "the takeover watch holds a snapshot (xmin {xmin}) from before transaction {ended} ended"
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The holder lives: the hint is still pending.
    assert!(!w.waiting.is_finished());
    w.waiting.abort();
}

//! Two `herald serve` nodes on one PostgreSQL database, with the timings of
//! the lease design's node-level test: ttl 12 s, safety margin 2 s, renewal
//! statement timeout 1 s, so a renewal every 2 s and a safety deadline 10 s
//! after a successful renewal was sent.
//!
//! Another session holds the lease row `FOR UPDATE`: for 60 % of the ttl the
//! holder's renewals time out, it retries and stays holder; for 133 % of the
//! ttl its watchdog stops it at the safety deadline with one structured log
//! record, the standby takes over, and every acknowledged message is stored
//! exactly once.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use herald_testkit::api::Api;
use herald_testkit::process::Server;
use herald_testkit::{TestDatabase, WAIT};
use reqwest::StatusCode;
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(12);
const SAFE_WINDOW: Duration = Duration::from_secs(10);
const CHANNEL: &str = "failover";

fn flags<'a>(db: &'a TestDatabase, node: &'a str) -> Vec<&'a str> {
    vec![
        "--database",
        db.url(),
        "--node-id",
        node,
        "--lease-ttl",
        "12s",
        "--lease-safety-margin",
        "2s",
        "--renew-statement-timeout",
        "1s",
    ]
}

/// Publishes to `api` in a loop until `stop`; records every acknowledged
/// `(offset, data id)`.
fn publisher(
    api: Api,
    worker: u32,
    acked: Arc<Mutex<Vec<(u64, String)>>>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut seq = 0u32;
        while !stop.is_cancelled() {
            seq += 1;
            let id = format!("w{worker}-{seq}");
            let Ok(answer) = api.try_publish(CHANNEL, &json!({ "id": id }), None).await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            if answer.status == StatusCode::CREATED {
                let offset = answer.body["offset"].as_u64().expect("an offset");
                acked.lock().unwrap().push((offset, id));
            } else {
                // Blocked or refused: pace the retries.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    })
}

/// A session that holds the lease row `FOR UPDATE` for `hold`.
async fn hold_lease_row(db: &TestDatabase, hold: Duration) {
    let client = db.raw_client().await;
    client
        .batch_execute("BEGIN; SELECT 1 FROM storage_leases WHERE name = 'writer' FOR UPDATE")
        .await
        .expect("lock the lease row");
    // The fault itself lasts `hold`: there is no event to wait for.
    tokio::time::sleep(hold).await;
    client.batch_execute("ROLLBACK").await.expect("unlock");
}

fn parse_time(text: &str) -> SystemTime {
    humantime::parse_rfc3339_weak(text.trim_end_matches('Z'))
        .unwrap_or_else(|e| panic!("not an RFC 3339 time: {text}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_stops_a_blocked_holder_and_the_standby_takes_over() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let mut a = Server::start_with(&dir.path().join("a"), &flags(&db, "a")).await;
    a.api.wait_role("holder", WAIT).await;
    let b = Server::start_with(&dir.path().join("b"), &flags(&db, "b")).await;
    b.api.wait_role("standby", WAIT).await;

    // Messages published to A are readable on B.
    for i in 0..10 {
        a.api
            .publish(CHANNEL, &json!({ "id": format!("warm-{i}") }))
            .await;
    }
    assert_eq!(b.api.head(CHANNEL).await, 10);

    let acked = Arc::new(Mutex::new(
        (1..=10)
            .map(|i| (i, format!("warm-{}", i - 1)))
            .collect::<Vec<_>>(),
    ));
    let stop = CancellationToken::new();
    let publishers: Vec<_> = (0..4)
        .map(|w| publisher(a.api.clone(), w, acked.clone(), stop.clone()))
        .collect();

    // 60 % of the ttl: renewals time out, the holder retries and stays.
    hold_lease_row(&db, TTL * 6 / 10).await;
    let released = Instant::now();
    let retried = Instant::now() + WAIT;
    loop {
        let records = a.log_records();
        let timeouts = records
            .iter()
            .filter(|r| {
                r["level"] == "WARN"
                    && r["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("renewal failed"))
            })
            .count();
        if timeouts >= 2 && a.api.status().await["role"] == "holder" {
            break;
        }
        assert!(
            Instant::now() < retried,
            "no renewal retries logged:\n{}",
            a.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A renews successfully once the row is free: its time since the last
    // successful renewal drops below the time since the release.
    let renewed = Instant::now() + WAIT;
    loop {
        let status = a.api.status().await;
        let since = status["since_last_renewal_ms"].as_u64();
        if since.is_some_and(|ms| Duration::from_millis(ms) < released.elapsed()) {
            assert_eq!(status["role"], "holder", "{status}");
            break;
        }
        assert!(
            Instant::now() < renewed,
            "A did not renew after the lock: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = acked.lock().unwrap().len();
    let progress = Instant::now() + WAIT;
    while acked.lock().unwrap().len() < before + 10 {
        assert!(
            Instant::now() < progress,
            "A accepts no writes after the short lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        a.log_records().iter().all(|r| r["level"] != "ERROR"),
        "{}",
        a.log_text()
    );

    // 133 % of the ttl: the watchdog stops A at its safety deadline.
    let locked_at = Instant::now();
    let hold = tokio::spawn(async move {
        hold_lease_row(&db, TTL * 4 / 3).await;
        db
    });
    let (status, exited_at) = a.wait_exit(TTL * 2).await;
    assert_eq!(
        status.code(),
        Some(3),
        "A must exit with the watchdog's status"
    );
    let stopped_after = exited_at - locked_at;
    assert!(
        stopped_after >= SAFE_WINDOW - Duration::from_secs(2)
            && stopped_after <= SAFE_WINDOW + Duration::from_secs(3),
        "A stopped {stopped_after:?} after the lock; its last renewal was at most 2 s before"
    );
    stop.cancel();
    for p in publishers {
        p.await.unwrap();
    }

    let records = a.log_records();
    let watchdog = records
        .iter()
        .find(|r| {
            r["message"]
                .as_str()
                .is_some_and(|m| m.contains("watchdog"))
        })
        .unwrap_or_else(|| panic!("no watchdog record:\n{}", a.log_text()));
    assert_eq!(watchdog["level"], "ERROR", "{watchdog}");
    eprintln!("A stopped {stopped_after:?} after the lock; watchdog record: {watchdog}");
    let sent = parse_time(watchdog["last_renewal_sent_at"].as_str().expect("sent at"));
    let fired = parse_time(watchdog["timestamp"].as_str().expect("timestamp"));
    let after_sent = fired.duration_since(sent).expect("fired after the renewal");
    assert!(
        after_sent >= SAFE_WINDOW - Duration::from_millis(50)
            && after_sent <= SAFE_WINDOW + Duration::from_millis(500),
        "the watchdog fired {after_sent:?} after the last successful renewal was sent: {watchdog}"
    );
    assert!(
        watchdog["watchdog_late_by_ms"].as_u64().expect("late by") < 500,
        "{watchdog}"
    );
    // Whether an attempt is in flight depends on where the 2 s attempt
    // cycle (1 s statement timeout, 1 s retry) stands at the deadline; the
    // record must say which, and for how long.
    let in_flight = watchdog["renewal_in_flight"].as_bool().expect("in flight");
    assert_eq!(
        watchdog["renewal_in_flight_for_ms"].as_u64().is_some(),
        in_flight,
        "{watchdog}"
    );
    let error = watchdog["last_renewal_error"].as_str().expect("last error");
    assert!(
        error.contains("statement timeout") || error.contains("renewal"),
        "{watchdog}"
    );

    // B takes over once the lease row is free and the lease has expired.
    let db = hold.await.unwrap();
    b.api.wait_role("holder", TTL).await;
    let offset = b
        .api
        .publish(CHANNEL, &json!({ "id": "after-takeover" }))
        .await;

    // Every acknowledged message is stored exactly once, at its offset.
    let (head, stored) = b.api.history_all(CHANNEL, 1000).await;
    assert_eq!(head, offset);
    let by_offset: BTreeMap<u64, String> = stored
        .iter()
        .map(|m| {
            (
                m["offset"].as_u64().unwrap(),
                m["data"]["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        by_offset.keys().copied().collect::<Vec<_>>(),
        (1..=head).collect::<Vec<_>>(),
        "offsets must be contiguous"
    );
    let ids: HashSet<&String> = by_offset.values().collect();
    assert_eq!(ids.len(), by_offset.len(), "a message is stored twice");
    for (offset, id) in acked.lock().unwrap().iter() {
        assert_eq!(
            by_offset.get(offset),
            Some(id),
            "acknowledged message {id} lost"
        );
    }

    // The new holder's writes carry a larger fencing token.
    let client = db.raw_client().await;
    let tokens: Vec<i64> = client
        .query(
            "SELECT token FROM messages WHERE channel = $1 ORDER BY \"offset\"",
            &[&CHANNEL],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "tokens went down: {tokens:?}"
    );
    assert!(
        tokens.last() > tokens.first(),
        "the takeover did not raise the token"
    );
}

/// SIGTERM on the holder releases the lease: the standby takes it over as
/// released (on its next acquire, every 1 s), long before it would expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_is_taken_over_within_one_acquire_interval() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let mut a = Server::start_with(&dir.path().join("a"), &flags(&db, "a")).await;
    a.api.wait_role("holder", WAIT).await;
    let b = Server::start_with(&dir.path().join("b"), &flags(&db, "b")).await;
    b.api.wait_role("standby", WAIT).await;
    let first = a.api.publish(CHANNEL, &json!({ "id": "before" })).await;

    a.sigterm();
    let (status, exited_at) = a.wait_exit(WAIT).await;
    assert_eq!(status.code(), Some(0), "a drain exits 0");
    let taken_over = Instant::now() + WAIT;
    let offset = loop {
        let answer = b
            .api
            .try_publish(CHANNEL, &json!({ "id": "after" }), None)
            .await
            .expect("publish to B");
        if answer.status == StatusCode::CREATED {
            break answer.body["offset"].as_u64().expect("an offset");
        }
        // Until it takes over, B has no holder to forward the publish to.
        assert_eq!(answer.body["error"]["code"], "no_holder", "{answer:?}");
        assert!(Instant::now() < taken_over, "B never became holder");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = exited_at.elapsed();
    eprintln!("handover on PostgreSQL: B accepted a write {took:?} after A exited");
    // Taken over because A released it, not because it expired (which
    // would take the whole ttl, 12 s).
    let takeover = b.acquisition(1, WAIT).await;
    assert_eq!(takeover["reason"], "released", "{takeover}");
    assert_eq!(offset, first + 1);
    let status = b.api.status().await;
    assert_eq!(status["lease"]["token"], 2, "{status}");
}

/// A drain whose writer cannot finish in time (its batch waits on a channel
/// row that another session holds) exits with status 5 and still releases
/// the lease on its way out, so a standby does not wait for expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_times_out_still_releases_the_lease() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let mut args = flags(&db, "a");
    args.extend(["--drain-timeout", "1s"]);
    let mut a = Server::start_with(&dir.path().join("a"), &args).await;
    a.api.wait_role("holder", WAIT).await;
    a.api.publish(CHANNEL, &json!({ "id": "before" })).await;

    let raw = db.raw_client().await;
    raw.batch_execute(&format!(
        "BEGIN; SELECT 1 FROM channels WHERE name = '{CHANNEL}' FOR UPDATE"
    ))
    .await
    .unwrap();
    let stuck = {
        let api = a.api.clone();
        tokio::spawn(async move {
            api.try_publish(CHANNEL, &json!({ "id": "stuck" }), None)
                .await
        })
    };
    // The writer's batch now waits on the channel's row lock.
    let monitor = db.raw_client().await;
    let deadline = Instant::now() + WAIT;
    loop {
        let waiting: i64 = monitor
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND application_name = 'herald' AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the writer never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    a.sigterm();
    let (status, _) = a.wait_exit(WAIT).await;
    assert_eq!(status.code(), Some(5), "{}", a.log_text());
    let holder: Option<String> = monitor
        .query_one(
            "SELECT holder FROM storage_leases WHERE name = 'writer'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        holder,
        None,
        "the lease was not released:\n{}",
        a.log_text()
    );
    raw.batch_execute("ROLLBACK").await.unwrap();
    let answer = stuck.await.unwrap();
    assert!(
        !answer.as_ref().is_ok_and(|a| a.status.is_success()),
        "the stuck publish was acknowledged: {answer:?}"
    );
}

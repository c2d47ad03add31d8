//! Three `herald serve` processes on one PostgreSQL database, as behind a
//! load balancer: every node serves subscriptions, accepts writes (a
//! standby forwards them to the holder) and the cluster fails over on a
//! crash, a hang, a drain and a database restart without losing or
//! repeating an acknowledged message.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_testkit::database::{PrivateCluster, TestDatabase};
use herald_testkit::process::{Server, FAST_LEASE};
use herald_testkit::sse::SseClient;
use herald_testkit::WAIT;
use reqwest::StatusCode;
use rustix::process::Signal;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const CHANNEL: &str = "cluster";

/// `n` nodes on `url`; node 0 is started first and is holder.
async fn start_nodes(url: &str, dir: &std::path::Path, n: usize) -> Vec<Server> {
    let mut nodes = Vec::new();
    for i in 0..n {
        let id = format!("node-{i}");
        let mut flags = vec!["--database", url, "--node-id", id.as_str()];
        flags.extend_from_slice(FAST_LEASE);
        let node = Server::start_with(&dir.join(&id), &flags).await;
        node.api
            .wait_role(if i == 0 { "holder" } else { "standby" }, WAIT)
            .await;
        nodes.push(node);
    }
    nodes
}

/// What one subscriber received: `(offset, id)` in arrival order.
type Seen = Arc<Mutex<Vec<(u64, String)>>>;

/// What the clients saw: acknowledged `(offset, id)` pairs and, per
/// subscriber, the `(offset, id)` sequence it received.
#[derive(Default)]
struct Record {
    acked: Mutex<Vec<(u64, String)>>,
}

/// A careful publisher: each message has an idempotency key; on any error
/// it retries the same message (same key) on the next node.
fn publisher(
    bases: Vec<String>,
    worker: usize,
    record: Arc<Record>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let mut node = worker;
        let mut seq = 0;
        'messages: while !stop.is_cancelled() {
            seq += 1;
            let id = format!("w{worker}-{seq}");
            loop {
                if stop.is_cancelled() {
                    break 'messages;
                }
                let base = &bases[node % bases.len()];
                let sent = http
                    .post(format!("{base}/v1/channels/{CHANNEL}/messages"))
                    .header("Idempotency-Key", &id)
                    .json(&json!({ "data": { "id": id } }))
                    .send()
                    .await;
                if let Ok(resp) = sent {
                    let status = resp.status();
                    if status == StatusCode::CREATED || status == StatusCode::OK {
                        let body: Value = resp.json().await.unwrap_or(Value::Null);
                        if let Some(offset) = body["offset"].as_u64() {
                            record.acked.lock().unwrap().push((offset, id.clone()));
                            continue 'messages;
                        }
                    }
                }
                node += 1;
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        }
    })
}

/// A subscriber that follows the channel over SSE and, when its stream
/// breaks, resumes with `Last-Event-ID` on the next node of `bases`.
fn follower(bases: Vec<String>, seen: Seen, stop: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        let mut node = 0;
        while !stop.is_cancelled() {
            let last = seen.lock().unwrap().last().map_or(0, |(o, _)| *o);
            let base = &bases[node % bases.len()];
            let url = format!("{base}/v1/channels/{CHANNEL}/events");
            let last = last.to_string();
            let sse = SseClient::open(&http, &url, &[("Last-Event-ID", &last)])
                .await
                .ok()
                .filter(|sse| (200..300).contains(&sse.status));
            if let Some(mut sse) = sse {
                loop {
                    let next = tokio::select! {
                        () = stop.cancelled() => return,
                        next = sse.next_event() => next,
                    };
                    let Some(event) = next else { break };
                    // The event type defaults to `message`.
                    if event.event.as_deref().unwrap_or("message") != "message" {
                        continue;
                    }
                    let message: Value = serde_json::from_str(&event.data).unwrap();
                    let offset = message["offset"].as_u64().unwrap();
                    let id = message["data"]["id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    seen.lock().unwrap().push((offset, id));
                }
            }
            node += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// The stored history, read from `server`: `(offset, id)` in offset order.
async fn history(server: &Server) -> Vec<(u64, String)> {
    let (_, messages) = server.api.history_all(CHANNEL, 1000).await;
    messages
        .iter()
        .map(|m| {
            (
                m["offset"].as_u64().unwrap(),
                m["data"]["id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The promises: offsets 1..=head, each message once, every acknowledged
/// message at its acknowledged offset, every subscriber's sequence a
/// gap-free, repeat-free prefix of the history.
fn check(stored: &[(u64, String)], record: &Record, followers: &[Seen]) {
    let offsets: Vec<u64> = stored.iter().map(|(o, _)| *o).collect();
    assert_eq!(
        offsets,
        (1..=stored.len() as u64).collect::<Vec<_>>(),
        "offsets must be 1..=head"
    );
    let ids: HashSet<&String> = stored.iter().map(|(_, id)| id).collect();
    assert_eq!(ids.len(), stored.len(), "a message is stored twice");
    let by_offset: BTreeMap<u64, &String> = stored.iter().map(|(o, id)| (*o, id)).collect();
    let acked = record.acked.lock().unwrap();
    assert!(!acked.is_empty(), "nothing was acknowledged");
    for (offset, id) in acked.iter() {
        assert_eq!(by_offset.get(offset), Some(&id), "acknowledged {id} lost");
    }
    for (i, seen) in followers.iter().enumerate() {
        let seen = seen.lock().unwrap();
        assert!(!seen.is_empty(), "subscriber {i} saw nothing");
        assert_eq!(
            seen.as_slice(),
            &stored[..seen.len()],
            "subscriber {i} saw a gap, a repeat or other data"
        );
    }
}

/// Waits until every follower has seen `head` messages.
async fn wait_followers(followers: &[Seen], head: usize) {
    let deadline = Instant::now() + WAIT;
    while followers.iter().any(|f| f.lock().unwrap().len() < head) {
        assert!(
            Instant::now() < deadline,
            "subscribers did not catch up to {head}: {:?}",
            followers
                .iter()
                .map(|f| f.lock().unwrap().len())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Publishes a probe to `server` until it is acknowledged; returns when.
async fn first_write_accepted(server: &Server, what: &str) -> Instant {
    let deadline = Instant::now() + WAIT * 2;
    let mut n = 0;
    loop {
        n += 1;
        let id = format!("probe-{what}-{n}");
        let answer = server
            .api
            .try_publish(CHANNEL, &json!({ "id": id }), Some(&id))
            .await;
        if let Ok(answer) = answer {
            if answer.status == StatusCode::CREATED {
                return Instant::now();
            }
        }
        assert!(Instant::now() < deadline, "no write accepted ({what})");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The log record of the takeover that followed token `token`: the first
/// acquisition with a higher token logged by one of `standbys`.
async fn takeover_after(standbys: &[Server], token: u64) -> Value {
    let waits = standbys
        .iter()
        .map(|node| Box::pin(node.acquisition(token, WAIT)));
    let (record, _, _) = futures::future::select_all(waits).await;
    assert_eq!(record["token"], token + 1, "{record}");
    record
}

struct Load {
    record: Arc<Record>,
    followers: Vec<Seen>,
    tasks: Vec<JoinHandle<()>>,
    stop: CancellationToken,
}

/// Three publishers over `bases` and one follower per base (each moving on
/// to the next base when its node goes away).
fn start_load(bases: &[String]) -> Load {
    let record = Arc::new(Record::default());
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for w in 0..3 {
        tasks.push(publisher(bases.to_vec(), w, record.clone(), stop.clone()));
    }
    let mut followers = Vec::new();
    for i in 0..bases.len() {
        let mut rotated = bases.to_vec();
        rotated.rotate_left(i);
        let seen = Arc::new(Mutex::new(Vec::new()));
        tasks.push(follower(rotated, seen.clone(), stop.clone()));
        followers.push(seen);
    }
    Load {
        record,
        followers,
        tasks,
        stop,
    }
}

impl Load {
    async fn wait_acks(&self, n: usize) {
        let deadline = Instant::now() + WAIT;
        while self.record.acked.lock().unwrap().len() < n {
            assert!(Instant::now() < deadline, "fewer than {n} acknowledgements");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the publishers, lets the followers catch up with `reader`'s
    /// history, stops them, and checks every promise.
    async fn finish(self, reader: &Server) {
        // Publishers first; followers keep reading.
        self.stop.cancel();
        for t in self.tasks {
            t.await.unwrap();
        }
        let stored = history(reader).await;
        let followers_stop = CancellationToken::new();
        let bases = vec![reader.url.clone()];
        let mut catch_up = Vec::new();
        for seen in &self.followers {
            catch_up.push(follower(
                bases.clone(),
                seen.clone(),
                followers_stop.clone(),
            ));
        }
        wait_followers(&self.followers, stored.len()).await;
        followers_stop.cancel();
        for t in catch_up {
            t.await.unwrap();
        }
        check(&stored, &self.record, &self.followers);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_serves_the_same_gap_free_sequence() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_nodes(db.url(), dir.path(), 3).await;
    let bases: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let load = start_load(&bases);
    load.wait_acks(150).await;
    load.finish(&nodes[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holder_is_replaced_within_two_seconds() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = start_nodes(db.url(), dir.path(), 3).await;
    let bases: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let load = start_load(&bases);
    load.wait_acks(60).await;

    nodes[0].sigkill();
    let killed = Instant::now();
    let accepted = first_write_accepted(&nodes[1], "crash").await;
    let took = accepted - killed;
    eprintln!("takeover after kill -9: {} ms", took.as_millis());
    // The crash fast path, not expiry: a standby saw the holder's session
    // lock free while its lease was still live.
    let takeover = takeover_after(&nodes[1..], 1).await;
    assert_eq!(takeover["reason"], "holder_gone", "{takeover}");
    assert_eq!(takeover["previous_holder"], "node-0", "{takeover}");
    let before = load.record.acked.lock().unwrap().len();
    load.wait_acks(before + 30).await;
    load.finish(&nodes[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_holder_is_fenced_and_stops_after_it_resumes() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = start_nodes(db.url(), dir.path(), 3).await;
    let bases: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let load = start_load(&bases[1..]);
    load.wait_acks(30).await;

    nodes[0].signal(Signal::STOP);
    let stopped = Instant::now();
    // A write sent to the frozen holder waits in its socket.
    let frozen = nodes[0].api.clone();
    let pending = tokio::spawn(async move {
        frozen
            .try_publish(
                CHANNEL,
                &json!({ "id": "to-the-frozen-holder" }),
                Some("frozen"),
            )
            .await
    });
    let accepted = first_write_accepted(&nodes[1], "hang").await;
    let took = accepted - stopped;
    eprintln!("takeover after SIGSTOP: {} ms", took.as_millis());
    // Only expiry can explain it: the frozen holder's sessions are alive,
    // so the crash fast path must not fire. (How soon after the SIGSTOP the
    // lease expired depends on when the holder last renewed, which a busy
    // machine can delay; the reason does not.)
    let takeover = takeover_after(&nodes[1..], 1).await;
    assert_eq!(takeover["reason"], "expired", "{takeover}");
    assert_eq!(takeover["previous_holder"], "node-0", "{takeover}");

    nodes[0].signal(Signal::CONT);
    let (status, _) = nodes[0].wait_exit(WAIT).await;
    assert!(
        matches!(status.code(), Some(3) | Some(4)),
        "the resumed holder must stop (watchdog or lease lost): {status:?}"
    );
    if let Ok(Ok(answer)) = pending.await {
        assert!(
            !answer.status.is_success(),
            "the frozen holder acknowledged a write: {answer:?}"
        );
    }
    let before = load.record.acked.lock().unwrap().len();
    load.wait_acks(before + 20).await;
    let stored = history(&nodes[1]).await;
    assert!(
        stored.iter().all(|(_, id)| id != "to-the-frozen-holder"),
        "the frozen holder committed after it lost the lease"
    );
    load.finish(&nodes[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_over_within_one_acquire_interval_under_load() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = start_nodes(db.url(), dir.path(), 3).await;
    let bases: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let load = start_load(&bases[1..]);
    load.wait_acks(60).await;

    nodes[0].sigterm();
    let signalled = Instant::now();
    // The drain released the lease: no wait for its expiry, nor for its
    // process to exit (which would be `holder_gone`).
    let takeover = takeover_after(&nodes[1..], 1).await;
    eprintln!(
        "takeover seen {} ms after SIGTERM",
        signalled.elapsed().as_millis()
    );
    assert_eq!(takeover["reason"], "released", "{takeover}");
    first_write_accepted(&nodes[1], "handover").await;
    let (status, _) = nodes[0].wait_exit(WAIT).await;
    assert_eq!(status.code(), Some(0));
    let before = load.record.acked.lock().unwrap().len();
    load.wait_acks(before + 30).await;
    load.finish(&nodes[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_under_load_loses_nothing() {
    let pg = PrivateCluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes = start_nodes(&pg.url(), dir.path(), 3).await;
    let bases: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let load = start_load(&bases);
    load.wait_acks(60).await;

    pg.restart_fast();
    let before = load.record.acked.lock().unwrap().len();
    load.wait_acks(before + 60).await;
    // Exactly one holder results.
    let deadline = Instant::now() + WAIT;
    loop {
        let mut holders = 0;
        for n in &nodes {
            if n.api.status().await["role"] == "holder" {
                holders += 1;
            }
        }
        if holders == 1 {
            break;
        }
        assert!(holders <= 1, "{holders} holders");
        assert!(Instant::now() < deadline, "no holder after the restart");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    load.finish(&nodes[2]).await;
}

/// A database outage shorter than the ttl never costs a live holder its
/// lease. A stop ends every session, the holder's liveness session with
/// its lock included; when the server is back, a standby must not take
/// that free lock for the holder's death before the holder has had time to
/// reconnect and take it again. Stops of 1, 6 and 12 s under load, with
/// the default lease timings (ttl 30 s): node 0 keeps the lease (same
/// fencing token) through all three, and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_outage_shorter_than_the_ttl_keeps_the_holder() {
    let pg = PrivateCluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = pg.url();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let id = format!("node-{i}");
        let flags = ["--database", url.as_str(), "--node-id", id.as_str()];
        let node = Server::start_with(&dir.path().join(&id), &flags).await;
        node.api
            .wait_role(if i == 0 { "holder" } else { "standby" }, WAIT)
            .await;
        nodes.push(node);
    }
    let token = nodes[0].api.status().await["lease"]["token"].clone();
    assert!(token.as_u64().is_some(), "{token}");
    let bases: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let load = start_load(&bases);
    load.wait_acks(30).await;

    for outage in [1, 6, 12] {
        pg.stop_fast();
        // The outage itself: the database is down for this long.
        tokio::time::sleep(Duration::from_secs(outage)).await;
        pg.start_again();
        let before = load.record.acked.lock().unwrap().len();
        load.wait_acks(before + 30).await;
        let status = nodes[0].api.status().await;
        assert_eq!(
            status["role"], "holder",
            "after a {outage} s outage: {status}"
        );
        assert_eq!(
            status["lease"]["token"], token,
            "after a {outage} s outage: {status}"
        );
    }
    for standby in &nodes[1..] {
        assert!(
            !standby
                .log_records()
                .iter()
                .any(|r| r["message"] == "writer lease acquired"),
            "{} acquired the lease:\n{}",
            standby.url,
            standby.log_text()
        );
    }
    load.finish(&nodes[0]).await;
}

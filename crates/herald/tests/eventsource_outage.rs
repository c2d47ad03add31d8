//! A real `EventSource` across a database outage: Node's `eventsource`
//! package (which behaves as browsers do: WHATWG HTML, "Server-sent
//! events") follows a channel on a node whose PostgreSQL stops for 6 s.
//! One client is connected before the outage and has its connection cut
//! during it, so that it reconnects (with `Last-Event-ID`) while the
//! database is down; another connects for the first time while it is down.
//! An `EventSource` gives up for good on any answer but `200`, so both
//! must be answered `200` and then get every message exactly once, in
//! order, once the database is back.
//!
//! The clients are `tests/clients/follow.mjs` run with `node`; the test
//! command installs their packages (`npm ci`) and names that directory in
//! `HERALD_TEST_NODE_CLIENTS` (and the `node` binary in `HERALD_TEST_NODE`,
//! else `node` on `PATH`).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use herald_chaos::proxy::{FaultProxy, Mode};
use herald_testkit::api::Api;
use herald_testkit::clients::{node_bin, node_clients, ClientProcess};
use herald_testkit::database::PrivateCluster;
use herald_testkit::process::Server;
use herald_testkit::{within, WAIT};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::process::Command;
use tokio::time::Instant;

const CHANNEL: &str = "outage";

/// How long the database stays down.
const OUTAGE: Duration = Duration::from_secs(6);

/// One `node follow.mjs` process and what it reported so far; every
/// report is checked as it is read.
struct Follower {
    name: &'static str,
    process: ClientProcess,
    /// Offsets received, in arrival order.
    offsets: Vec<u64>,
    /// Connections answered `200` with an event stream.
    opens: usize,
    /// Error reports (all of them with `readyState` 0, CONNECTING).
    errors: Vec<Value>,
}

impl Follower {
    /// Starts a client that follows `url`.
    fn start(clients: &Path, name: &'static str, url: &str) -> Self {
        let mut command = Command::new(node_bin());
        command
            .arg(clients.join("follow.mjs"))
            .arg(url)
            .current_dir(clients);
        Self {
            name,
            process: ClientProcess::spawn(command),
            offsets: Vec::new(),
            opens: 0,
            errors: Vec::new(),
        }
    }

    /// Reads and checks the next report; `None` once the client exited.
    /// A message must carry the offset after the last one received (so
    /// every message arrives once, in order); an error must leave the
    /// client reconnecting, never closed for good.
    async fn next_report(&mut self) -> Option<Value> {
        let what = format!("{}: the next report", self.name);
        let line = within(&what, WAIT, self.process.reports.next_line())
            .await
            .expect("read the client's stdout")?;
        let report: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("{}: not a JSON report ({e}): {line}", self.name));
        match report["type"].as_str() {
            Some("open") => self.opens += 1,
            Some("message") => {
                let offset = report["offset"].as_u64().expect("an offset");
                assert_eq!(
                    report["id"],
                    offset.to_string(),
                    "{}: the event id is the offset",
                    self.name
                );
                let expected = self.offsets.last().map_or(1, |last| last + 1);
                assert_eq!(
                    offset, expected,
                    "{}: after offsets {:?} came {offset}; every message must come once, in order",
                    self.name, self.offsets
                );
                assert_eq!(report["data"], json!({ "i": offset }), "{}", self.name);
                self.offsets.push(offset);
            }
            Some("error") => {
                assert_eq!(
                    report["readyState"], 0,
                    "{}: the EventSource gave up for good (readyState 2 is CLOSED): {report}",
                    self.name
                );
                self.errors.push(report.clone());
            }
            _ => panic!("{}: an unknown report: {line}", self.name),
        }
        Some(report)
    }

    /// [`Self::next_report`], failing the test when the client exited.
    async fn expect_report(&mut self) -> Value {
        match self.next_report().await {
            Some(report) => report,
            None => panic!(
                "{}: the client exited; its stderr:\n{}",
                self.name,
                self.process.stderr_text()
            ),
        }
    }

    /// Waits for the next connection to open.
    async fn wait_open(&mut self) {
        let opens = self.opens + 1;
        while self.opens < opens {
            self.expect_report().await;
        }
    }

    /// Waits for the next error report (a lost connection).
    async fn wait_error(&mut self) {
        let errors = self.errors.len() + 1;
        while self.errors.len() < errors {
            self.expect_report().await;
        }
    }

    /// Waits until every offset up to `last` was received.
    async fn wait_offsets(&mut self, last: u64) {
        while self.offsets.last().is_none_or(|o| *o < last) {
            self.expect_report().await;
        }
    }

    /// Ends the client (its stdin closes) and checks what it reported
    /// until it exited, and that it exited with status 0.
    async fn finish(&mut self) {
        self.process.close_stdin();
        while self.next_report().await.is_some() {}
        let status = within("the client exits", WAIT, self.process.child.wait())
            .await
            .expect("wait for node");
        assert!(
            status.success(),
            "{}: exited with {status}; its stderr:\n{}",
            self.name,
            self.process.stderr_text()
        );
    }
}

/// Publishes `{"i": i}` with the Idempotency-Key `m<i>`, retrying with the
/// same key while the node answers 503 or the request fails (its database
/// connections come back after the restart), and checks that it got offset
/// `i`.
async fn publish_once(api: &Api, i: u64) {
    let key = format!("m{i}");
    let deadline = Instant::now() + WAIT;
    loop {
        match api
            .try_publish(CHANNEL, &json!({ "i": i }), Some(&key))
            .await
        {
            Ok(answer) if answer.status.is_success() => {
                assert_eq!(answer.body["offset"], i, "{answer:?}");
                return;
            }
            Ok(answer) => assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}"),
            // The outcome is unknown: the same key again.
            Err(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "publish {i} did not succeed within {WAIT:?}"
        );
        // The answer says Retry-After: 1; a shorter pause keeps the test
        // quick and is harmless.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventsource_clients_follow_a_channel_across_a_database_outage() {
    let clients = node_clients(&["eventsource"], &["follow.mjs"]);
    let pg = PrivateCluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = pg.url();
    // The default lease (ttl 30 s) outlives the outage: the node stays
    // holder throughout.
    let server = Server::start_with(dir.path(), &["--database", &url, "--node-id", "node-0"]).await;
    server.api.wait_role("holder", WAIT).await;
    let node_addr: SocketAddr = server
        .url
        .trim_start_matches("http://")
        .parse()
        .expect("the node's address");
    // `early` reaches the node through a proxy that can cut its connection.
    let proxy = FaultProxy::start(node_addr).await.expect("start the proxy");
    let path = format!("/v1/channels/{CHANNEL}/events");

    let mut early = Follower::start(
        &clients,
        "early",
        &format!("http://{}{path}", proxy.local_addr()),
    );
    early.wait_open().await;
    for i in 1..=5 {
        publish_once(&server.api, i).await;
    }
    early.wait_offsets(5).await;

    pg.stop_fast();
    let stopped = Instant::now();
    // The outage is real: the node cannot read the history.
    server
        .api
        .get(&format!("/v1/channels/{CHANNEL}/messages"))
        .await
        .assert_error(StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable");

    // A first connection while the database is down.
    let mut late = Follower::start(&clients, "late", &format!("{}{path}", server.url));
    late.wait_open().await;
    // A reconnection while the database is down: `early`'s connection is
    // reset, and its EventSource reconnects by itself (after its
    // reconnection time, 3 s by default) with Last-Event-ID: 5.
    proxy.set_mode(Mode::Cut);
    proxy.set_mode(Mode::Pass);
    early.wait_error().await;
    early.wait_open().await;
    // The database stays down for OUTAGE in all (longer if the reconnection
    // above came later): the outage's length is the scenario's, not a wait
    // for an event.
    tokio::time::sleep_until(stopped + OUTAGE).await;
    pg.start_again();

    for i in 6..=16 {
        publish_once(&server.api, i).await;
    }
    early.wait_offsets(16).await;
    late.wait_offsets(16).await;
    early.finish().await;
    late.finish().await;
    assert_eq!(early.offsets, (1..=16).collect::<Vec<u64>>());
    assert_eq!(late.offsets, (1..=16).collect::<Vec<u64>>());
    assert_eq!(early.opens, 2, "early connected once and reconnected once");
    assert_eq!(
        early.errors.len(),
        1,
        "early lost its connection once: {:?}",
        early.errors
    );
    assert_eq!(late.opens, 1);
    assert!(
        late.errors.is_empty(),
        "late lost its connection: {:?}",
        late.errors
    );
    proxy.shutdown().await;
}

//! Centrifugo's client SDKs through a crash of the holder: two `herald
//! serve` processes on one PostgreSQL database, the holder killed with
//! SIGKILL. Each SDK, centrifuge-js (`tests/clients/centrifuge.mjs`) and
//! centrifuge-python (`tests/clients/python/centrifuge_follow.py`), runs
//! two clients of one channel:
//!
//! - on the standby (case A): it stays connected through the takeover, or
//!   reconnects and recovers;
//! - on the holder (case B), through a [`Balancer`] in front of both nodes,
//!   as a load balancer would put one address before the cluster: after
//!   the kill its connection breaks, the SDK reconnects by itself to the
//!   same address, the balancer sends it to the surviving node, and the
//!   SDK recovers from the offset and epoch it reached. Neither SDK moves
//!   to another endpoint by itself: centrifuge-js takes a list of
//!   transport endpoints but keeps the one that opened first, and
//!   centrifuge-python takes one address.
//!
//! Publications 1–3 are made before the kill; 4–6 from the moment of the
//! kill through the standby, each retried with its idempotency key until
//! acknowledged (the standby forwards to the dead holder until it takes
//! the lease over, then commits), while the balancer holds the case-B
//! client's reconnection (so that it must recover them); 7–9 after the
//! takeover. Both clients must receive every publication exactly once, in
//! order, and every resubscribe must say `recovered: true` in the epoch of
//! the first subscribe.
//!
//! The test command installs both SDKs (`npm ci` in `tests/clients`, a
//! virtualenv from `tests/clients/python/requirements.lock`) and names
//! them in `HERALD_TEST_NODE_CLIENTS` and `HERALD_TEST_PYTHON`.

use herald_testkit::api::Api;
use herald_testkit::auth::{hs256_token, write_auth_config, AuthFile};
use herald_testkit::balancer::Balancer;
use herald_testkit::process::{Server, FAST_LEASE};
use herald_testkit::sdk::{Sdk, SdkClient};
use herald_testkit::{TestDatabase, WAIT};
use serde_json::{json, Value};

/// The channel both clients follow (the default namespace rule:
/// subscribing needs a token that lists it).
const CHANNEL: &str = "news:failover";

/// Publishes `{"n": n}` through `api`, retried until acknowledged at
/// offset `n` ([`Api::publish_numbered`]); returns the failed attempts.
async fn publish(api: &Api, n: u64) -> usize {
    api.publish_numbered(CHANNEL, n, WAIT).await
}

/// The `ws://` URL of the client protocol at `addr` (`http://…` or a bare
/// address).
fn ws_url(addr: &str) -> String {
    format!(
        "ws://{}/connection/websocket",
        addr.trim_start_matches("http://")
    )
}

async fn recovers_when_the_holder_is_killed(sdk: Sdk) {
    // Fail at once, before a server starts, when the SDK is missing.
    sdk.check();
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let config = dir.path().join("herald.toml");
    let AuthFile { key, secret } = write_auth_config(&config, &["publish", "read"]);
    let flags = |node: &'static str| {
        let mut flags = vec![
            "--database",
            db.url(),
            "--node-id",
            node,
            "--config",
            config.to_str().expect("a UTF-8 path"),
        ];
        flags.extend_from_slice(FAST_LEASE);
        flags
    };
    let mut a = Server::start_with(&dir.path().join("a"), &flags("node-a")).await;
    a.api.wait_role("holder", WAIT).await;
    let b = Server::start_with(&dir.path().join("b"), &flags("node-b")).await;
    b.api.wait_role("standby", WAIT).await;
    let (a_api, b_api) = (
        Api::with_api_key(&a.url, &key),
        Api::with_api_key(&b.url, &key),
    );
    let addr = |server: &Server| {
        server
            .url
            .trim_start_matches("http://")
            .parse()
            .expect("a socket address")
    };
    let balancer = Balancer::start(vec![addr(&a), addr(&b)]).await;
    let token = hs256_token(&secret, "failover", &["news:*"]);

    // Case A on the standby, case B on the holder through the balancer.
    let mut on_standby = SdkClient::start(sdk, "on the standby", &ws_url(&b.url), &token, CHANNEL);
    let mut on_holder = SdkClient::start(
        sdk,
        "on the holder",
        &ws_url(&balancer.addr().to_string()),
        &token,
        CHANNEL,
    );
    let first = on_standby.follow().await;
    assert_eq!(first["offset"], 0, "a new channel: {first}");
    let epoch = first["epoch"].as_str().expect("an epoch").to_owned();
    assert_eq!(epoch.len(), 16, "{first}");
    let first = on_holder.follow().await;
    assert_eq!(first["epoch"], epoch.as_str(), "{first}");
    assert_eq!(balancer.routes(), [0], "case B starts on the holder");

    // Before the failover, through the holder.
    for n in 1..=3 {
        publish(&a_api, n).await;
    }
    on_standby.received_up_to(3).await;
    on_holder.received_up_to(3).await;

    // The holder crashes. Case B's reconnection waits at the balancer
    // while 4-6 are published through the standby.
    balancer.hold();
    a.sigkill();
    let (status, _) = a.wait_exit(WAIT).await;
    assert!(!status.success(), "the holder was killed: {status}");
    let mut failed = 0;
    for n in 4..=6 {
        failed += publish(&b_api, n).await;
    }
    println!("{sdk:?}: {failed} publish attempts failed during the failover");
    b_api.wait_role("holder", WAIT).await;
    on_holder
        .expect("the broken connection", |r| {
            r["type"] == "connecting" && r["code"] != 0
        })
        .await;
    balancer.release();

    // After the failover, through the new holder.
    for n in 7..=9 {
        publish(&b_api, n).await;
    }
    let again = on_holder
        .expect("resubscribed on the surviving node", |r| {
            r["type"] == "subscribed" && r["channel"] == CHANNEL
        })
        .await;
    assert_eq!(again["wasRecovering"], true, "{again}");
    assert_eq!(again["recovered"], true, "{again}");
    assert_eq!(again["epoch"], epoch.as_str(), "{again}");
    let routes = balancer.routes();
    assert!(
        routes.len() >= 2 && routes[1..].iter().all(|&node| node == 1),
        "case B reconnects to the surviving node only: {routes:?}"
    );

    let expected: Vec<(u64, Value)> = (1..=9).map(|n| (n, json!({ "n": n }))).collect();
    for client in [&mut on_standby, &mut on_holder] {
        client.received_up_to(9).await;
        assert_eq!(client.received, expected, "{}", client.what());
        // Every resubscribe (case A: only if it had to reconnect) recovers
        // in the one epoch.
        for report in &client.subscribed[1..] {
            assert_eq!(report["recovered"], true, "{}: {report}", client.what());
            assert_eq!(
                report["epoch"],
                epoch.as_str(),
                "{}: {report}",
                client.what()
            );
        }
    }
    assert!(on_holder.reconnects >= 1, "case B never reconnected");
    println!(
        "{sdk:?}: the client on the standby reconnected {} times",
        on_standby.reconnects
    );
    // Stored exactly once: the head is the last acknowledged offset.
    assert_eq!(b_api.head(CHANNEL).await, 9);
    on_standby.stop().await;
    on_holder.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_recovers_when_the_holder_is_killed() {
    recovers_when_the_holder_is_killed(Sdk::Js).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_python_recovers_when_the_holder_is_killed() {
    recovers_when_the_holder_is_killed(Sdk::Python).await;
}

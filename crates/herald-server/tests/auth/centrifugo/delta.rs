//! Fossil delta under load: subscribers of a `fossil_delta` namespace on
//! a holder with a short lease, publications as large as the node takes
//! and publications at the delta bound whose text makes the delta slow.
//! The holder keeps its lease, each renewal sent before the last safety
//! deadline passed, and every subscriber decodes every publication, once,
//! in order, at its offset (as a delta or whole).

use std::time::Duration;

use herald_auth::NamespaceRule;
use herald_lease::{LeaseConfig, LeaseState, StopReason};
use herald_server::ServerConfig;
use herald_testkit::{within, NODE_WAIT};
use serde_json::{json, Value};

use super::client::Client;
use crate::{Backend, Node, Place, Role};

/// Subscribers of the channel.
const SUBSCRIBERS: usize = 8;

/// The size of the large publications' JSON text: over the delta bound,
/// where a delta of unrelated text costs the `fossil-delta` crate seconds
/// per subscriber in a test build.
const LARGE_BYTES: usize = 512 * 1024;

/// The size of the small publications' JSON text: the delta bound
/// (`MAX_DELTA_BYTES` in `delta_cache.rs`), each delta computed.
const SMALL_BYTES: usize = 16 * 1024;

/// A xorshift generator: the test's texts are the same at every run.
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A letter or digit.
    fn char(&mut self) -> char {
        const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        char::from(CHARS[(self.next() % CHARS.len() as u64) as usize])
    }
}

/// A JSON string whose text is `bytes` long: unrelated random letters, the
/// case where the crate's cost grows with the square of the size.
fn unrelated(random: &mut Xorshift, bytes: usize) -> Value {
    Value::String((0..bytes - 2).map(|_| random.char()).collect())
}

/// A JSON string whose text is `bytes` long, made of one 16-byte block
/// repeated, its letters in an order of `stride`: every 16-byte window has
/// the same letters, so the crate walks its longest hash chains at every
/// byte (its slowest case at a given size).
fn chained(random: &mut Xorshift, stride: usize, bytes: usize) -> Value {
    let block: Vec<char> = (0..16).map(|_| random.char()).collect();
    Value::String((0..bytes - 2).map(|i| block[(i * stride) % 16]).collect())
}

/// The publications, in order: four at the delta bound (each after the
/// first a delta), two large ones (the second a delta of unrelated text
/// when computed), four at the bound again (the first whole after a large
/// one).
fn publications() -> Vec<Value> {
    let mut random = Xorshift(0x9e37_79b9_7f4a_7c15);
    let small = |random: &mut Xorshift, n: usize| chained(random, 1 + 2 * (n % 8), SMALL_BYTES);
    let mut all: Vec<Value> = (0..4).map(|n| small(&mut random, n)).collect();
    all.push(unrelated(&mut random, LARGE_BYTES));
    all.push(unrelated(&mut random, LARGE_BYTES));
    all.extend((4..8).map(|n| small(&mut random, n)));
    all
}

/// One subscriber's decoding, as the SDK does it: a delta applies to the
/// previous publication's JSON text, whole data replaces it.
#[derive(Default)]
struct Decoder {
    previous: Option<String>,
    deltas: usize,
}

impl Decoder {
    /// The value of publication `publication` (a push's `pub`).
    fn decode(&mut self, publication: &Value) -> Value {
        let data = publication["data"].as_str().expect("data as a JSON string");
        let text = if publication["delta"] == true {
            self.deltas += 1;
            let previous = self.previous.as_ref().expect("a delta after a publication");
            let applied = fossil_delta::apply(previous.as_bytes(), data.as_bytes())
                .expect("the delta applies");
            String::from_utf8(applied).expect("UTF-8 text")
        } else {
            data.to_owned()
        };
        let value = serde_json::from_str(&text).expect("JSON text");
        self.previous = Some(text);
        value
    }
}

/// A holder with a 5 s lease (renewals every 833 ms, a safety deadline
/// 4.17 s after the last renewal was sent) serves 8 subscribers with
/// Fossil delta while publications of 512 KiB (over the delta bound) and
/// of 16 KiB whose deltas are the crate's slowest are published: it holds
/// the lease throughout with the same token, each renewal was sent before
/// the safety deadline of the one before it (the design's bound), and
/// each subscriber decodes every publication in order at its offset, some
/// of them from deltas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_fossil_deltas_leave_the_lease_renewals_on_time() {
    let place = Place::new(Backend::Sqlite).await;
    let mut config = ServerConfig {
        max_message_bytes: 1024 * 1024,
        ..ServerConfig::default()
    };
    config.namespaces.insert(
        "delta".to_owned(),
        NamespaceRule {
            fossil_delta: Some(true),
            ..NamespaceRule::default()
        },
    );
    let lease_config = LeaseConfig::for_ttl(Duration::from_secs(5));
    let window = lease_config.safe_window();
    let node = Node::start_with_lease(&place, "node-a", Role::Holder, config, lease_config).await;
    let LeaseState::Holder { lease, .. } = node.lease.state() else {
        panic!("not holder: {:?}", node.lease.state());
    };
    // Every state the supervisor publishes from now on.
    let mut states = node.lease.subscribe();
    let seen = tokio::spawn(async move {
        let mut seen = vec![states.borrow_and_update().clone()];
        while states.changed().await.is_ok() {
            seen.push(states.borrow_and_update().clone());
        }
        seen
    });

    let mut clients = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let (mut c, _) = Client::connect(&node, "").await;
        let r = c
            .command(
                "subscribe",
                json!({"channel": "delta:doc", "delta": "fossil"}),
            )
            .await;
        assert_eq!(r["subscribe"]["delta"], true, "{r}");
        clients.push(c);
    }
    let published = publications();
    let load = async {
        for data in &published {
            let (status, body) = node.publish("delta:doc", data.clone()).await;
            assert_eq!(status, 201, "{body}; lease {:?}", node.lease.state());
        }
        let readers = clients.iter_mut().map(|c| {
            let published = &published;
            async move {
                let mut decoder = Decoder::default();
                for (i, want) in published.iter().enumerate() {
                    let push = c.push().await;
                    let publication = &push["pub"];
                    assert_eq!(publication["offset"], i as u64 + 1, "in order, once");
                    assert!(
                        decoder.decode(publication) == *want,
                        "publication {}",
                        i + 1
                    );
                }
                decoder.deltas
            }
        });
        futures::future::join_all(readers).await
    };
    let lost = node
        .lease
        .wait_for(|s| !matches!(s, LeaseState::Holder { lease: l, .. } if l.token == lease.token));
    let deltas = tokio::select! {
        deltas = load => deltas,
        state = lost => panic!("the holder lost the lease under the load: {state:?}"),
    };
    assert!(
        deltas.iter().all(|&n| n >= 1),
        "every subscriber decoded deltas: {deltas:?}"
    );

    // One more renewal after the load: renewals go on.
    let last = match node.lease.state() {
        LeaseState::Holder {
            safety_deadline, ..
        } => safety_deadline,
        other => panic!("not holder after the load: {other:?}"),
    };
    within(
        "a renewal after the load",
        NODE_WAIT,
        node.lease.wait_for(|s| {
            !matches!(s, LeaseState::Holder { safety_deadline, .. } if *safety_deadline <= last)
        }),
    )
    .await;
    node.stop_lease();
    let mut seen = within("the supervisor's end", NODE_WAIT, seen)
        .await
        .unwrap();
    // The end of the test's own stop.
    while matches!(
        seen.last(),
        Some(LeaseState::Stopped {
            reason: StopReason::Drained { .. }
        })
    ) {
        seen.pop();
    }
    let mut deadlines = Vec::new();
    for state in &seen {
        match state {
            LeaseState::Holder {
                lease: held,
                safety_deadline,
            } if held.token == lease.token => deadlines.push(*safety_deadline),
            other => panic!("the holder left its lease: {other:?} (seen: {seen:?})"),
        }
    }
    assert!(deadlines.len() >= 2, "renewals seen: {seen:?}");
    for pair in deadlines.windows(2) {
        // A renewal sent at `sent` moves the deadline to `sent + window`;
        // it was on time when sent before the deadline it replaced.
        let sent = pair[1].saturating_sub(window);
        assert!(
            sent <= pair[0],
            "a renewal was sent {:?} after the safety deadline",
            sent.duration_since(pair[0])
        );
    }
}

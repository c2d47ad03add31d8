//! The run's clients and what they record: careful publishers, reconnecting
//! SSE subscribers and the status monitor that spots takeovers. Independent
//! of `herald-testkit`'s clients on purpose (see the crate's docs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use herald_chaos::history::{Event, PublishResult};
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::node::Urls;

/// Bound of one publish request, answer included (a forward alone may take
/// 5 s).
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(7);

/// Attempts of one message before a publisher gives it up.
const MAX_ATTEMPTS: u32 = 40;

/// Bound of opening an SSE stream, and of the silence between two events
/// after which a subscriber reconnects. Longer than the checker's stall
/// bound ([`herald_chaos::checker::STALL_MS`]), so that a connection that
/// stalls is judged before the subscriber gives up on it.
const SSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Bound of one status request.
const STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// How often the monitor looks at every node's status.
const STATUS_POLL: Duration = Duration::from_millis(200);

/// The history being recorded, with the run's clock.
#[derive(Clone)]
pub(crate) struct Recorder {
    start: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Recorder {
    /// A recorder whose zero is now.
    pub(crate) fn new() -> Self {
        Self {
            start: Instant::now(),
            events: Arc::default(),
        }
    }

    /// Milliseconds since the run's start.
    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Appends an event.
    pub(crate) fn push(&self, event: Event) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
    }

    /// Everything recorded so far.
    pub(crate) fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A publisher: each message has a unique id (in its data) used as its
/// `Idempotency-Key`; on anything but an acknowledgement or a definite
/// refusal it retries the same message on the next node, up to
/// [`MAX_ATTEMPTS`] times. It stops after the attempt in flight when `stop`
/// is cancelled.
pub(crate) fn publisher(
    worker: usize,
    channel: String,
    urls: Urls,
    recorder: Recorder,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let http = urls
            .client()
            .timeout(PUBLISH_TIMEOUT)
            .build()
            .expect("an HTTP client");
        let client = format!("publisher-{worker}");
        let attempt = Attempt {
            http: &http,
            recorder: &recorder,
            client: &client,
            urls: &urls,
        };
        let mut node = worker;
        let mut seq = 0u64;
        'messages: while !stop.is_cancelled() {
            seq += 1;
            let id = format!("p{worker}-{seq}");
            for _ in 0..MAX_ATTEMPTS {
                if stop.is_cancelled() {
                    break 'messages;
                }
                if attempt.publish(node % urls.len(), &channel, &id).await {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue 'messages;
                }
                node += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    })
}

/// Bound of one request of [`stale_route_publisher`]: short, so that it
/// keeps probing the node it is stuck on.
const STALE_TIMEOUT: Duration = Duration::from_secs(2);

/// A client whose route still points at one node (a load balancer or a
/// client-side cache that has not noticed a failover): it publishes to node
/// `index` alone, alternating `channels`, one message at a time, each sent
/// once (a new id per message, used as its `Idempotency-Key`; a failed
/// message is given up, not retried elsewhere), until `stop` is cancelled;
/// the request in flight then still finishes and is recorded.
/// Messages are named `<name>-<n>`, so `name` must be unique in the run.
///
/// A resumed holder must refuse or forward every one of these: it gets
/// requests straight away whatever the other clients did, so what it
/// does with a stale lease is always judged by the checker.
pub(crate) fn stale_route_publisher(
    name: String,
    index: usize,
    channels: Vec<String>,
    urls: Urls,
    recorder: Recorder,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let http = urls
            .client()
            .timeout(STALE_TIMEOUT)
            .build()
            .expect("an HTTP client");
        let attempt = Attempt {
            http: &http,
            recorder: &recorder,
            client: &name,
            urls: &urls,
        };
        let mut seq = 0u64;
        while !stop.is_cancelled() {
            seq += 1;
            let id = format!("{name}-{seq}");
            let channel = &channels[usize::try_from(seq).unwrap_or(0) % channels.len()];
            // Never cut short: every message sent is recorded with what
            // its client learned, or the checker would find it stored
            // without a publisher.
            attempt.publish(index, channel, &id).await;
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    })
}

/// One publish attempt of a client, recorded in the history.
struct Attempt<'a> {
    http: &'a reqwest::Client,
    recorder: &'a Recorder,
    /// The client's name in the history.
    client: &'a str,
    urls: &'a Urls,
}

impl Attempt<'_> {
    /// Publishes message `id` (also its `Idempotency-Key`) to `channel` on
    /// node `index`, records the attempt with what the client learned, and
    /// returns whether it was acknowledged.
    async fn publish(&self, index: usize, channel: &str, id: &str) -> bool {
        let invoke_ms = self.recorder.now_ms();
        let result = publish_once(self.http, &self.urls.get(index), channel, id).await;
        let acked = matches!(result, PublishResult::Acked { .. });
        self.recorder.push(Event::Publish {
            client: self.client.to_owned(),
            node: format!("node-{index}"),
            channel: channel.to_owned(),
            id: id.to_owned(),
            idempotency_key: Some(id.to_owned()),
            invoke_ms,
            complete_ms: self.recorder.now_ms(),
            result,
        });
        acked
    }
}

async fn publish_once(
    http: &reqwest::Client,
    base: &str,
    channel: &str,
    id: &str,
) -> PublishResult {
    let sent = http
        .post(format!("{base}/v1/channels/{channel}/messages"))
        .header("Idempotency-Key", id)
        .json(&json!({ "data": { "id": id } }))
        .send()
        .await;
    let resp = match sent {
        Ok(resp) => resp,
        Err(e) => return PublishResult::transport_error(describe(&e)),
    };
    let status = resp.status().as_u16();
    let body: Value = match resp.bytes().await {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        Err(e) => return PublishResult::transport_error(describe(&e)),
    };
    if status == 200 || status == 201 {
        return match body["offset"].as_u64() {
            Some(offset) => PublishResult::Acked { offset },
            None => PublishResult::transport_error(format!("{status} without an offset")),
        };
    }
    let code = body["error"]["code"]
        .as_str()
        .map_or_else(|| status.to_string(), str::to_owned);
    PublishResult::from_error(status, &code)
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".to_owned()
    } else if e.is_connect() {
        "connect".to_owned()
    } else {
        "broken connection".to_owned()
    }
}

/// A subscriber that follows `channel` over SSE on node `home`, resuming
/// with `Last-Event-ID` after whatever it received last; when its node
/// cannot be reached it tries the next ones. Returns the last offset seen
/// through `last`.
pub(crate) fn subscriber(
    home: usize,
    channel: String,
    urls: Urls,
    recorder: Recorder,
    last: Arc<AtomicU64>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let name = format!("subscriber-{home}-{channel}");
        let http = urls
            .client()
            .connect_timeout(SSE_TIMEOUT)
            .build()
            .expect("an HTTP client");
        let mut node = home;
        while !stop.is_cancelled() {
            let index = node % urls.len();
            let base = urls.get(index);
            let node_id = format!("node-{index}");
            let after = last.load(Ordering::SeqCst);
            let request = http
                .get(format!("{base}/v1/channels/{channel}/events"))
                .header("accept", "text/event-stream")
                .header("Last-Event-ID", after.to_string())
                .send();
            let resp = tokio::select! {
                () = stop.cancelled() => break,
                r = tokio::time::timeout(SSE_TIMEOUT, request) => r,
            };
            let resp = match resp {
                Ok(Ok(resp)) if resp.status().is_success() => resp,
                _ => {
                    node += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            recorder.push(Event::Subscribe {
                subscriber: name.clone(),
                node: node_id.clone(),
                channel: channel.clone(),
                after,
                at_ms: recorder.now_ms(),
            });
            let mut events = resp.bytes_stream().eventsource();
            loop {
                let next = tokio::select! {
                    () = stop.cancelled() => break,
                    n = tokio::time::timeout(SSE_TIMEOUT, events.next()) => n,
                };
                let event = match next {
                    Ok(Some(Ok(event))) => event,
                    _ => break,
                };
                if event.event == "truncated" {
                    // Retention removed what this subscriber had not got:
                    // it goes on at `earliest` (the checker judges it).
                    let Ok(notice) = serde_json::from_str::<Value>(&event.data) else {
                        break;
                    };
                    let (Some(requested_after), Some(earliest)) = (
                        notice["requested_after"].as_u64(),
                        notice["earliest"].as_u64(),
                    ) else {
                        break;
                    };
                    recorder.push(Event::Truncated {
                        subscriber: name.clone(),
                        node: node_id.clone(),
                        channel: channel.clone(),
                        requested_after,
                        earliest,
                        at_ms: recorder.now_ms(),
                    });
                    last.store(earliest.saturating_sub(1), Ordering::SeqCst);
                    continue;
                }
                if event.event != "message" {
                    continue;
                }
                let Ok(message) = serde_json::from_str::<Value>(&event.data) else {
                    break;
                };
                let Some(offset) = message["offset"].as_u64() else {
                    break;
                };
                let id = message["data"]["id"]
                    .as_str()
                    .map_or_else(|| message["data"].to_string(), str::to_owned);
                recorder.push(Event::Delivery {
                    subscriber: name.clone(),
                    node: node_id.clone(),
                    channel: channel.clone(),
                    offset,
                    id,
                    at_ms: recorder.now_ms(),
                });
                last.store(offset, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// One look at a node's status.
#[derive(Clone, Debug, Default)]
pub(crate) struct Seen {
    /// The node answered and said it is holder.
    pub(crate) holder: bool,
    /// The fencing token in its answer.
    pub(crate) token: u64,
}

/// Polls every node's `/v1/status` every 200 ms and records a `Takeover`
/// whenever a node's role turns to `holder`.
pub(crate) fn monitor(urls: Urls, recorder: Recorder, stop: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let http = urls
            .client()
            .timeout(STATUS_TIMEOUT)
            .build()
            .expect("an HTTP client");
        let mut seen: Vec<Seen> = Vec::new();
        while !stop.is_cancelled() {
            let looks =
                futures::future::join_all((0..urls.len()).map(|i| status(&http, urls.get(i))))
                    .await;
            seen.resize(looks.len(), Seen::default());
            for (i, look) in looks.into_iter().enumerate() {
                let now = look.unwrap_or_default();
                if now.holder && !seen[i].holder {
                    recorder.push(Event::Takeover {
                        node: format!("node-{i}"),
                        token: now.token,
                        at_ms: recorder.now_ms(),
                    });
                }
                seen[i] = now;
            }
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(STATUS_POLL) => {}
            }
        }
    })
}

/// One look at a node's status; `None` when it did not answer.
pub(crate) async fn status(http: &reqwest::Client, base: String) -> Option<Seen> {
    let resp = http.get(format!("{base}/v1/status")).send().await.ok()?;
    let body: Value = resp.json().await.ok()?;
    Some(Seen {
        holder: body["role"] == "holder",
        token: body["lease"]["token"].as_u64().unwrap_or(0),
    })
}

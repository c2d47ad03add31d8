//! The run's Durable Streams clients (docs/durable-streams.md): idempotent
//! producers and SSE followers, recorded as the other clients are, so
//! that the checker judges them by the same rules.
//!
//! - A producer owns one JSON stream: it creates it, then appends
//!   `{"id": ...}` one message at a time as producer `<stream>` in epoch 0
//!   with sequence numbers 0, 1, 2, ..., sending an append that failed
//!   again with the same sequence number, on the next node, until it is
//!   acknowledged (a new one would be a gap). Each attempt is an
//!   [`Event::Publish`] whose `idempotency_key` names the producer, epoch
//!   and sequence: the checker holds every acknowledged append stored once
//!   at its offset, and a retry never stored twice. A duplicate's answer
//!   (`204` with the producer's last sequence) carries the stream's head,
//!   which is that append's offset: the producer is the stream's only
//!   writer and waits for each answer.
//! - A follower reads a stream over SSE or long-poll from the offset it
//!   reached ([`Event::Subscribe`]), and records each message of a data
//!   event (an answer, in long-poll) as a [`Event::Delivery`] at the
//!   offsets after it (one offset per message); the control event that
//!   follows (the answer's `Stream-Next-Offset`) must name the offset
//!   after the last. A `410` for an offset that retention removed is
//!   recorded as an [`Event::Truncated`] to the `earliest` it names, which
//!   the checker holds to the channel's final earliest.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use herald_chaos::history::{Event, PublishResult};
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::clients::Recorder;
use super::node::Urls;

/// Bound of one append or creation, answer included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(7);

/// Bound of opening an SSE stream, and of the silence between two events
/// after which a follower reconnects (the nodes send a keep-alive every
/// second).
const SSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The stream URL path of `channel` (its `:` are the path's `/`).
pub(crate) fn path_of(channel: &str) -> String {
    format!("/ds/{}", channel.replace(':', "/"))
}

/// The Herald offset a Durable Streams offset names (the part after `_`).
fn herald_offset(offset: &str) -> Option<u64> {
    offset.split_once('_')?.1.parse().ok()
}

/// A producer of `channel`'s stream (see the module's documentation),
/// starting on node `home`, until `stop` is cancelled (the append in
/// flight then finishes and is recorded).
pub(crate) fn producer(
    home: usize,
    channel: String,
    urls: Urls,
    recorder: Recorder,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let http = urls
            .client()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .expect("an HTTP client");
        let client = format!("producer-{channel}");
        let path = path_of(&channel);
        let mut node = home;
        // Create the stream (idempotent: a repeat is 200).
        loop {
            if stop.is_cancelled() {
                return;
            }
            let created = http
                .put(format!("{}{path}", urls.get(node % urls.len())))
                .header("content-type", "application/json")
                .send()
                .await;
            if created.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            node += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut seq = 0u64;
        'appends: while !stop.is_cancelled() {
            let id = format!("{client}-{seq}");
            loop {
                let index = node % urls.len();
                let invoke_ms = recorder.now_ms();
                let result = append(&http, &urls.get(index), &path, &client, seq, &id).await;
                let acked = matches!(result, PublishResult::Acked { .. });
                recorder.push(Event::Publish {
                    client: client.clone(),
                    node: format!("node-{index}"),
                    channel: channel.clone(),
                    id: id.clone(),
                    idempotency_key: Some(format!("{client}:0:{seq}")),
                    invoke_ms,
                    complete_ms: recorder.now_ms(),
                    result,
                });
                if acked {
                    seq += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue 'appends;
                }
                if stop.is_cancelled() {
                    break 'appends;
                }
                node += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    })
}

/// One append attempt: what the producer learned.
async fn append(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    producer: &str,
    seq: u64,
    id: &str,
) -> PublishResult {
    let sent = http
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .header("producer-id", producer)
        .header("producer-epoch", "0")
        .header("producer-seq", seq.to_string())
        .body(serde_json::json!({ "id": id }).to_string())
        .send()
        .await;
    let resp = match sent {
        Ok(resp) => resp,
        Err(e) => return PublishResult::transport_error(e.to_string()),
    };
    let status = resp.status().as_u16();
    let next = resp
        .headers()
        .get("stream-next-offset")
        .and_then(|v| v.to_str().ok())
        .and_then(herald_offset);
    if status == 200 || status == 204 {
        return match next {
            Some(offset) => PublishResult::Acked { offset },
            None => PublishResult::transport_error(format!("{status} without an offset")),
        };
    }
    let body: Value = match resp.bytes().await {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        Err(e) => return PublishResult::transport_error(e.to_string()),
    };
    let code = body["error"]["code"]
        .as_str()
        .map_or_else(|| status.to_string(), str::to_owned);
    PublishResult::from_error(status, &code)
}

/// How a follower reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Live {
    /// `live=sse`.
    Sse,
    /// `live=long-poll`.
    LongPoll,
}

impl Live {
    fn param(self) -> &'static str {
        match self {
            Self::Sse => "sse",
            Self::LongPoll => "long-poll",
        }
    }
}

/// What a refused read answered: `Some(earliest)` for a `410` that names
/// the stream's earliest offset.
async fn gone(resp: reqwest::Response) -> Option<u64> {
    if resp.status().as_u16() != 410 {
        return None;
    }
    let body: Value = serde_json::from_slice(&resp.bytes().await.ok()?).ok()?;
    body["error"]["earliest"].as_u64()
}

/// A follower of `channel`'s stream over SSE or long-poll, starting on
/// node `home` and moving to the next node when its node cannot be
/// reached; the offset it reached is kept in `last`.
pub(crate) fn follower(
    home: usize,
    live: Live,
    channel: String,
    urls: Urls,
    recorder: Recorder,
    last: Arc<AtomicU64>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let name = format!("stream-follower-{}-{home}-{channel}", live.param());
        let http = urls
            .client()
            .connect_timeout(SSE_TIMEOUT)
            .build()
            .expect("an HTTP client");
        let path = path_of(&channel);
        let mut node = home;
        while !stop.is_cancelled() {
            let index = node % urls.len();
            let node_id = format!("node-{index}");
            let after = last.load(Ordering::SeqCst);
            let url = |after: u64| {
                format!(
                    "{}{path}?offset={:016}_{after:016}&live={}",
                    urls.get(index),
                    0,
                    live.param()
                )
            };
            let resp = tokio::select! {
                () = stop.cancelled() => break,
                r = tokio::time::timeout(SSE_TIMEOUT, http.get(url(after)).send()) => r,
            };
            let resp = match resp {
                Ok(Ok(resp)) if resp.status().is_success() => resp,
                Ok(Ok(resp)) if resp.status().as_u16() == 410 => {
                    if let Some(earliest) = gone(resp).await {
                        truncated(&recorder, &name, &node_id, &channel, after, earliest);
                        last.store(earliest.saturating_sub(1), Ordering::SeqCst);
                    }
                    continue;
                }
                _ => {
                    // Not reachable, or the stream not created yet.
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
            if live == Live::LongPoll {
                long_poll(
                    &http, resp, &url, &recorder, &name, &node_id, &channel, &last, &stop,
                )
                .await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let mut at = after;
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
                if event.event == "control" {
                    let control: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
                    let named = control["streamNextOffset"].as_str().and_then(herald_offset);
                    if named != Some(at) {
                        // The control must name the offset after the data
                        // it follows; anything else ends the connection,
                        // and the follower resumes where it stood.
                        break;
                    }
                    last.store(at, Ordering::SeqCst);
                    continue;
                }
                if event.event != "data" {
                    continue;
                }
                match record_items(
                    &recorder,
                    &name,
                    &node_id,
                    &channel,
                    at,
                    event.data.as_bytes(),
                ) {
                    Some(end) => at = end,
                    None => break,
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Records that retention removed the messages after `after` below
/// `earliest` (the `410`'s body).
fn truncated(
    recorder: &Recorder,
    name: &str,
    node: &str,
    channel: &str,
    after: u64,
    earliest: u64,
) {
    recorder.push(Event::Truncated {
        subscriber: name.to_owned(),
        node: node.to_owned(),
        channel: channel.to_owned(),
        requested_after: after,
        earliest,
        at_ms: recorder.now_ms(),
    });
}

/// Records the messages of `body`, a JSON array (a data event, or a
/// long-poll answer), at the offsets after `after`; returns the offset of
/// the last, or `None` when `body` is not an array.
fn record_items(
    recorder: &Recorder,
    name: &str,
    node: &str,
    channel: &str,
    after: u64,
    body: &[u8],
) -> Option<u64> {
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    let mut at = after;
    for item in items {
        at += 1;
        let id = item["id"]
            .as_str()
            .map_or_else(|| item.to_string(), str::to_owned);
        recorder.push(Event::Delivery {
            subscriber: name.to_owned(),
            node: node.to_owned(),
            channel: channel.to_owned(),
            offset: at,
            id,
            at_ms: recorder.now_ms(),
        });
    }
    Some(at)
}

/// Records the messages of one long-poll answer ([`record_items`]); its
/// `Stream-Next-Offset` must name the last. Returns the offset reached,
/// or `None` when the answer breaks that rule or does not parse.
fn delivered(
    recorder: &Recorder,
    name: &str,
    node: &str,
    channel: &str,
    after: u64,
    next: Option<u64>,
    body: &[u8],
) -> Option<u64> {
    record_items(recorder, name, node, channel, after, body).filter(|at| next == Some(*at))
}

/// Follows with long-polls from the first answer `first` until a request
/// fails (the caller reconnects and records a new subscription).
#[allow(clippy::too_many_arguments)]
async fn long_poll(
    http: &reqwest::Client,
    first: reqwest::Response,
    url: &(dyn Fn(u64) -> String + Sync),
    recorder: &Recorder,
    name: &str,
    node: &str,
    channel: &str,
    last: &AtomicU64,
    stop: &CancellationToken,
) {
    let mut resp = first;
    loop {
        let after = last.load(Ordering::SeqCst);
        let next = resp
            .headers()
            .get("stream-next-offset")
            .and_then(|v| v.to_str().ok())
            .and_then(herald_offset);
        match resp.status().as_u16() {
            200 => {
                let Ok(body) = resp.bytes().await else { return };
                match delivered(recorder, name, node, channel, after, next, &body) {
                    Some(at) => last.store(at, Ordering::SeqCst),
                    None => return,
                }
            }
            204 if next == Some(after) => {}
            410 => {
                if let Some(earliest) = gone(resp).await {
                    truncated(recorder, name, node, channel, after, earliest);
                    last.store(earliest.saturating_sub(1), Ordering::SeqCst);
                }
                return;
            }
            _ => return,
        }
        let after = last.load(Ordering::SeqCst);
        resp = tokio::select! {
            () = stop.cancelled() => return,
            r = tokio::time::timeout(SSE_TIMEOUT, http.get(url(after)).send()) => match r {
                Ok(Ok(resp)) => resp,
                _ => return,
            },
        };
    }
}

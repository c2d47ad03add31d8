//! `GET /v1/channels/{channel}/events`: a channel as Server-Sent Events
//! (WHATWG HTML, "Server-sent events").
//!
//! Each message is one event: `id: <offset>`, `event: message`,
//! `data: {"offset","data","published_at"}`. When the subscriber's
//! position is below the channel's earliest offset (retention trimmed
//! what it had not got yet), one `event: truncated` with
//! `{"requested_after","earliest"}` comes first and the stream goes on at
//! `earliest`. A subscriber that may not read the channel's history
//! (`history = false`) starts at the head; its resume point is honoured
//! only within the history resume window, else one `event:
//! history_withheld` with `{"requested_after","head"}` (and `id: head`)
//! comes first and the stream goes on after the head (see
//! `subscription.rs`). When the channel is deleted, `event: deleted` with
//! `{"head"}` ends the stream. A comment line is sent every
//! `heartbeat` so that proxies keep the connection open. The client resumes
//! with the standard `Last-Event-ID` header (or `?after=N`). On drain the
//! stream simply ends; an `EventSource` reconnects to another node and
//! resumes where it stopped. The stream opens with `retry: 1000`
//! ([`RECONNECT_DELAY`]), so that reconnection waits one second rather
//! than the browser's default (about 3 s in Chromium and Firefox; the
//! spec leaves it to the user agent).
//!
//! A transient storage failure never becomes an error answer: in WHATWG
//! HTML, "Server-sent events", section "Processing model", an `EventSource`
//! that gets any answer other than `200` with `text/event-stream` "fails
//! the connection" for good (it never reconnects), whereas a stream that
//! ends or breaks is "reestablished" with `Last-Event-ID`. So once the
//! request is valid the answer is `200`, and a history or catch-up read
//! that fails transiently is waited out inside the stream (heartbeats go on
//! meanwhile; see `subscription.rs`). Bad input is still answered `400`
//! before the stream starts, and missing or bad credentials `401`, a
//! channel the credentials do not grant `403` (`auth`).
//!
//! A subscription made with a token ends when the token expires (its
//! `exp`): the last event is `event: token_expired` with the data
//! `{"code":"token_expired"}`, then the stream ends. The client opens a
//! new one with a fresh token and `Last-Event-ID` (or `?after=`), and gets
//! every message after the last one it saw.

use std::convert::Infallible;

use axum::extract::State;
use axum::http::header::CACHE_CONTROL;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use herald_core::Message;

use super::state::ApiState;
use herald_http::auth_extract::Subscriber;
use herald_http::error::Result;
use herald_http::extract::{resume_point, AfterQuery, ChannelPath, ValidQuery};
use herald_node::subscription::{Item, StartAt, Subscription};

/// Tells nginx-style proxies not to buffer the stream.
const X_ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

/// The reconnection time every event stream announces first (`retry:`, in
/// ms; WHATWG HTML, "Server-sent events", the `retry` field). One second:
/// after a node stops, the client's next attempt reaches a front that
/// already routes to a live node (a takeover of the writer lease takes
/// about 100 ms; reads never wait for one), while thousands of clients
/// reconnecting at once still come at most once a second each, not in a
/// tight loop. `EventSource` never adds jitter of its own.
pub(crate) const RECONNECT_DELAY: std::time::Duration = std::time::Duration::from_millis(1000);

/// The event that ends a subscription whose token expired.
const TOKEN_EXPIRED_EVENT: &str = "token_expired";

/// Opens the event stream (see the module docs): `400` for bad input,
/// `401`/`403` for credentials that do not grant the channel, `503
/// storage_unavailable` only when the storage fails with an error that is
/// not transient, else `200`.
pub(crate) async fn events(
    State(state): State<ApiState>,
    Subscriber(who): Subscriber,
    ChannelPath(channel): ChannelPath,
    headers: HeaderMap,
    ValidQuery(query): ValidQuery<AfterQuery>,
) -> Result<Response> {
    let shared = &state.shared;
    shared.auth().may_subscribe(&who, &channel)?;
    let start = StartAt::new(
        resume_point(&headers, &query)?,
        shared.auth().live_only_window(&who, &channel),
    );
    let expiry = who
        .token()
        .map(|token| Box::pin(tokio::time::sleep(token.time_left())));
    let sub = Subscription::start_paged(
        shared.node.storage().clone(),
        shared.node.hub(),
        channel,
        start,
        "sse",
        shared.settings.read_page_messages(),
    )
    .await?;
    let stream = futures::stream::unfold(Some((sub, expiry)), |open| async move {
        let (mut sub, mut expiry) = open?;
        let next = match expiry.as_mut() {
            Some(expired) => tokio::select! {
                // Expiry first: a busy channel does not keep it open.
                biased;
                () = expired.as_mut() => None,
                next = sub.next_item() => Some(next),
            },
            None => Some(sub.next_item().await),
        };
        match next {
            Some(Ok(Some(item))) => {
                Some((Ok::<_, Infallible>(item_event(&item)), Some((sub, expiry))))
            }
            None => {
                tracing::debug!(channel = %sub.channel(), "SSE stream ends: the token expired");
                let last = Event::default()
                    .event(TOKEN_EXPIRED_EVENT)
                    .data(r#"{"code":"token_expired"}"#);
                Some((Ok(last), None))
            }
            // Ended, or a storage failure that is not transient: finish the
            // body; the client resumes.
            Some(ended) => {
                if let Err(e) = ended {
                    e.log();
                }
                tracing::debug!(channel = %sub.channel(), "SSE stream ends");
                None
            }
        }
    })
    .take_until(shared.shutdown.clone().cancelled_owned());
    let retry = Event::default().retry(RECONNECT_DELAY);
    let stream = futures::stream::once(async move { Ok(retry) }).chain(stream);
    let sse = Sse::new(stream).keep_alive(KeepAlive::new().interval(shared.settings.heartbeat));
    Ok((
        [
            (X_ACCEL_BUFFERING, HeaderValue::from_static("no")),
            // `no-transform`: a compressing proxy must not buffer the
            // stream to compress it (RFC 9111 §5.2.2.6).
            (
                CACHE_CONTROL,
                HeaderValue::from_static("no-cache, no-transform"),
            ),
        ],
        sse,
    )
        .into_response())
}

/// One item as an SSE event: a message, or `event: truncated` (with
/// `id: earliest − 1`, so that a reconnecting `EventSource` resumes where
/// the stream goes on), or `event: history_withheld` (with `id: head`,
/// likewise), or `event: deleted` (the stream ends after it).
fn item_event(item: &Item) -> Event {
    match item {
        Item::Message(message) => event(message),
        Item::Truncated { earliest, .. } => Event::default()
            .id(earliest.saturating_sub(1).to_string())
            .event("truncated")
            .data(item.control_json(false).unwrap_or_default()),
        Item::Withheld { head, .. } => Event::default()
            .id(head.to_string())
            .event("history_withheld")
            .data(item.control_json(false).unwrap_or_default()),
        Item::Deleted { .. } => Event::default()
            .event("deleted")
            .data(item.control_json(false).unwrap_or_default()),
        // Only a subscription that ends at closure hands it out (Durable
        // Streams' followers); this one does not ask for it.
        Item::Closed { .. } => Event::default()
            .event("closed")
            .data(item.control_json(false).unwrap_or_default()),
    }
}

/// One message as an SSE event.
fn event(message: &Message) -> Event {
    let data = serde_json::to_string(message).unwrap_or_else(|e| {
        // Message's fields are a number, raw JSON and a string: this cannot
        // fail; keep the stream going if it ever does.
        tracing::error!(offset = message.offset, error = %e, "message did not serialize");
        "null".to_owned()
    });
    Event::default()
        .id(message.offset.to_string())
        .event("message")
        .data(data)
}

//! `GET ?live=sse`: a stream followed over Server-Sent Events, as the
//! protocol frames it (PROTOCOL.md, "SSE mode"): each batch of messages is
//! one `event: data` (a JSON array in JSON mode, the text of a `text/*`
//! stream, else standard base64 with `Stream-SSE-Data-Encoding: base64`)
//! followed at once by one `event: control` whose data is
//! `{"streamNextOffset", "streamCursor", "upToDate"}`; a closed stream's
//! last control says `"streamClosed": true` (without a cursor) and the
//! answer ends. The data lines are split at every CR, LF and CRLF, so a
//! payload can never frame an event of its own (the SSE spec, "Parsing an
//! event stream").
//!
//! A task follows the stream (`follow.rs`: what is stored after the
//! offset, then this node's hub's notices, whose messages it sends without
//! reading them again) and writes the events to the answer; every
//! `long_poll_timeout` without news it sends a comment (`:`) and looks at
//! the stream's properties (a standby hears of a close that appends
//! nothing, or of an expiry, that way). A storage read that fails
//! transiently is waited out, the comments going on meanwhile. It ends
//! when the client goes, the stream is deleted (at once, or soft-deleted
//! while forks of it live: both end the same way, without a last event)
//! or closed, or the node drains.
//!
//! A reader that came with a token is followed only until the token's
//! `exp`, as Herald's own SSE does (`api/sse.rs`): the wait has a branch
//! for it and every send is checked against it first, so nothing is sent
//! after the expiry; the last event is then `event: token_expired` with
//! the data `{"code":"token_expired"}`, and the answer ends. The client
//! reads on with a fresh token from the last `streamNextOffset` it got.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::HeaderValue;
use axum::response::Response;
use base64::Engine as _;
use bytes::Bytes;
use herald_core::{media_type, Message, Offset, StreamInfo};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::chunk::{body, start};
use super::follow::{End, Follower};
use super::offset::{self, ReadFrom};
use super::request;
use super::response::set;
use crate::state::StreamsState;
use herald_http::error::Result;

/// Events written ahead of a slow client before the task waits.
const QUEUED_EVENTS: usize = 8;

/// The last event of a reader whose token expired (as Herald's own SSE
/// ends, `api/sse.rs`).
const TOKEN_EXPIRED_EVENT: &str = "event: token_expired\ndata:{\"code\":\"token_expired\"}\n\n";

/// Whether a stream of `content_type` is sent base64-encoded: neither
/// `text/*` nor JSON.
fn is_binary(content_type: &str) -> bool {
    let media = media_type(content_type);
    !(media.starts_with("text/") || media == "application/json")
}

/// Appends `payload` as `data:` lines, split at CR, LF and CRLF.
fn data_lines(out: &mut String, payload: &str) {
    let mut rest = payload;
    loop {
        match rest.find(['\r', '\n']) {
            Some(i) => {
                out.push_str("data:");
                out.push_str(&rest[..i]);
                out.push('\n');
                let skip = if rest[i..].starts_with("\r\n") { 2 } else { 1 };
                rest = &rest[i + skip..];
            }
            None => {
                out.push_str("data:");
                out.push_str(rest);
                out.push('\n');
                return;
            }
        }
    }
}

/// One `event: data` for `messages` of a stream of `content_type`.
fn data_event(content_type: &str, messages: &[Message]) -> String {
    let payload = body(content_type, messages);
    let mut out = String::from("event: data\n");
    if is_binary(content_type) {
        out.push_str("data:");
        out.push_str(&base64::engine::general_purpose::STANDARD.encode(&payload));
        out.push('\n');
    } else {
        data_lines(&mut out, &String::from_utf8_lossy(&payload));
    }
    out.push('\n');
    out
}

/// One `event: control`: the next offset, and the cursor while the stream
/// is open, or `streamClosed` once it is closed and read to its end.
fn control_event(next: Offset, up_to_date: bool, closed: bool, cursor: Option<&str>) -> String {
    let mut fields = vec![format!("\"streamNextOffset\":\"{}\"", offset::format(next))];
    if closed {
        fields.push("\"streamClosed\":true".to_owned());
    } else {
        fields.push(format!(
            "\"streamCursor\":\"{}\"",
            offset::cursor(request::now_ms(), cursor)
        ));
    }
    if up_to_date {
        fields.push("\"upToDate\":true".to_owned());
    }
    format!("event: control\ndata:{{{}}}\n\n", fields.join(","))
}

/// Answers `200` with the event stream and starts the task that writes it;
/// `expires` is when the reader's token expires (`None`: never).
///
/// # Errors
/// 410 `offset_gone` for an offset before what is stored; 503 when the
/// first read of the stream fails with an error that is not transient
/// (a transient one is waited out inside the stream).
pub(crate) async fn serve(
    state: StreamsState,
    info: StreamInfo,
    from: ReadFrom,
    cursor: Option<String>,
    expires: Option<Instant>,
) -> Result<Response> {
    let after = start(&info, from)?;
    let follower = Follower::start(&state, &info, after).await?;
    let (tx, rx) = mpsc::channel::<std::result::Result<Bytes, Infallible>>(QUEUED_EVENTS);
    let binary = is_binary(&info.config.content_type);
    tokio::spawn(follow(state, info, follower, cursor, expires, tx));
    let mut answer = Response::new(Body::from_stream(ReceiverStream::new(rx)));
    let headers = answer.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if binary {
        set(headers, "stream-sse-data-encoding", "base64");
    }
    Ok(answer)
}

/// Whether `expires` has passed.
fn expired(expires: Option<Instant>) -> bool {
    expires.is_some_and(|at| Instant::now() >= at)
}

/// Waits until `expires`; forever when it is `None`.
async fn until(expires: Option<Instant>) {
    match expires {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Writes the events of `follower`'s batches to `tx` until the stream
/// ends, or until `expires` (the reader's token), when the last event is
/// [`TOKEN_EXPIRED_EVENT`]. Every `long_poll_timeout` without a batch it
/// sends a comment and looks at the stream's properties: gone ends the
/// answer, closed is told to the follower (a standby hears of a close that
/// appends nothing only that way).
async fn follow(
    state: StreamsState,
    mut info: StreamInfo,
    mut follower: Follower,
    cursor: Option<String>,
    expires: Option<Instant>,
    tx: mpsc::Sender<std::result::Result<Bytes, Infallible>>,
) {
    // Sent instead of anything else once the token expired.
    let token_expired = |tx: mpsc::Sender<std::result::Result<Bytes, Infallible>>| async move {
        tracing::debug!("Durable Streams SSE ends: the token expired");
        let _ = tx
            .send(Ok(Bytes::from_static(TOKEN_EXPIRED_EVENT.as_bytes())))
            .await;
    };
    let keep_alive = state.config.long_poll_timeout;
    // A reader that stays connected keeps reading: its stream's TTL is
    // restarted every half TTL while it does (the renewals are coalesced
    // per node, `stream_renewals.rs`).
    let mut renewals = info.config.ttl_s.map(|ttl_s| {
        let every = std::time::Duration::from_millis((ttl_s.saturating_mul(1000) / 2).max(250));
        tokio::time::interval_at(tokio::time::Instant::now() + every, every)
    });
    loop {
        let batch = tokio::select! {
            // Expiry first: a busy stream does not keep the reader on.
            biased;
            () = until(expires) => return token_expired(tx).await,
            Some(_) = async { Some(renewals.as_mut()?.tick().await) } => {
                state.shared.node.stream_renewals().note_read(&info);
                continue;
            }
            batch = follower.next_batch() => batch,
            () = tokio::time::sleep(keep_alive) => {
                if tx.send(Ok(Bytes::from_static(b":\n\n"))).await.is_err() {
                    return;
                }
                info = match info_now(&state, &info).await {
                    Some(info) => info,
                    None => return,
                };
                if info.closed {
                    follower.closed_at(info.head);
                }
                continue;
            }
            () = tx.closed() => return,
            () = state.shared.shutdown.cancelled() => return,
        };
        let batch = match batch {
            Ok(batch) => batch,
            Err(e) => {
                e.log();
                tracing::debug!(channel = %info.channel, "SSE stream read failed; the stream ends");
                return;
            }
        };
        let closed = batch.end == Some(End::Closed);
        if let Some(end) = batch.end.filter(|_| !closed) {
            // Deleted (at once, or while forks of it live: both end the
            // same way), or removed before it was read: no last event.
            tracing::debug!(channel = %info.channel, ?end, "SSE stream ends");
            return;
        }
        let mut events = String::new();
        if !batch.messages.is_empty() {
            events.push_str(&data_event(&info.config.content_type, &batch.messages));
        }
        events.push_str(&control_event(
            batch.next,
            batch.up_to_date,
            closed,
            cursor.as_deref(),
        ));
        if expired(expires) {
            return token_expired(tx).await;
        }
        if tx.send(Ok(Bytes::from(events))).await.is_err() || closed {
            return;
        }
    }
}

/// The stream as the storage holds it now; `None` once it is gone:
/// deleted, soft-deleted (deleted while forks of it live), expired, or
/// when the storage fails with an error that is not transient (which ends
/// the stream: the client resumes). While the storage is unavailable the
/// stream is taken as it was (`current`): the look is made again at the
/// next comment.
async fn info_now(state: &StreamsState, current: &StreamInfo) -> Option<StreamInfo> {
    match state
        .shared
        .node
        .storage()
        .stream_info(&current.channel)
        .await
    {
        Ok(info) => info.filter(|info| !info.soft_deleted),
        Err(e @ herald_storage::Error::Unavailable { .. }) => {
            tracing::debug!(channel = %current.channel, error = %e, "SSE stream check failed; looked at again later");
            Some(current.clone())
        }
        Err(e) => {
            tracing::debug!(channel = %current.channel, error = %e, "SSE stream check failed; the stream ends");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_lines_never_frame_an_event() {
        let mut out = String::new();
        data_lines(&mut out, "a\r\n\r\nevent: control\rdata: {}\nb");
        assert_eq!(
            out,
            "data:a\ndata:\ndata:event: control\ndata:data: {}\ndata:b\n"
        );
    }

    #[test]
    fn controls_carry_a_cursor_until_the_stream_is_closed() {
        let open = control_event(3, true, false, None);
        assert!(open.starts_with("event: control\ndata:{\"streamNextOffset\":\"0000000000000000_0000000000000003\",\"streamCursor\":\""));
        assert!(open.ends_with(",\"upToDate\":true}\n\n"));
        let closed = control_event(3, true, true, None);
        assert_eq!(
            closed,
            "event: control\ndata:{\"streamNextOffset\":\"0000000000000000_0000000000000003\",\"streamClosed\":true,\"upToDate\":true}\n\n"
        );
        assert!(is_binary("application/octet-stream") && is_binary("image/png"));
        assert!(!is_binary("text/plain; charset=utf-8") && !is_binary("APPLICATION/JSON"));
    }
}

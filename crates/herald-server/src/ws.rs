//! `GET /v1/channels/{channel}/ws`: a channel over WebSocket (RFC 6455).
//!
//! One text frame per message, `{"offset","data","published_at"}`, in
//! offset order. Two other frames carry a `"type"`: `{"type":"truncated",
//! "requested_after":N,"earliest":M}` when the subscriber's position is
//! below the channel's earliest offset (the messages then go on at M), and
//! `{"type":"deleted","head":N}` when the channel is deleted, followed by
//! a Close with 1000 "channel deleted". Resume with `?after=N` (or a `Last-Event-ID` header, as for
//! SSE). The socket is read concurrently: pings are answered (by the
//! protocol layer), a client Close ends the session, and data frames from
//! the client are **ignored** (the route is read-only). Close codes (RFC
//! 6455 §7.4.1): 1009 "message too big" when the client sends a message
//! or frame over `ws_max_message_bytes`, 1008 "policy violation" when the
//! resume point turns out to be beyond the head only after an outage at
//! the start, 1001 "going away" when the node drains, 1011 when the
//! storage fails mid-stream with an error that is not transient (the client
//! resumes from its last offset).
//!
//! A transient storage failure (the database down or restarting) neither
//! refuses the upgrade nor closes the session: the subscription waits and
//! reads again until the storage answers (see `subscription.rs`), the pings
//! go on meanwhile, and the messages then follow in order. A browser's
//! WebSocket reports a refused handshake only as an error with close code
//! 1006, which clients cannot tell from a permanent refusal.
//!
//! Keepalive: the server sends a Ping frame (RFC 6455 §5.5.2) every
//! `heartbeat` (15 s by default, the SSE heartbeat's period), so that
//! proxies with a read timeout (nginx's `proxy_read_timeout` is 60 s by
//! default) keep an idle subscription open. A client that has sent nothing
//! (no Pong, no other frame) by the next Ping is taken for gone, and its
//! connection is closed without a Close handshake.

use std::time::Duration;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{close_code, CloseFrame, Message as Frame, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::Response;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::api::{resume_after, AfterQuery, ChannelPath, ValidQuery};
use crate::conn_limit::ClientSlot;
use crate::metrics;
use crate::subscription::{Item, Subscription};
use crate::{AppState, Error, Result};

/// How long the server waits for a client to answer its Close frame, or to
/// take a frame, while closing.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Capacity of a session's read buffer, allocated up front for every
/// connection. The WebSocket library's default (128 KiB) made an idle
/// subscriber cost about 130 KB; clients only send control frames (pongs,
/// Close) on this read-only route, so a small buffer is enough, and it
/// grows when a larger frame arrives.
const WS_READ_BUFFER_BYTES: usize = 4096;

/// Validates the request, subscribes, and upgrades. Frames are written out
/// as they are sent (no write buffering), so nothing waits in a buffer.
pub(crate) async fn upgrade(
    State(state): State<AppState>,
    ChannelPath(channel): ChannelPath,
    headers: HeaderMap,
    ValidQuery(query): ValidQuery<AfterQuery>,
    slot: Option<Extension<ClientSlot>>,
    upgrade: std::result::Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response> {
    // Client messages (the server ignores them) and frames are held to
    // `ws_max_message_bytes`: a larger one closes the session with 1009.
    let max = state.config().ws_max_message_bytes;
    let upgrade = upgrade
        .map_err(|r| Error::InvalidUpgrade(r.body_text()))?
        .read_buffer_size(WS_READ_BUFFER_BYTES)
        .write_buffer_size(0)
        .max_message_size(max)
        .max_frame_size(max);
    let after = resume_after(&headers, &query)?;
    let shared = &state.shared;
    let sub =
        Subscription::start(shared.storage.clone(), &shared.hub, channel, after, "ws").await?;
    let shutdown = shared.shutdown.clone();
    let sessions = shared.ws_sessions.clone();
    let heartbeat = shared.config.heartbeat;
    let span = tracing::debug_span!(
        "ws",
        node_id = %shared.config.node_id,
        channel = %sub.channel(),
        after,
    );
    Ok(upgrade.on_upgrade(move |socket| {
        // A proxied client's connection slot lasts as long as the session.
        let slot = slot.map(|Extension(slot)| slot);
        sessions.track_future(
            async move {
                session(socket, sub, heartbeat, shutdown).await;
                drop(slot);
            }
            .instrument(span),
        )
    }))
}

/// Why a session ends.
enum End {
    /// The client closed or went away: nothing more to send.
    ClientGone,
    /// Send this Close frame, then wait briefly for the client's.
    Close(u16, &'static str),
}

/// Runs one WebSocket session until the client leaves (or stops answering
/// the keepalive pings sent every `heartbeat`), the node drains, or the
/// storage fails with an error that is not transient.
async fn session(
    socket: WebSocket,
    mut sub: Subscription,
    heartbeat: Duration,
    shutdown: CancellationToken,
) {
    let (mut tx, mut rx) = socket.split();
    let mut pings = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
    pings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Whether the client sent any frame since the last ping.
    let mut heard = true;
    let end = loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break End::Close(close_code::AWAY, "server is shutting down"),
            incoming = rx.next() => match incoming {
                Some(Ok(Frame::Close(_))) => {
                    // Flushes the protocol's Close reply.
                    let _ = tokio::time::timeout(CLOSE_TIMEOUT, tx.close()).await;
                    break End::ClientGone;
                }
                // Pings are answered by the protocol layer; pongs and data
                // frames only show that the client is there.
                Some(Ok(_)) => heard = true,
                Some(Err(e)) if is_too_big(&e) => {
                    metrics::ws_message_too_big();
                    break End::Close(close_code::SIZE, "message too big");
                }
                None | Some(Err(_)) => break End::ClientGone,
            },
            _ = pings.tick() => {
                if !heard {
                    tracing::debug!(heartbeat_ms = u64::try_from(heartbeat.as_millis()).unwrap_or(u64::MAX), "no pong from the client; closing");
                    break End::ClientGone;
                }
                heard = false;
                tokio::select! {
                    sent = tx.send(Frame::Ping(Default::default())) => if sent.is_err() { break End::ClientGone },
                    () = shutdown.cancelled() => break End::Close(close_code::AWAY, "server is shutting down"),
                }
            }
            next = sub.next_item() => match next {
                Ok(Some(Item::Message(message))) => {
                    let text = match serde_json::to_string(&message) {
                        Ok(text) => text,
                        Err(e) => {
                            tracing::error!(offset = message.offset, error = %e, "message did not serialize");
                            break End::Close(close_code::ERROR, "internal error");
                        }
                    };
                    tokio::select! {
                        sent = tx.send(Frame::Text(text.into())) => if sent.is_err() { break End::ClientGone },
                        () = shutdown.cancelled() => break End::Close(close_code::AWAY, "server is shutting down"),
                    }
                }
                Ok(Some(item)) => {
                    let deleted = matches!(item, Item::Deleted { .. });
                    let text = item.control_json(true).unwrap_or_default();
                    tokio::select! {
                        sent = tx.send(Frame::Text(text.into())) => if sent.is_err() { break End::ClientGone },
                        () = shutdown.cancelled() => break End::Close(close_code::AWAY, "server is shutting down"),
                    }
                    if deleted {
                        break End::Close(close_code::NORMAL, "channel deleted");
                    }
                }
                Ok(None) => break End::Close(close_code::AWAY, "subscription ended"),
                // Found only after an outage at the start (else the
                // upgrade was refused with 409): the client's resume point
                // is foreign to this channel.
                Err(Error::OffsetBeyondHead { .. }) => {
                    break End::Close(close_code::POLICY, "offset_beyond_head");
                }
                // Not transient (those are waited out in `next`).
                Err(e) => {
                    e.log();
                    break End::Close(close_code::ERROR, "storage failed; resume later");
                }
            },
        }
    };
    if let End::Close(code, reason) = end {
        close(tx, rx, code, reason).await;
    }
    tracing::debug!(channel = %sub.channel(), "WebSocket session ended");
}

/// Whether a read error is a client message or frame over the size limit.
fn is_too_big(error: &axum::Error) -> bool {
    std::error::Error::source(error)
        .and_then(|inner| inner.downcast_ref::<tungstenite::Error>())
        .is_some_and(|e| matches!(e, tungstenite::Error::Capacity(_)))
}

/// Sends a Close frame and waits (bounded) for the client's Close reply.
async fn close(
    mut tx: SplitSink<WebSocket, Frame>,
    mut rx: SplitStream<WebSocket>,
    code: u16,
    reason: &'static str,
) {
    let frame = Frame::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }));
    if !matches!(
        tokio::time::timeout(CLOSE_TIMEOUT, tx.send(frame)).await,
        Ok(Ok(()))
    ) {
        return;
    }
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        while let Some(Ok(frame)) = rx.next().await {
            if matches!(frame, Frame::Close(_)) {
                break;
            }
        }
    })
    .await;
}

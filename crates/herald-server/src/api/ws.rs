//! `GET /v1/channels/{channel}/ws`: a channel over WebSocket (RFC 6455).
//!
//! One text frame per message, `{"offset","data","published_at"}`, in
//! offset order. Two other frames carry a `"type"`: `{"type":"truncated",
//! "requested_after":N,"earliest":M}` when the subscriber's position is
//! below the channel's earliest offset (the messages then go on at M), and
//! `{"type":"deleted","head":N}` when the channel is deleted, followed by
//! a Close with 1000 "channel deleted". A subscriber that may not read
//! the channel's history (`history = false`) starts at the head; when its
//! resume point is older than the history resume window, one
//! `{"type":"history_withheld","requested_after":N,"head":H}` comes first
//! and the messages go on after H (see `subscription.rs`). Resume with `?after=N` (or a `Last-Event-ID` header, as for
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
//! Access control (`auth`): the token or API key comes in the
//! `Authorization` or `X-API-Key` header or `?token=`, checked before the
//! upgrade (`401`/`403` as HTTP answers). A browser can also upgrade
//! without credentials and send the token as its first text frame,
//! `{"token":"<JWT>"}`, within 10 s ([`AUTH_FRAME_TIMEOUT`]); until then
//! nothing is sent. A refusal then closes the socket with 4401
//! "unauthorized" (no, bad or late token), 4403 "forbidden" (the token
//! does not grant the channel) or 3005 "token expired". A subscription
//! made with a token is closed with 3005 "token expired" (Centrifugo's
//! code) when the token's `exp` passes; the client reconnects with a fresh
//! token and `?after=<last offset>`.
//!
//! Keepalive: the server sends a Ping frame (RFC 6455 §5.5.2) every
//! `heartbeat` (15 s by default, the SSE heartbeat's period), so that
//! proxies with a read timeout (nginx's `proxy_read_timeout` is 60 s by
//! default) keep an idle subscription open. A client that has sent nothing
//! (no Pong, no other frame) by the next Ping is taken for gone, and its
//! connection is closed without a Close handshake.

use std::time::Duration;

use axum::extract::ws::close_code;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::Response;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use herald_auth::{AuthError, Credential, Principal};
use tokio_tungstenite::tungstenite::Message as Frame;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::state::ApiState;
use herald_http::auth_extract::Subscriber;
use herald_http::conn_limit::ClientSlot;
use herald_http::error::{Error, Result};
use herald_http::extract::{resume_point, AfterQuery, ChannelPath, ValidQuery};
use herald_http::metrics;
use herald_http::websocket::{close, is_too_big, Socket, Upgrade, CLOSE_TIMEOUT};
use herald_node::node_error::NodeError;
use herald_node::subscription::{Item, StartAt, Subscription};

/// How long a client that upgraded without credentials has to send its
/// token frame.
pub(crate) const AUTH_FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// Close code: the token expired (as Centrifugo's).
pub(crate) const CLOSE_TOKEN_EXPIRED: u16 = 3005;
/// Close code: no token frame in time, or a bad token (private use range,
/// RFC 6455 §7.4.2; 4000 + HTTP 401).
pub(crate) const CLOSE_UNAUTHORIZED: u16 = 4401;
/// Close code: the token does not grant the channel (4000 + HTTP 403).
pub(crate) const CLOSE_FORBIDDEN: u16 = 4403;

/// The first frame of a client that upgraded without credentials.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFrame {
    token: String,
}

/// Capacity of the WebSocket library's read buffer of a session,
/// allocated up front for every connection. Clients send only control
/// frames (pongs, Close) on this read-only route, a pong from a browser
/// in 6 bytes, and at most one token frame: a small buffer is enough (it
/// grows when a larger frame arrives, and reads never wait on its size,
/// see `websocket.rs`). The library's default (128 KiB) once made an idle
/// subscriber cost about 130 KB, a 4 KiB buffer 8.7 KB.
const WS_READ_BUFFER_BYTES: usize = 128;

/// Validates the request, checks its credentials, subscribes, and
/// upgrades. Frames are written out as they are sent (no write
/// buffering), so nothing waits in a buffer.
pub(crate) async fn upgrade(
    State(state): State<ApiState>,
    Subscriber(who): Subscriber,
    ChannelPath(channel): ChannelPath,
    headers: HeaderMap,
    ValidQuery(query): ValidQuery<AfterQuery>,
    slot: Option<Extension<ClientSlot>>,
    upgrade: std::result::Result<Upgrade, Error>,
) -> Result<Response> {
    // Client messages (the server ignores them) and frames are held to
    // `ws_max_message_bytes`: a larger one closes the session with 1009.
    let max = state.settings().ws_max_message_bytes;
    let upgrade = upgrade?;
    let resume = resume_point(&headers, &query)?;
    let shared = &state.shared;
    let sessions = state.sessions.clone();
    let span = tracing::debug_span!(
        "ws",
        node_id = %shared.settings.node_id,
        channel = %channel,
        after = resume,
    );
    match shared.auth().may_subscribe(&who, &channel) {
        Ok(()) => {}
        // No credentials at all: they may come in the first frame.
        Err(AuthError::MissingCredentials(_)) if matches!(who, Principal::Anonymous) => {
            let state = state.clone();
            // A proxied client's connection slot lasts as long as the
            // session.
            let slot = slot.map(|Extension(slot)| slot);
            return Ok(
                upgrade.on_upgrade(WS_READ_BUFFER_BYTES, max, move |socket| {
                    sessions.track_future(
                        authenticate_then_serve(socket, state, channel, resume, slot)
                            .instrument(span),
                    )
                }),
            );
        }
        Err(e) => return Err(e.into()),
    }
    let expires = expiry(&who);
    let start = StartAt::new(resume, shared.auth().live_only_window(&who, &channel));
    let sub = Subscription::start_paged(
        shared.node.storage().clone(),
        shared.node.hub(),
        channel,
        start,
        "ws",
        shared.settings.read_page_messages(),
    )
    .await?;
    let shutdown = shared.shutdown.clone();
    let heartbeat = shared.settings.heartbeat;
    // A proxied client's connection slot lasts as long as the session.
    let slot = slot.map(|Extension(slot)| slot);
    Ok(
        upgrade.on_upgrade(WS_READ_BUFFER_BYTES, max, move |socket| {
            let (tx, rx) = socket.split();
            let session = Session {
                tx,
                rx,
                sub,
                heartbeat,
                shutdown,
                expires,
                slot,
            };
            sessions.track_future(session.run().instrument(span))
        }),
    )
}

/// When a subscription by `who` must end: at its token's `exp`.
fn expiry(who: &Principal) -> Option<tokio::time::Instant> {
    who.token()
        .map(|token| tokio::time::Instant::now() + token.time_left())
}

/// A session whose client upgraded without credentials: waits up to
/// [`AUTH_FRAME_TIMEOUT`] for `{"token":"..."}`, checks it, then serves
/// as [`Session::run`]; else closes with 4401, 4403 or 3005.
async fn authenticate_then_serve(
    socket: Socket,
    state: ApiState,
    channel: herald_core::ChannelName,
    resume: Option<herald_core::Offset>,
    slot: Option<ClientSlot>,
) {
    let (tx, mut rx) = socket.split();
    let first = tokio::select! {
        () = state.shared.shutdown.cancelled() => {
            return close(tx, rx, close_code::AWAY, "server is shutting down").await;
        }
        // Pings and pongs before it are skipped (the protocol layer
        // answers pings).
        first = tokio::time::timeout(AUTH_FRAME_TIMEOUT, async {
            loop {
                match rx.next().await {
                    Some(Ok(Frame::Ping(_) | Frame::Pong(_))) => continue,
                    other => return other,
                }
            }
        }) => first,
    };
    let token = match first {
        Ok(Some(Ok(Frame::Text(text)))) => serde_json::from_str::<TokenFrame>(&text).ok(),
        Ok(None | Some(Err(_))) => return,
        Ok(Some(Ok(_))) | Err(_) => None,
    };
    let Some(TokenFrame { token }) = token else {
        return close(tx, rx, CLOSE_UNAUTHORIZED, "send {\"token\":\"...\"} first").await;
    };
    let auth = &state.shared.auth();
    let granted = auth
        .resolve(Some(Credential::Token(&token)))
        .await
        .and_then(|who| auth.may_subscribe(&who, &channel).map(|()| who));
    let who = match granted {
        Ok(who) => who,
        Err(e) => {
            let (code, reason) = match e {
                AuthError::TokenExpired => (CLOSE_TOKEN_EXPIRED, "token expired"),
                AuthError::Forbidden(_) => (CLOSE_FORBIDDEN, "forbidden"),
                _ => (CLOSE_UNAUTHORIZED, "unauthorized"),
            };
            return close(tx, rx, code, reason).await;
        }
    };
    let shared = &state.shared;
    let start = StartAt::new(resume, auth.live_only_window(&who, &channel));
    let sub = match Subscription::start_paged(
        shared.node.storage().clone(),
        shared.node.hub(),
        channel,
        start,
        "ws",
        shared.settings.read_page_messages(),
    )
    .await
    {
        Ok(sub) => sub,
        Err(e) => {
            e.log();
            return close(tx, rx, close_code::ERROR, "storage failed; resume later").await;
        }
    };
    let session = Session {
        tx,
        rx,
        sub,
        heartbeat: shared.settings.heartbeat,
        shutdown: shared.shutdown.clone(),
        expires: expiry(&who),
        slot,
    };
    Box::pin(session.run()).await;
}

/// Why a session ends.
enum End {
    /// The client closed or went away: nothing more to send.
    ClientGone,
    /// Send this Close frame, then wait briefly for the client's.
    Close(u16, &'static str),
}

/// What one WebSocket session holds while it runs: kept to what an idle
/// session needs (see `websocket.rs`), each part once.
struct Session {
    /// The socket's writing half.
    tx: SplitSink<Socket, Frame>,
    /// The socket's reading half.
    rx: SplitStream<Socket>,
    /// The channel followed.
    sub: Subscription,
    /// Period of the keepalive pings.
    heartbeat: Duration,
    /// Cancelled when the node drains.
    shutdown: CancellationToken,
    /// When the token's `exp` ends the session, if it came with a token.
    expires: Option<tokio::time::Instant>,
    /// A proxied client's connection slot, held as long as the session.
    slot: Option<ClientSlot>,
}

impl Session {
    /// Runs the session until the client leaves (or stops answering the
    /// keepalive pings sent every `heartbeat`), the node drains, the
    /// storage fails with an error that is not transient, or `expires`
    /// (the token's `exp`) passes.
    async fn run(mut self) {
        // Fields are used in place: the future holds each of them once.
        let end = serve(
            &mut self.tx,
            &mut self.rx,
            &mut self.sub,
            self.heartbeat,
            &self.shutdown,
            self.expires,
        )
        .await;
        match end {
            End::Close(code, reason) => close(self.tx, self.rx, code, reason).await,
            End::ClientGone => drop((self.tx, self.rx)),
        }
        tracing::debug!(channel = %self.sub.channel(), "WebSocket session ended");
        drop(self.sub);
        drop(self.slot);
    }
}

/// The loop of [`Session::run`]: says why the session ends.
async fn serve(
    tx: &mut SplitSink<Socket, Frame>,
    rx: &mut SplitStream<Socket>,
    sub: &mut Subscription,
    heartbeat: Duration,
    shutdown: &CancellationToken,
    expires: Option<tokio::time::Instant>,
) -> End {
    let mut pings = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
    pings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Whether the client sent any frame since the last ping.
    let mut heard = true;
    // On the heap, and only for a session that came with a token: most
    // sessions never expire, and an idle one holds only what it needs.
    let mut expired = expires.map(|at| Box::pin(tokio::time::sleep_until(at)));
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break End::Close(close_code::AWAY, "server is shutting down"),
            () = until(&mut expired) => break End::Close(CLOSE_TOKEN_EXPIRED, "token expired"),
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
                Err(NodeError::OffsetBeyondHead { .. }) => {
                    break End::Close(close_code::POLICY, "offset_beyond_head");
                }
                // Not transient (those are waited out in `next`).
                Err(e) => {
                    e.log();
                    break End::Close(close_code::ERROR, "storage failed; resume later");
                }
            },
        }
    }
}

/// Waits for `expired` to fire; forever when there is none.
async fn until(expired: &mut Option<std::pin::Pin<Box<tokio::time::Sleep>>>) {
    match expired {
        Some(sleep) => sleep.as_mut().await,
        None => std::future::pending().await,
    }
}

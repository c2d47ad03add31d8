//! One connection at `/connection/websocket`: the socket loop. It reads
//! frames of newline-separated commands (answered in one frame, in
//! order), writes the subscriptions' publication pushes (client-side and
//! server-side subscriptions alike; several per frame when they queue
//! up), sends the `{}` ping every `ping_interval` once
//! connected and closes with 3012 "no pong" when the client's `{}` does
//! not follow within `pong_timeout`, and closes with Centrifugo's codes
//! when the connection or a subscription token expires (3005, 3006), the
//! client sends a frame that is not the protocol (3501), does not connect
//! in time (3502), or the node drains (3001, the client reconnects to
//! another node).

use std::collections::{BTreeSet, HashMap};

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{Message as Frame, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, State};
use axum::response::Response;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use herald_core::ChannelName;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use super::codes::{self, Disconnect};
use super::registry::Control;
use crate::auth::Principal;
use crate::conn_limit::ClientSlot;
use crate::{AppState, Error, Result};

/// Frames a session's subscriptions may queue before their tasks wait.
const OUT_CAPACITY: usize = 256;
/// Most queued pushes written in one frame.
const PUSHES_PER_FRAME: usize = 64;
/// How long closing may wait for the client.
const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
/// Read buffer allocated per connection (grows with larger frames).
const READ_BUFFER_BYTES: usize = 4096;
/// Room for a command's own fields around the largest message.
const COMMAND_OVERHEAD_BYTES: usize = 16 * 1024;

/// What a subscription task sends its session.
#[derive(Debug)]
pub(crate) enum Out {
    /// A publication push of subscription `generation` of `channel`.
    Push {
        /// The channel.
        channel: ChannelName,
        /// Which subscription to the channel queued it; a push of an
        /// ended one is dropped.
        generation: u64,
        /// The push, one JSON line.
        text: String,
    },
    /// The subscription could not go on: close with this code.
    End(Disconnect),
}

/// A live subscription of the session.
pub(crate) struct Sub {
    /// Tells its pushes from those of an earlier subscription.
    pub(crate) generation: u64,
    /// The task that follows the channel; aborted when the subscription
    /// ends.
    pub(crate) task: JoinHandle<()>,
    /// When its subscription token expires, if it was made with one.
    pub(crate) expires: Option<Instant>,
    /// Its channel has `join_leave`: its end is announced as a leave.
    pub(crate) join_leave: bool,
    /// The subscription token's `info` (Centrifugo's `chan_info`).
    pub(crate) chan_info: Option<String>,
}

impl Drop for Sub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The state of one connection.
pub(crate) struct Session {
    pub(crate) state: AppState,
    /// The client id given in the connect reply.
    pub(crate) client: String,
    /// Who connected; `None` until `connect`.
    pub(crate) who: Option<Principal>,
    /// When the connection token expires.
    pub(crate) expires: Option<Instant>,
    /// The live subscriptions (client-side and server-side).
    pub(crate) subs: HashMap<ChannelName, Sub>,
    /// The channels of the server-side subscriptions made at connect (the
    /// token's `subs`), to tell a `refresh` whose token changes them.
    pub(crate) server_subs: BTreeSet<ChannelName>,
    /// Counter behind [`Sub::generation`].
    pub(crate) generations: u64,
    /// Where subscription tasks queue their pushes.
    pub(crate) out: mpsc::Sender<Out>,
    /// The registry's way in, handed over at connect.
    pub(crate) control: Option<mpsc::Sender<Control>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        let registry = &self.state.shared.centrifugo;
        registry.remove(&self.client);
        for channel in self.subs.keys() {
            registry.join_leave.unlisten(channel, &self.client);
        }
    }
}

/// `GET /connection/websocket`: upgrades and runs the session. A client
/// that came through a trusted proxy keeps its connection slot
/// (`conn_limit.rs`) for as long as the session runs, not only until the
/// `101` answer is sent.
pub(crate) async fn upgrade(
    State(state): State<AppState>,
    slot: Option<Extension<ClientSlot>>,
    upgrade: std::result::Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response> {
    let max = state.config().max_message_bytes + COMMAND_OVERHEAD_BYTES;
    let upgrade = upgrade
        .map_err(|r| Error::InvalidUpgrade(r.body_text()))?
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(0)
        .max_message_size(max)
        .max_frame_size(max);
    let sessions = state.shared.ws_sessions.clone();
    let span = tracing::debug_span!("centrifugo", node_id = %state.config().node_id);
    let slot = slot.map(|Extension(slot)| slot);
    Ok(upgrade.on_upgrade(move |socket| {
        sessions.track_future(
            async move {
                run(socket, state).await;
                drop(slot);
            }
            .instrument(span),
        )
    }))
}

/// A random client id in the UUID v4 text form (RFC 9562 §5.4).
fn client_id() -> String {
    let bits: u128 = rand::random();
    let bits = (bits & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Runs one connection until it closes.
async fn run(socket: WebSocket, state: AppState) {
    let (mut tx, mut rx) = socket.split();
    let (out, mut out_rx) = mpsc::channel(OUT_CAPACITY);
    let (control, mut control_rx) = mpsc::channel(8);
    let config = state.config().centrifugo.clone();
    let shutdown = state.shared.shutdown.clone();
    let mut session = Session {
        state,
        client: client_id(),
        who: None,
        expires: None,
        subs: HashMap::new(),
        server_subs: BTreeSet::new(),
        generations: 0,
        out,
        control: Some(control),
    };
    let connect_by = Instant::now() + config.connect_timeout;
    let mut pings =
        tokio::time::interval_at(Instant::now() + config.ping_interval, config.ping_interval);
    pings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When the pong to the last ping is due, while it is awaited.
    let mut pong_by: Option<Instant> = None;
    let end: Option<Disconnect> = loop {
        let connected = session.who.is_some();
        let (deadline, on_deadline) = next_deadline(&session, connect_by, pong_by);
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break Some(codes::SHUTDOWN),
            Some(control) = control_rx.recv() => match control {
                Control::Disconnect(d) => break Some(d),
                Control::Unsubscribe(channel) => {
                    if session.unsubscribe(&channel).await {
                        let push = super::protocol::unsubscribe_push(channel.as_str(), 2000, "server unsubscribe");
                        if send(&mut tx, push).await.is_err() { break None; }
                    }
                }
            },
            incoming = rx.next() => match incoming {
                Some(Ok(Frame::Text(text))) => {
                    let handled = session.handle_frame(text.as_str()).await;
                    if handled.pong {
                        pong_by = None;
                    }
                    if !handled.replies.is_empty() && send(&mut tx, handled.replies.join("\n")).await.is_err() {
                        break None;
                    }
                    if let Some(d) = handled.close { break Some(d); }
                }
                Some(Ok(Frame::Binary(_))) => break Some(codes::BAD_REQUEST),
                Some(Ok(Frame::Close(_))) => {
                    let _ = tokio::time::timeout(CLOSE_TIMEOUT, tx.close()).await;
                    break None;
                }
                Some(Ok(_)) => {}
                // A frame over the size limit, or a broken connection: a
                // Close frame is tried (it fails at once on a dead socket).
                Some(Err(_)) => break Some(codes::BAD_REQUEST),
                None => break None,
            },
            Some(item) = out_rx.recv() => {
                let mut lines = Vec::new();
                let mut end = None;
                let mut next = Some(item);
                while let Some(item) = next.take() {
                    match item {
                        Out::Push { channel, generation, text } => {
                            if session.subs.get(&channel).is_some_and(|s| s.generation == generation) {
                                lines.push(text);
                            }
                        }
                        Out::End(d) => { end = Some(d); break; }
                    }
                    if lines.len() < PUSHES_PER_FRAME {
                        next = out_rx.try_recv().ok();
                    }
                }
                if !lines.is_empty() && send(&mut tx, lines.join("\n")).await.is_err() {
                    break None;
                }
                if end.is_some() { break end; }
            }
            _ = pings.tick(), if connected => {
                if send(&mut tx, "{}".to_owned()).await.is_err() { break None; }
                if pong_by.is_none() {
                    pong_by = Some(Instant::now() + config.pong_timeout);
                }
            }
            () = tokio::time::sleep_until(deadline), if on_deadline.is_some() => {
                break on_deadline;
            }
        }
    };
    session.end_subscriptions();
    if let Some(d) = end {
        tracing::debug!(client = %session.client, code = d.code, reason = d.reason, "closing");
        close(tx, rx, d).await;
    }
}

/// The earliest deadline of the session and the disconnect it brings:
/// the connect timeout (3502) before `connect`; the pong (3012); the
/// connection token's expiry (3005); a subscription token's (3006).
fn next_deadline(
    session: &Session,
    connect_by: Instant,
    pong_by: Option<Instant>,
) -> (Instant, Option<Disconnect>) {
    let mut best: Option<(Instant, Disconnect)> = None;
    let mut consider = |at: Option<Instant>, d: Disconnect| {
        if let Some(at) = at {
            if best.is_none_or(|(b, _)| at < b) {
                best = Some((at, d));
            }
        }
    };
    if session.who.is_none() {
        consider(Some(connect_by), codes::STALE);
    }
    consider(pong_by, codes::NO_PONG);
    consider(session.expires, codes::EXPIRED);
    for sub in session.subs.values() {
        consider(sub.expires, codes::SUB_EXPIRED);
    }
    match best {
        Some((at, d)) => (at, Some(d)),
        None => (Instant::now(), None),
    }
}

/// Sends one text frame.
async fn send(
    tx: &mut SplitSink<WebSocket, Frame>,
    text: String,
) -> std::result::Result<(), axum::Error> {
    tx.send(Frame::Text(text.into())).await
}

/// Sends the Close frame of `d` and waits (bounded) for the client's, as
/// Herald's own WebSocket route does.
async fn close(tx: SplitSink<WebSocket, Frame>, rx: SplitStream<WebSocket>, d: Disconnect) {
    crate::ws::close(tx, rx, d.code, d.reason).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_uuid_v4_text() {
        let id = client_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        assert_ne!(client_id(), id);
    }
}

//! One client connection, whatever its transport (`transport.rs`): the
//! WebSocket at `/connection/websocket`, or an HTTP stream or SSE
//! response whose client sends its commands to `/emulation`
//! (`emulation.rs`). The session loop reads
//! frames of newline-separated commands (at most
//! [`max_commands_per_frame`] a frame, else 3013 "too many requests"),
//! answers them in order, writing replies as they are ready (several per
//! frame while they are small), writes the subscriptions' publication
//! pushes (client-side and server-side subscriptions alike; several per
//! frame when they queue up), sends the `{}` ping every `ping_interval`
//! once connected and closes with 3012 "no pong" when the client's `{}`
//! does not follow within `pong_timeout`, or when a write to the socket
//! takes longer than `write_timeout` (a client that stopped reading), and
//! closes with Centrifugo's codes when the connection or a subscription
//! token expires (3005, 3006: checked first in the loop, before every
//! command and around every write, so a busy socket cannot outlive its
//! token), the client sends a frame that is not the protocol (3501), does
//! not connect in time (3502), or the node drains (3001, the client
//! reconnects to another node; also while a write waits).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::http::header::SEC_WEBSOCKET_PROTOCOL;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use futures::StreamExt;
use herald_auth::Principal;
use herald_core::ChannelName;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::codec::Batch;
use super::codec::Encoding;
use super::codes::{self, Disconnect};
use super::context::CentrifugoState;
use super::mailbox::{Control, Mailbox, Out, Push, QueueBudget};
use super::transport::{Connection, Incoming, Sink, Source};
use herald_http::conn_limit::ClientSlot;
use herald_http::error::{Error, Result};
use herald_http::websocket::Upgrade;

/// Frames a session's subscriptions may queue before their tasks wait
/// (and at most `subscriber_queue_bytes` of them, [`QueueBudget`]).
const OUT_CAPACITY: usize = 256;
/// Most queued pushes written in one frame.
const PUSHES_PER_FRAME: usize = 64;
/// Replies of one client frame are gathered into one socket frame until
/// they hold this many bytes; then they are written and the next ones
/// gathered.
pub(crate) const REPLY_FRAME_BYTES: usize = 64 * 1024;
/// How long closing may wait for the client.
const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
/// The WebSocket library's read buffer allocated per connection: room for
/// a client's `{}` pong and small commands (it grows with larger frames;
/// reads never wait on its size, see `websocket.rs`).
const READ_BUFFER_BYTES: usize = 512;
/// Room for a command's own fields around the largest message.
const COMMAND_OVERHEAD_BYTES: usize = 16 * 1024;
/// The least number of commands one client frame may hold (see
/// [`max_commands_per_frame`]).
pub(crate) const MIN_COMMANDS_PER_FRAME: usize = 256;
/// `subscribe`, `history`, `presence`, `presence_stats`, `refresh` and
/// `sub_refresh` commands (each a storage read or a token check) a
/// connection may run per second once its burst is spent; beyond, they
/// answer 111 "too many requests" (a temporary error: the SDK retries)
/// and touch neither the storage nor the token verifier.
pub(crate) const READS_PER_S: f64 = 20.0;

/// The most commands one client frame may hold: 256, or one more than
/// `channel_limit` when that is larger (a reconnecting SDK sends its
/// `connect` and a `subscribe` per channel in one frame). A frame with
/// more is not run: the connection closes with 3013 "too many requests",
/// as Centrifugo's disconnect for a client that sends too many commands.
pub(crate) fn max_commands_per_frame(channel_limit: usize) -> usize {
    MIN_COMMANDS_PER_FRAME.max(channel_limit.saturating_add(1))
}

/// The burst of the commands [`READS_PER_S`] limits a connection may run
/// at once: twice `channel_limit`, at least [`MIN_COMMANDS_PER_FRAME`]
/// (so that a reconnecting SDK's resubscribes all pass), then
/// [`READS_PER_S`].
pub(crate) fn reads_burst(channel_limit: usize) -> usize {
    MIN_COMMANDS_PER_FRAME.max(channel_limit.saturating_mul(2))
}

/// A token bucket on the session's clock: `burst` at once, then `per_s`.
#[derive(Debug)]
pub(crate) struct Bucket {
    tokens: f64,
    burst: f64,
    per_s: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket.
    pub(crate) fn new(burst: usize, per_s: f64) -> Self {
        let burst = burst as f64;
        Self {
            tokens: burst,
            burst,
            per_s,
            at: Instant::now(),
        }
    }

    /// Takes one token; `false` when there is none.
    pub(crate) fn take(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * self.per_s;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Why a write to the socket did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The connection is broken: nothing more can be sent.
    Gone,
    /// Close with this code (the write deadline passed, a token expired
    /// or the node drains).
    Close(Disconnect),
}

/// The connection's writing half, with the deadline every write is held
/// to.
pub(crate) struct Writer {
    sink: Sink,
    shutdown: CancellationToken,
    /// The longest one write may wait for the client (`write_timeout`).
    timeout: Duration,
    /// The session's push queue: once it overflowed, a waiting write ends
    /// with 3008.
    queue: Arc<QueueBudget>,
}

impl Writer {
    /// Writes one batch of replies and pushes, unless `deadline` (a token's expiry and its
    /// code) has passed or passes meanwhile, the node drains (3001), the
    /// push queue overflows its byte budget (3008), or the write takes
    /// longer than the write timeout (3012): a client that stops reading
    /// cannot hold the session past any of them.
    pub(crate) async fn send(
        &mut self,
        batch: Batch,
        deadline: Option<(Instant, Disconnect)>,
    ) -> std::result::Result<(), Stop> {
        let (at, on_deadline) = match deadline {
            Some((at, d)) => (at, Some(d)),
            None => (Instant::now(), None),
        };
        let write_by = Instant::now() + self.timeout;
        tokio::select! {
            biased;
            () = self.shutdown.cancelled() => Err(Stop::Close(codes::SHUTDOWN)),
            () = self.queue.overflowed() => Err(Stop::Close(codes::SLOW)),
            () = tokio::time::sleep_until(at), if on_deadline.is_some() => {
                Err(Stop::Close(on_deadline.unwrap_or(codes::EXPIRED)))
            }
            () = tokio::time::sleep_until(write_by) => {
                tracing::debug!(
                    write_timeout_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
                    "the client does not take its frames; closing"
                );
                Err(Stop::Close(codes::NO_PONG))
            }
            sent = self.sink.send(batch) => sent.map_err(|_| Stop::Gone),
        }
    }
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
    pub(crate) state: CentrifugoState,
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
    /// The session id an emulation transport's client names in its
    /// `/emulation` requests (a secret of this connection, unlike the
    /// client id, which presence shows); `None` on a WebSocket.
    pub(crate) emulation: Option<String>,
    /// The form of the protocol the connection speaks.
    pub(crate) encoding: Encoding,
    /// Counter behind [`Sub::generation`].
    pub(crate) generations: u64,
    /// Where subscription tasks queue their pushes.
    pub(crate) out: mpsc::Sender<Out>,
    /// The bytes of the pushes queued in `out`, against
    /// `subscriber_queue_bytes`.
    pub(crate) queue: Arc<QueueBudget>,
    /// The registry's way in, handed to it at connect.
    pub(crate) mailbox: Arc<Mailbox>,
    /// Commands that read the storage or check a token (`subscribe`,
    /// `history`, `presence`, `presence_stats`, `refresh`,
    /// `sub_refresh`) allowed now ([`READS_PER_S`]).
    pub(crate) reads: Bucket,
    /// Refusals (103) logged at INFO so far; past
    /// [`MAX_DENIALS_LOGGED`] a connection's refusals go to DEBUG, so
    /// that one client cannot flood the log.
    pub(crate) denials_logged: std::sync::atomic::AtomicU32,
}

/// Most refusals (103) of one connection logged at INFO (`permission
/// denied`); the rest are logged at DEBUG.
pub(crate) const MAX_DENIALS_LOGGED: u32 = 8;

impl Session {
    /// The earliest token expiry of the session and its close code: the
    /// connection token's (3005) or a subscription token's (3006).
    pub(crate) fn expiry(&self) -> Option<(Instant, Disconnect)> {
        let subs = self
            .subs
            .values()
            .filter_map(|s| s.expires.map(|at| (at, codes::SUB_EXPIRED)));
        self.expires
            .map(|at| (at, codes::EXPIRED))
            .into_iter()
            .chain(subs)
            .min_by_key(|(at, _)| *at)
    }

    /// The close code of a token that has expired by now, if any.
    pub(crate) fn expired(&self) -> Option<Disconnect> {
        self.expiry()
            .filter(|(at, _)| *at <= Instant::now())
            .map(|(_, d)| d)
    }

    /// Writes `batch` to the client, held to the tokens' expiry (see
    /// [`Writer::send`]).
    pub(crate) async fn write(
        &self,
        writer: &mut Writer,
        batch: Batch,
    ) -> std::result::Result<(), Stop> {
        if let Some(d) = self.expired() {
            return Err(Stop::Close(d));
        }
        writer.send(batch, self.expiry()).await
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let registry = &self.state.centrifugo.registry;
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
///
/// The encoding is chosen by the subprotocols the client lists
/// (`Sec-WebSocket-Protocol`, RFC 6455 §1.9): `centrifuge-protobuf`
/// without `centrifuge-json` is the binary protocol (`codec.rs`), named
/// in the answer; otherwise JSON, with `centrifuge-json` named when the
/// client listed it.
pub(crate) async fn upgrade(
    State(state): State<CentrifugoState>,
    slot: Option<Extension<ClientSlot>>,
    headers: HeaderMap,
    upgrade: std::result::Result<Upgrade, Error>,
) -> Result<Response> {
    let max = max_frame_bytes(state.settings());
    let max_commands = max_commands_per_frame(state.config().channel_limit);
    let upgrade = upgrade?;
    let listed = subprotocols(&headers);
    let (encoding, named) = if listed.contains(&PROTOBUF) && !listed.contains(&JSON) {
        (Encoding::Protobuf, Some(PROTOBUF))
    } else {
        (Encoding::Json, listed.contains(&JSON).then_some(JSON))
    };
    let sessions = state.centrifugo.sessions.clone();
    let span = tracing::debug_span!("centrifugo", node_id = %state.settings().node_id);
    let slot = slot.map(|Extension(slot)| slot);
    let mut response = upgrade.on_upgrade(READ_BUFFER_BYTES, max, move |socket| {
        let (tx, rx) = socket.split();
        let connection = Connection {
            sink: Sink::WebSocket(tx, encoding),
            source: Source::WebSocket(rx, encoding, max_commands),
            encoding,
            emulation: None,
        };
        sessions.track_future(run(connection, state, slot).instrument(span))
    });
    if let Some(named) = named {
        response
            .headers_mut()
            .insert(SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(named));
    }
    Ok(response)
}

/// The WebSocket subprotocol of Centrifugo's binary (protobuf) protocol.
const PROTOBUF: &str = "centrifuge-protobuf";

/// The WebSocket subprotocol of the JSON protocol, named in the upgrade
/// when the client lists it (clients that list none get none).
const JSON: &str = "centrifuge-json";

/// The subprotocols the upgrade's `Sec-WebSocket-Protocol` lists.
fn subprotocols(headers: &HeaderMap) -> Vec<&str> {
    headers
        .get_all(SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect()
}

/// The most bytes of client commands one frame may hold: the largest
/// message and room for the command around it.
pub(crate) fn max_frame_bytes(settings: &herald_http::shared::Settings) -> usize {
    settings.max_message_bytes + COMMAND_OVERHEAD_BYTES
}

/// A random client id in the UUID v4 text form (RFC 9562 §5.4).
pub(crate) fn client_id() -> String {
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

/// Runs one connection until it closes; a proxied client's connection
/// slot is held until then (dropped last).
pub(crate) async fn run(connection: Connection, state: CentrifugoState, _slot: Option<ClientSlot>) {
    let Connection {
        sink,
        mut source,
        emulation,
        encoding,
    } = connection;
    let (out, mut out_rx) = mpsc::channel(OUT_CAPACITY);
    let config = state.config().clone();
    let shutdown = state.shared.shutdown.clone();
    let queue = Arc::new(QueueBudget::new(state.settings().subscriber_queue_bytes));
    let mut writer = Writer {
        sink,
        shutdown: shutdown.clone(),
        timeout: config.write_timeout,
        queue: Arc::clone(&queue),
    };
    let mailbox = Arc::new(Mailbox::default());
    let mut session = Session {
        state,
        client: client_id(),
        who: None,
        expires: None,
        subs: HashMap::new(),
        server_subs: BTreeSet::new(),
        emulation,
        encoding,
        generations: 0,
        out,
        queue: Arc::clone(&queue),
        mailbox: Arc::clone(&mailbox),
        reads: Bucket::new(reads_burst(config.channel_limit), READS_PER_S),
        denials_logged: std::sync::atomic::AtomicU32::new(0),
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
        // Deadlines first: a client that keeps the socket busy (frames
        // always ready, pushes always queued) cannot starve them.
        let step = tokio::select! {
            biased;
            () = shutdown.cancelled() => Err(Stop::Close(codes::SHUTDOWN)),
            // A subscriber whose queue passed its byte budget: a slow
            // consumer, which reconnects and recovers from its offset.
            () = queue.overflowed() => Err(Stop::Close(codes::SLOW)),
            () = tokio::time::sleep_until(deadline), if on_deadline.is_some() => {
                Err(Stop::Close(on_deadline.unwrap_or(codes::EXPIRED)))
            }
            control = mailbox.next() => match control {
                Control::Disconnect(d) => Err(Stop::Close(d)),
                Control::Unsubscribe(channel) => {
                    // Boxed, as the commands below: a command's future
                    // takes room only while it runs, not in every idle
                    // connection's.
                    if Box::pin(session.unsubscribe(&channel)).await {
                        let push = super::replies::unsubscribe_push(channel.as_str(), 2000, "server unsubscribe");
                        session.write(&mut writer, Batch::of(session.encoding, &push)).await
                    } else {
                        Ok(())
                    }
                }
            },
            incoming = source.next() => match incoming {
                Incoming::Frame(frame) => {
                    let handled = Box::pin(session.handle_frame(frame, &mut writer)).await;
                    if handled.pong {
                        pong_by = None;
                    }
                    handled.end.map_or(Ok(()), Err)
                }
                Incoming::NotTheProtocol => Err(Stop::Close(codes::BAD_REQUEST)),
                Incoming::Close => {
                    writer.sink.close(CLOSE_TIMEOUT).await;
                    Err(Stop::Gone)
                }
                Incoming::Other => Ok(()),
                // A frame over the size limit, or a broken connection: a
                // Close frame is tried (it fails at once on a dead socket).
                Incoming::Broken => Err(Stop::Close(codes::BAD_REQUEST)),
                Incoming::End => Err(Stop::Gone),
            },
            Some(item) = out_rx.recv() => {
                let mut pushes = Batch::new(session.encoding);
                let mut count = 0;
                let mut end = None;
                let mut next = Some(item);
                while let Some(item) = next.take() {
                    match item {
                        Out::Push(push) => {
                            let Push { channel, generation, encoded, queued_bytes } = *push;
                            queue.release(queued_bytes);
                            if session.subs.get(&channel).is_some_and(|s| s.generation == generation) {
                                pushes.push(&encoded);
                                count += 1;
                            }
                        }
                        Out::End(d) => { end = Some(d); break; }
                    }
                    if count < PUSHES_PER_FRAME {
                        next = out_rx.try_recv().ok();
                    }
                }
                let sent = if count == 0 {
                    Ok(())
                } else {
                    session.write(&mut writer, pushes).await
                };
                sent.and(end.map_or(Ok(()), |d| Err(Stop::Close(d))))
            }
            _ = pings.tick(), if connected => {
                let sent = writer.send(Batch::ping(session.encoding), session.expiry()).await;
                if pong_by.is_none() {
                    pong_by = Some(Instant::now() + config.pong_timeout);
                }
                sent
            }
        };
        match step {
            Ok(()) => {}
            Err(Stop::Gone) => break None,
            Err(Stop::Close(d)) => break Some(d),
        }
    };
    session.end_subscriptions();
    if let Some(d) = end {
        tracing::debug!(client = %session.client, code = d.code, reason = d.reason, "closing");
        writer.sink.disconnect(source, d, CLOSE_TIMEOUT).await;
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
    if let Some((at, d)) = session.expiry() {
        consider(Some(at), d);
    }
    match best {
        Some((at, d)) => (at, Some(d)),
        None => (Instant::now(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reads' bucket: its burst at once, then its rate, on the
    /// session's clock (paused here).
    #[tokio::test(start_paused = true)]
    async fn the_reads_bucket_gives_its_burst_then_its_rate() {
        let mut bucket = Bucket::new(reads_burst(128), READS_PER_S);
        let burst = (0..1000).take_while(|_| bucket.take()).count();
        assert_eq!(burst, 256);
        assert!(!bucket.take());
        tokio::time::advance(Duration::from_secs(1)).await;
        let refilled = (0..1000).take_while(|_| bucket.take()).count();
        assert_eq!(refilled, 20);
        tokio::time::advance(Duration::from_secs(3600)).await;
        let full = (0..1000).take_while(|_| bucket.take()).count();
        assert_eq!(full, 256, "the bucket holds at most its burst");
        assert_eq!(reads_burst(1000), 2000);
        assert_eq!(max_commands_per_frame(128), 256);
        assert_eq!(max_commands_per_frame(1000), 1001);
    }

    #[test]
    fn client_ids_are_uuid_v4_text() {
        let id = client_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        assert_ne!(client_id(), id);
    }
}

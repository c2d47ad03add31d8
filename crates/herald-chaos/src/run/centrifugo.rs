//! Subscribers that speak Centrifugo's client protocol (JSON, protocol v2,
//! at `/connection/websocket`; docs/centrifugo.md) as Centrifugo's SDKs
//! do: one WebSocket connection per subscriber that connects with a JWT,
//! subscribes to every channel of the run, answers each ping (`{}`) with a
//! pong (`{}`), and after a break reconnects and subscribes with `recover:
//! true` and the offset and epoch it reached. When a recovery answers
//! `recovered: false` (retention removed what it missed), it reloads the
//! channel's state as Centrifugo's documentation tells an application to,
//! from the history (the oldest publications held), and goes on from
//! there; the checker accepts the skipped offsets only below the earliest
//! offset that read found.
//!
//! Independent of `herald-testkit`'s clients and of any SDK on purpose
//! (see the crate's docs): what it records is exactly what it saw.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use herald_chaos::history::{Event, StreamPosition};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message as Frame;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;

use super::clients::Recorder;
use super::node::Urls;

/// Bound of opening a connection and of its `connect` reply, and of the
/// silence after which a subscriber gives the connection up and
/// reconnects. The nodes ping every [`super::node::CENTRIFUGO_PING`]
/// (3 s), so a live connection is never silent this long; longer than the
/// checker's stall bound ([`herald_chaos::checker::STALL_MS`]), as the SSE
/// subscribers' bound is.
const SILENCE: Duration = Duration::from_secs(5);

/// The `limit` of the history read after `recovered: false`: the most
/// Herald returns in one answer (docs/centrifugo.md, "Epochs and
/// recovery"). The `trim` channels hold about 20.
const HISTORY_LIMIT: u64 = 1000;

/// One channel a subscriber follows, with the last offset it reached
/// (read by the runner to let subscribers catch up at the end).
#[derive(Clone)]
pub(crate) struct Followed {
    /// The channel.
    pub(crate) channel: String,
    /// The offset reached.
    pub(crate) last: Arc<AtomicU64>,
}

/// A Centrifugo subscriber named `centrifugo-<home>` that connects to node
/// `home` first and follows every channel of `channels` on one connection;
/// when a node cannot be reached, or the connection fails before every
/// channel is subscribed, it tries the next node. It records its
/// subscribe replies, history reads, deliveries and closes, and stops
/// when `stop` is cancelled.
pub(crate) fn subscriber(
    home: usize,
    channels: Vec<Followed>,
    urls: Urls,
    recorder: Recorder,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut client = Client {
            name: format!("centrifugo-{home}"),
            positions: vec![None; channels.len()],
            channels,
            recorder,
        };
        let token = urls.centrifugo_token();
        let mut node = home;
        while !stop.is_cancelled() {
            let index = node % urls.len();
            let url = format!(
                "{}/connection/websocket",
                urls.get(index).replacen("http://", "ws://", 1)
            );
            if !client.session(index, &url, &token, &stop).await {
                node += 1;
            }
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    })
}

/// A subscriber and what it keeps across connections.
struct Client {
    /// Its name in the history.
    name: String,
    channels: Vec<Followed>,
    /// Per channel, the stream position reached: the offset of the last
    /// publication received (or the subscribe position) and the epoch of
    /// the last reply; `None` before the first subscribe reply.
    positions: Vec<Option<StreamPosition>>,
    recorder: Recorder,
}

/// Where one channel's subscription on a connection stands.
enum State {
    /// The subscribe command is sent, its reply not yet in.
    Subscribing,
    /// `recovered: false`: the history read is sent; live publications
    /// wait in `buffered` until it is in.
    Reloading {
        /// The offset the client asked to recover after.
        resume_after: u64,
        /// The reply's offset (the head): live publications follow it.
        head: u64,
        /// Live publications `(offset, id)` received meanwhile.
        buffered: Vec<(u64, String)>,
    },
    /// Subscribed: publications are delivered as they come.
    Live,
}

/// A command waiting for its reply.
enum Pending {
    Connect,
    /// The subscribe of channel `.0`, recovering from `.1`.
    Subscribe(usize, Option<StreamPosition>),
    /// The history read of channel `.0`.
    History(usize),
}

/// How a connection ended.
struct End {
    /// The node's close code, if it sent one.
    code: Option<u16>,
    /// Its reason, or what ended the connection.
    reason: String,
}

impl End {
    fn because(reason: impl Into<String>) -> Self {
        Self {
            code: None,
            reason: reason.into(),
        }
    }
}

/// One connection's state.
struct Session {
    node: String,
    states: Vec<Option<State>>,
    pending: Vec<(u64, Pending)>,
    next_id: u64,
    connected: bool,
    pongs: u64,
    /// Commands to send after the frame being handled.
    out: Vec<String>,
}

impl Session {
    fn command(&mut self, pending: Pending, body: Value) {
        self.next_id += 1;
        let mut command = body;
        command["id"] = json!(self.next_id);
        self.out.push(command.to_string());
        self.pending.push((self.next_id, pending));
    }

    fn take_pending(&mut self, id: u64) -> Option<Pending> {
        let at = self.pending.iter().position(|(i, _)| *i == id)?;
        Some(self.pending.remove(at).1)
    }

    /// Whether every channel's subscribe was answered.
    fn subscribed(&self) -> bool {
        self.states
            .iter()
            .all(|s| matches!(s, Some(State::Live | State::Reloading { .. })))
    }
}

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

impl Client {
    /// One connection to node `index` at `url`, from its opening to its
    /// end. Returns whether every channel got subscribed on it.
    async fn session(
        &mut self,
        index: usize,
        url: &str,
        token: &str,
        stop: &CancellationToken,
    ) -> bool {
        let opened = tokio::select! {
            () = stop.cancelled() => return true,
            r = tokio::time::timeout(SILENCE, tokio_tungstenite::connect_async(url)) => r,
        };
        let Ok(Ok((mut socket, _))) = opened else {
            return false;
        };
        let mut session = Session {
            node: format!("node-{index}"),
            states: self.channels.iter().map(|_| None).collect(),
            pending: Vec::new(),
            next_id: 0,
            connected: false,
            pongs: 0,
            out: Vec::new(),
        };
        session.command(
            Pending::Connect,
            json!({"connect": {"token": token, "name": "herald-chaos"}}),
        );
        let end = self.follow(&mut socket, &mut session, stop).await;
        let subscribed = session.subscribed();
        if session.connected {
            let channels = self
                .channels
                .iter()
                .zip(&session.states)
                .filter(|(_, s)| s.is_some())
                .map(|(f, _)| f.channel.clone())
                .collect();
            self.recorder.push(Event::CentrifugoClosed {
                subscriber: self.name.clone(),
                node: session.node.clone(),
                channels,
                code: end.code,
                reason: end.reason,
                pongs: session.pongs,
                at_ms: self.recorder.now_ms(),
            });
        }
        // Best effort: the node may be gone.
        let _ = tokio::time::timeout(Duration::from_millis(200), socket.close(None)).await;
        subscribed
    }

    /// Sends what is queued and handles frames until the connection ends.
    async fn follow(
        &mut self,
        socket: &mut Socket,
        session: &mut Session,
        stop: &CancellationToken,
    ) -> End {
        loop {
            if !session.out.is_empty() {
                let frame = session.out.join("\n");
                session.out.clear();
                if socket.send(Frame::text(frame)).await.is_err() {
                    return End::because("broken while sending");
                }
            }
            let next = tokio::select! {
                () = stop.cancelled() => return End::because("the run ended"),
                n = tokio::time::timeout(SILENCE, socket.next()) => n,
            };
            let text = match next {
                Err(_) => return End::because("silent"),
                Ok(None) => return End::because("closed without a close frame"),
                Ok(Some(Err(e))) => return End::because(format!("broken: {e}")),
                Ok(Some(Ok(Frame::Close(frame)))) => {
                    return match frame {
                        Some(frame) => End {
                            code: Some(u16::from(frame.code)),
                            reason: frame.reason.to_string(),
                        },
                        None => End::because("closed without a code"),
                    }
                }
                Ok(Some(Ok(Frame::Text(text)))) => text,
                // WebSocket pings are answered by the library.
                Ok(Some(Ok(_))) => continue,
            };
            for line in text.as_str().split('\n').filter(|l| !l.trim().is_empty()) {
                let Ok(value) = serde_json::from_str::<Value>(line) else {
                    return End::because(format!("not JSON: {line}"));
                };
                if let Err(end) = self.handle(session, &value) {
                    return end;
                }
            }
        }
    }

    /// Handles one reply or push.
    fn handle(&mut self, session: &mut Session, value: &Value) -> Result<(), End> {
        if value.as_object().is_some_and(serde_json::Map::is_empty) {
            // The node's ping: answered with a pong.
            session.out.push("{}".to_owned());
            session.pongs += 1;
            return Ok(());
        }
        if let Some(id) = value["id"].as_u64() {
            let Some(pending) = session.take_pending(id) else {
                return Err(End::because(format!("a reply to no command: {value}")));
            };
            if !value["error"].is_null() {
                return Err(End::because(format!("error reply: {}", value["error"])));
            }
            return match pending {
                Pending::Connect => {
                    session.connected = true;
                    for k in 0..self.channels.len() {
                        self.subscribe(session, k);
                    }
                    Ok(())
                }
                Pending::Subscribe(k, from) => {
                    self.subscribed(session, k, from, &value["subscribe"])
                }
                Pending::History(k) => self.reloaded(session, k, &value["history"]),
            };
        }
        let push = &value["push"];
        if let (Some(channel), Some(publication)) = (push["channel"].as_str(), push.get("pub")) {
            let Some(k) = self.channels.iter().position(|f| f.channel == channel) else {
                return Err(End::because(format!("a push of another channel: {value}")));
            };
            let Some(offset) = publication["offset"].as_u64() else {
                return Err(End::because(format!(
                    "a publication without offset: {value}"
                )));
            };
            let id = publication_id(publication);
            match &mut session.states[k] {
                Some(State::Reloading { buffered, .. }) => buffered.push((offset, id)),
                _ => self.deliver(session, k, offset, id),
            }
        }
        // Other pushes (join, leave, ...) carry nothing to judge.
        Ok(())
    }

    /// Sends channel `k`'s subscribe: with recovery once it has a position.
    fn subscribe(&mut self, session: &mut Session, k: usize) {
        let from = self.positions[k].clone();
        let mut request = json!({"channel": self.channels[k].channel});
        if let Some(from) = &from {
            request["recover"] = json!(true);
            request["offset"] = json!(from.offset);
            request["epoch"] = json!(from.epoch);
        }
        session.states[k] = Some(State::Subscribing);
        session.command(Pending::Subscribe(k, from), json!({ "subscribe": request }));
    }

    /// Channel `k`'s subscribe reply.
    fn subscribed(
        &mut self,
        session: &mut Session,
        k: usize,
        from: Option<StreamPosition>,
        reply: &Value,
    ) -> Result<(), End> {
        let (Some(epoch), Some(offset)) = (reply["epoch"].as_str(), reply["offset"].as_u64())
        else {
            return Err(End::because(format!(
                "a subscribe reply without position: {reply}"
            )));
        };
        let recovered = reply["recovered"].as_bool().unwrap_or(false);
        let publications = reply["publications"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let channel = self.channels[k].channel.clone();
        self.recorder.push(Event::CentrifugoSubscribed {
            subscriber: self.name.clone(),
            node: session.node.clone(),
            channel: channel.clone(),
            recover_from: from.clone(),
            recovered,
            epoch: epoch.to_owned(),
            offset,
            publications: publications.len(),
            at_ms: self.recorder.now_ms(),
        });
        // The stream starts after the resume point when there was one,
        // else at the channel's current position.
        let after = from.as_ref().map_or(offset, |f| f.offset);
        self.recorder.push(Event::Subscribe {
            subscriber: self.name.clone(),
            node: session.node.clone(),
            channel: channel.clone(),
            after,
            at_ms: self.recorder.now_ms(),
        });
        self.positions[k] = Some(StreamPosition {
            offset: after,
            epoch: epoch.to_owned(),
        });
        self.channels[k].last.store(after, Ordering::SeqCst);
        match from {
            Some(from) if !recovered => {
                session.states[k] = Some(State::Reloading {
                    resume_after: from.offset,
                    head: offset,
                    buffered: Vec::new(),
                });
                session.command(
                    Pending::History(k),
                    json!({"history": {"channel": channel, "limit": HISTORY_LIMIT}}),
                );
            }
            _ => {
                session.states[k] = Some(State::Live);
                for publication in &publications {
                    let Some(offset) = publication["offset"].as_u64() else {
                        return Err(End::because(format!(
                            "a publication without offset: {reply}"
                        )));
                    };
                    self.deliver(session, k, offset, publication_id(publication));
                }
            }
        }
        Ok(())
    }

    /// Channel `k`'s history read after `recovered: false`: what it holds
    /// after the resume point, up to the reply's head, then the live
    /// publications that came meanwhile.
    fn reloaded(&mut self, session: &mut Session, k: usize, reply: &Value) -> Result<(), End> {
        let Some(State::Reloading {
            resume_after,
            head,
            buffered,
        }) = session.states[k].take()
        else {
            return Err(End::because("a history reply while not reloading"));
        };
        let (Some(epoch), Some(history_head)) = (reply["epoch"].as_str(), reply["offset"].as_u64())
        else {
            return Err(End::because(format!(
                "a history reply without position: {reply}"
            )));
        };
        let publications = reply["publications"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut read = Vec::with_capacity(publications.len());
        for publication in &publications {
            let Some(offset) = publication["offset"].as_u64() else {
                return Err(End::because(format!(
                    "a publication without offset: {reply}"
                )));
            };
            read.push((offset, publication_id(publication)));
        }
        let first = read.first().map(|(offset, _)| *offset);
        let channel = self.channels[k].channel.clone();
        self.recorder.push(Event::CentrifugoHistory {
            subscriber: self.name.clone(),
            node: session.node.clone(),
            channel: channel.clone(),
            first,
            offset: history_head,
            epoch: epoch.to_owned(),
            at_ms: self.recorder.now_ms(),
        });
        // Live publications continue after `head`: what the history no
        // longer holds up to there is skipped, as a truncation.
        let earliest = first
            .unwrap_or(history_head.saturating_add(1))
            .min(head.saturating_add(1));
        if earliest > resume_after.saturating_add(1) {
            self.recorder.push(Event::Truncated {
                subscriber: self.name.clone(),
                node: session.node.clone(),
                channel,
                requested_after: resume_after,
                earliest,
                at_ms: self.recorder.now_ms(),
            });
            if let Some(position) = &mut self.positions[k] {
                position.offset = earliest - 1;
            }
            self.channels[k].last.store(earliest - 1, Ordering::SeqCst);
        }
        session.states[k] = Some(State::Live);
        for (offset, id) in read {
            if offset > resume_after && offset <= head {
                self.deliver(session, k, offset, id);
            }
        }
        for (offset, id) in buffered {
            self.deliver(session, k, offset, id);
        }
        Ok(())
    }

    /// Records a publication of channel `k` received at `offset`.
    fn deliver(&mut self, session: &Session, k: usize, offset: u64, id: String) {
        self.recorder.push(Event::Delivery {
            subscriber: self.name.clone(),
            node: session.node.clone(),
            channel: self.channels[k].channel.clone(),
            offset,
            id,
            at_ms: self.recorder.now_ms(),
        });
        if let Some(position) = &mut self.positions[k] {
            position.offset = offset;
        }
        self.channels[k].last.store(offset, Ordering::SeqCst);
    }
}

/// The message id the run's publishers put in `data` (`{"id": ...}`), or
/// the data itself.
fn publication_id(publication: &Value) -> String {
    publication["data"]["id"]
        .as_str()
        .map_or_else(|| publication["data"].to_string(), str::to_owned)
}

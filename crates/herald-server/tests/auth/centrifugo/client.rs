//! A hand-written client of Centrifugo's JSON protocol for the tests: it
//! sends commands (one or several per frame), reads frames of
//! newline-separated replies and pushes, answers the server's `{}` pings
//! when asked to, and reports the close code.

use std::collections::VecDeque;

use futures::{SinkExt, StreamExt};
use herald_testkit::ws::Ws;
use herald_testkit::{within, NODE_WAIT};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message as Frame;

use crate::Node;

/// One connection to `/connection/websocket`.
pub(crate) struct Client {
    ws: Ws,
    next_id: u32,
    /// Lines read but not taken yet.
    pending: VecDeque<Value>,
    /// Answer `{}` pings with `{}` pongs.
    pub(crate) pong: bool,
    /// Pings seen so far.
    pub(crate) pings: usize,
    /// The close code, once closed.
    pub(crate) closed: Option<Option<u16>>,
}

impl Client {
    /// Opens a connection (not yet `connect`ed).
    pub(crate) async fn open(node: &Node) -> Self {
        let ws = node
            .ws("/connection/websocket", &[])
            .await
            .expect("upgrade");
        Self {
            ws,
            next_id: 0,
            pending: VecDeque::new(),
            pong: true,
            pings: 0,
            closed: None,
        }
    }

    /// Opens a connection and connects with `token` ("" for none); the
    /// connect result.
    pub(crate) async fn connect(node: &Node, token: &str) -> (Self, Value) {
        let mut client = Self::open(node).await;
        let reply = client.command("connect", json!({ "token": token })).await;
        let result = reply["connect"].clone();
        assert!(result.is_object(), "connect failed: {reply}");
        (client, result)
    }

    /// Sends `text` as one text frame.
    pub(crate) async fn send_text(&mut self, text: &str) {
        self.ws
            .send(Frame::Text(text.to_owned().into()))
            .await
            .expect("send");
    }

    /// Sends a raw frame.
    pub(crate) async fn send_frame(&mut self, frame: Frame) {
        self.ws.send(frame).await.expect("send");
    }

    /// A new command id.
    pub(crate) fn id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    /// Sends `{"id":N,"<method>":params}` and returns the reply with that
    /// id (pushes read meanwhile are kept for [`Client::push`]).
    pub(crate) async fn command(&mut self, method: &str, params: Value) -> Value {
        let id = self.id();
        let mut command = json!({ "id": id });
        command[method] = params;
        self.send_text(&command.to_string()).await;
        self.reply(id).await
    }

    /// The reply with `id`.
    pub(crate) async fn reply(&mut self, id: u32) -> Value {
        if let Some(i) = self.pending.iter().position(|v| v["id"] == id) {
            return self.pending.remove(i).unwrap();
        }
        loop {
            let frame = self
                .frame()
                .await
                .expect("connection closed before the reply");
            let mut found = None;
            for line in frame {
                if found.is_none() && line["id"] == id {
                    found = Some(line);
                } else {
                    self.pending.push_back(line);
                }
            }
            if let Some(reply) = found {
                return reply;
            }
        }
    }

    /// The next push (`{"push":...}`), skipping pings.
    pub(crate) async fn push(&mut self) -> Value {
        loop {
            if let Some(i) = self.pending.iter().position(|v| v.get("push").is_some()) {
                return self.pending.remove(i).unwrap()["push"].clone();
            }
            let frame = self.frame().await.expect("connection closed before a push");
            self.pending.extend(frame);
        }
    }

    /// The lines of the next text frame without its pings (empty for a
    /// frame that held only a ping), answering pings as [`Client::pong`]
    /// says; `None` once closed (see [`Client::closed`]).
    pub(crate) async fn frame(&mut self) -> Option<Vec<Value>> {
        loop {
            if self.closed.is_some() {
                return None;
            }
            let next = within("a frame", NODE_WAIT, self.ws.next()).await;
            match next {
                Some(Ok(Frame::Text(text))) => {
                    let mut lines = Vec::new();
                    for line in text.split('\n').filter(|l| !l.trim().is_empty()) {
                        let value: Value = serde_json::from_str(line).expect("a JSON line");
                        if value == json!({}) {
                            self.pings += 1;
                            if self.pong {
                                self.send_text("{}").await;
                            }
                        } else {
                            lines.push(value);
                        }
                    }
                    return Some(lines);
                }
                Some(Ok(Frame::Close(frame))) => {
                    self.closed = Some(frame.map(|f| u16::from(f.code)));
                    while let Some(Ok(_)) = self.ws.next().await {}
                    return None;
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    self.closed = Some(None);
                    return None;
                }
            }
        }
    }

    /// Reads until the server closes, for at most [`NODE_WAIT`] (pings
    /// keep coming meanwhile, so the per-frame bound alone would not end
    /// it); its close code.
    pub(crate) async fn closed_with(&mut self) -> Option<u16> {
        within("the server's close", NODE_WAIT, async {
            while self.frame().await.is_some() {}
        })
        .await;
        self.closed.expect("closed")
    }
}

//! The transports one session (`session.rs`) runs on: how its frames
//! reach the client and how the client's commands reach it.
//!
//! - **WebSocket** (`/connection/websocket`): a text frame each way holds
//!   newline-separated JSON objects, or, with the subprotocol
//!   `centrifuge-protobuf`, a binary frame holds delimited protobuf
//!   messages (`codec.rs`); the session ends with a Close frame whose
//!   code is the disconnect's (RFC 6455 §7.4.2's private range).
//! - **HTTP streaming** (`/connection/http_stream`) and **SSE**
//!   (`/connection/sse`): the server's frames go into the response body,
//!   the client's commands come in through `/emulation` (`emulation.rs`).
//!   An HTTP stream writes each JSON object followed by `\n` (or, when
//!   its request was `application/octet-stream`, delimited protobuf
//!   replies); SSE writes
//!   each as one event, `data: <object>\n\n` (the HTML standard's "Server-
//!   sent events" format). A disconnect is a `{"push":{"disconnect":
//!   {"code":N,"reason":"..."}}}` push, then the end of the body, as
//!   Centrifugo ends these transports (a WebSocket carries the code in its
//!   Close frame instead).

use std::time::Duration;

use bytes::Bytes;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as Frame;

use super::codec::{decode_protobuf, Batch, ClientFrame, Encoding};
use super::codes::Disconnect;
use super::emulation_sessions::Registration;
use herald_http::websocket::Socket;

/// One client connection as the session gets it.
pub(crate) struct Connection {
    /// Where the session's frames go.
    pub(crate) sink: Sink,
    /// Where the client's frames come from.
    pub(crate) source: Source,
    /// The form of the protocol it speaks.
    pub(crate) encoding: Encoding,
    /// The session id of an emulation transport (see
    /// [`super::session::Session::emulation`]).
    pub(crate) emulation: Option<String>,
}

/// How a body-streaming transport frames the session's replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// Each object followed by `\n` (`/connection/http_stream`).
    Lines,
    /// Each object as one SSE event, `data: <object>\n\n`
    /// (`/connection/sse`).
    Events,
    /// Delimited protobuf replies (`/connection/http_stream` in the
    /// binary form).
    Protobuf,
}

impl Framing {
    /// The body bytes of one batch of replies: JSON objects separated by
    /// `\n` (none of them holds a raw newline: JSON escapes it inside
    /// strings, replies are written compact and stored values on one
    /// line, `replies::one_line`) for lines and events, delimited
    /// protobuf replies for protobuf; `None` for a batch of the other
    /// encoding (a bug: the connection is closed rather than sent it).
    pub(crate) fn encode(self, batch: Batch) -> Option<Bytes> {
        match (self, batch) {
            (Self::Protobuf, Batch::Protobuf(bytes)) => Some(Bytes::from(bytes)),
            (Self::Lines | Self::Events, Batch::Json(text)) => Some(self.encode_json(&text)),
            _ => None,
        }
    }

    /// The body bytes of JSON objects separated by `\n`.
    fn encode_json(self, text: &str) -> Bytes {
        match self {
            Self::Lines | Self::Protobuf => {
                let mut body = String::with_capacity(text.len() + 1);
                body.push_str(text);
                body.push('\n');
                Bytes::from(body)
            }
            Self::Events => {
                let mut body = String::with_capacity(text.len() + 16);
                for line in text.split('\n') {
                    body.push_str("data: ");
                    body.push_str(line);
                    body.push_str("\n\n");
                }
                Bytes::from(body)
            }
        }
    }
}

/// The writing half of a connection.
pub(crate) enum Sink {
    /// A WebSocket's, in its encoding.
    WebSocket(SplitSink<Socket, Frame>, Encoding),
    /// A response body's: its chunks go to the body stream through a
    /// bounded queue, so that a client that stops reading holds up the
    /// session's writes (and the write timeout ends it).
    Body {
        /// The body's queue.
        tx: mpsc::Sender<Bytes>,
        /// How frames are written.
        framing: Framing,
    },
}

/// The connection is gone: nothing more can be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gone;

impl Sink {
    /// Writes one batch of replies and pushes, encoded for the
    /// connection (a WebSocket frame, or a chunk of the body).
    ///
    /// # Errors
    /// [`Gone`] when the client is gone (or the batch is of the other
    /// encoding, a bug).
    pub(crate) async fn send(&mut self, batch: Batch) -> Result<(), Gone> {
        match (self, batch) {
            (Self::WebSocket(tx, Encoding::Json), Batch::Json(text)) => {
                tx.send(Frame::Text(text.into())).await.map_err(|_| Gone)
            }
            (Self::WebSocket(tx, Encoding::Protobuf), Batch::Protobuf(bytes)) => {
                tx.send(Frame::Binary(bytes.into())).await.map_err(|_| Gone)
            }
            (Self::WebSocket(..), _) => Err(Gone),
            (Self::Body { tx, framing }, batch) => {
                let bytes = framing.encode(batch).ok_or(Gone)?;
                tx.send(bytes).await.map_err(|_| Gone)
            }
        }
    }

    /// Ends the connection after the client closed its side (a WebSocket
    /// Close frame answered), waiting at most `timeout`.
    pub(crate) async fn close(&mut self, timeout: Duration) {
        if let Self::WebSocket(tx, _) = self {
            let _ = tokio::time::timeout(timeout, tx.close()).await;
        }
    }

    /// Ends the connection with disconnect `d`: a WebSocket Close frame
    /// with its code (the client's Close awaited), or the disconnect push
    /// and the end of the body; each step waits at most `timeout`.
    pub(crate) async fn disconnect(self, source: Source, d: Disconnect, timeout: Duration) {
        match (self, source) {
            (Self::WebSocket(tx, _), Source::WebSocket(rx, _, _)) => {
                herald_http::websocket::close(tx, rx, d.code, d.reason).await;
            }
            (Self::Body { tx, framing }, _) => {
                let push = super::replies::disconnect_push(d.code, d.reason);
                let encoding = if framing == Framing::Protobuf {
                    Encoding::Protobuf
                } else {
                    Encoding::Json
                };
                if let Some(bytes) = framing.encode(Batch::of(encoding, &push)) {
                    let _ = tokio::time::timeout(timeout, tx.send(bytes)).await;
                }
            }
            (Self::WebSocket(..), Source::Emulation { .. }) => {}
        }
    }
}

/// What the client sent next.
pub(crate) enum Incoming {
    /// A frame of commands.
    Frame(ClientFrame),
    /// A frame that is not the protocol (of the connection's encoding).
    NotTheProtocol,
    /// The client's WebSocket Close frame.
    Close,
    /// A WebSocket control frame (ping, pong): nothing to do.
    Other,
    /// A frame over the size limit, or a broken WebSocket.
    Broken,
    /// The client is gone.
    End,
}

/// The reading half of a connection.
pub(crate) enum Source {
    /// A WebSocket's, in its encoding, with the most commands one frame
    /// may hold (`session::max_commands_per_frame`).
    WebSocket(SplitStream<Socket>, Encoding, usize),
    /// An emulation transport's: frames of commands posted to
    /// `/emulation` for this session; the client is gone when the body's
    /// reader (the HTTP response) is dropped.
    Emulation {
        /// The frames posted for the session; the registration removes the
        /// session from the node's map when the session ends.
        commands: Registration,
        /// The response body's queue, watched for its reader's end.
        body: mpsc::Sender<Bytes>,
    },
}

impl Source {
    /// The client's next frame.
    pub(crate) async fn next(&mut self) -> Incoming {
        match self {
            Self::WebSocket(rx, encoding, max_commands) => match (rx.next().await, *encoding) {
                (Some(Ok(Frame::Text(text))), Encoding::Json) => {
                    Incoming::Frame(ClientFrame::Json(text.as_str().to_owned()))
                }
                (Some(Ok(Frame::Binary(bytes))), Encoding::Protobuf) => {
                    match decode_protobuf(&bytes, *max_commands) {
                        Ok(frame) => Incoming::Frame(frame),
                        Err(_) => Incoming::NotTheProtocol,
                    }
                }
                (Some(Ok(Frame::Text(_) | Frame::Binary(_))), _) => Incoming::NotTheProtocol,
                (Some(Ok(Frame::Close(_))), _) => Incoming::Close,
                (Some(Ok(_)), _) => Incoming::Other,
                (Some(Err(_)), _) => Incoming::Broken,
                (None, _) => Incoming::End,
            },
            Self::Emulation { commands, body } => tokio::select! {
                frame = commands.next() => frame.map_or(Incoming::End, Incoming::Frame),
                () = body.closed() => Incoming::End,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_written_as_lines_or_events() {
        let frame = || Batch::Json("{\"id\":1,\"connect\":{}}\n{\"push\":{}}".to_owned());
        assert_eq!(
            Framing::Lines.encode(frame()),
            Some(Bytes::from("{\"id\":1,\"connect\":{}}\n{\"push\":{}}\n"))
        );
        assert_eq!(
            Framing::Events.encode(frame()).unwrap(),
            Bytes::from("data: {\"id\":1,\"connect\":{}}\n\ndata: {\"push\":{}}\n\n")
        );
    }
}

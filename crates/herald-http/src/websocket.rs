//! WebSocket helpers shared by the protocol wings (API v1's `api/ws.rs`
//! and Centrifugo's `centrifugo/session.rs`): the upgrade ([`Upgrade`]),
//! the socket a session reads from ([`Socket`]) and the closing handshake
//! ([`close`]).
//!
//! Memory of an idle session: a session costs what it keeps between
//! frames, and most sessions wait far longer than they work. So the socket
//! under the WebSocket library is read on demand ([`OnDemandIo`]): a read
//! from the connection goes into a buffer on the stack, and only what the
//! library has not taken yet is kept on the heap, until it takes it. The
//! library's own read buffer is sized to the frames the session expects
//! (its `read_buffer_size`; it grows with a larger frame). Frames are
//! written out as they are sent (no write buffering).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::FromRequestParts;
use axum::http::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use bytes::{Buf, Bytes};
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message as Frame;
use tokio_tungstenite::WebSocketStream;

use crate::error::Error;

/// How long the server waits for a client to answer its Close frame, or to
/// take a frame, while closing.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Bytes taken from the connection by one read of [`OnDemandIo`], into a
/// buffer on the stack.
const READ_CHUNK_BYTES: usize = 8192;

/// A WebSocket session's socket (after the upgrade).
pub type Socket = WebSocketStream<OnDemandIo<TokioIo<Upgraded>>>;

/// A valid WebSocket upgrade request (RFC 6455 §4.2.1, or RFC 8441 over
/// HTTP/2), checked exactly as axum's `WebSocketUpgrade` checks it; the
/// session is started by [`Upgrade::on_upgrade`].
pub struct Upgrade {
    /// `Sec-WebSocket-Key` (HTTP/1.1), whose digest the `101` answer
    /// carries; `None` over HTTP/2.
    key: Option<HeaderValue>,
    /// The connection, once the answer is sent.
    on_upgrade: OnUpgrade,
}

impl<S: Send + Sync> FromRequestParts<S> for Upgrade {
    /// 400 `invalid_upgrade`, with the reason as axum words it.
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> std::result::Result<Self, Error> {
        // axum's extractor checks the request and takes the connection's
        // upgrade from it; a copy is kept here, so that the session is
        // started on this module's socket rather than axum's.
        let on_upgrade = parts.extensions.get::<OnUpgrade>().cloned();
        let key = parts.headers.get(SEC_WEBSOCKET_KEY).cloned();
        let checked = WebSocketUpgrade::from_request_parts(parts, state)
            .await
            .map_err(|r| Error::InvalidUpgrade(r.body_text()))?;
        let http2 = parts.version > axum::http::Version::HTTP_11;
        drop(checked);
        let on_upgrade = on_upgrade
            .ok_or_else(|| Error::InvalidUpgrade("Connection is not upgradable".to_owned()))?;
        Ok(Self {
            key: if http2 { None } else { key },
            on_upgrade,
        })
    }
}

impl Upgrade {
    /// Answers the upgrade and, once the connection is handed over, runs
    /// `session` on it, on its own task (the session's future is boxed
    /// then, so that the task spawned here stays small). Client frames and messages are
    /// held to `max_message_bytes` (a larger one is an error of the read,
    /// see [`is_too_big`]); the library's read buffer starts at
    /// `read_buffer_bytes`. A connection that fails before the upgrade
    /// completes ends without a session (logged at debug level).
    pub fn on_upgrade<F, Fut>(
        self,
        read_buffer_bytes: usize,
        max_message_bytes: usize,
        session: F,
    ) -> Response
    where
        F: FnOnce(Socket) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let on_upgrade = self.on_upgrade;
        // On the heap until the upgrade completes, then moved into the
        // session's future: the task's own allocation, which lasts as
        // long as the session, keeps no room for it.
        let session = Box::new(session);
        tokio::spawn(async move {
            let upgraded = match on_upgrade.await {
                Ok(upgraded) => upgraded,
                Err(e) => {
                    tracing::debug!(error = %e, "the WebSocket upgrade failed");
                    return;
                }
            };
            let config = WebSocketConfig::default()
                .read_buffer_size(read_buffer_bytes)
                .write_buffer_size(0)
                .max_message_size(Some(max_message_bytes))
                .max_frame_size(Some(max_message_bytes));
            let io = OnDemandIo::new(TokioIo::new(upgraded));
            let socket = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
            // On the heap, made once the connection is handed over: this
            // task then holds only a pointer to it.
            let session = Box::pin(session(socket));
            session.await;
        });
        match self.key {
            Some(key) => {
                let mut response = Response::new(axum::body::Body::empty());
                *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
                let headers = response.headers_mut();
                headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
                headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
                if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
                    headers.insert(SEC_WEBSOCKET_ACCEPT, accept);
                }
                response
            }
            // HTTP/2 (RFC 8441 §5): a 2xx answer with an empty body.
            None => Response::new(axum::body::Body::empty()),
        }
    }
}

/// The connection under a WebSocket session, read on demand: each read
/// takes up to [`READ_CHUNK_BYTES`] from the connection into a buffer on
/// the stack, hands the library what it asked for, and keeps the rest on
/// the heap only until the library takes it. An idle session thus holds
/// no read buffer here, and the library may read in small steps without a
/// system call for each. Writes pass through.
pub struct OnDemandIo<T> {
    inner: T,
    /// Bytes read from the connection and not taken yet; `None` (nothing
    /// allocated) when there are none.
    pending: Option<Bytes>,
}

impl<T> OnDemandIo<T> {
    /// Wraps `inner`.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            pending: None,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for OnDemandIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(pending) = &mut this.pending {
            let n = pending.len().min(buf.remaining());
            buf.put_slice(&pending[..n]);
            pending.advance(n);
            if pending.is_empty() {
                this.pending = None;
            }
            return Poll::Ready(Ok(()));
        }
        if buf.remaining() >= READ_CHUNK_BYTES {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let mut chunk = [std::mem::MaybeUninit::<u8>::uninit(); READ_CHUNK_BYTES];
        let mut read = ReadBuf::uninit(&mut chunk);
        ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
        let filled = read.filled();
        let n = filled.len().min(buf.remaining());
        buf.put_slice(&filled[..n]);
        if filled.len() > n {
            this.pending = Some(Bytes::copy_from_slice(&filled[n..]));
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for OnDemandIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Whether a read error is a client message or frame over the size limit.
pub fn is_too_big(error: &tokio_tungstenite::tungstenite::Error) -> bool {
    matches!(error, tokio_tungstenite::tungstenite::Error::Capacity(_))
}

/// Sends a Close frame and waits (bounded, [`CLOSE_TIMEOUT`] each way)
/// for the client's Close reply: ends API v1's WebSocket sessions and
/// Centrifugo's.
pub async fn close(
    mut tx: SplitSink<Socket, Frame>,
    mut rx: SplitStream<Socket>,
    code: u16,
    reason: &'static str,
) {
    let frame = Frame::Close(Some(CloseFrame {
        code: CloseCode::from(code),
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

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A read larger than the caller's buffer is handed out in the
    /// caller's steps, in order, without another read of the connection;
    /// once all of it was taken, nothing is kept.
    #[tokio::test]
    async fn reads_keep_only_what_was_not_taken_yet() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let mut io = OnDemandIo::new(server);
        let sent: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        client.write_all(&sent).await.unwrap();
        let mut got = Vec::new();
        let mut step = [0u8; 100];
        while got.len() < sent.len() {
            let n = io.read(&mut step).await.unwrap();
            assert!(n > 0 && n <= step.len());
            got.extend_from_slice(&step[..n]);
            assert_eq!(
                io.pending.as_ref().map_or(0, Bytes::len),
                sent.len() - got.len(),
                "everything read that was not taken waits in `pending`"
            );
        }
        assert_eq!(got, sent);
        assert!(io.pending.is_none(), "an idle socket holds no read buffer");
        // A large read goes straight to the caller's buffer.
        client.write_all(&sent).await.unwrap();
        let mut large = vec![0u8; READ_CHUNK_BYTES];
        let n = io.read(&mut large).await.unwrap();
        assert_eq!(&large[..n], &sent[..n]);
        assert!(io.pending.is_none());
        // The end of the connection reads as such.
        drop(client);
        let mut rest = Vec::new();
        io.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, sent[n..]);
    }
}

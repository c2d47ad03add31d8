//! The accept loop: serves each connection with HTTP/1 (upgrades included,
//! for WebSocket) or HTTP/2, bounds how long a client may take to send a
//! request head, and drains gracefully. A plain-TCP connection whose first
//! bytes are an SSE subscription request is served by `sse_connection.rs`
//! instead, outside hyper; its first bytes are awaited under the same
//! header read timeout, and a drain closes it while it waits for them.
//!
//! Time limits on a connection:
//! - before the protocol is known (HTTP/2 is recognised by its 24-byte
//!   preface, RFC 9113 §3.4; any other first bytes mean HTTP/1), the
//!   connection is closed when that takes longer than the header read
//!   timeout. hyper's protocol detection has no limit of its own, so a
//!   client that connects and sends nothing would otherwise stay forever;
//! - HTTP/1: hyper's header read timeout, which runs while a request head
//!   is awaited, for the first request and between kept-alive requests;
//! - HTTP/2: a PING after the same period without a frame from the client,
//!   and the connection closes when it is not answered in time.
//!
//! With TLS, the handshake comes first and has the same time limit.
//!
//! A request whose head arrived is never cut by these limits: bodies, SSE
//! streams and WebSocket sessions last as long as the application keeps
//! them. A connection closed because its request head did not come in time
//! counts in `herald_idle_connections_closed_total`.
//!
//! Connections per client address (`conn_limit.rs`): a connection from an
//! address that has `max_connections_per_ip` open already is still
//! accepted, and every request on it is answered `429
//! too_many_connections` with `Connection: close`, so the client learns
//! why rather than seeing a reset. Connections from trusted proxies are not
//! counted here (their requests are, by `X-Forwarded-For`).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::convert::Infallible;

use axum::http::header::CONNECTION;
use axum::http::{HeaderValue, Request};
use axum::response::IntoResponse;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::conn_limit::{ConnectionLimits, Peer};
use crate::error::Error;
use crate::metrics;
use crate::sse_connection::{self, Opening};

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// First pause after a failed accept.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(50);

/// Longest pause after failed accepts.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Accepts connections on `listener` and serves `app` on each until `stop`
/// is cancelled; with `tls`, each connection first completes a TLS
/// handshake, which must end within `header_read_timeout` (a failed one is
/// logged at debug level and the connection closed). Then it stops accepting (the listener is closed), asks
/// every connection to finish gracefully (in-flight requests complete, idle
/// connections close) and returns once all of them have ended.
///
/// Accept errors never end the loop: a connection that failed before it
/// was accepted is skipped, and any other error (such as running out of
/// file descriptors) is logged and retried after a pause that doubles from
/// [`ACCEPT_BACKOFF_MIN`] up to [`ACCEPT_BACKOFF_MAX`].
pub async fn serve_connections(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: Router,
    header_read_timeout: Duration,
    max_streams_per_connection: u32,
    limits: Arc<ConnectionLimits>,
    stop: CancellationToken,
) {
    let refusal = refusal_router();
    let builder = Arc::new(connection_builder(
        header_read_timeout,
        max_streams_per_connection,
    ));
    let graceful = GracefulShutdown::new();
    let mut backoff = Backoff::default();
    loop {
        let accepted = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                backoff.reset();
                let watcher = graceful.watcher();
                let builder = Arc::clone(&builder);
                let tls = tls.clone();
                // Trusted proxies are not counted per connection.
                let slot = if limits.is_trusted(peer.ip()) {
                    Ok(None)
                } else {
                    limits.try_acquire(peer.ip()).map(Some).ok_or(())
                };
                let router = if slot.is_ok() { &app } else { &refusal };
                let service = TowerToHyperService::new(with_peer(router.clone(), peer));
                // SSE subscriptions are served outside hyper, on plain TCP
                // (`sse_connection.rs`); a refused connection is not.
                let sse_router = (slot.is_ok() && tls.is_none()).then(|| app.clone());
                let stop = stop.clone();
                tokio::spawn(async move {
                    // Held until the connection ends.
                    let _slot = slot;
                    let mut stream = stream;
                    if let Some(sse_router) = sse_router {
                        // Each stage boxed: the task keeps room only for
                        // what the connection is doing now.
                        let opening = Box::pin(sse_connection::open(
                            &mut stream,
                            header_read_timeout,
                            &stop,
                        ))
                        .await;
                        match opening {
                            Ok(Opening::Subscription(request)) => {
                                drop(service);
                                // `watcher` lives until the stream ends, so
                                // that a drain waits for it.
                                let answer =
                                    Box::pin(sse_connection::answer(request, sse_router, peer))
                                        .await;
                                if let Some(answer) = answer {
                                    Box::pin(sse_connection::write(stream, answer, peer)).await;
                                }
                                drop(watcher);
                                return;
                            }
                            Ok(Opening::Other) => {}
                            Ok(Opening::Silent) => {
                                metrics::idle_connection_closed();
                                tracing::debug!(%peer, "closing a connection that sent no request head in time");
                                return;
                            }
                            Ok(Opening::Draining) => return,
                            Err(e) => {
                                tracing::debug!(%peer, error = %e, "connection ended with an error");
                                return;
                            }
                        }
                    }
                    // hyper's connection state takes several KiB: boxed, so
                    // that a task serving an SSE subscription above does not
                    // carry room for it.
                    Box::pin(async move {
                        let detected = Arc::new(AtomicBool::new(false));
                        let Some(tls) = tls else {
                            let io =
                                TokioIo::new(DetectProtocol::new(stream, Arc::clone(&detected)));
                            let conn =
                                watcher.watch(builder.serve_connection_with_upgrades(io, service));
                            serve_one(conn, &detected, header_read_timeout, peer).await;
                            return;
                        };
                        let stream =
                            match tokio::time::timeout(header_read_timeout, tls.accept(stream))
                                .await
                            {
                                Ok(Ok(stream)) => stream,
                                Ok(Err(e)) => {
                                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                    return;
                                }
                                Err(_) => {
                                    tracing::debug!(%peer, "closing a connection whose TLS handshake did not finish in time");
                                    return;
                                }
                            };
                        let io = TokioIo::new(DetectProtocol::new(stream, Arc::clone(&detected)));
                        let conn =
                            watcher.watch(builder.serve_connection_with_upgrades(io, service));
                        serve_one(conn, &detected, header_read_timeout, peer).await;
                    })
                    .await;
                });
            }
            Err(e) if is_connection_error(&e) => {
                tracing::debug!(error = %e, "a connection failed before it was accepted");
            }
            Err(e) => {
                let pause = backoff.next_pause();
                tracing::warn!(
                    error = %e,
                    retry_in_ms = pause.as_millis() as u64,
                    "accepting a connection failed"
                );
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
    drop(listener);
    tracing::debug!(
        connections = graceful.count(),
        "not accepting connections; waiting for open ones to end"
    );
    graceful.shutdown().await;
}

/// `router`, with the connection's [`Peer`] address in each request's
/// extensions.
fn with_peer(
    router: Router,
    peer: SocketAddr,
) -> impl tower::Service<
    Request<Incoming>,
    Response = axum::response::Response,
    Error = Infallible,
    Future = impl Future<Output = Result<axum::response::Response, Infallible>> + Send,
> + Clone {
    tower::service_fn(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(Peer(peer));
        router.clone().oneshot(request)
    })
}

/// Answers every request `429 too_many_connections` and closes the
/// connection after the answer.
fn refusal_router() -> Router {
    Router::new().fallback(|| async {
        let mut response = Error::TooManyConnections.into_response();
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        response
    })
}

/// The connection settings: HTTP/1 with `header_read_timeout`, HTTP/2 with
/// PINGs at the same period and at most `max_streams` requests at once.
fn connection_builder(header_read_timeout: Duration, max_streams: u32) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(header_read_timeout)
        .keep_alive_timeout(header_read_timeout)
        .max_concurrent_streams(max_streams);
    builder
}

/// Drives one connection. Until the client's first bytes have told which
/// protocol it speaks, the connection may last at most
/// `header_read_timeout`; from then on the protocol's own limits apply.
async fn serve_one<F>(
    conn: F,
    detected: &AtomicBool,
    header_read_timeout: Duration,
    peer: SocketAddr,
) where
    F: Future<Output = Result<(), Box<dyn std::error::Error + Send + Sync>>>,
{
    let mut conn = pin!(conn);
    let result = match tokio::time::timeout(header_read_timeout, conn.as_mut()).await {
        Ok(result) => result,
        Err(_) if detected.load(Ordering::Acquire) => conn.await,
        Err(_) => {
            metrics::idle_connection_closed();
            tracing::debug!(%peer, "closing a connection that sent no request head in time");
            return;
        }
    };
    if let Err(e) = result {
        if e.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_timeout)
        {
            // hyper's header read timeout: no request head in time.
            metrics::idle_connection_closed();
        }
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// Whether an accept error concerns only the connection being accepted
/// (the peer gave up before the accept): such errors need no pause.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    )
}

/// The pauses between failed accepts: [`ACCEPT_BACKOFF_MIN`], doubling up to
/// [`ACCEPT_BACKOFF_MAX`], back to the start after a successful accept.
#[derive(Debug, Default)]
struct Backoff {
    /// The pause after the last failure, `None` after a success.
    last: Option<Duration>,
}

impl Backoff {
    /// The pause to take after one more failure.
    fn next_pause(&mut self) -> Duration {
        let pause = self.last.map_or(ACCEPT_BACKOFF_MIN, |last| {
            (last * 2).min(ACCEPT_BACKOFF_MAX)
        });
        self.last = Some(pause);
        pause
    }

    /// Forgets the failures.
    fn reset(&mut self) {
        self.last = None;
    }
}

/// A connection's socket that watches the first bytes the client sends, the
/// way hyper tells HTTP/2 from HTTP/1, and sets `detected` once the protocol
/// is known: at the first byte that differs from the HTTP/2 preface, or
/// when the whole preface has arrived.
struct DetectProtocol<T> {
    /// The socket.
    inner: T,
    /// How many leading bytes matched the HTTP/2 preface so far.
    matched: usize,
    /// Set once the protocol is known.
    detected: Arc<AtomicBool>,
}

impl<T> DetectProtocol<T> {
    /// Wraps `inner`; `detected` is set once the protocol is known.
    fn new(inner: T, detected: Arc<AtomicBool>) -> Self {
        Self {
            inner,
            matched: 0,
            detected,
        }
    }

    /// Looks at `fresh`, the bytes just read.
    fn observe(&mut self, fresh: &[u8]) {
        if self.matched == H2_PREFACE.len() {
            return;
        }
        for &byte in fresh {
            if byte != H2_PREFACE[self.matched] {
                // HTTP/1; stop looking.
                self.matched = H2_PREFACE.len();
                break;
            }
            self.matched += 1;
            if self.matched == H2_PREFACE.len() {
                break;
            }
        }
        if self.matched == H2_PREFACE.len() {
            self.detected.store(true, Ordering::Release);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for DetectProtocol<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) {
            let this = &mut *self;
            this.observe(&buf.filled()[before..]);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for DetectProtocol<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_backoff_doubles_to_one_second_and_resets() {
        let mut b = Backoff::default();
        let pauses: Vec<u64> = (0..8).map(|_| b.next_pause().as_millis() as u64).collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1000, 1000, 1000]);
        b.reset();
        assert_eq!(b.next_pause(), ACCEPT_BACKOFF_MIN);
    }

    fn detector() -> (DetectProtocol<()>, Arc<AtomicBool>) {
        let detected = Arc::new(AtomicBool::new(false));
        (DetectProtocol::new((), Arc::clone(&detected)), detected)
    }

    #[test]
    fn the_protocol_is_known_at_the_first_byte_off_the_preface_or_at_its_end() {
        let (mut d, detected) = detector();
        d.observe(b"P");
        d.observe(b"RI * HTTP/2.0\r\n");
        assert!(!detected.load(Ordering::Acquire), "a prefix of the preface");
        d.observe(b"\r\nSM\r\n\r\n");
        assert!(detected.load(Ordering::Acquire), "the whole preface");

        let (mut d, detected) = detector();
        d.observe(b"POST /v1");
        assert!(detected.load(Ordering::Acquire), "HTTP/1 at the 'O'");

        let (mut d, detected) = detector();
        d.observe(b"");
        assert!(!detected.load(Ordering::Acquire));
        d.observe(b"G");
        assert!(detected.load(Ordering::Acquire), "HTTP/1 at the first byte");
    }
}

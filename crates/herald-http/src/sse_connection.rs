//! SSE subscriptions served outside the HTTP library, so that an idle
//! subscriber costs little more than its subscription.
//!
//! hyper keeps a read buffer (at least 8 KiB) and the write buffer that
//! carried the response head for as long as a response lasts; an SSE
//! response never ends, so every idle subscriber would hold both. Here, a
//! connection whose first request is an SSE subscription
//! (`GET /v1/channels/{channel}/events`, HTTP/1.1, no body, no upgrade) is
//! recognised from the bytes it sent first, without consuming them
//! ([`open`]); its head is then taken off the socket and the request goes
//! through the same router, layers and handler as any other ([`answer`]),
//! and the answer is written here ([`write`]).
//! An event stream is written as a chunked body (RFC 9112
//! §7.1), each event written as it comes with no buffer kept in between;
//! any other answer (an error) whole. Both carry `Connection: close`: the
//! connection closes when the answer ends. Every other connection, and one
//! whose first bytes do not hold a complete request head yet, is served by
//! hyper exactly as before (nothing was read from it).
//!
//! Client bytes that come while the stream runs are read into a small
//! scratch buffer on the stack and dropped (an SSE client sends nothing);
//! end of stream or an error there means the client left, and the
//! subscription ends at once.

use std::io;
use std::net::SocketAddr;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::header::{CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, DATE, TRANSFER_ENCODING};
use axum::http::{HeaderName, HeaderValue, Method, Request, Response, Version};
use axum::Router;
use bytes::Bytes;
use http_body::Body as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::conn_limit::Peer;

/// Most bytes of a connection's opening looked at. A request head that is
/// longer, or not complete in the first bytes that arrived, goes to hyper.
const OPENING_BYTES: usize = 4096;

/// Most header fields of a recognised request; more go to hyper.
const MAX_HEADERS: usize = 48;

/// Largest answer other than an event stream written here (the route's
/// error answers are a few hundred bytes).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// The route served here: `GET /v1/channels/{channel}/events`.
const PATH_PREFIX: &str = "/v1/channels/";
const PATH_SUFFIX: &str = "/events";

/// What a connection's first bytes are.
pub enum Opening {
    /// A complete SSE subscription request, its head already taken off the
    /// socket.
    Subscription(Box<Request<Body>>),
    /// Anything else, the socket untouched: hyper serves it.
    Other,
    /// Nothing came within the header read timeout.
    Silent,
    /// The server drains: the connection is closed without an answer.
    Draining,
}

/// Waits (at most `header_read_timeout`, and not past `stop`) for the
/// connection's first bytes and looks at them without consuming them.
/// When they hold a complete SSE subscription request (see the module
/// docs), takes its head off the socket and returns it as a request with
/// an empty body; otherwise returns [`Opening::Other`] with nothing read.
///
/// # Errors
/// An I/O error of the socket (the connection is then dropped).
pub async fn open(
    stream: &mut TcpStream,
    header_read_timeout: Duration,
    stop: &CancellationToken,
) -> io::Result<Opening> {
    // The buffer lives only inside each poll: a connection waiting for its
    // first bytes holds none.
    let first_bytes = std::future::poll_fn(|cx| {
        let mut opening = vec![0u8; OPENING_BYTES];
        let mut buf = ReadBuf::new(&mut opening);
        let n = std::task::ready!(stream.poll_peek(cx, &mut buf))?;
        opening.truncate(n);
        Poll::Ready(Ok::<_, io::Error>(opening))
    });
    let peeked = tokio::select! {
        biased;
        () = stop.cancelled() => return Ok(Opening::Draining),
        peeked = tokio::time::timeout(header_read_timeout, first_bytes) => peeked,
    };
    let Ok(peeked) = peeked else {
        return Ok(Opening::Silent);
    };
    let mut opening = peeked?;
    let Some((request, head_len)) = subscription_request(&opening) else {
        return Ok(Opening::Other);
    };
    // The head is in the socket's receive buffer already: this read does
    // not wait for the client.
    stream.read_exact(&mut opening[..head_len]).await?;
    Ok(Opening::Subscription(Box::new(request)))
}

/// Parses `bytes` as the head of an SSE subscription request; returns the
/// request and the head's length in bytes, or `None` when `bytes` do not
/// hold a complete head or hold any other request.
fn subscription_request(bytes: &[u8]) -> Option<(Request<Body>, usize)> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut fields);
    let httparse::Status::Complete(head_len) = parsed.parse(bytes).ok()? else {
        return None;
    };
    if parsed.method != Some("GET") || parsed.version != Some(1) {
        return None;
    }
    let target = parsed.path?;
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    let channel = path.strip_prefix(PATH_PREFIX)?.strip_suffix(PATH_SUFFIX)?;
    if channel.is_empty() || channel.contains('/') {
        return None;
    }
    let mut request = Request::builder()
        .method(Method::GET)
        .uri(target)
        .version(Version::HTTP_11);
    for field in parsed.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes()).ok()?;
        // A body, an upgrade or an expectation: hyper's job.
        let plain_get = match name.as_str() {
            "content-length" => field.value == b"0",
            "transfer-encoding" | "upgrade" | "expect" => false,
            _ => true,
        };
        if !plain_get {
            return None;
        }
        request = request.header(name, HeaderValue::from_bytes(field.value).ok()?);
    }
    Some((request.body(Body::empty()).ok()?, head_len))
}

/// The answer to a subscription request, ready to be written.
pub enum Answer {
    /// An event stream: its head, then its body, chunk by chunk.
    Stream {
        /// The status line and header fields.
        head: Vec<u8>,
        /// The events.
        body: Body,
    },
    /// Any other answer (an error), head and body, with `Connection:
    /// close`.
    Whole(Vec<u8>),
}

/// Answers `request` through `router`, with the connection's [`Peer`]:
/// the same layers and handler as any request. Returns `None` when the
/// answer is not an event stream and its body fails or is larger than
/// [`MAX_ANSWER_BYTES`] (the connection is then dropped).
pub async fn answer(
    request: Box<Request<Body>>,
    router: Router,
    peer: SocketAddr,
) -> Option<Answer> {
    let mut request = *request;
    request.extensions_mut().insert(Peer(peer));
    let response = match router.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    if is_event_stream(&response) {
        let head = head(&response, &Framing::Chunked);
        return Some(Answer::Stream {
            head,
            body: response.into_body(),
        });
    }
    let (parts, body) = response.into_parts();
    let body = match axum::body::to_bytes(body, MAX_ANSWER_BYTES).await {
        Ok(body) => body,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "an answer on the SSE route could not be read");
            return None;
        }
    };
    let mut whole = head(
        &Response::from_parts(parts, Body::empty()),
        &Framing::Length(body.len()),
    );
    whole.extend_from_slice(&body);
    Some(Answer::Whole(whole))
}

/// Writes `answer` on `stream`, an event stream as it comes (see the
/// module docs), then closes the connection. Returns when the answer
/// ended, the client left, or writing to it failed.
pub async fn write(mut stream: TcpStream, answer: Answer, peer: SocketAddr) {
    let outcome = match answer {
        Answer::Stream { head, body } => stream_events(&mut stream, head, body).await,
        Answer::Whole(whole) => stream.write_all(&whole).await,
    };
    match outcome {
        Ok(()) => {
            // The answer is complete; a failed shutdown changes nothing.
            let _ = stream.shutdown().await;
        }
        Err(e) => tracing::debug!(%peer, error = %e, "SSE connection ended with an error"),
    }
}

/// Whether `response` is an event stream (`text/event-stream`).
fn is_event_stream(response: &Response<Body>) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// How an answer's body is framed.
enum Framing {
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// `Content-Length`, then the connection closes.
    Length(usize),
}

/// The status line and header fields of `response`, with the framing's
/// fields and a `Date` (RFC 9110 §6.6.1) when the answer has none.
fn head(response: &Response<Body>, framing: &Framing) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let status = response.status();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut field = |name: &[u8], value: &[u8]| {
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    };
    for (name, value) in response.headers() {
        if name != CONTENT_LENGTH && name != TRANSFER_ENCODING && name != CONNECTION {
            field(name.as_str().as_bytes(), value.as_bytes());
        }
    }
    if !response.headers().contains_key(DATE) {
        field(
            b"date",
            httpdate::fmt_http_date(SystemTime::now()).as_bytes(),
        );
    }
    match framing {
        Framing::Chunked => field(b"transfer-encoding", b"chunked"),
        Framing::Length(len) => field(b"content-length", len.to_string().as_bytes()),
    }
    // The connection closes when the answer ends, an event stream's too:
    // said in the head, so that a client does not keep the connection for
    // its next request (RFC 9112 §9.6) and send that request into a
    // connection this node is closing.
    field(b"connection", b"close");
    out.extend_from_slice(b"\r\n");
    out
}

/// What happened first while a stream runs.
enum Step {
    /// The body's next frame, or its end.
    Frame(Option<Result<Bytes, axum::Error>>),
    /// The client closed the connection (or it broke).
    ClientLeft,
}

/// Writes the head, then each event as one chunk as soon as the body yields
/// it, until the body ends (the last chunk follows) or the client leaves.
async fn stream_events(stream: &mut TcpStream, head: Vec<u8>, mut body: Body) -> io::Result<()> {
    stream.write_all(&head).await?;
    drop(head);
    loop {
        let step = tokio::select! {
            frame = next_data(&mut body) => Step::Frame(frame),
            () = client_left(stream) => Step::ClientLeft,
        };
        match step {
            Step::Frame(Some(Ok(data))) => write_chunk(stream, &data).await?,
            Step::Frame(Some(Err(e))) => return Err(io::Error::other(e)),
            Step::Frame(None) => return stream.write_all(b"0\r\n\r\n").await,
            Step::ClientLeft => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the client closed the connection",
                ))
            }
        }
    }
}

/// The body's next non-empty data frame (trailers are skipped), or `None`
/// at its end.
async fn next_data(body: &mut Body) -> Option<Result<Bytes, axum::Error>> {
    loop {
        let frame = std::future::poll_fn(|cx| std::pin::Pin::new(&mut *body).poll_frame(cx));
        match frame.await? {
            Ok(frame) => match frame.into_data() {
                Ok(data) if !data.is_empty() => return Some(Ok(data)),
                _ => {}
            },
            Err(e) => return Some(Err(e)),
        }
    }
}

/// One chunk of the chunked coding (RFC 9112 §7.1): size in hex, the data.
async fn write_chunk(stream: &mut TcpStream, data: &[u8]) -> io::Result<()> {
    let size = format!("{:x}\r\n", data.len());
    let mut out = Vec::with_capacity(size.len() + data.len() + 2);
    out.extend_from_slice(size.as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    stream.write_all(&out).await
}

/// Resolves when the client has closed the connection (or it broke);
/// anything it sends meanwhile is read and dropped.
async fn client_left(stream: &TcpStream) {
    loop {
        if stream.readable().await.is_err() {
            return;
        }
        let mut scratch = [0u8; 64];
        match stream.try_read(&mut scratch) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &str) -> Option<(Request<Body>, usize)> {
        subscription_request(head.as_bytes())
    }

    #[test]
    fn a_complete_sse_get_is_recognised_with_its_length() {
        let head = "GET /v1/channels/news:a/events?after=3 HTTP/1.1\r\nHost: h\r\nAccept: text/event-stream\r\nLast-Event-ID: 7\r\n\r\n";
        let (request, len) = parse(&format!("{head}GET /next")).expect("recognised");
        assert_eq!(len, head.len());
        assert_eq!(request.uri(), "/v1/channels/news:a/events?after=3");
        assert_eq!(request.headers()["last-event-id"], "7");
        assert_eq!(request.version(), Version::HTTP_11);
    }

    #[test]
    fn anything_else_is_left_to_hyper() {
        for head in [
            // Not complete yet.
            "GET /v1/channels/a/events HTTP/1.1\r\nHost: h\r\n",
            // Other routes and methods.
            "GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET /v1/channels/a/ws HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET /v1/channels//events HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET /v1/channels/a/b/events HTTP/1.1\r\nHost: h\r\n\r\n",
            "HEAD /v1/channels/a/events HTTP/1.1\r\nHost: h\r\n\r\n",
            "POST /v1/channels/a/events HTTP/1.1\r\nHost: h\r\n\r\n",
            // HTTP/1.0, HTTP/2's preface.
            "GET /v1/channels/a/events HTTP/1.0\r\nHost: h\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            // A body, an upgrade, an expectation.
            "GET /v1/channels/a/events HTTP/1.1\r\nContent-Length: 2\r\n\r\nab",
            "GET /v1/channels/a/events HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET /v1/channels/a/events HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            "GET /v1/channels/a/events HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
            // Not HTTP.
            "\u{0}\u{1}garbage\r\n\r\n",
        ] {
            assert!(parse(head).is_none(), "{head:?}");
        }
        let empty_body = "GET /v1/channels/a/events HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
        assert!(parse(empty_body).is_some());
    }

    #[test]
    fn more_fields_than_the_limit_are_left_to_hyper() {
        let mut head = String::from("GET /v1/channels/a/events HTTP/1.1\r\n");
        for i in 0..=MAX_HEADERS {
            head.push_str(&format!("x-{i}: v\r\n"));
        }
        head.push_str("\r\n");
        assert!(parse(&head).is_none());
    }

    #[test]
    fn a_head_has_the_framing_and_a_date() {
        let response = Response::builder()
            .status(200)
            .header(CONTENT_TYPE, "text/event-stream")
            .header(CONTENT_LENGTH, "5")
            .body(Body::empty())
            .unwrap();
        let text = String::from_utf8(head(&response, &Framing::Chunked)).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(
            text.contains("content-type: text/event-stream\r\n"),
            "{text}"
        );
        // A stream's connection closes when it ends: the head says so.
        assert!(
            text.contains("transfer-encoding: chunked\r\nconnection: close\r\n"),
            "{text}"
        );
        assert!(text.contains("\r\ndate: "), "{text}");
        assert!(!text.contains("content-length"), "{text}");
        assert!(text.ends_with("\r\n\r\n"), "{text}");
        let text = String::from_utf8(head(&response, &Framing::Length(12))).unwrap();
        assert!(
            text.contains("content-length: 12\r\nconnection: close\r\n"),
            "{text}"
        );
    }
}

//! Centrifugo's bidirectional emulation: the transports where the server's
//! frames stream in an HTTP response and the client's commands come in as
//! separate `POST /emulation` requests (Centrifugo's documentation,
//! "Bidirectional emulation"; centrifuge-js's `http_stream` and `sse`
//! transports):
//!
//! - `POST /connection/http_stream`: the body holds the client's first
//!   frame (its `connect`); the answer streams the session's frames, each
//!   JSON object followed by `\n`;
//! - `GET /connection/sse?cf_connect=<frame>` (or `POST` with the frame as
//!   the body): the answer is `text/event-stream`, one event per object;
//! - `POST /emulation` with `{"node": "<node id>", "session": "<session>",
//!   "data": "<frame>"}`: the frame is run by that session, which answers
//!   in its stream; `204` once it is queued. The connect reply names the
//!   `session` (a random secret of the connection, not the public client
//!   id) and the `node`. A request that reaches another node of the
//!   cluster than the session's is forwarded once to that node's
//!   advertised URL (from the node reports).
//!
//! The session behind them is the WebSocket's (`session.rs`); only the
//! framing differs (`transport.rs`). The binary form (`codec.rs`) is
//! chosen by `Content-Type: application/octet-stream`: an HTTP stream
//! whose request body is delimited `Command`s streams delimited `Reply`s,
//! and an `/emulation` body is then an `EmulationRequest` whose `data`
//! holds delimited `Command`s. SSE is text: JSON only.

use std::convert::Infallible;

use std::collections::BTreeMap;

use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

use super::codec::Encoding;
use super::codec::{decode_protobuf, ClientFrame};
use super::context::CentrifugoState;
use super::session::{self, client_id};
use super::transport::{Connection, Framing, Sink, Source};
use herald_http::conn_limit::ClientSlot;
use herald_http::error::{Error, Result};
use herald_http::extract::{read_limited, FromQuery, QueryParams, ValidQuery};
use herald_node::forward::ForwardRequest;

/// Chunks of a response body queued before the session's writes wait
/// for the client to read.
const BODY_QUEUE: usize = 8;

/// Whether a body is the binary protocol.
fn is_protobuf(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/octet-stream"))
}

/// The checks a web page's request must pass before anything runs
/// (`edge.rs`): an `Origin` the CORS allow-list allows (or none: not a
/// browser), and a body of `application/json` (or `application/<x>+json`)
/// or, where `binary`, `application/octet-stream`, types a page can send
/// only after a CORS preflight.
///
/// # Errors
/// 403 `origin_not_allowed`; 415 `unsupported_media_type`.
fn from_a_page_allowed(
    state: &CentrifugoState,
    headers: &HeaderMap,
    uri: &Uri,
    binary: bool,
) -> Result<()> {
    herald_http::edge::cross_origin_write_refusal(&state.shared, headers, uri)?;
    if herald_http::edge::is_json(headers) || (binary && is_protobuf(headers)) {
        Ok(())
    } else {
        Err(Error::UnsupportedMediaType)
    }
}

/// A frame of commands from a request body (a binary body is decoded
/// with `codec.rs`).
///
/// # Errors
/// 400 `invalid_body` when it is empty, not UTF-8 JSON text or, in the
/// binary form, not delimited `Command`s.
fn frame(headers: &HeaderMap, body: &[u8], max_commands: usize) -> Result<ClientFrame> {
    if is_protobuf(headers) {
        if body.is_empty() {
            return Err(Error::InvalidBody(
                "the body must hold the connect command".to_owned(),
            ));
        }
        return decode_protobuf(body, max_commands).map_err(|e| Error::InvalidBody(e.to_string()));
    }
    let text = std::str::from_utf8(body)
        .map_err(|_| Error::InvalidBody("the commands must be UTF-8 JSON".to_owned()))?;
    if text.trim().is_empty() {
        return Err(Error::InvalidBody(
            "the body must hold the connect command".to_owned(),
        ));
    }
    Ok(ClientFrame::Json(text.to_owned()))
}

/// `POST /connection/http_stream`: starts a session whose frames stream
/// in the answer, one JSON object per line (delimited protobuf replies
/// for an `application/octet-stream` request).
///
/// # Errors
/// See [`from_a_page_allowed`] and [`frame`]; 413 `payload_too_large`
/// for a body over the frame limit; 503 `draining` while the node drains.
pub(crate) async fn http_stream(
    State(state): State<CentrifugoState>,
    slot: Option<Extension<ClientSlot>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    from_a_page_allowed(&state, &headers, &uri, true)?;
    let limit = session::max_frame_bytes(state.settings());
    let body = read_limited(&headers, body, limit).await?;
    let first = frame(
        &headers,
        &body,
        session::max_commands_per_frame(state.config().channel_limit),
    )?;
    let framing = if is_protobuf(&headers) {
        Framing::Protobuf
    } else {
        Framing::Lines
    };
    start(state, slot, first, framing)
}

/// `cf_connect` of an SSE request: the client's first frame.
#[derive(Debug)]
pub(crate) struct SseQuery {
    cf_connect: Option<String>,
}

impl FromQuery for SseQuery {
    fn from_query(params: &QueryParams) -> Result<Self> {
        Ok(Self {
            cf_connect: params.get("cf_connect")?.map(str::to_owned),
        })
    }
}

/// Whether `frame` is one `connect` command and nothing else.
fn only_connect(frame: &ClientFrame) -> bool {
    let ClientFrame::Json(frame) = frame else {
        return false;
    };
    let line = frame.trim();
    !line.contains('\n')
        && serde_json::from_str::<BTreeMap<String, &RawValue>>(line)
            .is_ok_and(|fields| fields.contains_key("connect"))
        && super::protocol::Shape::of(line).is_some_and(|s| s.requests == 1 && !s.unknown)
}

/// `GET /connection/sse?cf_connect=<frame>` and `POST /connection/sse`
/// (the frame as the body): starts a session whose frames stream as
/// server-sent events. The first frame is one `connect` and nothing else:
/// a `GET` is a request any page can make without a preflight (an image,
/// a link), so it may start a session but not run anything else.
///
/// # Errors
/// 400 `invalid_query` without `cf_connect` (or with two) on a `GET`, or
/// when the frame is not one `connect`; for a `POST`, see
/// [`from_a_page_allowed`] (JSON only: SSE is text) and [`frame`], and 413
/// `payload_too_large`; 403 `origin_not_allowed` from a page whose origin
/// is not allowed; 503 `draining` while the node drains.
pub(crate) async fn sse(
    State(state): State<CentrifugoState>,
    slot: Option<Extension<ClientSlot>>,
    method: Method,
    uri: Uri,
    ValidQuery(query): ValidQuery<SseQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    let first: ClientFrame = if method == Method::POST {
        from_a_page_allowed(&state, &headers, &uri, false)?;
        let limit = session::max_frame_bytes(state.settings());
        let body = read_limited(&headers, body, limit).await?;
        frame(
            &headers,
            &body,
            session::max_commands_per_frame(state.config().channel_limit),
        )?
    } else {
        herald_http::edge::cross_origin_write_refusal(&state.shared, &headers, &uri)?;
        query
            .cf_connect
            .filter(|c| !c.trim().is_empty())
            .map(ClientFrame::Json)
            .ok_or_else(|| {
                Error::InvalidQuery("cf_connect must hold the connect command".to_owned())
            })?
    };
    if !only_connect(&first) {
        return Err(Error::InvalidQuery(
            "the first frame of an SSE session must be one connect command".to_owned(),
        ));
    }
    start(state, slot, first, Framing::Events)
}

/// Starts the session on its own task (tracked for the drain) and answers
/// with its stream.
fn start(
    state: CentrifugoState,
    slot: Option<Extension<ClientSlot>>,
    first: ClientFrame,
    framing: Framing,
) -> Result<Response> {
    if state.draining() {
        return Err(Error::Draining);
    }
    let (body_tx, body_rx) = mpsc::channel::<Bytes>(BODY_QUEUE);
    let registration = state.centrifugo.emulation.register(client_id(), first);
    let connection = Connection {
        sink: Sink::Body {
            tx: body_tx.clone(),
            framing,
        },
        emulation: Some(registration.id.clone()),
        encoding: if framing == Framing::Protobuf {
            Encoding::Protobuf
        } else {
            Encoding::Json
        },
        source: Source::Emulation {
            commands: registration,
            body: body_tx,
        },
    };
    let span = tracing::debug_span!("centrifugo", node_id = %state.settings().node_id);
    let sessions = state.centrifugo.sessions.clone();
    let slot = slot.map(|Extension(slot)| slot);
    tokio::spawn(sessions.track_future(session::run(connection, state, slot).instrument(span)));
    let content_type = match framing {
        Framing::Protobuf => "application/octet-stream",
        Framing::Lines => "application/json",
        Framing::Events => "text/event-stream; charset=utf-8",
    };
    let body = Body::from_stream(ReceiverStream::new(body_rx).map(Ok::<_, Infallible>));
    Ok((
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("private, no-cache, no-store, must-revalidate, max-age=0"),
            ),
            (
                header::HeaderName::from_static("x-accel-buffering"),
                HeaderValue::from_static("no"),
            ),
        ],
        body,
    )
        .into_response())
}

/// The body of `POST /emulation` (`EmulationRequest` of `client.proto`,
/// JSON form: `data` is the frame as a JSON string).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EmulationRequest {
    /// The node the session runs on (the connect reply's `node`).
    #[serde(default)]
    node: String,
    /// The session (the connect reply's `session`).
    session: String,
    /// The frame of commands.
    data: String,
}

/// `POST /emulation`: hands a frame of commands to its session.
///
/// # Errors
/// See [`from_a_page_allowed`]; 413 `payload_too_large` for a frame over
/// the frame limit; 400 `invalid_json` for a body that is not an emulation request (in the
/// binary form: `invalid_body`, also when its `data` is not delimited
/// `Command`s); 404 `session_not_found` when no session of that id runs
/// on the node it names (forwarded there once when that is another node);
/// 503 `queue_full` when the session does not take the frame within the
/// write timeout.
pub(crate) async fn emulate(
    State(state): State<CentrifugoState>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    from_a_page_allowed(&state, &headers, &uri, true)?;
    let limit = session::max_frame_bytes(state.settings());
    // The frame arrives as a JSON string: escaping may double it.
    let body = read_limited(&headers, body, 2 * limit + 1024).await?;
    let own = &state.settings().node_id;
    let request = if is_protobuf(&headers) {
        use prost::Message as _;
        let binary = super::protocol::EmulationRequest::decode(body.as_ref())
            .map_err(|e| Error::InvalidBody(e.to_string()))?;
        let data = if binary.node.is_empty() || binary.node == state.settings().node_id {
            if binary.data.len() > limit {
                return Err(Error::PayloadTooLarge { limit });
            }
            decode_protobuf(
                &binary.data,
                session::max_commands_per_frame(state.config().channel_limit),
            )
            .map_err(|e| Error::InvalidBody(e.to_string()))?
        } else {
            // Read where the session runs.
            ClientFrame::Protobuf(Vec::new())
        };
        (binary.node, binary.session, data)
    } else {
        let json: EmulationRequest =
            serde_json::from_slice(&body).map_err(|e| Error::InvalidJson(e.to_string()))?;
        if json.data.len() > limit && (json.node.is_empty() || json.node == *own) {
            return Err(Error::PayloadTooLarge { limit });
        }
        (json.node, json.session, ClientFrame::Json(json.data))
    };
    let (node, session, data) = request;
    if !node.is_empty() && node != *own {
        return forward(&state, &node, &headers, body).await;
    }
    let Some(queue) = state.centrifugo.emulation.get(&session) else {
        return Err(Error::SessionNotFound);
    };
    let timeout = state.config().write_timeout;
    match tokio::time::timeout(timeout, queue.send(data)).await {
        Ok(Ok(())) => Ok(StatusCode::NO_CONTENT.into_response()),
        // The session ended meanwhile.
        Ok(Err(_)) => Err(Error::SessionNotFound),
        Err(_) => Err(Error::QueueFull),
    }
}

/// Sends an emulation request to `node`, which holds its session, at the
/// URL it reports; one hop only.
async fn forward(
    state: &CentrifugoState,
    node: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response> {
    if herald_node::forward::was_forwarded(headers) {
        return Err(Error::SessionNotFound);
    }
    let shared = &state.shared;
    let sessions = &state.centrifugo.emulation;
    let urls = match sessions.node_urls() {
        Some(urls) => urls,
        None => {
            let reports = shared.node.storage().node_reports().await.map_err(|e| {
                herald_node::node_error::StorageFailure::new("node_reports", None, e)
            })?;
            sessions.keep_node_urls(
                reports
                    .into_iter()
                    .filter(|r| !r.url.is_empty())
                    .map(|r| (r.node_id, r.url))
                    .collect(),
            )
        }
    };
    let Some(url) = urls.get(node).cloned() else {
        return Err(Error::SessionNotFound);
    };
    let request = ForwardRequest {
        method: Method::POST,
        path: "/emulation".to_owned(),
        body,
        headers,
        carry: herald_node::forward::CarriedHeaders::NONE,
    };
    match shared.node.forwarder().to_node(&url, request).await {
        Ok(answer) => {
            let mut response = Response::new(Body::from(answer.body().clone()));
            *response.status_mut() = answer.status();
            if let Some(content_type) = answer.content_type() {
                response
                    .headers_mut()
                    .insert(header::CONTENT_TYPE, content_type.clone());
            }
            Ok(response)
        }
        Err(e) => {
            tracing::debug!(node = %node, url = %url, error = %e, "emulation request not forwarded");
            Err(Error::SessionNotFound)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_from_utf8_json_bodies_only() {
        let mut headers = HeaderMap::new();
        assert!(matches!(
            frame(&headers, b"{\"id\":1}", 256).unwrap(),
            ClientFrame::Json(text) if text == "{\"id\":1}"
        ));
        assert!(matches!(
            frame(&headers, b"  \n", 256),
            Err(Error::InvalidBody(_))
        ));
        assert!(matches!(
            frame(&headers, b"\xff", 256),
            Err(Error::InvalidBody(_))
        ));
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        assert!(
            matches!(
                frame(&headers, b"\x0a\x02", 256),
                Err(Error::InvalidBody(_))
            ),
            "a delimited command cut short"
        );
        // id 1, an empty connect: `{"id":1,"connect":{}}`.
        let ClientFrame::Protobuf(commands) =
            frame(&headers, &[0x04, 0x08, 0x01, 0x22, 0x00], 256).unwrap()
        else {
            panic!("a protobuf frame")
        };
        let command = commands[0].as_ref().unwrap();
        assert_eq!((command.id, command.requests()), (1, 1));
        assert!(command.connect.is_some());
    }
}

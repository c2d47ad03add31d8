//! `PUT` (create), `POST` (append, close) and `DELETE` of a stream. Each
//! checks the caller's right to publish to the stream's channel (a
//! creation, closure or deletion also the right to manage streams there,
//! `Auth::may_manage_stream`), its publish rate, then its headers and
//! body, before anything is written; the write itself is
//! herald-node's (`streams.rs`): committed here on the holder, or
//! forwarded once to the holder, whose answer is returned unchanged.

use axum::extract::{Path, State};
use axum::http::header::{ETAG, HOST, LOCATION};
use axum::http::{HeaderMap, HeaderName, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use herald_core::{
    is_json_media, media_type, ChannelName, Fork, ForkLimits, StreamAppend, StreamAppended,
    StreamConfig, StreamCreate, StreamCreated, StreamInfo,
};
use herald_node::forward::CarriedHeaders;
use herald_node::publish::Routed;
use herald_node::streams::{self, StreamDeleted, StreamRequest};

use super::body::AppendBody;
use super::response::{self, set};
use super::{naming, offset, producer_wait, request};
use crate::state::StreamsState;
use herald_http::auth_extract::Caller;
use herald_http::error::{Error, Result};

/// The type of a stream created without one (PROTOCOL.md, "Create").
const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// The header a standby adds to a creation it forwards when its client
/// may make a channel that holds messages a stream (value `1`): the
/// holder believes it only of a request that carries the cluster secret.
const FORWARDED_MAY_CONVERT: HeaderName = HeaderName::from_static("herald-forwarded-may-convert");

/// The headers a forwarded stream write carries besides `Content-Type`:
/// to the holder, the protocol's request headers and
/// [`FORWARDED_MAY_CONVERT`]; back, the protocol's answer headers,
/// `Location` and `ETag`.
const CARRIED: CarriedHeaders = CarriedHeaders {
    request: |name| is_protocol_header(name) || *name == FORWARDED_MAY_CONVERT,
    answer: |name| is_protocol_header(name) || *name == LOCATION || *name == ETAG,
};

/// Whether `name` is a Durable Streams header (`Stream-*` or
/// `Producer-*`, PROTOCOL.md of durable-streams/durable-streams).
fn is_protocol_header(name: &HeaderName) -> bool {
    let name = name.as_str();
    name.starts_with("stream-") || name.starts_with("producer-")
}

/// The checked channel of a write at `path`, after the caller's right to
/// publish to it.
fn channel(
    state: &StreamsState,
    who: &herald_auth::Principal,
    path: &str,
    headers: &HeaderMap,
    uri: &Uri,
) -> Result<ChannelName> {
    herald_http::edge::cross_origin_write_refusal(&state.shared, headers, uri)?;
    let channel = naming::channel_of(path).map_err(Error::InvalidStreamRequest)?;
    state.shared.auth().may_publish(who, &channel)?;
    if state.shared.draining() {
        return Err(Error::Draining);
    }
    Ok(channel)
}

/// What a standby forwards of this request.
fn forwarded<'a>(
    method: Method,
    uri: &Uri,
    headers: &'a HeaderMap,
    body: Bytes,
) -> StreamRequest<'a> {
    StreamRequest {
        method,
        path: uri
            .path_and_query()
            .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned()),
        headers,
        body,
        carry: CARRIED,
    }
}

/// The answer to a creation that found or made `info`.
fn created(info: &StreamInfo, status: StatusCode, location: Option<String>) -> Response {
    let mut answer = response::empty(status, info.head);
    response::content_type(&mut answer, &info.config.content_type);
    if info.closed {
        response::closed(&mut answer);
    }
    if let Some(location) = location {
        set(answer.headers_mut(), LOCATION.as_str(), &location);
    }
    answer
}

/// The fork a `PUT` asks for (`Stream-Forked-From`, `Stream-Fork-Offset`,
/// `Stream-Fork-Sub-Offset`), with its source as it is now.
///
/// # Errors
/// 400 for a malformed header or a sub-offset without what it needs; 404
/// when the source is not a live stream.
async fn fork(
    state: &StreamsState,
    who: &herald_auth::Principal,
    headers: &HeaderMap,
) -> Result<Option<(Fork, StreamInfo)>> {
    let header = |name: &str| -> Result<Option<&str>> {
        headers
            .get(name)
            .map(|v| {
                v.to_str().map(str::trim).map_err(|_| {
                    Error::InvalidStreamRequest(format!("{name} must be visible ASCII"))
                })
            })
            .transpose()
    };
    let from = header("stream-forked-from")?;
    let at = header("stream-fork-offset")?;
    let sub = header("stream-fork-sub-offset")?;
    let Some(from) = from else {
        if at.is_some() || sub.is_some() {
            return Err(Error::InvalidStreamRequest(
                "Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From".to_owned(),
            ));
        }
        return Ok(None);
    };
    let sub_offset = match sub {
        None => 0,
        Some(text) if text == "0" || (!text.starts_with('0') && !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())) => {
            text.parse::<u64>().map_err(|_| Error::InvalidStreamRequest("Stream-Fork-Sub-Offset is too large".to_owned()))?
        }
        Some(text) => {
            return Err(Error::InvalidStreamRequest(format!(
                "Stream-Fork-Sub-Offset must be a whole number without sign or leading zero, got {text:?}"
            )))
        }
    };
    let prefix = &state.config.prefix;
    let path = from
        .strip_prefix(prefix.as_str())
        .filter(|rest| rest.starts_with('/'))
        .unwrap_or(from)
        .trim_start_matches('/');
    let source = naming::channel_of(path).map_err(Error::InvalidStreamRequest)?;
    // A fork reads its source whole: the caller must be allowed to (a
    // forwarded fork was checked so, with the client's credentials, by the
    // node that forwarded it).
    if !matches!(who, herald_auth::Principal::Cluster) {
        state.shared.auth().may_read_history(who, &source)?;
    }
    let info = super::chunk::info(state, &source)
        .await?
        .ok_or(Error::StreamNotFound)?;
    if info.soft_deleted {
        return Err(Error::StreamConflict(
            "the source is being deleted: it cannot be forked".to_owned(),
        ));
    }
    let offset = match at {
        None if sub_offset > 0 => {
            return Err(Error::InvalidStreamRequest(
                "Stream-Fork-Sub-Offset above 0 needs Stream-Fork-Offset".to_owned(),
            ))
        }
        None => info.head,
        Some(text) => match offset::parse(text) {
            Ok(offset::ReadFrom::After(offset)) => offset,
            _ => {
                return Err(Error::InvalidStreamRequest(format!(
                    "Stream-Fork-Offset must be an offset of the source, got {text:?}"
                )))
            }
        },
    };
    if offset > info.head {
        return Err(Error::InvalidStreamRequest(
            "Stream-Fork-Offset is beyond the source's tail".to_owned(),
        ));
    }
    let ds = &state.config;
    Ok(Some((
        Fork {
            source,
            offset,
            sub_offset,
            limits: ForkLimits {
                max_messages: ds.max_fork_messages,
                max_bytes: ds.max_fork_bytes,
                max_forks: ds.max_forks_per_source,
            },
        },
        info,
    )))
}

/// How many messages a fork of `source` at `fork` copies at most, as the
/// publish rate counts them: the stored ones up to its offset, and the
/// sub-offset's part of what follows (whole messages in JSON, one partial
/// message in bytes).
fn fork_copies(fork: &Fork, source: &StreamInfo) -> usize {
    let stored = (fork.offset + 1).saturating_sub(source.earliest);
    let more = match (fork.sub_offset, is_json_media(&source.config.content_type)) {
        (0, _) => 0,
        (sub, true) => sub,
        (_, false) => 1,
    };
    usize::try_from(stored.saturating_add(more)).unwrap_or(usize::MAX)
}

/// Whether `who` may make a channel that holds messages a stream (see
/// [`StreamCreate::may_convert`]): deleting or closing it later takes it
/// from its other writers, so that needs what deleting a channel needs,
/// `admin` (docs/security.md). The storage checks it inside the fenced
/// creation, against the channel as it is then.
fn may_convert(state: &StreamsState, who: &herald_auth::Principal, headers: &HeaderMap) -> bool {
    match who {
        herald_auth::Principal::Cluster => headers
            .get(FORWARDED_MAY_CONVERT)
            .is_some_and(|v| v.as_bytes() == b"1"),
        _ => state.shared.auth().may_admin(who).is_ok(),
    }
}

/// `PUT`: creates the stream, or answers 200 when it exists with the same
/// configuration (content type compared by media type, TTL, expiry,
/// closure), 409 when with another.
pub(crate) async fn put(
    State(state): State<StreamsState>,
    Caller(who): Caller,
    Path(path): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    AppendBody(body): AppendBody,
) -> Result<Response> {
    let channel = channel(&state, &who, &path, &headers, &uri)?;
    state.shared.auth().may_manage_stream(&who, &channel)?;
    let fork = fork(&state, &who, &headers).await?;
    let mut content_type = request::content_type(&headers)?;
    let mut ttl_s = request::ttl_s(&headers)?;
    let mut expires_at_ms = request::expires_at_ms(&headers)?;
    if ttl_s.is_some() && expires_at_ms.is_some() {
        return Err(Error::InvalidStreamRequest(
            "Stream-TTL and Stream-Expires-At exclude each other: send one".to_owned(),
        ));
    }
    if let Some((_, source)) = &fork {
        // A fork is of its source's type, and lives as long unless told.
        let inherited = &source.config.content_type;
        if content_type
            .as_deref()
            .is_some_and(|t| media_type(t) != media_type(inherited))
        {
            return Err(Error::StreamConflict(format!(
                "a fork has its source's content type, {inherited}"
            )));
        }
        content_type = Some(inherited.clone());
        if ttl_s.is_none() && expires_at_ms.is_none() {
            ttl_s = source.config.ttl_s;
            expires_at_ms = source.config.expires_at_ms;
        }
    }
    let content_type = content_type.unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_owned());
    let messages = request::messages(
        is_json_media(&content_type),
        &body,
        true,
        request::AppendLimits::of(&state.shared.settings, &state.config),
    )?;
    // A creation counts against the caller's publish rate as appends do:
    // one per message it writes, its fork's copies included (at least
    // one).
    let copies = fork
        .as_ref()
        .map_or(0, |(f, source)| fork_copies(f, source));
    state
        .shared
        .auth()
        .take_publishes(&who, messages.len().saturating_add(copies).max(1))?;
    let may_convert = may_convert(&state, &who, &headers);
    let create = StreamCreate {
        channel: channel.clone(),
        config: StreamConfig {
            content_type,
            ttl_s,
            expires_at_ms,
        },
        closed: request::closes(&headers),
        messages,
        fork: fork.map(|(fork, _)| fork),
        may_convert,
    };
    let location = headers.get(HOST).and_then(|h| h.to_str().ok()).map(|host| {
        let scheme = if state.shared.settings.tls {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{host}{}", uri.path())
    });
    let wanted = create.config.clone();
    let wanted_sub_offset = create.fork.as_ref().map(|f| f.sub_offset);
    let wanted_source = create.fork.as_ref().map(|f| f.source.clone());
    let closes = create.closed;
    let written = create.messages.len() as herald_core::Offset;
    let forking = create.fork.is_some();
    // What the holder is told of this node's decision, if it forwards.
    let mut carried = headers.clone();
    carried.remove(FORWARDED_MAY_CONVERT);
    if may_convert {
        carried.insert(
            FORWARDED_MAY_CONVERT,
            axum::http::HeaderValue::from_static("1"),
        );
    }
    let request = forwarded(Method::PUT, &uri, &carried, body);
    match streams::create_stream(&state.shared.node, create, request).await? {
        Routed::Holder(answer) => Ok(response::from_holder(answer)),
        Routed::Here(StreamCreated::Created { info, .. }) => {
            if !forking && info.earliest + written <= info.head {
                // The channel held messages before: it was converted.
                herald_http::audit::admin_action(
                    &who,
                    "stream_from_channel",
                    Some(channel.as_str()),
                    None,
                );
            }
            Ok(created(&info, StatusCode::CREATED, location))
        }
        Routed::Here(StreamCreated::Exists(info)) if info.soft_deleted => {
            Err(Error::StreamConflict(
                "the stream at this path is being deleted; create it again once its deletion ends"
                    .to_owned(),
            ))
        }
        Routed::Here(StreamCreated::Exists(info)) => {
            let same = media_type(&info.config.content_type) == media_type(&wanted.content_type)
                && info.config.ttl_s == wanted.ttl_s
                && info.config.expires_at_ms == wanted.expires_at_ms
                && info.closed == closes
                && wanted_sub_offset.is_none_or(|sub| sub == info.fork_sub_offset)
                && (wanted_source.is_none() || wanted_source == info.fork_of);
            if !same {
                return Err(Error::StreamConflict(
                    "a stream exists at this path with another configuration (content type, \
                     TTL, expiry or closure)"
                        .to_owned(),
                ));
            }
            Ok(created(&info, StatusCode::OK, None))
        }
        Routed::Here(StreamCreated::SourceNotFound) => Err(Error::StreamNotFound),
        Routed::Here(StreamCreated::SourceGone) => Err(Error::StreamConflict(
            "the source is being deleted: it cannot be forked".to_owned(),
        )),
        Routed::Here(StreamCreated::ForkOutOfRange) => Err(Error::InvalidStreamRequest(
            "the fork offset (with its sub-offset) is beyond the source's data, or before \
             what it still stores"
                .to_owned(),
        )),
        Routed::Here(StreamCreated::ForkTooLarge { messages, bytes }) => {
            let ds = &state.config;
            Err(Error::ForkTooLarge(format!(
                "the fork would copy {messages} messages of {bytes} bytes from its source; \
                 a fork copies at most durable_streams.max_fork_messages = {} messages and \
                 durable_streams.max_fork_bytes = {} bytes",
                ds.max_fork_messages, ds.max_fork_bytes
            )))
        }
        Routed::Here(StreamCreated::TooManyForks { forks }) => Err(Error::StreamConflict(format!(
            "the source has {forks} live forks: durable_streams.max_forks_per_source = {} \
             allows no more",
            state.config.max_forks_per_source
        ))),
        Routed::Here(StreamCreated::ChannelHasMessages) => {
            Err(Error::Auth(herald_auth::AuthError::Forbidden(
                "this channel holds messages written through Herald's API or Centrifugo: \
                 making it a stream (which its writers could then close or delete) needs an \
                 API key with admin"
                    .to_owned(),
            )))
        }
        Routed::Here(StreamCreated::Expired) => Err(Error::Internal(
            "an expired stream was still there after its deletion".to_owned(),
        )),
    }
}

/// `POST`: appends the body (one message of bytes, or in JSON mode one per
/// element of a top-level array), closes the stream with
/// `Stream-Closed: true` (alone with an empty body), idempotently with
/// producer headers.
pub(crate) async fn post(
    State(state): State<StreamsState>,
    Caller(who): Caller,
    Path(path): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    AppendBody(body): AppendBody,
) -> Result<Response> {
    let channel = channel(&state, &who, &path, &headers, &uri)?;
    let producer = request::producer(&headers)?;
    let close = request::closes(&headers);
    if close {
        // Closing a stream ends every writer's appends: a right of its own.
        state.shared.auth().may_manage_stream(&who, &channel)?;
    }
    let content_type = request::content_type(&headers)?;
    let stream_seq = request::stream_seq(&headers)?;
    let close_only = body.is_empty() && close;
    if body.is_empty() && !close {
        return Err(Error::InvalidStreamRequest(
            "an append needs a body (or Stream-Closed: true to close the stream)".to_owned(),
        ));
    }
    let messages = if close_only {
        Vec::new()
    } else {
        let Some(content_type) = &content_type else {
            return Err(Error::InvalidStreamRequest(
                "an append needs a Content-Type".to_owned(),
            ));
        };
        request::messages(
            is_json_media(content_type),
            &body,
            false,
            request::AppendLimits::of(&state.shared.settings, &state.config),
        )?
    };
    // Appends count against the caller's publish rate, one per message
    // (a close alone as one), as Herald's own publishes do.
    state
        .shared
        .auth()
        .take_publishes(&who, messages.len().max(1))?;
    let settings = &state.config;
    let append = StreamAppend {
        channel: channel.clone(),
        content_type: if close_only { None } else { content_type },
        messages,
        producer: producer.clone(),
        stream_seq,
        close,
        producer_limits: settings.producer_limits(),
    };
    // An append ahead of its producer's turn waits, bounded, for the
    // appends before it (`producer_wait.rs`), woken by their commits.
    let deadline = tokio::time::Instant::now() + settings.producer_gap_wait;
    let mut waiting = None;
    let appended = loop {
        let signal = waiting.as_ref().map(producer_wait::Waiting::signal);
        let woken = signal.as_ref().map(|s| s.notified());
        let request = forwarded(Method::POST, &uri, &headers, body.clone());
        let appended =
            match streams::append_stream(&state.shared.node, append.clone(), request).await? {
                Routed::Holder(answer) => return Ok(response::from_holder(answer)),
                Routed::Here(appended) => appended,
            };
        let (StreamAppended::SeqGap { expected, received }, Some(p)) = (&appended, &producer)
        else {
            break appended;
        };
        if received <= expected || settings.producer_gap_wait.is_zero() {
            break appended;
        }
        let Some(woken) = woken else {
            // Registered, then tried again: a commit in between is seen.
            waiting = state.producer_waits.wait(&channel, &p.id);
            if waiting.is_none() {
                break appended;
            }
            continue;
        };
        if tokio::time::timeout_at(deadline, woken).await.is_err() {
            break appended;
        }
    };
    drop(waiting);
    if let (StreamAppended::Appended { .. }, Some(p)) = (&appended, &producer) {
        state.producer_waits.committed(&channel, &p.id);
    }
    let producer_headers = |answer: &mut Response, seq: u64| {
        if let Some(p) = &producer {
            set(answer.headers_mut(), "producer-epoch", &p.epoch.to_string());
            set(answer.headers_mut(), "producer-seq", &seq.to_string());
        }
    };
    match appended {
        StreamAppended::Appended { head, closed, .. } => {
            let status = if producer.is_some() && !close_only {
                StatusCode::OK
            } else {
                StatusCode::NO_CONTENT
            };
            let mut answer = response::empty(status, head);
            if closed {
                response::closed(&mut answer);
            }
            producer_headers(&mut answer, producer.as_ref().map_or(0, |p| p.seq));
            Ok(answer)
        }
        StreamAppended::Duplicate {
            head,
            last_seq,
            closed,
        } => {
            let mut answer = response::empty(StatusCode::NO_CONTENT, head);
            if closed {
                response::closed(&mut answer);
            }
            producer_headers(&mut answer, last_seq);
            Ok(answer)
        }
        StreamAppended::NotFound => Err(Error::StreamNotFound),
        StreamAppended::Gone => Err(Error::StreamGone),
        StreamAppended::Closed { head } => Err(Error::StreamClosed {
            next_offset: offset::format(head),
        }),
        StreamAppended::ContentTypeMismatch { content_type } => Err(Error::StreamConflict(
            format!("the stream's content type is {content_type}"),
        )),
        StreamAppended::StaleEpoch { epoch } => Err(Error::StaleProducerEpoch { epoch }),
        StreamAppended::EpochWithoutSeqZero => Err(Error::InvalidStreamRequest(
            "a new producer epoch starts at Producer-Seq 0".to_owned(),
        )),
        StreamAppended::SeqGap { expected, received } => {
            Err(Error::ProducerSeqGap { expected, received })
        }
        StreamAppended::StreamSeqConflict => Err(Error::StreamConflict(
            "Stream-Seq must be greater, as bytes, than the last one the stream accepted"
                .to_owned(),
        )),
        StreamAppended::Empty => Err(Error::InvalidStreamRequest(
            "an append needs at least one message (or Stream-Closed: true)".to_owned(),
        )),
        StreamAppended::TooManyProducers { limit } => Err(Error::TooManyProducers { limit }),
    }
}

/// `DELETE`: deletes the stream (its messages, producers and properties);
/// its channel keeps its head, so a stream created again at the path goes
/// on with later offsets and none of the old data.
pub(crate) async fn delete(
    State(state): State<StreamsState>,
    Caller(who): Caller,
    Path(path): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response> {
    let channel = channel(&state, &who, &path, &headers, &uri)?;
    state.shared.auth().may_manage_stream(&who, &channel)?;
    let request = forwarded(Method::DELETE, &uri, &headers, Bytes::new());
    match streams::delete_stream(&state.shared.node, &channel, request).await? {
        Routed::Holder(answer) => Ok(response::from_holder(answer)),
        Routed::Here(StreamDeleted::Deleted) => Ok(StatusCode::NO_CONTENT.into_response()),
        Routed::Here(StreamDeleted::NotFound) => Err(Error::StreamNotFound),
    }
}

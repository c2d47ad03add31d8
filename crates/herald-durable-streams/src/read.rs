//! `GET` of a stream (catch-up from an offset, and long-poll) and `HEAD`.
//! Every node serves them: a catch-up from the storage, a long-poll as a
//! follower of the stream (`follow.rs`: what is stored after the offset,
//! then this node's hub's notices, the writer's on the holder, the standby
//! feed's on a standby), waiting at most `long_poll_timeout`, and
//! never past the expiry of the reader's token: a long-poll whose token
//! expires before it can answer data answers `401 token_expired` (the
//! client asks again with a fresh token from the same offset).

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::header::{ETAG, IF_NONE_MATCH};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use herald_core::StreamInfo;
use tokio::time::Instant;

use super::chunk::{body, info, read_chunk, start};
use super::follow::{End, Follower};
use super::offset::{self, ReadFrom};
use super::response::{self, set};
use super::{naming, request, sse};
use crate::state::StreamsState;
use herald_http::auth_extract::Subscriber;
use herald_http::error::{Error, Result};

/// How a `GET` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Live {
    /// Catch-up: what is stored, now.
    No,
    /// `live=long-poll`.
    LongPoll,
    /// `live=sse`.
    Sse,
}

/// The query of a `GET`.
#[derive(Debug)]
pub(crate) struct ReadQuery {
    /// `offset`, if given.
    pub(crate) from: Option<ReadFrom>,
    /// `live`.
    pub(crate) live: Live,
    /// `cursor`, as the client echoed it.
    pub(crate) cursor: Option<String>,
}

fn parse_query(pairs: Vec<(String, String)>) -> Result<ReadQuery> {
    let one = |name: &str| -> Result<Option<&str>> {
        let mut values = pairs
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str());
        let first = values.next();
        if values.next().is_some() {
            return Err(Error::InvalidStreamRequest(format!(
                "{name} is given more than once"
            )));
        }
        Ok(first)
    };
    let from = one("offset")?
        .map(offset::parse)
        .transpose()
        .map_err(Error::InvalidStreamRequest)?;
    let live = match one("live")? {
        None => Live::No,
        Some("long-poll") => Live::LongPoll,
        Some("sse") => Live::Sse,
        Some(other) => {
            return Err(Error::InvalidStreamRequest(format!(
                "live must be long-poll or sse, got {other:?}"
            )))
        }
    };
    if live != Live::No && from.is_none() {
        return Err(Error::InvalidStreamRequest(
            "a live read needs an offset (-1 for the start, now for the tail)".to_owned(),
        ));
    }
    let cursor = one("cursor")?.map(str::to_owned);
    Ok(ReadQuery { from, live, cursor })
}

/// The live stream at `path`, after the caller's right to read it.
async fn stream(
    state: &StreamsState,
    who: &herald_auth::Principal,
    path: &str,
    live: bool,
    from: Option<ReadFrom>,
) -> Result<StreamInfo> {
    let channel = naming::channel_of(path).map_err(Error::InvalidStreamRequest)?;
    let auth = state.shared.auth();
    if live {
        auth.may_subscribe(who, &channel)?;
    } else {
        auth.may_read_history(who, &channel)?;
    }
    let info = info(state, &channel).await?.ok_or(Error::StreamNotFound)?;
    // A live read of what was stored before it began needs the right to
    // read history; one from the tail (`now`, or the offset a previous
    // read ended at) does not (the live-only subscribers of
    // docs/security.md).
    let stored = match from {
        Some(ReadFrom::Now) => false,
        Some(ReadFrom::After(after)) => after < info.head,
        _ => true,
    };
    if live && stored {
        auth.may_read_history(who, &channel)?;
    }
    if info.soft_deleted {
        return Err(Error::StreamGone);
    }
    Ok(info)
}

/// `GET`: catch-up, long-poll or SSE, by `live`.
pub(crate) async fn get(
    State(state): State<StreamsState>,
    Subscriber(who): Subscriber,
    Path(path): Path<String>,
    query: std::result::Result<Query<Vec<(String, String)>>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response> {
    let Query(pairs) = query.map_err(|e| Error::InvalidStreamRequest(e.body_text()))?;
    let query = parse_query(pairs)?;
    let info = stream(&state, &who, &path, query.live != Live::No, query.from).await?;
    // A read restarts the stream's TTL (PROTOCOL.md), batched by the node.
    state.shared.node.stream_renewals().note_read(&info);
    let from = query.from.unwrap_or(ReadFrom::Start);
    // When the reader's token expires: a live read ends then.
    let expires = who.token().map(|token| Instant::now() + token.time_left());
    match query.live {
        Live::No => catch_up(&state, &info, from, &headers).await,
        Live::LongPoll => long_poll(&state, info, from, query.cursor, expires).await,
        Live::Sse => sse::serve(state, info, from, query.cursor, expires).await,
    }
}

/// A catch-up read: what is stored after the offset, now.
async fn catch_up(
    state: &StreamsState,
    info: &StreamInfo,
    from: ReadFrom,
    headers: &HeaderMap,
) -> Result<Response> {
    let after = start(info, from)?;
    if from == ReadFrom::Now {
        let mut answer = Response::new(Body::from(body(&info.config.content_type, &[])));
        set(
            answer.headers_mut(),
            "stream-next-offset",
            &offset::format(after),
        );
        set(answer.headers_mut(), "stream-up-to-date", "true");
        response::content_type(&mut answer, &info.config.content_type);
        response::cache(&mut answer, "no-store");
        if info.closed {
            response::closed(&mut answer);
        }
        return Ok(answer);
    }
    let chunk = read_chunk(state, &info.channel, after).await?;
    let closed = chunk.up_to_date && info.closed && chunk.next >= info.head;
    let etag = format!(
        "\"{}-{}-{}{}\"",
        chunk.deletion,
        after,
        chunk.next,
        if closed { "-c" } else { "" }
    );
    let not_modified = headers
        .get(IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut answer = if not_modified {
        let mut answer = Response::new(Body::empty());
        *answer.status_mut() = StatusCode::NOT_MODIFIED;
        answer
    } else {
        Response::new(Body::from(body(&info.config.content_type, &chunk.messages)))
    };
    set(
        answer.headers_mut(),
        "stream-next-offset",
        &offset::format(chunk.next),
    );
    set(answer.headers_mut(), ETAG.as_str(), &etag);
    response::content_type(&mut answer, &info.config.content_type);
    if chunk.up_to_date {
        set(answer.headers_mut(), "stream-up-to-date", "true");
        // The tail grows: a cache must ask again.
        response::cache(&mut answer, "no-cache");
    } else {
        // A full chunk from an offset never changes; with access control
        // on, only the client's own cache may keep it.
        response::cache(
            &mut answer,
            if state.shared.auth().enabled() {
                "private, max-age=60, stale-while-revalidate=300"
            } else {
                "public, max-age=60, stale-while-revalidate=300"
            },
        );
    }
    if closed {
        response::closed(&mut answer);
    }
    Ok(answer)
}

/// A long-poll read: answers at once with what is stored after the offset,
/// else waits for the stream's next message, at most the configured
/// timeout, then answers `204`. A closed stream at its tail answers `204`
/// with `Stream-Closed: true`, at once or when the close comes. The read
/// follows the stream as a [`Follower`] (`follow.rs`): the messages a
/// notice carries are answered without reading the storage again.
///
/// # Errors
/// 401 `token_expired` once `expires` (the reader's token) has passed: the
/// wait ends then, and no data is answered after it. 404
/// `stream_not_found` when the stream is deleted during the wait (410
/// `stream_gone` while it is being deleted), 410 `offset_gone` when what
/// the reader had not got yet was removed, 503 when the storage fails
/// with an error that is not transient.
async fn long_poll(
    state: &StreamsState,
    info: StreamInfo,
    from: ReadFrom,
    cursor: Option<String>,
    expires: Option<Instant>,
) -> Result<Response> {
    let channel = info.channel.clone();
    let after = start(&info, from)?;
    // Subscribed before the first read: a message committed after it is
    // announced, so none is missed between the read and the wait.
    let mut follower = Follower::start(state, &info, after).await?;
    let timeout = state.config.long_poll_timeout;
    let deadline = Instant::now() + timeout;
    // The wait ends at the token's expiry if that comes first.
    let wait_until = expires.map_or(deadline, |at| at.min(deadline));
    let token_expired = || expires.is_some_and(|at| Instant::now() >= at);
    loop {
        let batch = tokio::select! {
            // What is there already is answered, whatever the time.
            biased;
            batch = follower.next_batch() => Some(batch?),
            () = tokio::time::sleep_until(wait_until) => None,
            () = state.shared.shutdown.cancelled() => None,
        };
        if token_expired() {
            return Err(Error::Auth(herald_auth::AuthError::TokenExpired));
        }
        let cursor_now = offset::cursor(request::now_ms(), cursor.as_deref());
        let Some(batch) = batch else {
            let mut answer = response::empty(StatusCode::NO_CONTENT, after);
            set(answer.headers_mut(), "stream-up-to-date", "true");
            set(answer.headers_mut(), "stream-cursor", &cursor_now);
            return Ok(answer);
        };
        if !batch.messages.is_empty() {
            let mut answer =
                Response::new(Body::from(body(&info.config.content_type, &batch.messages)));
            set(
                answer.headers_mut(),
                "stream-next-offset",
                &offset::format(batch.next),
            );
            set(answer.headers_mut(), "stream-cursor", &cursor_now);
            set(
                answer.headers_mut(),
                ETAG.as_str(),
                &format!("\"{}-{}-{}\"", follower.deletion(), after, batch.next),
            );
            if batch.up_to_date {
                set(answer.headers_mut(), "stream-up-to-date", "true");
            }
            response::content_type(&mut answer, &info.config.content_type);
            response::cache(&mut answer, "no-cache");
            return Ok(answer);
        }
        match batch.end {
            // At the tail, nothing new yet: wait on.
            None => {}
            Some(End::Closed) => {
                let mut answer = response::empty(StatusCode::NO_CONTENT, batch.next);
                set(answer.headers_mut(), "stream-up-to-date", "true");
                response::closed(&mut answer);
                return Ok(answer);
            }
            // Deleted during the wait: as a new read of it is answered
            // (410 while it is being deleted).
            Some(End::Deleted) => {
                return Err(match super::chunk::info(state, &channel).await? {
                    Some(info) if info.soft_deleted => Error::StreamGone,
                    _ => Error::StreamNotFound,
                })
            }
            Some(End::Truncated { earliest }) => return Err(Error::OffsetGone { earliest }),
            Some(End::Stopped) => {
                let mut answer = response::empty(StatusCode::NO_CONTENT, after);
                set(answer.headers_mut(), "stream-up-to-date", "true");
                set(answer.headers_mut(), "stream-cursor", &cursor_now);
                return Ok(answer);
            }
        }
    }
}

/// `HEAD`: the stream's metadata, never cached, without touching its TTL.
pub(crate) async fn head(
    State(state): State<StreamsState>,
    Subscriber(who): Subscriber,
    Path(path): Path<String>,
) -> Result<Response> {
    let info = stream(&state, &who, &path, false, None).await?;
    let mut answer = response::empty(StatusCode::OK, info.head);
    response::content_type(&mut answer, &info.config.content_type);
    response::cache(&mut answer, "no-store");
    if let Some(ttl) = info.config.ttl_s {
        set(answer.headers_mut(), "stream-ttl", &ttl.to_string());
    }
    if let Some(at) = info.config.expires_at_ms {
        set(
            answer.headers_mut(),
            "stream-expires-at",
            &herald_core::format_rfc3339_ms(at),
        );
    }
    if info.closed {
        response::closed(&mut answer);
    }
    Ok(answer)
}

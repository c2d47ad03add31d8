//! `POST /v1/messages`: a batch publish, all entries in one fenced
//! transaction, all or nothing.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use herald_auth::AuthError;
use herald_core::{format_rfc3339_ms, ChannelName, IdempotencyKey, NewMessage, Tags};
use herald_http::auth_extract::Caller;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::state::ApiState;
use crate::api::publish::holder_response;
use herald_http::error::{Error, Result};
use herald_http::extract::{check_depth, read_limited};
use herald_node::metrics;
use herald_node::publish::{self, BatchPublished};

/// Most entries in one batch publish.
pub(crate) const MAX_BATCH_ENTRIES: usize = 1000;

/// The request body: `{"messages": [entry, ...]}`, nothing else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    messages: Vec<Entry>,
}

/// One entry: `{"channel": "...", "data": <any JSON>, "idempotency_key":
/// "...", "tags": {"<key>": "<value>"}}` (key and tags optional), nothing
/// else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    channel: String,
    data: Box<RawValue>,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    tags: Tags,
}

/// One entry of the answer, in the order of the request.
#[derive(Debug, Serialize)]
struct EntryResult<'a> {
    channel: &'a ChannelName,
    offset: u64,
    published_at: String,
    /// `true` when the entry's idempotency key was already used on its
    /// channel (by an earlier publish, or an earlier entry of this batch):
    /// nothing new was stored for it, and `offset` and `published_at` are
    /// the original message's.
    duplicate: bool,
}

/// The answer: `201` when at least one entry was stored, `200` when every
/// entry was a duplicate.
#[derive(Debug, Serialize)]
struct BatchAnswer<'a> {
    results: Vec<EntryResult<'a>>,
}

/// Appends every entry of the batch in one transaction; answers only after
/// the commit. On a standby it is forwarded once to the holder, as a single
/// publish is.
pub(crate) async fn publish_batch(State(state): State<ApiState>, req: Request) -> Response {
    let started = Instant::now();
    let (mut parts, body) = req.into_parts();
    let outcome = append(&state, &mut parts, body).await;
    let (result, response) = match outcome {
        Ok(BatchPublished::Committed(appended)) => {
            let created = appended.iter().any(|a| !a.duplicate);
            let results = appended
                .iter()
                .map(|a| EntryResult {
                    channel: &a.channel,
                    offset: a.offset,
                    published_at: format_rfc3339_ms(a.published_at_ms),
                    duplicate: a.duplicate,
                })
                .collect();
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            let label = if created { "created" } else { "duplicate" };
            (
                label,
                (status, Json(BatchAnswer { results })).into_response(),
            )
        }
        Ok(BatchPublished::Forwarded(answer)) => ("forwarded", holder_response(answer)),
        Err(e) => (e.code(), e.into_response()),
    };
    metrics::publish_finished(result, started.elapsed().as_secs_f64());
    response
}

/// Checks the caller's credentials (401) before the body is read, so that
/// a client waiting for `100 Continue` gets the refusal at once.
async fn append(state: &ApiState, parts: &mut Parts, body: Body) -> Result<BatchPublished> {
    let Caller(who) = Caller::from_request_parts(parts, state).await?;
    let headers = &parts.headers;
    let raw = read_limited(headers, body, state.settings().max_batch_body_bytes).await?;
    let messages = parse_batch(&raw, state.settings().max_message_bytes)?;
    let shared = &state.shared;
    // Every entry's channel must be allowed; the first that is not is
    // named, and nothing of the batch is stored.
    for (index, message) in messages.iter().enumerate() {
        shared
            .auth()
            .may_publish(&who, &message.channel)
            .map_err(|e: AuthError| Error::InBatchEntry {
                index,
                error: Box::new(e.into()),
            })?;
    }
    if state.draining() {
        return Err(Error::Draining);
    }
    shared.auth().take_publishes(&who, messages.len())?;
    let published = publish::publish_batch(&shared.publisher(), messages, headers, raw).await?;
    Ok(published)
}

/// Parses and validates a batch body: 1 to [`MAX_BATCH_ENTRIES`] entries,
/// each with a valid channel name, `data` of at most `max_message_bytes`
/// and nested at most `MAX_DATA_DEPTH` levels, and a valid idempotency key
/// if any. The first invalid entry is named by its index.
///
/// # Errors
/// [`Error::InvalidJson`] (not JSON), [`Error::InvalidBody`] (another
/// shape, or no entry, or too many), [`Error::InBatchEntry`] (an invalid
/// entry, with that entry's own error).
pub(crate) fn parse_batch(raw: &Bytes, max_message_bytes: usize) -> Result<Vec<NewMessage>> {
    let body: BatchBody = serde_json::from_slice(raw).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => Error::InvalidBody(format!(
            "{e}; expected {{\"messages\": [{{\"channel\", \"data\", \"idempotency_key\"}}, ...]}}"
        )),
        _ => Error::InvalidJson(e.to_string()),
    })?;
    if body.messages.is_empty() || body.messages.len() > MAX_BATCH_ENTRIES {
        return Err(Error::InvalidBody(format!(
            "a batch holds 1 to {MAX_BATCH_ENTRIES} messages, not {}",
            body.messages.len()
        )));
    }
    body.messages
        .into_iter()
        .enumerate()
        .map(|(index, entry)| {
            entry_message(entry, max_message_bytes).map_err(|error| Error::InBatchEntry {
                index,
                error: Box::new(error),
            })
        })
        .collect()
}

fn entry_message(entry: Entry, max_message_bytes: usize) -> Result<NewMessage> {
    let channel =
        ChannelName::new(&entry.channel).map_err(|e| Error::InvalidChannel(e.to_string()))?;
    if entry.data.get().len() + entry.tags.byte_len() > max_message_bytes {
        return Err(Error::PayloadTooLarge {
            limit: max_message_bytes,
        });
    }
    check_depth(entry.data.get())?;
    let idempotency_key = entry
        .idempotency_key
        .map(|k| IdempotencyKey::new(&k).map_err(|e| Error::InvalidIdempotencyKey(e.to_string())))
        .transpose()?;
    Ok(NewMessage {
        channel,
        data: herald_core::Payload::Json(Arc::from(entry.data)),
        idempotency_key,
        tags: entry.tags,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<Vec<NewMessage>> {
        parse_batch(&Bytes::from(body.to_owned()), 100)
    }

    #[test]
    fn entries_keep_their_order_data_and_keys() {
        let messages = parse(
            r#"{"messages":[{"channel":"a","data":{"x": 1}},{"channel":"b","data":"y","idempotency_key":"k"}]}"#,
        )
        .unwrap();
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0].channel.as_str(), "a");
        assert_eq!(messages[0].data.to_json_text(), r#"{"x": 1}"#);
        assert!(messages[0].idempotency_key.is_none());
        assert_eq!(messages[1].idempotency_key.as_ref().unwrap().as_str(), "k");
    }

    #[test]
    fn the_first_invalid_entry_is_named() {
        let err = parse(
            r#"{"messages":[{"channel":"a","data":1},{"channel":"bad name","data":2},{"channel":"c","data":3,"idempotency_key":""}]}"#,
        )
        .unwrap_err();
        assert_eq!(err.code(), "invalid_channel");
        assert!(err.to_string().starts_with("messages[1]: "), "{err}");

        let err =
            parse(r#"{"messages":[{"channel":"a","data":1,"idempotency_key":""}]}"#).unwrap_err();
        assert_eq!(err.code(), "invalid_idempotency_key");
        assert!(err.to_string().starts_with("messages[0]: "), "{err}");

        let big = format!(
            r#"{{"messages":[{{"channel":"a","data":"{}"}}]}}"#,
            "x".repeat(200)
        );
        let err = parse(&big).unwrap_err();
        assert_eq!(err.code(), "payload_too_large");
        assert_eq!(err.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn shapes_and_counts_are_checked() {
        assert_eq!(parse("{").unwrap_err().code(), "invalid_json");
        assert_eq!(
            parse(r#"{"messages":[]}"#).unwrap_err().code(),
            "invalid_body"
        );
        assert_eq!(parse(r#"{"data":1}"#).unwrap_err().code(), "invalid_body");
        assert_eq!(
            parse(r#"{"messages":[{"channel":"a","data":1,"extra":2}]}"#)
                .unwrap_err()
                .code(),
            "invalid_body"
        );
        let many = format!(
            r#"{{"messages":[{}]}}"#,
            vec![r#"{"channel":"a","data":1}"#; MAX_BATCH_ENTRIES + 1].join(",")
        );
        assert_eq!(parse(&many).unwrap_err().code(), "invalid_body");
    }
}

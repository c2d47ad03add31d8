//! Centrifugo's server HTTP API: `POST /api/<method>` with a JSON body,
//! authorized by an API key in `X-API-Key`, `Authorization: apikey <KEY>`
//! or `?api_key=` (Centrifugo's documentation, "Server API walkthrough").
//! Herald's API keys are the keys; their permissions apply (`publish` for
//! publish and broadcast, `read` for history, `admin` for the rest).
//!
//! Every answer that got past the key check is HTTP 200 with
//! `{"result": ...}` or `{"error": {"code", "message"}}` (codes as in
//! `codes.rs`); a missing or unknown key is HTTP 401, as Centrifugo does.
//! `batch` answers `{"replies": [{"<method>": ...} | {"error": ...}]}`.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use herald_core::{ChannelName, IdempotencyKey, Tags};
use herald_storage::ClusterEvent;
use serde::Deserialize;
use serde_json::value::{to_raw_value, RawValue};
use serde_json::{json, Map, Value};

use super::codes::{self, ReplyError};
use super::history::{history, HistoryQuery};
use super::protocol::{publications, StreamPosition};
use crate::auth::{Credential, Pattern, Principal};
use crate::AppState;

/// A method's result, kept as JSON text (publication data stays byte
/// for byte what was published).
type Outcome = Result<Box<RawValue>, ReplyError>;

/// `POST /api/{method}`.
pub(crate) async fn call(
    State(state): State<AppState>,
    Path(method): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let who = match principal(&state, &headers, query.as_deref()) {
        Ok(who) => who,
        Err(status) => return status.into_response(),
    };
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        Bytes::from_static(b"{}")
    } else {
        body
    };
    let params: Box<RawValue> = match serde_json::from_slice(&body) {
        Ok(params) => params,
        Err(_) => return answer(&Err(ReplyError::bad_request())),
    };
    if method == "batch" {
        return batch(&state, &who, &headers, &params).await;
    }
    answer(&run(&state, &who, &headers, &method, &params).await)
}

/// The caller, from its API key; 401 when access control is on and the key
/// is missing or unknown. A call a standby forwarded (`Herald-Forwarded-By`,
/// `history_remove`) is the cluster's when it carries the cluster secret,
/// and 401 without it, as a forwarded publish is (`auth/extract.rs`).
fn principal(
    state: &AppState,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Principal, StatusCode> {
    let auth = &state.shared.auth;
    if crate::forward::was_forwarded(headers) {
        return auth
            .principal(headers, None)
            .map_err(|_| StatusCode::UNAUTHORIZED);
    }
    if !auth.enabled() {
        return Ok(Principal::Anonymous);
    }
    let from_authorization = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("apikey"))
        .map(|(_, key)| key.trim());
    let from_header = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let from_query = query.and_then(|q| {
        q.split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(name, _)| *name == "api_key")
            .map(|(_, key)| key)
    });
    let key = from_header
        .or(from_authorization)
        .or(from_query)
        .filter(|k| !k.is_empty())
        .ok_or(StatusCode::UNAUTHORIZED)?;
    match auth.resolve(Some(Credential::ApiKey(key))) {
        Ok(who @ Principal::Key(_)) => Ok(who),
        _ => Err(StatusCode::UNAUTHORIZED),
    }
}

/// `{"result": ...}` or `{"error": ...}`, HTTP 200.
fn answer(outcome: &Outcome) -> Response {
    let body = match outcome {
        Ok(result) => format!("{{\"result\":{}}}", result.get()),
        Err(e) => json!({ "error": e }).to_string(),
    };
    (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// `batch`: `{"commands": [{"<method>": {...}}, ...]}`, run in order.
async fn batch(
    state: &AppState,
    who: &Principal,
    headers: &HeaderMap,
    params: &RawValue,
) -> Response {
    #[derive(Deserialize)]
    struct Batch {
        commands: Vec<Map<String, Value>>,
    }
    let Ok(Batch { commands }) = serde_json::from_str::<Batch>(params.get()) else {
        return answer(&Err(ReplyError::bad_request()));
    };
    let mut replies = Vec::with_capacity(commands.len());
    for command in commands {
        let reply = match command.into_iter().next() {
            Some((method, params)) if method != "batch" => match to_raw_value(&params) {
                Ok(params) => match run(state, who, headers, &method, &params).await {
                    Ok(result) => format!("{{{}:{}}}", json!(method), result.get()),
                    Err(e) => json!({ "error": e }).to_string(),
                },
                Err(_) => json!({ "error": ReplyError::bad_request() }).to_string(),
            },
            Some(_) => json!({ "error": ReplyError::method_not_found() }).to_string(),
            None => json!({ "error": ReplyError::bad_request() }).to_string(),
        };
        replies.push(reply);
    }
    let body = format!("{{\"replies\":[{}]}}", replies.join(","));
    (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// Parses `params` as `T`, or 107.
fn params<'a, T: Deserialize<'a>>(params: &'a RawValue) -> Result<T, ReplyError> {
    serde_json::from_str(params.get()).map_err(|_| ReplyError::bad_request())
}

fn raw(value: &impl serde::Serialize) -> Outcome {
    to_raw_value(value).map_err(|_| ReplyError::internal())
}

fn channel(name: &str) -> Result<ChannelName, ReplyError> {
    ChannelName::new(name).map_err(|_| ReplyError::bad_request())
}

/// Runs one method (`headers` are the request's, for a call to forward).
async fn run(
    state: &AppState,
    who: &Principal,
    headers: &HeaderMap,
    method: &str,
    p: &RawValue,
) -> Outcome {
    match method {
        "publish" => publish(state, who, params(p)?).await,
        "broadcast" => broadcast(state, who, params(p)?).await,
        "history" => history_method(state, who, params(p)?).await,
        "channels" => channels(state, who, params(p)?).await,
        "info" => info(state, who).await,
        "unsubscribe" => unsubscribe(state, who, params(p)?).await,
        "disconnect" => disconnect(state, who, params(p)?).await,
        "presence" => presence_method(state, who, params(p)?, false).await,
        "presence_stats" => presence_method(state, who, params(p)?, true).await,
        "history_remove" => {
            let p: ChannelParams = params(p)?;
            let channel = channel(&p.channel)?;
            super::history_remove::history_remove(state, who, headers, channel).await?;
            raw(&json!({}))
        }
        _ => Err(ReplyError::method_not_found()),
    }
}

/// The parameters of `publish` and `broadcast`: the data is `data` (any
/// JSON) or `b64data` (base64 of JSON text; Herald stores JSON only).
/// (One struct for both: `serde(flatten)` cannot carry a `RawValue`.)
#[derive(Deserialize)]
struct PublishParams {
    #[serde(default)]
    channel: String,
    #[serde(default)]
    channels: Vec<String>,
    #[serde(default)]
    data: Option<Box<RawValue>>,
    #[serde(default)]
    b64data: Option<String>,
    #[serde(default)]
    idempotency_key: Option<String>,
    /// `null` is no tags, as protobuf's JSON mapping reads it.
    #[serde(default)]
    tags: Option<Tags>,
    #[serde(default)]
    skip_history: bool,
}

/// What `publish` and `broadcast` store: the data, its tags, and the
/// idempotency key.
struct Payload {
    data: Arc<RawValue>,
    tags: Tags,
    key: Option<IdempotencyKey>,
}

impl PublishParams {
    /// The JSON to store, its tags and the idempotency key, or 107 for data
    /// that is missing, not JSON, or asks for what Herald does not do
    /// (`skip_history`: every publication is stored). (Tags that are not
    /// an object of strings fail the parameters' parse: 107 too.)
    fn payload(self) -> Result<Payload, ReplyError> {
        if self.skip_history {
            return Err(ReplyError::bad_request());
        }
        let data = match (self.data, self.b64data) {
            (Some(data), None) => data,
            (None, Some(b64)) => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b64.as_bytes())
                    .map_err(|_| ReplyError::bad_request())?;
                let text = String::from_utf8(bytes).map_err(|_| ReplyError::bad_request())?;
                RawValue::from_string(text).map_err(|_| ReplyError::bad_request())?
            }
            _ => return Err(ReplyError::bad_request()),
        };
        let key = self
            .idempotency_key
            .filter(|k| !k.is_empty())
            .map(IdempotencyKey::new)
            .transpose()
            .map_err(|_| ReplyError::bad_request())?;
        Ok(Payload {
            data: Arc::from(data),
            tags: self.tags.unwrap_or_default(),
            key,
        })
    }
}

/// Publishes to one channel: `{"offset","epoch"}`.
async fn publish_one(
    state: &AppState,
    who: &Principal,
    channel: ChannelName,
    payload: &Payload,
) -> Outcome {
    let auth = &state.shared.auth;
    if auth.may_publish(who, &channel).is_err() {
        return Err(ReplyError::permission_denied());
    }
    if auth.take_publishes(who, 1).is_err() {
        return Err(ReplyError::too_many_requests());
    }
    let epoch = epoch(state, &channel).await?;
    let offset = super::publish::publish(
        state,
        channel,
        Arc::clone(&payload.data),
        payload.tags.clone(),
        payload.key.clone(),
    )
    .await?;
    raw(&json!({ "offset": offset, "epoch": epoch }))
}

async fn publish(state: &AppState, who: &Principal, p: PublishParams) -> Outcome {
    let channel = channel(&p.channel)?;
    let payload = p.payload()?;
    publish_one(state, who, channel, &payload).await
}

/// Publishes to each channel in turn: `{"responses":[...]}`, one publish
/// answer per channel.
async fn broadcast(state: &AppState, who: &Principal, p: PublishParams) -> Outcome {
    let channels = p.channels.clone();
    let payload = p.payload()?;
    let mut responses = Vec::with_capacity(channels.len());
    for name in &channels {
        let outcome = match channel(name) {
            Ok(c) => publish_one(state, who, c, &payload).await,
            Err(e) => Err(e),
        };
        responses.push(match outcome {
            Ok(result) => format!("{{\"result\":{}}}", result.get()),
            Err(e) => json!({ "error": e }).to_string(),
        });
    }
    RawValue::from_string(format!("{{\"responses\":[{}]}}", responses.join(",")))
        .map_err(|_| ReplyError::internal())
}

async fn epoch(state: &AppState, channel: &ChannelName) -> Result<String, ReplyError> {
    state
        .shared
        .storage
        .channel_epoch(channel)
        .await
        .map_err(|e| {
            crate::StorageFailure::new("channel_epoch", Some(channel), e).log();
            ReplyError::internal()
        })
}

#[derive(Deserialize)]
struct HistoryParams {
    channel: String,
    #[serde(default)]
    limit: i64,
    #[serde(default)]
    since: Option<StreamPosition>,
    #[serde(default)]
    reverse: bool,
}

async fn history_method(state: &AppState, who: &Principal, p: HistoryParams) -> Outcome {
    let channel = channel(&p.channel)?;
    if state.shared.auth.may_read_history(who, &channel).is_err() {
        return Err(ReplyError::permission_denied());
    }
    let epoch = epoch(state, &channel).await?;
    let query = HistoryQuery {
        limit: p.limit,
        since: p.since,
        reverse: p.reverse,
    };
    let h = history(state.shared.storage.as_ref(), &channel, epoch, &query).await?;
    raw(&json!({
        "publications": to_raw_value(&publications(&h.publications)).map_err(|_| ReplyError::internal())?,
        "epoch": h.epoch,
        "offset": h.offset,
    }))
}

#[derive(Deserialize)]
struct ChannelsParams {
    #[serde(default)]
    pattern: Option<String>,
}

/// Every channel with history, and every channel with subscribers on this
/// node, with `num_clients` counted on this node.
async fn channels(state: &AppState, who: &Principal, p: ChannelsParams) -> Outcome {
    if state.shared.auth.may_admin(who).is_err() {
        return Err(ReplyError::permission_denied());
    }
    let stored = state.shared.storage.channels().await.map_err(|e| {
        crate::StorageFailure::new("channels", None, e).log();
        ReplyError::internal()
    })?;
    let mut counts = state.shared.centrifugo.subscribers();
    for head in stored {
        counts.entry(head.name).or_insert(0);
    }
    let pattern = p.pattern.filter(|p| !p.is_empty()).map(Pattern::new);
    let channels: Map<String, Value> = counts
        .into_iter()
        .filter(|(c, _)| pattern.as_ref().is_none_or(|p| p.matches(c.as_str())))
        .map(|(c, n)| (c.as_str().to_owned(), json!({ "num_clients": n })))
        .collect();
    raw(&json!({ "channels": channels }))
}

/// Every live node, as it last reported itself (`node_info.rs`).
async fn info(state: &AppState, who: &Principal) -> Outcome {
    if state.shared.auth.may_admin(who).is_err() {
        return Err(ReplyError::permission_denied());
    }
    raw(&super::node_info::info(state).await?)
}

#[derive(Deserialize)]
struct UserChannel {
    user: String,
    channel: String,
}

/// Tells every node (`cluster.rs`) to act on `event`: `{}`, or 107 for
/// an event too large to send (nothing done), 100 when the storage cannot
/// send it (nothing done either).
async fn tell_cluster(state: &AppState, event: ClusterEvent) -> Outcome {
    match crate::cluster::tell(state, event).await {
        Ok(()) => raw(&json!({})),
        Err(herald_storage::Error::ClusterEventTooLarge { .. }) => Err(ReplyError::bad_request()),
        Err(e) => {
            crate::StorageFailure::new("send_cluster_event", None, e).log();
            Err(ReplyError::internal())
        }
    }
}

/// Ends `user`'s subscriptions to `channel` on every node.
async fn unsubscribe(state: &AppState, who: &Principal, p: UserChannel) -> Outcome {
    if state.shared.auth.may_admin(who).is_err() {
        return Err(ReplyError::permission_denied());
    }
    let channel = channel(&p.channel)?;
    tell_cluster(
        state,
        ClusterEvent::Unsubscribe {
            user: p.user,
            channel,
        },
    )
    .await
}

#[derive(Deserialize)]
struct DisconnectParams {
    user: String,
    #[serde(default)]
    disconnect: Option<CustomDisconnect>,
}

#[derive(Deserialize)]
struct CustomDisconnect {
    code: u16,
}

/// Closes `user`'s connections on every node: 3503 "force disconnect"
/// (the client does not reconnect), or 3011 "force reconnect" when the
/// request's `disconnect.code` is one a client reconnects after
/// (3000–3499).
async fn disconnect(state: &AppState, who: &Principal, p: DisconnectParams) -> Outcome {
    if state.shared.auth.may_admin(who).is_err() {
        return Err(ReplyError::permission_denied());
    }
    let d = match p.disconnect {
        Some(CustomDisconnect { code }) if (3000..3500).contains(&code) => codes::FORCE_RECONNECT,
        _ => codes::FORCE_NO_RECONNECT,
    };
    tell_cluster(
        state,
        ClusterEvent::Disconnect {
            user: p.user,
            code: d.code,
        },
    )
    .await
}

#[derive(Deserialize)]
struct ChannelParams {
    channel: String,
}

/// `presence` (`presence_stats` with `stats`), for a key that may read the
/// channel; 108 when the channel's namespace has no presence.
async fn presence_method(
    state: &AppState,
    who: &Principal,
    p: ChannelParams,
    stats: bool,
) -> Outcome {
    let channel = channel(&p.channel)?;
    if !super::presence::enabled(state, &channel) {
        return Err(ReplyError::not_available());
    }
    if state.shared.auth.may_read_history(who, &channel).is_err() {
        return Err(ReplyError::permission_denied());
    }
    let result = if stats {
        super::presence::stats(state, &channel).await?
    } else {
        super::presence::presence(state, &channel).await?
    };
    raw(&result)
}

//! Centrifugo's server HTTP API: `POST /api/<method>` with a JSON body,
//! authorized by an API key in `X-API-Key`, `Authorization: apikey <KEY>`
//! or `?api_key=` (Centrifugo's documentation, "Server API walkthrough").
//! Herald's API keys are the keys; their permissions apply (`publish` for
//! publish and broadcast, `read` for history, `admin` for the rest).
//!
//! Refused before any method runs, with an HTTP status as Centrifugo
//! answers and `{"error": {"code", "message"}}`, in this order: an unknown
//! method 404 (104); a missing or unknown key 401 (101), checked before
//! the body is read; a `Content-Type` that is not JSON 415 (107); a body
//! over `max_batch_body_bytes` 413 (106); a body
//! that does not decode (not a JSON object, a field of another JSON type)
//! 400 (107). Every other answer is HTTP 200 with `{"result": ...}` or
//! `{"error": {"code", "message"}}` (codes as in `codes.rs`). `batch`
//! answers `{"replies": [{"<method>": ...} | {"error": ...}]}`.

use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use herald_auth::policy::Pattern;
use herald_auth::{Credential, Principal};
use herald_core::{ChannelName, IdempotencyKey, Tags};
use herald_storage::ClusterEvent;
use serde::Deserialize;
use serde_json::value::{to_raw_value, RawValue};
use serde_json::{json, Map, Value};

use super::codes::{self, ReplyError};
use super::context::CentrifugoState;
use super::history::{history, Budget, HistoryQuery};
use super::protocol::{object, StreamPosition};
use super::replies::publications;
use herald_http::auth_extract::RequestPrincipal;
use herald_http::error::Error;
use herald_http::extract::read_limited;

/// A method's result, kept as JSON text (publication data stays byte
/// for byte what was published).
type Outcome = Result<Box<RawValue>, ReplyError>;

/// The methods served; another name is 404, as in Centrifugo, whose router
/// has a route per method. In the order Centrifugo looks for them in a
/// batch command: the first one a command holds runs.
const METHODS: [&str; 11] = [
    "publish",
    "broadcast",
    "unsubscribe",
    "disconnect",
    "history",
    "history_remove",
    "presence",
    "presence_stats",
    "info",
    "channels",
    "batch",
];

/// Most commands one `batch` may hold; a batch with more is refused
/// before any runs (413, 106 "limit exceeded").
pub(crate) const MAX_BATCH_COMMANDS: usize = 1000;

/// Parameters that do not decode: not a JSON object, or a field of
/// another JSON type than the method's (Centrifugo answers 400; a missing
/// field is its default, and refused by the method if it needs one).
#[derive(Debug)]
struct Undecodable;

/// `POST /api/{method}`. An unknown method is 404; then the key is checked
/// before the body is read, so a caller without one gets 401 whatever it
/// sends, and a client that waits for `100 Continue` never sends its body;
/// then a body that does not decode is 400.
pub(crate) async fn call(
    State(state): State<CentrifugoState>,
    Path(method): Path<String>,
    request: Request,
) -> Response {
    if !METHODS.contains(&method.as_str()) {
        return failure(StatusCode::NOT_FOUND, &ReplyError::method_not_found());
    }
    let (parts, body) = request.into_parts();
    let Some(who) = principal(&state, &parts.headers, &parts.uri).await else {
        return failure(StatusCode::UNAUTHORIZED, &unauthorized(&parts.headers));
    };
    // A JSON body only: a web page can send another type to any host
    // without a CORS preflight (`edge.rs`).
    if !herald_http::edge::is_json(&parts.headers) {
        return failure(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &ReplyError::bad_request(),
        );
    }
    let limit = state.settings().max_batch_body_bytes;
    let body = match read_limited(&parts.headers, body, limit).await {
        Ok(body) => body,
        Err(Error::PayloadTooLarge { .. }) => {
            return failure(StatusCode::PAYLOAD_TOO_LARGE, &ReplyError::limit_exceeded())
        }
        Err(_) => return failure(StatusCode::BAD_REQUEST, &ReplyError::bad_request()),
    };
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        Bytes::from_static(b"{}")
    } else {
        body
    };
    let bad_request = || failure(StatusCode::BAD_REQUEST, &ReplyError::bad_request());
    let params: Box<RawValue> = match serde_json::from_slice::<Box<RawValue>>(&body) {
        Ok(params) if params.get().starts_with('{') => params,
        _ => return bad_request(),
    };
    if method == "batch" {
        return batch(&state, &who, &parts.headers, &params)
            .await
            .unwrap_or_else(|_| bad_request());
    }
    let budget = Budget::of(state.settings());
    match run(&state, &who, &parts.headers, &method, &params, budget).await {
        Ok(outcome) => answer(&outcome),
        Err(Undecodable) => bad_request(),
    }
}

/// Centrifugo's 101 for a call without a usable key, its message naming
/// where the server API looks for one, and saying so when the caller sent
/// another `Authorization` scheme (a client token's `Bearer` is the usual
/// mistake).
fn unauthorized(headers: &HeaderMap) -> ReplyError {
    let scheme = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_whitespace().next())
        .filter(|scheme| !scheme.eq_ignore_ascii_case("apikey"));
    let wrong = scheme.map_or(String::new(), |scheme| {
        format!(" (Authorization: {scheme} is not taken here)")
    });
    ReplyError {
        message: format!(
            "unauthorized: the server API takes an API key in X-API-Key, \
             Authorization: apikey <KEY> or ?api_key={wrong}"
        ),
        ..ReplyError::unauthorized()
    }
}

/// The caller, from its API key; `None` when access control is on and the
/// key is missing or unknown. `?api_key=` is percent-decoded, as any query
/// parameter. A call a standby forwarded (`Herald-Forwarded-By`,
/// `history_remove`) is the cluster's when it carries the cluster secret,
/// and `None` without it, as a forwarded publish is (`auth_extract.rs`).
async fn principal(state: &CentrifugoState, headers: &HeaderMap, uri: &Uri) -> Option<Principal> {
    let auth = &state.shared.auth();
    if herald_node::forward::was_forwarded(headers) {
        return auth.principal(headers, None).await.ok();
    }
    if !auth.enabled() {
        return Some(Principal::Anonymous);
    }
    let from_authorization = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("apikey"))
        .map(|(_, key)| key.trim().to_owned());
    let from_header = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(|key| key.trim().to_owned());
    let from_query = || {
        Query::<Vec<(String, String)>>::try_from_uri(uri)
            .ok()?
            .0
            .into_iter()
            .find(|(name, _)| name == "api_key")
            .map(|(_, key)| key)
    };
    let key = from_header
        .or(from_authorization)
        .or_else(from_query)
        .filter(|k| !k.is_empty())?;
    match auth.resolve(Some(Credential::ApiKey(&key))).await {
        Ok(who @ Principal::Key(_)) => Some(who),
        _ => None,
    }
}

/// A refusal before any method ran: `status` with
/// `{"error": {"code", "message"}}`.
fn failure(status: StatusCode, error: &ReplyError) -> Response {
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        json!({ "error": error }).to_string(),
    )
        .into_response()
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

/// `batch`: `{"commands": [{"<method>": {...}}, ...]}`, run in order. A
/// command runs the first method of [`METHODS`] it holds (not `null`;
/// other fields are ignored), as in Centrifugo; one with none is answered
/// 104, a `null` command or one whose parameters do not decode 107, in
/// its place. More than [`MAX_BATCH_COMMANDS`] commands: 413 with 106,
/// nothing run. The `history` replies of one batch share one byte budget
/// ([`Budget`]); once less than `max_message_bytes` of it is left, a
/// further `history` answers 106 in its place.
async fn batch(
    state: &CentrifugoState,
    who: &Principal,
    headers: &HeaderMap,
    params: &RawValue,
) -> Result<Response, Undecodable> {
    #[derive(Deserialize)]
    struct Batch {
        #[serde(default)]
        commands: Vec<Option<Map<String, Value>>>,
        /// Centrifugo may run the commands concurrently; Herald runs them
        /// in order either way (the field is decoded, not used).
        #[serde(default, rename = "parallel")]
        _parallel: bool,
    }
    let Batch { commands, .. } = decode(params)?;
    if commands.len() > MAX_BATCH_COMMANDS {
        return Ok(failure(
            StatusCode::PAYLOAD_TOO_LARGE,
            &ReplyError::limit_exceeded(),
        ));
    }
    let mut budget = Budget::of(state.settings());
    let mut replies = Vec::with_capacity(commands.len());
    for command in commands {
        let Some(command) = command else {
            replies.push(json!({ "error": ReplyError::bad_request() }).to_string());
            continue;
        };
        let chosen = METHODS
            .iter()
            .filter(|m| **m != "batch")
            .find_map(|m| command.get(*m).filter(|p| !p.is_null()).map(|p| (*m, p)));
        let reply = match chosen {
            Some(("history", _)) if budget.bytes < state.settings().max_message_bytes => {
                json!({ "error": ReplyError::limit_exceeded() }).to_string()
            }
            Some((method, params)) => match to_raw_value(params) {
                Ok(params) => match run(state, who, headers, method, &params, budget).await {
                    Ok(Ok(result)) => format!("{{{}:{}}}", json!(method), result.get()),
                    Ok(Err(e)) => json!({ "error": e }).to_string(),
                    Err(Undecodable) => json!({ "error": ReplyError::bad_request() }).to_string(),
                },
                Err(_) => json!({ "error": ReplyError::bad_request() }).to_string(),
            },
            None => json!({ "error": ReplyError::method_not_found() }).to_string(),
        };
        budget.bytes = budget.bytes.saturating_sub(reply.len());
        replies.push(reply);
    }
    let body = format!("{{\"replies\":[{}]}}", replies.join(","));
    Ok((
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}

/// Decodes `params` as `T`: a JSON object whose fields have `T`'s types
/// (serde alone would also take an array of the fields' values).
fn decode<'a, T: Deserialize<'a>>(params: &'a RawValue) -> Result<T, Undecodable> {
    if !params.get().starts_with('{') {
        return Err(Undecodable);
    }
    serde_json::from_str(params.get()).map_err(|_| Undecodable)
}

fn raw(value: &impl serde::Serialize) -> Outcome {
    to_raw_value(value).map_err(|_| ReplyError::internal())
}

fn channel(name: &str) -> Result<ChannelName, ReplyError> {
    ChannelName::new(name).map_err(|_| ReplyError::bad_request())
}

/// Runs one method (`Err` when its parameters do not decode; `headers`
/// are the request's, for a call to forward).
async fn run(
    state: &CentrifugoState,
    who: &Principal,
    headers: &HeaderMap,
    method: &str,
    p: &RawValue,
    budget: Budget,
) -> Result<Outcome, Undecodable> {
    Ok(match method {
        "publish" => publish(state, who, decode(p)?).await,
        "broadcast" => broadcast(state, who, decode(p)?).await,
        "history" => history_method(state, who, decode(p)?, budget).await,
        "channels" => channels(state, who, decode(p)?).await,
        "info" => info(state, who).await,
        "unsubscribe" => unsubscribe(state, who, decode(p)?).await,
        "disconnect" => disconnect(state, who, decode(p)?).await,
        "presence" => presence_method(state, who, decode(p)?, false).await,
        "presence_stats" => presence_method(state, who, decode(p)?, true).await,
        "history_remove" => history_remove(state, who, headers, decode(p)?).await,
        _ => Err(ReplyError::method_not_found()),
    })
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
    /// an object of strings fail the parameters' decoding: 400.)
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
    state: &CentrifugoState,
    who: &Principal,
    channel: ChannelName,
    payload: &Payload,
) -> Outcome {
    let auth = &state.shared.auth();
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

async fn publish(state: &CentrifugoState, who: &Principal, p: PublishParams) -> Outcome {
    let channel = channel(&p.channel)?;
    let payload = p.payload()?;
    publish_one(state, who, channel, &payload).await
}

/// Publishes to each channel in turn: `{"responses":[...]}`, one publish
/// answer per channel; no channel is 107, as in Centrifugo.
async fn broadcast(state: &CentrifugoState, who: &Principal, p: PublishParams) -> Outcome {
    if p.channels.is_empty() {
        return Err(ReplyError::bad_request());
    }
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

async fn epoch(state: &CentrifugoState, channel: &ChannelName) -> Result<String, ReplyError> {
    state
        .shared
        .node
        .storage()
        .channel_epoch(channel)
        .await
        .map_err(|e| {
            herald_node::node_error::StorageFailure::new("channel_epoch", Some(channel), e).log();
            ReplyError::internal()
        })
}

#[derive(Deserialize)]
struct HistoryParams {
    #[serde(default)]
    channel: String,
    #[serde(default)]
    limit: i64,
    #[serde(default, deserialize_with = "object")]
    since: Option<StreamPosition>,
    #[serde(default)]
    reverse: bool,
}

/// `history`, within `budget` (see `history.rs`).
async fn history_method(
    state: &CentrifugoState,
    who: &Principal,
    p: HistoryParams,
    budget: Budget,
) -> Outcome {
    let channel = channel(&p.channel)?;
    if state.shared.auth().may_read_history(who, &channel).is_err() {
        return Err(ReplyError::permission_denied());
    }
    let epoch = epoch(state, &channel).await?;
    let query = HistoryQuery {
        limit: p.limit,
        since: p.since,
        reverse: p.reverse,
    };
    let h = history(
        state.shared.node.storage().as_ref(),
        &channel,
        epoch,
        &query,
        budget,
    )
    .await?;
    // Written as is, never parsed into a `Value`: a stored publication
    // nested deeper than serde_json's recursion limit must not fail the
    // reply.
    #[derive(serde::Serialize)]
    struct HistoryReply<'a> {
        publications: Box<serde_json::value::RawValue>,
        epoch: &'a str,
        offset: u64,
    }
    raw(&HistoryReply {
        publications: to_raw_value(&publications(&h.publications))
            .map_err(|_| ReplyError::internal())?,
        epoch: &h.epoch,
        offset: h.offset,
    })
}

#[derive(Deserialize)]
struct ChannelsParams {
    #[serde(default)]
    pattern: Option<String>,
}

/// Every channel with subscribers on some node, with `num_clients` summed
/// over the nodes (`node_info.rs`), those whose name matches `pattern`.
async fn channels(state: &CentrifugoState, who: &Principal, p: ChannelsParams) -> Outcome {
    if state.shared.auth().may_admin(who).is_err() {
        return Err(ReplyError::permission_denied());
    }
    let shared = &state.shared;
    let counts = super::node_info::channel_counts(
        shared.node.storage().as_ref(),
        &state.centrifugo.registry,
        &shared.settings.node_id,
    )
    .await?;
    let pattern = p.pattern.filter(|p| !p.is_empty()).map(Pattern::new);
    let channels: Map<String, Value> = counts
        .into_iter()
        .filter(|(c, _)| pattern.as_ref().is_none_or(|p| p.matches(c.as_str())))
        .map(|(c, n)| (c.as_str().to_owned(), json!({ "num_clients": n })))
        .collect();
    raw(&json!({ "channels": channels }))
}

/// Every live node, as it last reported itself (`node_info.rs`).
async fn info(state: &CentrifugoState, who: &Principal) -> Outcome {
    if state.shared.auth().may_admin(who).is_err() {
        return Err(ReplyError::permission_denied());
    }
    let shared = &state.shared;
    raw(&super::node_info::info(
        shared.node.storage().as_ref(),
        &state.centrifugo.registry,
        &shared.settings.node_id,
    )
    .await?)
}

#[derive(Deserialize)]
struct UserChannel {
    #[serde(default)]
    user: String,
    #[serde(default)]
    channel: String,
}

/// Tells every node (`cluster.rs`) to act on `event`: `{}`, or 107 for
/// an event too large to send (nothing done), 100 when the storage cannot
/// send it (nothing done either).
async fn tell_cluster(state: &CentrifugoState, event: ClusterEvent) -> Outcome {
    let shared = &state.shared;
    match super::cluster::tell(
        shared.node.storage().as_ref(),
        &state.centrifugo.registry,
        event,
    )
    .await
    {
        Ok(()) => raw(&json!({})),
        Err(herald_storage::Error::ClusterEventTooLarge { .. }) => Err(ReplyError::bad_request()),
        Err(e) => {
            herald_node::node_error::StorageFailure::new("send_cluster_event", None, e).log();
            Err(ReplyError::internal())
        }
    }
}

/// Ends `user`'s subscriptions to `channel` on every node.
async fn unsubscribe(state: &CentrifugoState, who: &Principal, p: UserChannel) -> Outcome {
    if state.shared.auth().may_admin(who).is_err() {
        return Err(ReplyError::permission_denied());
    }
    let channel = channel(&p.channel)?;
    herald_http::audit::admin_action(
        who,
        "unsubscribe",
        Some(channel.as_str()),
        Some(p.user.as_str()),
    );
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
    #[serde(default)]
    user: String,
    #[serde(default, deserialize_with = "object")]
    disconnect: Option<CustomDisconnect>,
}

/// `disconnect.code` is a `uint32` in Centrifugo's API; only whether it is
/// in 3000–3499 matters here.
#[derive(Deserialize)]
struct CustomDisconnect {
    #[serde(default)]
    code: u32,
}

/// Closes `user`'s connections on every node: 3503 "force disconnect"
/// (the client does not reconnect), or 3011 "force reconnect" when the
/// request's `disconnect.code` is one a client reconnects after
/// (3000–3499).
async fn disconnect(state: &CentrifugoState, who: &Principal, p: DisconnectParams) -> Outcome {
    if state.shared.auth().may_admin(who).is_err() {
        return Err(ReplyError::permission_denied());
    }
    let d = match p.disconnect {
        Some(CustomDisconnect { code }) if (3000..3500).contains(&code) => codes::FORCE_RECONNECT,
        _ => codes::FORCE_NO_RECONNECT,
    };
    herald_http::audit::admin_action(who, "disconnect", None, Some(p.user.as_str()));
    tell_cluster(
        state,
        ClusterEvent::Disconnect {
            user: p.user,
            code: d.code,
        },
    )
    .await
}

/// `history_remove` (`admin`): every stored publication of the channel up
/// to its head removed, head and epoch kept (`history_remove.rs`).
async fn history_remove(
    state: &CentrifugoState,
    who: &Principal,
    headers: &HeaderMap,
    p: ChannelParams,
) -> Outcome {
    let channel = channel(&p.channel)?;
    super::history_remove::history_remove(state, who, headers, channel).await?;
    raw(&json!({}))
}

#[derive(Deserialize)]
struct ChannelParams {
    #[serde(default)]
    channel: String,
}

/// `presence` (`presence_stats` with `stats`), for a key that may read the
/// channel; 108 when the channel's namespace has no presence.
async fn presence_method(
    state: &CentrifugoState,
    who: &Principal,
    p: ChannelParams,
    stats: bool,
) -> Outcome {
    let channel = channel(&p.channel)?;
    if !super::presence::enabled(state, &channel) {
        return Err(ReplyError::not_available());
    }
    if state.shared.auth().may_read_history(who, &channel).is_err() {
        return Err(ReplyError::permission_denied());
    }
    let result = if stats {
        super::presence::stats(state, &channel).await?
    } else {
        super::presence::presence(state, &channel).await?
    };
    raw(&result)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use axum::body::Body;
    use axum::http::Request;
    use herald_core::FencingToken;
    use tokio_util::sync::CancellationToken;
    use tower::ServiceExt;

    use super::*;
    use crate::app;
    use crate::config::ServerConfig;
    use crate::state::AppState;
    use herald_auth::{api_key_sha256, generate_api_key, ApiKeyConfig, AuthConfig, Permission};
    use herald_node::testing::{FakeLease, MemoryStorage};

    /// A holder with one API key that may do everything; the key.
    async fn node() -> (AppState, String, CancellationToken) {
        node_on(MemoryStorage::new()).await
    }

    /// [`node`] on `storage`.
    async fn node_on(storage: Arc<MemoryStorage>) -> (AppState, String, CancellationToken) {
        let key = generate_api_key();
        let config = ServerConfig {
            max_batch_body_bytes: 4096,
            auth: AuthConfig {
                api_keys: vec![ApiKeyConfig {
                    name: "backend".to_owned(),
                    sha256: api_key_sha256(&key),
                    permissions: vec![Permission::Publish, Permission::Read, Permission::Admin],
                    channels: None,
                    publish_rate_per_s: None,
                    publish_burst: None,
                }],
                ..AuthConfig::default()
            },
            ..ServerConfig::default()
        };
        let shutdown = CancellationToken::new();
        let state = AppState::start_with(
            storage,
            FakeLease::holder(FencingToken(1)),
            config,
            shutdown.clone(),
        )
        .await
        .unwrap();
        (state, key, shutdown)
    }

    async fn send(state: &AppState, request: Request<Body>) -> (StatusCode, Value) {
        let response = app(state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn the_key_is_checked_before_the_body_is_read() {
        let (state, key, shutdown) = node().await;
        // Without a key: 401, and the body is never read (a client
        // waiting for `100 Continue` would never be asked for it).
        let polled = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&polled);
        let body = Body::from_stream(futures::stream::once(async move {
            flag.store(true, Ordering::SeqCst);
            Ok::<_, std::convert::Infallible>(Bytes::from_static(b"{\"channel\":\"a\",\"data\":1}"))
        }));
        let request = Request::post("/api/publish")
            .header("content-type", "application/json")
            .header("expect", "100-continue")
            .body(body)
            .unwrap();
        let response = app(state.clone()).oneshot(request).await.unwrap();
        assert!(!polled.load(Ordering::SeqCst), "the body was read");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&body).unwrap(),
            json!({"error": {"code": 101, "message": "unauthorized: the server API takes an API \
                key in X-API-Key, Authorization: apikey <KEY> or ?api_key="}})
        );
        // A client token's scheme is named as not taken here.
        let request = Request::post("/api/publish")
            .header("content-type", "application/json")
            .header("authorization", "Bearer eyJhbGciOi")
            .body(Body::from("{}"))
            .unwrap();
        let (status, body) = send(&state, request).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(body["error"]["code"], 101, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("Authorization: Bearer is not taken here")
                    && m.contains("X-API-Key")),
            "{body}"
        );
        // A body over the limit without a key is a 401 too, not a 413.
        let big = json!({"channel": "a", "data": "x".repeat(8000)}).to_string();
        let request = Request::post("/api/publish")
            .header("content-type", "application/json")
            .body(Body::from(big.clone()))
            .unwrap();
        assert_eq!(send(&state, request).await.0, StatusCode::UNAUTHORIZED);
        // With the key, the same body is over the limit: 413, 106.
        let request = Request::post("/api/publish")
            .header("content-type", "application/json")
            .header("x-api-key", &key)
            .body(Body::from(big))
            .unwrap();
        let (status, answer) = send(&state, request).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(answer["error"]["code"], 106, "{answer}");
        shutdown.cancel();
        state.stopped().await;
    }

    #[tokio::test]
    async fn statuses_are_centrifugos() {
        let (state, key, shutdown) = node().await;
        let cases = [
            // No such method: 404, as Centrifugo's router.
            (
                "teleport",
                "{}",
                404,
                json!({"error": {"code": 104, "message": "method not found"}}),
            ),
            // Not a JSON object, or a field of another type: 400.
            (
                "publish",
                "{not json",
                400,
                json!({"error": {"code": 107, "message": "bad request"}}),
            ),
            ("publish", r#"["news:a", 1]"#, 400, json!(null)),
            ("history", r#"["news:a", 10]"#, 400, json!(null)),
            ("info", "null", 400, json!(null)),
            ("publish", r#"{"channel": 5, "data": 1}"#, 400, json!(null)),
            (
                "history",
                r#"{"channel": "news:a", "limit": "10"}"#,
                400,
                json!(null),
            ),
            (
                "history",
                r#"{"channel": "news:a", "since": [0, ""]}"#,
                400,
                json!(null),
            ),
            (
                "disconnect",
                r#"{"user": "u", "disconnect": [3000]}"#,
                400,
                json!(null),
            ),
            ("batch", r#"{"commands": 5}"#, 400, json!(null)),
            (
                "batch",
                r#"{"commands": [], "parallel": "yes"}"#,
                400,
                json!(null),
            ),
            // A field missing is its default, refused by the method when
            // it needs one: 200 with 107.
            (
                "publish",
                r#"{"data": 1}"#,
                200,
                json!({"error": {"code": 107, "message": "bad request"}}),
            ),
            (
                "history",
                "{}",
                200,
                json!({"error": {"code": 107, "message": "bad request"}}),
            ),
            (
                "presence",
                "{}",
                200,
                json!({"error": {"code": 107, "message": "bad request"}}),
            ),
            // A broadcast to no channel.
            (
                "broadcast",
                r#"{"channels": [], "data": 1}"#,
                200,
                json!({"error": {"code": 107, "message": "bad request"}}),
            ),
            (
                "broadcast",
                r#"{"data": 1}"#,
                200,
                json!({"error": {"code": 107, "message": "bad request"}}),
            ),
            // Any uint32 disconnect code.
            (
                "disconnect",
                r#"{"user": "u", "disconnect": {"code": 70000}}"#,
                200,
                json!({"result": {}}),
            ),
            ("info", " ", 200, json!(null)),
            ("batch", "{}", 200, json!({"replies": []})),
            // In a batch, a command that does not decode is 107 in place.
            (
                "batch",
                r#"{"commands": [{"publish": {"channel": 5}}, {"history": {"channel": "news:a"}}]}"#,
                200,
                json!(null),
            ),
        ];
        for (method, body, status, expected) in cases {
            let request = Request::post(format!("/api/{method}"))
                .header("content-type", "application/json")
                .header("x-api-key", &key)
                .body(Body::from(body))
                .unwrap();
            let (got, answer) = send(&state, request).await;
            assert_eq!(got.as_u16(), status, "{method} {body}: {answer}");
            if status == 400 {
                assert_eq!(
                    answer,
                    json!({"error": {"code": 107, "message": "bad request"}})
                );
            }
            if !expected.is_null() {
                assert_eq!(answer, expected, "{method} {body}");
            }
            if method == "batch" && body.contains("publish") {
                assert_eq!(answer["replies"][0]["error"]["code"], 107, "{answer}");
                assert_eq!(answer["replies"][1]["history"]["offset"], 0, "{answer}");
            }
        }
        shutdown.cancel();
        state.stopped().await;
    }

    #[tokio::test]
    async fn a_batch_command_runs_the_first_method_it_holds() {
        let (state, key, shutdown) = node().await;
        let body = json!({"commands": [
            // Another field that sorts first is ignored.
            {"aaa": 1, "publish": {"channel": "news:a", "data": 1}},
            // Two methods: the first in Centrifugo's order runs.
            {"history": {"channel": "news:a"}, "publish": {"channel": "news:a", "data": 2}},
            // A method that is null is not there.
            {"publish": null, "info": {}},
            {"teleport": {}},
            {},
            null,
            {"batch": {"commands": []}},
        ]});
        let request = Request::post("/api/batch")
            .header("content-type", "application/json")
            .header("x-api-key", &key)
            .body(Body::from(body.to_string()))
            .unwrap();
        let (status, answer) = send(&state, request).await;
        assert_eq!(status, StatusCode::OK);
        let replies = answer["replies"].as_array().unwrap();
        assert_eq!(replies.len(), 7, "{answer}");
        assert_eq!(replies[0]["publish"]["offset"], 1, "{answer}");
        assert_eq!(replies[1]["publish"]["offset"], 2, "{answer}");
        assert!(replies[2]["info"]["nodes"].is_array(), "{answer}");
        let not_found = json!({"error": {"code": 104, "message": "method not found"}});
        assert_eq!(replies[3], not_found);
        assert_eq!(replies[4], not_found);
        assert_eq!(
            replies[5],
            json!({"error": {"code": 107, "message": "bad request"}})
        );
        assert_eq!(replies[6], not_found);
        shutdown.cancel();
        state.stopped().await;
    }

    /// A batch of more than 1000 commands is refused before any runs,
    /// and its `history` replies share one byte budget: once a reply has
    /// spent it, the next `history` answers 106.
    #[tokio::test]
    async fn a_batch_is_bounded_in_commands_and_bytes() {
        let storage = MemoryStorage::new();
        let (state, key, shutdown) = node_on(storage.clone()).await;
        let post = |body: String| {
            Request::post("/api/batch")
                .header("content-type", "application/json")
                .header("x-api-key", &key)
                .body(Body::from(body))
                .unwrap()
        };
        let publish = r#"{"publish":{"channel":"news:c","data":1}}"#;
        let too_many = format!("{{\"commands\":[{}]}}", vec!["{}"; 1001].join(","));
        let (status, answer) = send(&state, post(too_many)).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(answer["error"]["code"], 106, "{answer}");
        let (status, answer) = send(&state, post(format!("{{\"commands\":[{publish}]}}"))).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(
            answer["replies"][0]["publish"]["offset"], 1,
            "nothing ran before: {answer}"
        );
        // 12 MB of history: a reply holds about 8 MiB of it, the next
        // history of the batch none.
        let data = format!("\"{}\"", "x".repeat(60_000));
        for _ in 0..200 {
            storage.append_as_other_node("news:b", &data);
        }
        let history = r#"{"history":{"channel":"news:b","limit":1000}}"#;
        let body = format!("{{\"commands\":[{history},{history},{publish}]}}");
        let request = Request::post("/api/batch")
            .header("content-type", "application/json")
            .header("x-api-key", &key)
            .body(Body::from(body))
            .unwrap();
        let response = app(state.clone()).oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = axum::body::to_bytes(response.into_body(), 64 << 20)
            .await
            .unwrap();
        let answer: Value = serde_json::from_slice(&body).unwrap();
        let first = answer["replies"][0]["history"]["publications"]
            .as_array()
            .map_or(0, Vec::len);
        assert!((100..200).contains(&first), "{first} publications");
        assert_eq!(answer["replies"][1]["error"]["code"], 106);
        assert_eq!(answer["replies"][2]["publish"]["offset"], 2);
        shutdown.cancel();
        state.stopped().await;
    }

    #[tokio::test]
    async fn the_query_key_is_percent_decoded() {
        let (state, key, shutdown) = node().await;
        let encoded: String = key.bytes().map(|b| format!("%{b:02X}")).collect();
        let request = Request::post(format!("/api/info?api_key={encoded}"))
            .header("content-type", "application/json")
            .body(Body::from("{}"))
            .unwrap();
        let (status, answer) = send(&state, request).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert!(answer["result"]["nodes"].is_array(), "{answer}");
        shutdown.cancel();
        state.stopped().await;
    }
}

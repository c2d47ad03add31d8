//! The commands of a connection: what each does and answers. Replies are
//! built with `protocol.rs`; errors are Centrifugo's codes (`codes.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use herald_auth::{AuthError, Credential, Principal};
use herald_core::{ChannelName, Message, Offset, Tags};
use herald_storage::{ClientInfo, PresenceEvent, PresenceEventKind};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::channel_options::ChannelOptions;
use super::codes::{self, Disconnect, ReplyError};
use super::fossil_delta::FossilDelta;
use super::history::{cost, history, Budget, HistoryQuery};
use super::mailbox::{Out, Push, QueueBudget};
use super::presence;
use super::protocol::DataForm;
use super::protocol::{
    self, error_reply, publications, reply, ChannelRequest, Command, ConnectRequest,
    HistoryRequest, Publication, PublishRequest, RefreshRequest, SubRefreshRequest,
    SubscribeRequest, SUBSCRIPTION_FLAG_REJECT_UNRECOVERED,
};
use super::recovery::{self, Recovery};
use super::session::{
    max_commands_per_frame, Session, Stop, Sub, Writer, MAX_DENIALS_LOGGED, REPLY_FRAME_BYTES,
};
use super::tags_filter::FilterNode;
use herald_node::node_error::StorageContext;
use herald_node::subscription::{Item, StartAt, Subscription};

/// The version the connect reply names: Herald's.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What one frame of commands ended with (its replies are written).
#[derive(Debug, Default)]
pub(crate) struct Handled {
    /// The session ends: close with this code, or the client is gone.
    pub(crate) end: Option<Stop>,
    /// The frame held a pong (`{}`).
    pub(crate) pong: bool,
}

/// The outcome of one command.
enum Answer {
    /// A reply.
    Reply(String),
    /// A reply, then pushes.
    Replies(Vec<String>),
    /// No reply (a pong).
    Nothing,
    /// Close the connection.
    Close(Disconnect),
}

/// `Ok(result)` → the reply named `method`; `Err(error)` → the error reply.
fn answer<T: Serialize>(id: u32, method: &str, result: Result<T, ReplyError>) -> Answer {
    Answer::Reply(match result {
        Ok(result) => reply(id, method, &result),
        Err(e) => error_reply(id, &e),
    })
}

/// The seconds left until `at` (at least 1, so that a live token never
/// reads as expired), for `ttl` fields.
fn ttl_s(left: std::time::Duration) -> u32 {
    u32::try_from(left.as_secs().max(1)).unwrap_or(u32::MAX)
}

/// A channel name from a request, or 107 bad request.
fn channel(name: &str) -> Result<ChannelName, ReplyError> {
    ChannelName::new(name).map_err(|_| ReplyError::bad_request())
}

#[derive(Serialize)]
struct ConnectResult<'a> {
    client: &'a str,
    version: &'a str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    expires: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl: Option<u32>,
    ping: u64,
    pong: bool,
    /// An emulation transport's session id, for its `/emulation` requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<&'a str>,
    /// The node the session runs on, with `session`.
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<&'a str>,
    /// The server-side subscriptions, by channel.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    subs: BTreeMap<&'a str, SubscribeResult<'a>>,
}

#[derive(Serialize)]
struct SubscribeResult<'a> {
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    expires: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl: Option<u32>,
    recoverable: bool,
    positioned: bool,
    epoch: &'a str,
    offset: Offset,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    publications: Vec<Publication<'a>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    recovered: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    was_recovering: bool,
    /// Publications come as Fossil deltas (`fossil_delta.rs`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    delta: bool,
    /// The `data` of a server-side subscription's `subs` entry.
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<std::borrow::Cow<'a, RawValue>>,
}

/// A subscription as it started: what its subscribe result reports.
struct Started {
    /// The channel's epoch.
    epoch: String,
    /// Live publications continue after this offset.
    position: Offset,
    /// Every publication after the client's offset, when recovered.
    missed: Vec<Message>,
    /// A recovery was asked for and succeeded.
    recovered: bool,
    /// A recovery was asked for.
    was_recovering: bool,
    /// How the publications' `data` is written (a delta subscription's
    /// whole form).
    form: DataForm<'static>,
    /// Delta is on for the subscription.
    delta: bool,
}

impl Started {
    /// The subscribe result, with `expiry` and `data`.
    fn result<'a>(&'a self, expiry: &Expiry, data: Option<&'a RawValue>) -> SubscribeResult<'a> {
        let data = data.map(protocol::one_line);
        SubscribeResult {
            expires: expiry.expires,
            ttl: expiry.ttl,
            recoverable: true,
            positioned: true,
            epoch: &self.epoch,
            offset: self.position,
            publications: self
                .missed
                .iter()
                .map(|m| Publication::with_form(m, self.form))
                .collect(),
            recovered: self.recovered,
            was_recovering: self.was_recovering,
            delta: self.delta,
            data,
        }
    }
}

/// How a subscription hands its publications out: only those its tags
/// `filter` passes; as Fossil deltas when `delta` is on.
#[derive(Debug, Default)]
struct Follow {
    filter: Option<Arc<FilterNode>>,
    delta: Option<FossilDelta>,
}

/// Where a client asks to recover from: the epoch and offset it saw, and
/// the history resume window when it may not read the channel's history
/// (`recovery.rs`).
struct RecoverFrom<'a> {
    epoch: &'a str,
    offset: Offset,
    live_only: Option<std::time::Duration>,
    /// Answer 112 instead of `recovered: false`
    /// ([`SUBSCRIPTION_FLAG_REJECT_UNRECOVERED`]).
    reject_unrecovered: bool,
}

/// What a `subscribe` asks for that a stream subscription of Herald does
/// not serve, refused as Centrifugo refuses it where it is not set up:
/// no channel, a type other than stream, a map's paging fields, an
/// unknown delta type or a malformed tags filter close the connection
/// with 3501; a map (types 1–3) or shared poll (4) subscription is
/// answered 108 "not available". `None`: the request is served.
fn unserved_subscribe(id: u32, req: &SubscribeRequest) -> Option<Answer> {
    if req.channel.is_empty() {
        return Some(Answer::Close(codes::BAD_REQUEST));
    }
    match req.kind {
        0 => {}
        1..=4 => return Some(Answer::Reply(error_reply(id, &ReplyError::not_available()))),
        _ => return Some(Answer::Close(codes::BAD_REQUEST)),
    }
    let map_fields = req.phase != 0 || !req.cursor.is_empty() || req.limit != 0 || req.asc;
    let delta_known = matches!(req.delta.as_str(), "" | "fossil");
    let filter_valid = req.tf.as_ref().is_none_or(|tf| tf.validate().is_ok());
    (map_fields || !delta_known || !filter_valid).then_some(Answer::Close(codes::BAD_REQUEST))
}

/// The join and leave part of a new subscription.
#[derive(Default)]
struct JoinLeave {
    /// The subscribe request asked for join and leave pushes
    /// (`join_leave`).
    asked: bool,
    /// The subscription token's `info`, announced as `chan_info`.
    chan_info: Option<String>,
}

#[derive(Serialize)]
struct HistoryResult<'a> {
    publications: Vec<Publication<'a>>,
    epoch: &'a str,
    offset: Offset,
}

#[derive(Serialize)]
struct Expiry {
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    expires: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl: Option<u32>,
}

impl Expiry {
    /// No expiry.
    const NONE: Self = Self {
        expires: false,
        ttl: None,
    };

    fn of(who: &Principal) -> Self {
        let ttl = who.token().map(|t| ttl_s(t.time_left()));
        Self {
            expires: ttl.is_some(),
            ttl,
        }
    }
}

/// When `who`'s token expires, on the session's clock.
fn expiry_instant(who: &Principal) -> Option<Instant> {
    who.token().map(|t| Instant::now() + t.time_left())
}

/// Centrifugo's empty result, `{}`.
#[derive(Serialize)]
struct Empty {}

impl Session {
    /// Runs the commands of one text frame, in order, and writes their
    /// replies as they are ready (gathered into socket frames of up to
    /// [`REPLY_FRAME_BYTES`]), so that at most one command's reply waits
    /// in memory. A frame of more than [`max_commands_per_frame`] lines
    /// is not run: 3013. A line that is not a command closes the
    /// connection with 3501 after the replies so far. Before each command
    /// the tokens' expiry is checked: an expired one closes the
    /// connection (3005, 3006), and replies not yet written are dropped.
    pub(crate) async fn handle_frame(&mut self, text: &str, writer: &mut Writer) -> Handled {
        let mut handled = Handled::default();
        let lines = text.split('\n').map(str::trim).filter(|l| !l.is_empty());
        let cap = max_commands_per_frame(self.state.config().channel_limit);
        if lines.clone().count() > cap {
            tracing::debug!(client = %self.client, max_commands = cap, "too many commands in a frame");
            handled.end = Some(Stop::Close(codes::TOO_MANY_REQUESTS));
            return handled;
        }
        let mut batch = String::new();
        for line in lines {
            if let Some(d) = self.expired() {
                handled.end = Some(Stop::Close(d));
                return handled;
            }
            // A command is a JSON object (serde would also take an array
            // of its fields' values).
            let command = line
                .starts_with('{')
                .then(|| serde_json::from_str::<Command>(line).ok())
                .flatten();
            // One request, and no field the protocol lacks, in a command
            // that runs (a pong runs nothing).
            let command = command.filter(|c| {
                c.id == 0 || !protocol::Shape::of(line).is_some_and(protocol::Shape::ambiguous)
            });
            let Some(command) = command else {
                handled.end = Some(
                    self.flush(writer, &mut batch)
                        .await
                        .err()
                        .unwrap_or(Stop::Close(codes::BAD_REQUEST)),
                );
                return handled;
            };
            let texts = match self.handle(command, &mut handled.pong).await {
                Answer::Reply(text) => vec![text],
                Answer::Replies(texts) => texts,
                Answer::Nothing => Vec::new(),
                Answer::Close(d) => {
                    handled.end = Some(
                        self.flush(writer, &mut batch)
                            .await
                            .err()
                            .unwrap_or(Stop::Close(d)),
                    );
                    return handled;
                }
            };
            for text in texts {
                if !batch.is_empty() {
                    batch.push('\n');
                }
                batch.push_str(&text);
            }
            if batch.len() >= REPLY_FRAME_BYTES {
                if let Err(stop) = self.flush(writer, &mut batch).await {
                    handled.end = Some(stop);
                    return handled;
                }
            }
        }
        if let Err(stop) = self.flush(writer, &mut batch).await {
            handled.end = Some(stop);
        }
        handled
    }

    /// Writes the gathered replies, if any.
    async fn flush(&self, writer: &mut Writer, batch: &mut String) -> Result<(), Stop> {
        if batch.is_empty() {
            return Ok(());
        }
        self.write(writer, std::mem::take(batch)).await
    }

    /// Runs one command.
    async fn handle(&mut self, c: Command, pong: &mut bool) -> Answer {
        let id = c.id;
        if id == 0 {
            // Centrifugo: a command without an id is the client's pong,
            // or a `send`; whatever else it holds is never run, and
            // before `connect` it is a protocol error.
            if self.who.is_none() {
                return Answer::Close(codes::BAD_REQUEST);
            }
            if c.send.is_some() {
                return Answer::Close(codes::NOT_AVAILABLE);
            }
            *pong = true;
            return Answer::Nothing;
        }
        if let Some(req) = c.connect {
            return self.connect(id, req).await;
        }
        if self.who.is_none() {
            // Centrifugo: any command before `connect` is a protocol error.
            return Answer::Close(codes::BAD_REQUEST);
        }
        // Each of these reads the storage (a presence query on every
        // `presence`) or verifies a token: they share the connection's
        // bucket (`session.rs`), so that one connection cannot turn its
        // frames into a flood of storage reads.
        let reads = c.subscribe.is_some()
            || c.history.is_some()
            || c.presence.is_some()
            || c.presence_stats.is_some()
            || c.refresh.is_some()
            || c.sub_refresh.is_some();
        if reads && !self.reads.take() {
            return Answer::Reply(error_reply(id, &ReplyError::too_many_requests()));
        }
        if let Some(req) = c.subscribe {
            self.subscribe(id, req).await
        } else if let Some(ChannelRequest { channel }) = c.unsubscribe {
            answer(id, "unsubscribe", self.unsubscribe_command(&channel).await)
        } else if let Some(req) = c.publish {
            // A map publish or removal (type 1, or a key) is not served.
            match (req.kind, req.key.is_empty() && !req.removed) {
                (0, true) => answer(id, "publish", self.publish(req).await.map(|()| Empty {})),
                (0 | 1, _) => Answer::Reply(error_reply(id, &ReplyError::not_available())),
                _ => Answer::Close(codes::BAD_REQUEST),
            }
        } else if let Some(req) = c.history {
            self.history(id, req).await
        } else if let Some(ChannelRequest { channel }) = c.presence {
            answer(id, "presence", self.presence(&channel, false).await)
        } else if let Some(ChannelRequest { channel }) = c.presence_stats {
            answer(id, "presence_stats", self.presence(&channel, true).await)
        } else if c.rpc.is_some() {
            Answer::Reply(error_reply(id, &ReplyError::not_available()))
        } else if c.send.is_some() {
            // An asynchronous message with nothing to take it: Centrifugo
            // closes with 3508 "not available".
            Answer::Close(codes::NOT_AVAILABLE)
        } else if c.ping.is_some() {
            Answer::Reply(reply(id, "ping", &Empty {}))
        } else if let Some(req) = c.refresh {
            self.refresh(id, req).await
        } else if let Some(req) = c.sub_refresh {
            self.sub_refresh(id, req).await
        } else {
            Answer::Reply(error_reply(id, &ReplyError::method_not_found()))
        }
    }

    /// A refusal by access control, answered 103 "permission denied",
    /// which tells the client nothing more: logged as `permission denied`
    /// with the client, its user, the command, the channel and the reason
    /// (the refusal's message, never a credential), at INFO for the first
    /// [`MAX_DENIALS_LOGGED`] of the connection, then at DEBUG.
    fn denied(
        &self,
        command: &'static str,
        who: &Principal,
        channel: &ChannelName,
        reason: &AuthError,
    ) -> ReplyError {
        let user = who.token().map_or("", |t| t.subject.as_str());
        let logged = self.denials_logged.fetch_add(1, Ordering::Relaxed);
        if logged < MAX_DENIALS_LOGGED {
            tracing::info!(
                client = %self.client,
                user,
                command,
                channel = %channel,
                reason = %reason,
                "permission denied"
            );
        } else {
            tracing::debug!(
                client = %self.client,
                user,
                command,
                channel = %channel,
                reason = %reason,
                "permission denied"
            );
        }
        ReplyError::permission_denied()
    }

    /// Checks a client token: the principal, or the answer to give
    /// (109 for an expired token, which the SDK renews; 3500 for a token
    /// that does not verify, or, once connected, names another user than
    /// the connection's: "" for an anonymous connection, as in
    /// Centrifugo).
    async fn check_token(&self, id: u32, token: &str) -> Result<Principal, Answer> {
        let auth = &self.state.shared.auth();
        let who = match auth.resolve(Some(Credential::Token(token))).await {
            Ok(who) => who,
            Err(AuthError::TokenExpired) => {
                return Err(Answer::Reply(error_reply(id, &ReplyError::token_expired())))
            }
            Err(e) => {
                // The client gets only 3500 "invalid token": the reason
                // (never the token) goes to the log.
                tracing::info!(client = %self.client, reason = %e, "token refused");
                return Err(Answer::Close(codes::INVALID_TOKEN));
            }
        };
        let user = who.token().map(|t| t.subject.as_str()).unwrap_or_default();
        if self.who.is_some() && user != self.user() {
            return Err(Answer::Close(codes::INVALID_TOKEN));
        }
        Ok(who)
    }

    /// `connect`: checks the token and, when it has a `subs` claim, makes
    /// its server-side subscriptions (recovering each from where `req.subs`
    /// says), reported in the reply's `subs`. Every server-side
    /// subscription must be allowed by the namespace rules (the claim
    /// grants it as a subscription token would), else the reply is 103 and
    /// the connection stays unconnected; a storage failure while they start
    /// closes the connection with 3004 (the client reconnects), as
    /// Centrifugo does. A token whose `subs` name more channels than
    /// `channel_limit` closes the connection with 3505 "channel limit"
    /// before any of them starts, as Centrifugo's connect does. A connect
    /// without a token, on a node with access control and without
    /// `anonymous_connect`, closes with 3501 "bad request".
    async fn connect(&mut self, id: u32, req: ConnectRequest) -> Answer {
        if self.who.is_some() {
            return Answer::Close(codes::BAD_REQUEST);
        }
        let who = if req.token.is_empty() {
            // No token: an anonymous connection only where the operator
            // allows it (or nothing is checked); else Centrifugo's answer
            // to a connect without credentials.
            let state = &self.state;
            if state.shared.auth().enabled() && !state.config().anonymous_connect {
                tracing::debug!(client = %self.client, "connect without a token refused");
                return Answer::Close(codes::BAD_REQUEST);
            }
            Principal::Anonymous
        } else {
            match self.check_token(id, &req.token).await {
                Ok(who) => who,
                Err(answer) => return answer,
            }
        };
        let server_subs: Vec<(ChannelName, Option<Box<RawValue>>)> = who
            .token()
            .map(|t| {
                t.server_subs()
                    .iter()
                    .map(|(c, d)| (c.clone(), d.clone()))
                    .collect()
            })
            .unwrap_or_default();
        if server_subs.len() > self.state.config().channel_limit {
            return Answer::Close(codes::CHANNEL_LIMIT);
        }
        for (channel, _) in &server_subs {
            if let Err(e) = self.state.shared.auth().may_subscribe(&who, channel) {
                return Answer::Reply(error_reply(id, &self.denied("connect", &who, channel, &e)));
            }
        }
        tracing::debug!(client = %self.client, name = %req.name, version = %req.version, "connected");
        let expiry = Expiry::of(&who);
        let user = who.token().map(|t| t.subject.clone()).unwrap_or_default();
        self.state
            .centrifugo
            .registry
            .insert(&self.client, &user, Arc::clone(&self.mailbox));
        self.expires = expiry_instant(&who);
        self.who = Some(who);
        let mut started = Vec::with_capacity(server_subs.len());
        // One budget for every recovery of the reply.
        let mut budget = Budget::of(self.state.settings());
        for (channel, data) in server_subs {
            let recover =
                req.subs
                    .get(channel.as_str())
                    .filter(|r| r.recover)
                    .map(|r| RecoverFrom {
                        epoch: &r.epoch,
                        offset: r.offset,
                        live_only: self.who.as_ref().and_then(|who| {
                            self.state.shared.auth().live_only_window(who, &channel)
                        }),
                        reject_unrecovered: false,
                    });
            match self
                .start_subscription(
                    &channel,
                    recover,
                    None,
                    JoinLeave::default(),
                    budget,
                    Follow::default(),
                )
                .await
            {
                Ok(s) => {
                    let spent: usize = s.missed.iter().map(cost).sum();
                    budget.bytes = budget.bytes.saturating_sub(spent);
                    started.push((channel, data, s));
                }
                // What the session started so far ends with it.
                Err(_) => return Answer::Close(codes::SERVER_ERROR),
            }
        }
        self.server_subs = started.iter().map(|(c, ..)| c.clone()).collect();
        let config = &self.state.config();
        Answer::Reply(reply(
            id,
            "connect",
            &ConnectResult {
                client: &self.client,
                version: VERSION,
                expires: expiry.expires,
                ttl: expiry.ttl,
                ping: config.ping_interval.as_secs(),
                pong: true,
                session: self.emulation.as_deref(),
                node: self
                    .emulation
                    .is_some()
                    .then_some(self.state.settings().node_id.as_str()),
                subs: started
                    .iter()
                    .map(|(c, data, s)| (c.as_str(), s.result(&Expiry::NONE, data.as_deref())))
                    .collect(),
            },
        ))
    }

    async fn subscribe(&mut self, id: u32, req: SubscribeRequest) -> Answer {
        if let Some(refused) = unserved_subscribe(id, &req) {
            return refused;
        }
        let channel = match channel(&req.channel) {
            Ok(channel) => channel,
            Err(e) => return Answer::Reply(error_reply(id, &e)),
        };
        if self.subs.contains_key(&channel) {
            return Answer::Reply(error_reply(id, &ReplyError::already_subscribed()));
        }
        // Centrifugo checks its channel limit after "already subscribed"
        // and before the token: 106, nothing started.
        if self.subs.len() >= self.state.config().channel_limit {
            return Answer::Reply(error_reply(id, &ReplyError::limit_exceeded()));
        }
        let (who, sub_token) = if req.token.is_empty() {
            (self.who.clone().unwrap_or(Principal::Anonymous), false)
        } else {
            match self.check_token(id, &req.token).await {
                Ok(who) => (who, true),
                Err(answer) => return answer,
            }
        };
        if let Err(e) = self.state.shared.auth().may_subscribe(&who, &channel) {
            return Answer::Reply(error_reply(
                id,
                &self.denied("subscribe", &who, &channel, &e),
            ));
        }
        let (expiry, expires) = if sub_token {
            (Expiry::of(&who), expiry_instant(&who))
        } else {
            (Expiry::NONE, None)
        };
        let join_leave = JoinLeave {
            asked: req.join_leave,
            chan_info: if sub_token {
                who.token().and_then(|t| t.info.clone())
            } else {
                None
            },
        };
        let recover = req.recover.then_some(RecoverFrom {
            epoch: &req.epoch,
            offset: req.offset,
            live_only: self.state.shared.auth().live_only_window(&who, &channel),
            reject_unrecovered: req.flag & SUBSCRIPTION_FLAG_REJECT_UNRECOVERED != 0,
        });
        let budget = Budget::of(self.state.settings());
        let filter = req.tf.map(Arc::new);
        let delta = (req.delta == "fossil"
            && ChannelOptions::of(&self.state, &channel).fossil_delta)
            .then(|| FossilDelta::new(self.encoding, &self.state.centrifugo.deltas, &channel));
        let follow = Follow { filter, delta };
        match self
            .start_subscription(&channel, recover, expires, join_leave, budget, follow)
            .await
        {
            Ok(started) => Answer::Reply(reply(id, "subscribe", &started.result(&expiry, None))),
            Err(e) => Answer::Reply(error_reply(id, &e)),
        }
    }

    /// Starts this connection's subscription to `channel` (its rights were
    /// checked): its presence row, the channel's epoch, the recovery from
    /// `recover` if asked (see `recovery.rs`), then the live
    /// [`Subscription`] after the last publication handed out, followed by
    /// a task that queues its pushes. `expires` is when a subscription
    /// token ends it. Where the channel's namespace has `join_leave`, its
    /// join is announced, and the connection gets the channel's join and
    /// leave pushes (its own join first, after the reply) when it asked for
    /// them or the namespace forces them. With a tags `filter`, only the
    /// publications it passes are recovered and pushed (the others are
    /// skipped, their offsets included). On failure nothing of it is left.
    ///
    /// # Errors
    /// 100 (logged) when the storage fails; 112 when a recovery that
    /// asked to reject an unrecovered position fails.
    async fn start_subscription(
        &mut self,
        channel: &ChannelName,
        recover: Option<RecoverFrom<'_>>,
        expires: Option<Instant>,
        join_leave: JoinLeave,
        budget: Budget,
        how: Follow,
    ) -> Result<Started, ReplyError> {
        let Follow { filter, delta } = how;
        let options = ChannelOptions::of(&self.state, channel);
        presence::join(&self.state, &self.client, &self.user(), channel).await?;
        let started = self
            .follow_channel(channel, recover.as_ref(), budget, filter.as_deref())
            .await;
        let (mut started, live) = match started {
            Ok(Some(started)) => started,
            Ok(None) => {
                presence::remove(&self.state, &self.client, channel).await;
                return Err(ReplyError::unrecoverable_position());
            }
            Err(e) => {
                e.log();
                // The row goes before the answer: a refused subscribe
                // leaves nothing behind when it is answered.
                presence::remove(&self.state, &self.client, channel).await;
                return Err(ReplyError::internal());
            }
        };
        self.generations += 1;
        let generation = self.generations;
        if let Some(delta) = &delta {
            started.form = delta.whole();
            started.delta = true;
        }
        let task = tokio::spawn(follow(
            live,
            generation,
            self.out.clone(),
            Follow { filter, delta },
            Arc::clone(&self.queue),
        ));
        self.subs.insert(
            channel.clone(),
            Sub {
                generation,
                task,
                expires,
                join_leave: options.join_leave,
                chan_info: join_leave.chan_info.clone(),
            },
        );
        let registry = &self.state.centrifugo.registry;
        registry.set_subscribed(&self.client, channel, true);
        // Listening first: a subscriber that asked gets its own join,
        // after the reply (the session writes the reply before it reads
        // its push queue again), as Centrifugo's subscribers do.
        let pushes = &registry.join_leave;
        if options.pushes_join_leave(join_leave.asked) {
            pushes.listen(channel, &self.client, generation, self.out.clone());
        }
        if options.join_leave {
            pushes.emit(self.presence_event(
                PresenceEventKind::Join,
                channel.clone(),
                join_leave.chan_info,
            ));
        }
        Ok(started)
    }

    /// The storage's part of [`Session::start_subscription`]: the epoch,
    /// the recovery (only the publications `filter` passes), and the live
    /// subscription after its last publication; `None` when the recovery
    /// failed and was asked to be rejected.
    async fn follow_channel(
        &self,
        channel: &ChannelName,
        recover: Option<&RecoverFrom<'_>>,
        budget: Budget,
        filter: Option<&FilterNode>,
    ) -> crate::error::Result<Option<(Started, Subscription)>> {
        let shared = &self.state.shared;
        let storage = shared.node.storage().as_ref();
        let epoch = storage
            .channel_epoch(channel)
            .await
            .during("channel_epoch", Some(channel))?;
        let recovery = match recover {
            Some(from) => {
                recovery::recover(
                    storage,
                    channel,
                    &epoch,
                    from.epoch,
                    from.offset,
                    from.live_only,
                    budget,
                )
                .await?
            }
            None => {
                let page = storage
                    .read(channel, Offset::MAX, 1)
                    .await
                    .during("read", Some(channel))?;
                Recovery::NotRecovered {
                    position: page.head,
                }
            }
        };
        let (mut missed, position, recovered) = match recovery {
            Recovery::Recovered {
                publications,
                position,
            } => (publications, position, true),
            Recovery::NotRecovered { .. } if recover.is_some_and(|r| r.reject_unrecovered) => {
                return Ok(None);
            }
            Recovery::NotRecovered { position } => (Vec::new(), position, false),
        };
        if let Some(filter) = filter {
            missed.retain(|m| filter.matches(&m.tags));
        }
        let live = Subscription::start_paged(
            Arc::clone(shared.node.storage()),
            shared.node.hub(),
            channel.clone(),
            StartAt::After(position),
            "centrifugo",
            shared.settings.read_page_messages(),
        )
        .await?;
        let started = Started {
            epoch,
            position,
            missed,
            recovered,
            was_recovering: recover.is_some(),
            form: DataForm::Plain,
            delta: false,
        };
        Ok(Some((started, live)))
    }

    /// Ends the subscription to `channel` (the server API's
    /// `unsubscribe`), its presence row removed before it returns, so that
    /// no removal of it is in flight when the client subscribes again;
    /// `false` if there was none.
    pub(crate) async fn unsubscribe(&mut self, channel: &ChannelName) -> bool {
        let removed = self.end_subscription(channel);
        if removed {
            presence::remove(&self.state, &self.client, channel).await;
        }
        removed
    }

    /// Ends the subscription to `channel` (not its presence row), and
    /// announces its leave.
    fn end_subscription(&mut self, channel: &ChannelName) -> bool {
        let Some(sub) = self.subs.remove(channel) else {
            return false;
        };
        self.state
            .centrifugo
            .registry
            .set_subscribed(&self.client, channel, false);
        self.ended(channel.clone(), sub);
        true
    }

    /// Ends every subscription (the connection closes): their leaves are
    /// announced and their presence rows removed in the background.
    pub(crate) fn end_subscriptions(&mut self) {
        let subs = std::mem::take(&mut self.subs);
        let channels: BTreeSet<ChannelName> = subs.keys().cloned().collect();
        for (channel, sub) in subs {
            self.ended(channel, sub);
        }
        presence::leave(&self.state, &self.client, channels);
    }

    /// After `sub` of `channel` ended: no more pushes of the channel, and
    /// a leave where the channel has `join_leave` (the client itself, no
    /// longer a listener, does not get it).
    fn ended(&self, channel: ChannelName, sub: Sub) {
        let join_leave = &self.state.centrifugo.registry.join_leave;
        join_leave.unlisten(&channel, &self.client);
        if sub.join_leave {
            let chan_info = sub.chan_info.clone();
            drop(sub);
            join_leave.emit(self.presence_event(PresenceEventKind::Leave, channel, chan_info));
        }
    }

    /// A join or leave of this connection in `channel`: its user, client
    /// id, connection token's `info` and `chan_info`.
    fn presence_event(
        &self,
        kind: PresenceEventKind,
        channel: ChannelName,
        chan_info: Option<String>,
    ) -> PresenceEvent {
        let token = self.who.as_ref().and_then(Principal::token);
        PresenceEvent {
            kind,
            channel,
            info: ClientInfo {
                user: self.user(),
                client: self.client.clone(),
                conn_info: token.and_then(|t| t.info.clone()),
                chan_info,
            },
        }
    }

    /// The connection's user: its token's `sub`, empty when anonymous.
    fn user(&self) -> String {
        self.who
            .as_ref()
            .and_then(Principal::token)
            .map(|t| t.subject.clone())
            .unwrap_or_default()
    }

    /// `presence` (or `presence_stats` with `stats`) of a channel the
    /// connection may subscribe to; 108 when its namespace has no
    /// presence.
    async fn presence(&self, name: &str, stats: bool) -> Result<serde_json::Value, ReplyError> {
        let channel = channel(name)?;
        if !presence::enabled(&self.state, &channel) {
            return Err(ReplyError::not_available());
        }
        let who = self.who.clone().unwrap_or(Principal::Anonymous);
        if let Err(e) = self.state.shared.auth().may_subscribe(&who, &channel) {
            let command = if stats { "presence_stats" } else { "presence" };
            return Err(self.denied(command, &who, &channel, &e));
        }
        if stats {
            presence::stats(&self.state, &channel).await
        } else {
            presence::presence(&self.state, &channel).await
        }
    }

    /// The `unsubscribe` command: its presence row is gone when it is
    /// answered.
    async fn unsubscribe_command(&mut self, name: &str) -> Result<Empty, ReplyError> {
        let channel = channel(name)?;
        if self.end_subscription(&channel) {
            presence::remove(&self.state, &self.client, &channel).await;
        }
        Ok(Empty {})
    }

    async fn publish(&mut self, req: PublishRequest) -> Result<(), ReplyError> {
        let channel = channel(&req.channel)?;
        let who = self.who.clone().unwrap_or(Principal::Anonymous);
        let auth = self.state.shared.auth();
        if let Err(e) = auth.may_publish(&who, &channel) {
            return Err(self.denied("publish", &who, &channel, &e));
        }
        if auth.take_publishes(&who, 1).is_err() {
            return Err(ReplyError::too_many_requests());
        }
        let data: Arc<RawValue> = Arc::from(req.data);
        // Centrifugo's client publish carries no tags.
        super::publish::publish(&self.state, channel, data, Tags::default(), None)
            .await
            .map(|_| ())
    }

    async fn history(&mut self, id: u32, req: HistoryRequest) -> Answer {
        let channel = match channel(&req.channel) {
            Ok(channel) => channel,
            Err(e) => return Answer::Reply(error_reply(id, &e)),
        };
        let who = self.who.clone().unwrap_or(Principal::Anonymous);
        let shared = &self.state.shared;
        if let Err(e) = shared.auth().may_read_history(&who, &channel) {
            return Answer::Reply(error_reply(id, &self.denied("history", &who, &channel, &e)));
        }
        let epoch = match shared.node.storage().channel_epoch(&channel).await {
            Ok(epoch) => epoch,
            Err(e) => {
                herald_node::node_error::StorageFailure::new("channel_epoch", Some(&channel), e)
                    .log();
                return Answer::Reply(error_reply(id, &ReplyError::internal()));
            }
        };
        let query = HistoryQuery {
            limit: req.limit,
            since: req.since,
            reverse: req.reverse,
        };
        let budget = Budget::of(self.state.settings());
        match history(
            shared.node.storage().as_ref(),
            &channel,
            epoch,
            &query,
            budget,
        )
        .await
        {
            Ok(h) => Answer::Reply(reply(
                id,
                "history",
                &HistoryResult {
                    publications: publications(&h.publications),
                    epoch: &h.epoch,
                    offset: h.offset,
                },
            )),
            Err(e) => Answer::Reply(error_reply(id, &e)),
        }
    }

    /// `refresh`: a new connection token for the same user. A token whose
    /// `subs` differ from the server-side subscriptions the connection has
    /// (a channel added, or one made at connect gone) closes it with 3010
    /// instead, so that the client reconnects with the new token's
    /// subscriptions (Centrifugo does the same). An expired token closes
    /// it with 3005, as Centrifugo does, so that the SDK reconnects with a
    /// token it fetches anew (an error reply would end its connection for
    /// good). The client-side subscriptions made on the connection's
    /// credentials (not with a subscription token) that the new token no
    /// longer grants end after the reply, each with an `unsubscribe` push
    /// (code 2000).
    async fn refresh(&mut self, id: u32, req: RefreshRequest) -> Answer {
        let who = match self.check_token(id, &req.token).await {
            Ok(who) => who,
            Err(Answer::Reply(_)) => return Answer::Close(codes::EXPIRED),
            Err(answer) => return answer,
        };
        let empty = BTreeMap::new();
        let wanted = who.token().map_or(&empty, |t| t.server_subs());
        let added = wanted.keys().any(|c| !self.subs.contains_key(c));
        let dropped = self
            .server_subs
            .iter()
            .any(|c| self.subs.contains_key(c) && !wanted.contains_key(c));
        if added || dropped {
            return Answer::Close(codes::INSUFFICIENT_STATE);
        }
        let auth = &self.state.shared.auth();
        let lost: Vec<ChannelName> = self
            .subs
            .iter()
            .filter(|(c, sub)| sub.expires.is_none() && !self.server_subs.contains(*c))
            .filter(|(c, _)| auth.may_subscribe(&who, c).is_err())
            .map(|(c, _)| c.clone())
            .collect();
        let expiry = Expiry::of(&who);
        self.expires = expiry_instant(&who);
        self.who = Some(who);
        #[derive(Serialize)]
        struct RefreshResult<'a> {
            client: &'a str,
            version: &'a str,
            #[serde(flatten)]
            expiry: Expiry,
        }
        let mut texts = vec![reply(
            id,
            "refresh",
            &RefreshResult {
                client: &self.client,
                version: VERSION,
                expiry,
            },
        )];
        for channel in lost {
            if self.unsubscribe(&channel).await {
                texts.push(protocol::unsubscribe_push(
                    channel.as_str(),
                    2000,
                    "not granted by the refreshed token",
                ));
            }
        }
        Answer::Replies(texts)
    }

    /// `sub_refresh`: a new subscription token for a subscription. An
    /// expired token closes the connection with 3006, as Centrifugo does,
    /// so that the SDK reconnects and resubscribes with a token it fetches
    /// anew (an error reply would end the subscription for good).
    async fn sub_refresh(&mut self, id: u32, req: SubRefreshRequest) -> Answer {
        // Track and untrack (keyed subscriptions) are not served.
        match (req.kind, req.track.is_empty() && req.untrack.is_empty()) {
            (0, true) => {}
            (1 | 2, _) => return Answer::Reply(error_reply(id, &ReplyError::not_available())),
            _ => return Answer::Close(codes::BAD_REQUEST),
        }
        let channel = match channel(&req.channel) {
            Ok(channel) => channel,
            Err(e) => return Answer::Reply(error_reply(id, &e)),
        };
        if !self.subs.contains_key(&channel) {
            return Answer::Reply(error_reply(id, &ReplyError::permission_denied()));
        }
        let who = match self.check_token(id, &req.token).await {
            Ok(who) => who,
            Err(Answer::Reply(_)) => return Answer::Close(codes::SUB_EXPIRED),
            Err(answer) => return answer,
        };
        if let Err(e) = self.state.shared.auth().may_subscribe(&who, &channel) {
            return Answer::Reply(error_reply(
                id,
                &self.denied("sub_refresh", &who, &channel, &e),
            ));
        }
        let expires = expiry_instant(&who);
        if let Some(sub) = self.subs.get_mut(&channel) {
            sub.expires = expires;
        }
        Answer::Reply(reply(id, "sub_refresh", &Expiry::of(&who)))
    }
}

/// Follows one subscription: queues a push per publication, in offset
/// order, until the session drops it (the task is aborted), the storage
/// fails with an error that is not transient (3004, the client
/// reconnects and recovers), or `queue` refuses a push that would take
/// it past its byte budget (the session closes with 3008 "slow", the
/// client reconnects and recovers). When retention trimmed messages this
/// subscriber had not got yet, or the channel was deleted, the session
/// ends with 3010 "insufficient state": the client reconnects and its
/// recovery answers `recovered: false`, never a silent gap.
async fn follow(
    mut live: Subscription,
    generation: u64,
    out: tokio::sync::mpsc::Sender<Out>,
    how: Follow,
    queue: Arc<QueueBudget>,
) {
    let Follow { filter, mut delta } = how;
    let channel = live.channel().clone();
    loop {
        match live.next_item().await {
            Ok(Some(Item::Truncated { .. } | Item::Withheld { .. } | Item::Deleted { .. })) => {
                let _ = out.send(Out::End(codes::INSUFFICIENT_STATE)).await;
                return;
            }
            Ok(Some(Item::Message(message)))
                if filter.as_ref().is_some_and(|f| !f.matches(&message.tags)) => {}
            Ok(Some(Item::Message(message))) => {
                let text = match delta.as_mut() {
                    Some(delta) => delta.push(&message).await,
                    None => protocol::publication_push(channel.as_str(), &message),
                };
                let queued_bytes = text.len();
                if !queue.admit(queued_bytes) {
                    tracing::debug!(channel = %channel, "the connection's queue is over its byte budget: a slow consumer");
                    return;
                }
                let push = Out::Push(Box::new(Push {
                    channel: channel.clone(),
                    generation,
                    text,
                    queued_bytes,
                }));
                if out.send(push).await.is_err() {
                    return;
                }
            }
            Ok(None) => {
                let _ = out.send(Out::End(codes::SHUTDOWN)).await;
                return;
            }
            Err(e) => {
                e.log();
                let _ = out.send(Out::End(codes::SERVER_ERROR)).await;
                return;
            }
        }
    }
}

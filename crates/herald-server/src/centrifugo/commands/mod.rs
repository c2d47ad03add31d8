//! The commands of a connection: what each does and answers, one file
//! per command (`connect.rs`, `subscribe.rs`, `unsubscribe.rs`,
//! `publish.rs`, `history.rs`, `presence.rs`, `refresh.rs`,
//! `sub_refresh.rs`; `follow.rs` the task that pushes a subscription's
//! publications). Here: running a frame of commands, the dispatch of one
//! command, and what the commands share (token checks, refusals, expiry).
//! Replies are the typed messages of `replies.rs`, encoded for the
//! connection (`codec.rs`); errors are Centrifugo's codes (`codes.rs`).

mod connect;
mod follow;
mod history;
mod presence;
mod publish;
mod refresh;
mod sub_refresh;
mod subscribe;
mod unsubscribe;

use std::sync::atomic::Ordering;

use herald_auth::{AuthError, Credential, Principal};
use herald_core::ChannelName;
use herald_storage::{ClientInfo, PresenceEvent, PresenceEventKind};
use tokio::time::Instant;

use super::codec::{Batch, ClientFrame};
use super::codes::{self, Disconnect, ReplyError};
use super::protocol::{ChannelRequest, Command, Empty};
use super::replies::Reply;
use super::session::{
    max_commands_per_frame, Session, Stop, Writer, MAX_DENIALS_LOGGED, REPLY_FRAME_BYTES,
};

/// The version the connect and refresh replies name: Herald's.
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
    /// A reply (boxed: the enum stays small).
    Reply(Box<Reply>),
    /// A reply, then pushes.
    Replies(Vec<Reply>),
    /// No reply (a pong).
    Nothing,
    /// Close the connection.
    Close(Disconnect),
}

impl Answer {
    /// The reply `reply`.
    fn reply(reply: Reply) -> Self {
        Self::Reply(Box::new(reply))
    }

    /// `Ok(reply)` → it; `Err(error)` → the error reply to command `id`.
    fn of(id: u32, result: Result<Reply, ReplyError>) -> Self {
        Self::reply(result.unwrap_or_else(|e| Reply::error(id, &e)))
    }

    /// The error reply to command `id`.
    fn error(id: u32, error: &ReplyError) -> Self {
        Self::reply(Reply::error(id, error))
    }
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

/// Whether a token expires, and the seconds left when it does (`expires`
/// and `ttl` of the connect, subscribe, refresh and sub_refresh results).
struct Expiry {
    expires: bool,
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

    /// `ttl` as the protocol's field: 0 (left out) without an expiry.
    fn ttl(&self) -> u32 {
        self.ttl.unwrap_or(0)
    }
}

/// When `who`'s token expires, on the session's clock.
fn expiry_instant(who: &Principal) -> Option<Instant> {
    who.token().map(|t| Instant::now() + t.time_left())
}

impl Session {
    /// Runs the commands of one frame, in order, and writes their
    /// replies as they are ready (gathered into socket frames of up to
    /// [`REPLY_FRAME_BYTES`]), so that at most one command's reply waits
    /// in memory. A frame of more than [`max_commands_per_frame`]
    /// commands is not run: 3013. A command that does not decode closes
    /// the connection with 3501 after the replies so far. Before each
    /// command the tokens' expiry is checked: an expired one closes the
    /// connection (3005, 3006), and replies not yet written are dropped.
    pub(crate) async fn handle_frame(
        &mut self,
        mut frame: ClientFrame,
        writer: &mut Writer,
    ) -> Handled {
        let mut handled = Handled::default();
        let cap = max_commands_per_frame(self.state.config().channel_limit);
        if frame.len() > cap {
            tracing::debug!(client = %self.client, max_commands = cap, "too many commands in a frame");
            handled.end = Some(Stop::Close(codes::TOO_MANY_REQUESTS));
            return handled;
        }
        let mut batch = Batch::new(self.encoding);
        for command in frame.commands() {
            if let Some(d) = self.expired() {
                handled.end = Some(Stop::Close(d));
                return handled;
            }
            let Some(command) = command else {
                handled.end = Some(
                    self.flush(writer, &mut batch)
                        .await
                        .err()
                        .unwrap_or(Stop::Close(codes::BAD_REQUEST)),
                );
                return handled;
            };
            let replies = match self.handle(command, &mut handled.pong).await {
                Answer::Reply(reply) => vec![*reply],
                Answer::Replies(replies) => replies,
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
            for reply in &replies {
                batch.push_reply(reply);
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
    async fn flush(&self, writer: &mut Writer, batch: &mut Batch) -> Result<(), Stop> {
        if batch.is_empty() {
            return Ok(());
        }
        self.write(writer, batch.take()).await
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
            return Answer::error(id, &ReplyError::too_many_requests());
        }
        if let Some(req) = c.subscribe {
            self.subscribe(id, req).await
        } else if let Some(ChannelRequest { channel }) = c.unsubscribe {
            self.unsubscribe_command(id, &channel).await
        } else if let Some(req) = c.publish {
            self.publish_command(id, req).await
        } else if let Some(req) = c.history {
            self.history(id, req).await
        } else if let Some(ChannelRequest { channel }) = c.presence {
            self.presence(id, &channel, false).await
        } else if let Some(ChannelRequest { channel }) = c.presence_stats {
            self.presence(id, &channel, true).await
        } else if c.rpc.is_some() {
            Answer::error(id, &ReplyError::not_available())
        } else if c.send.is_some() {
            // An asynchronous message with nothing to take it: Centrifugo
            // closes with 3508 "not available".
            Answer::Close(codes::NOT_AVAILABLE)
        } else if c.ping.is_some() {
            Answer::reply(Reply {
                id,
                ping: Some(Empty {}),
                ..Reply::default()
            })
        } else if let Some(req) = c.refresh {
            self.refresh(id, req).await
        } else if let Some(req) = c.sub_refresh {
            self.sub_refresh(id, req).await
        } else {
            Answer::error(id, &ReplyError::method_not_found())
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
                return Err(Answer::error(id, &ReplyError::token_expired()))
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
}

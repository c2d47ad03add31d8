//! `connect`: the connection token, and the server-side subscriptions
//! its `subs` claim makes.

use std::collections::BTreeMap;
use std::sync::Arc;

use herald_auth::Principal;
use herald_core::ChannelName;
use serde_json::value::RawValue;

use super::follow::Follow;
use super::subscribe::{JoinLeave, RecoverFrom};
use super::{expiry_instant, Answer, Expiry, VERSION};
use crate::centrifugo::codes;
use crate::centrifugo::history::{cost, Budget};
use crate::centrifugo::protocol::ConnectRequest;
use crate::centrifugo::replies::{ConnectResult, Reply};
use crate::centrifugo::session::Session;

impl Session {
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
    pub(super) async fn connect(&mut self, id: u32, req: ConnectRequest) -> Answer {
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
                return Answer::error(id, &self.denied("connect", &who, channel, &e));
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
        let mut subs = BTreeMap::new();
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
                    subs.insert(
                        channel.as_str().to_owned(),
                        s.result(&Expiry::NONE, data.as_deref()),
                    );
                    started.push(channel);
                }
                // What the session started so far ends with it.
                Err(_) => return Answer::Close(codes::SERVER_ERROR),
            }
        }
        self.server_subs = started.into_iter().collect();
        let config = self.state.config();
        let node = if self.emulation.is_some() {
            self.state.settings().node_id.clone()
        } else {
            String::new()
        };
        Answer::reply(Reply {
            id,
            connect: Some(ConnectResult {
                client: self.client.clone(),
                version: VERSION.to_owned(),
                expires: expiry.expires,
                ttl: expiry.ttl(),
                ping: u32::try_from(config.ping_interval.as_secs()).unwrap_or(u32::MAX),
                pong: true,
                session: self.emulation.clone().unwrap_or_default(),
                node,
                subs,
            }),
            ..Reply::default()
        })
    }
}

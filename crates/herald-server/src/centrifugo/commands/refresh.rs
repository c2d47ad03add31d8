//! `refresh`: a new connection token.

use std::collections::BTreeMap;

use herald_core::ChannelName;

use super::{expiry_instant, Answer, Expiry, VERSION};
use crate::centrifugo::codes;
use crate::centrifugo::protocol::RefreshRequest;
use crate::centrifugo::replies::{unsubscribe_push, RefreshResult, Reply};
use crate::centrifugo::session::Session;

impl Session {
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
    pub(super) async fn refresh(&mut self, id: u32, req: RefreshRequest) -> Answer {
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
        let mut replies = vec![Reply {
            id,
            refresh: Some(RefreshResult {
                client: self.client.clone(),
                version: VERSION.to_owned(),
                expires: expiry.expires,
                ttl: expiry.ttl(),
            }),
            ..Reply::default()
        }];
        for channel in lost {
            if self.unsubscribe(&channel).await {
                replies.push(unsubscribe_push(
                    channel.as_str(),
                    2000,
                    "not granted by the refreshed token",
                ));
            }
        }
        Answer::Replies(replies)
    }
}

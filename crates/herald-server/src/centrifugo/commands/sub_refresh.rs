//! `sub_refresh`: a new subscription token.

use super::{channel, expiry_instant, Answer, Expiry};
use crate::centrifugo::codes::{self, ReplyError};
use crate::centrifugo::protocol::SubRefreshRequest;
use crate::centrifugo::replies::{Reply, SubRefreshResult};
use crate::centrifugo::session::Session;

impl Session {
    /// `sub_refresh`: a new subscription token for a subscription. An
    /// expired token closes the connection with 3006, as Centrifugo does,
    /// so that the SDK reconnects and resubscribes with a token it fetches
    /// anew (an error reply would end the subscription for good).
    pub(super) async fn sub_refresh(&mut self, id: u32, req: SubRefreshRequest) -> Answer {
        // Track and untrack (keyed subscriptions) are not served.
        match (req.kind, req.track.is_empty() && req.untrack.is_empty()) {
            (0, true) => {}
            (1 | 2, _) => return Answer::error(id, &ReplyError::not_available()),
            _ => return Answer::Close(codes::BAD_REQUEST),
        }
        let channel = match channel(&req.channel) {
            Ok(channel) => channel,
            Err(e) => return Answer::error(id, &e),
        };
        if !self.subs.contains_key(&channel) {
            return Answer::error(id, &ReplyError::permission_denied());
        }
        let who = match self.check_token(id, &req.token).await {
            Ok(who) => who,
            Err(Answer::Reply(_)) => return Answer::Close(codes::SUB_EXPIRED),
            Err(answer) => return answer,
        };
        if let Err(e) = self.state.shared.auth().may_subscribe(&who, &channel) {
            return Answer::error(id, &self.denied("sub_refresh", &who, &channel, &e));
        }
        let expires = expiry_instant(&who);
        if let Some(sub) = self.subs.get_mut(&channel) {
            sub.expires = expires;
        }
        let expiry = Expiry::of(&who);
        Answer::reply(Reply {
            id,
            sub_refresh: Some(SubRefreshResult {
                expires: expiry.expires,
                ttl: expiry.ttl(),
            }),
            ..Reply::default()
        })
    }
}

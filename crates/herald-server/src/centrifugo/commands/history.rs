//! `history`: with Centrifugo's `limit`, `since` and `reverse`
//! (`centrifugo/history.rs`).

use herald_auth::Principal;

use super::{channel, Answer};
use crate::centrifugo::codes::ReplyError;
use crate::centrifugo::history::{history, Budget, HistoryQuery};
use crate::centrifugo::protocol::HistoryRequest;
use crate::centrifugo::replies::{publications, HistoryResult, Reply};
use crate::centrifugo::session::Session;

impl Session {
    /// `history`: the channel's publications as `req` asks (`history.rs`).
    pub(super) async fn history(&mut self, id: u32, req: HistoryRequest) -> Answer {
        let channel = match channel(&req.channel) {
            Ok(channel) => channel,
            Err(e) => return Answer::error(id, &e),
        };
        let who = self.who.clone().unwrap_or(Principal::Anonymous);
        let shared = &self.state.shared;
        if let Err(e) = shared.auth().may_read_history(&who, &channel) {
            return Answer::error(id, &self.denied("history", &who, &channel, &e));
        }
        let epoch = match shared.node.storage().channel_epoch(&channel).await {
            Ok(epoch) => epoch,
            Err(e) => {
                herald_node::node_error::StorageFailure::new("channel_epoch", Some(&channel), e)
                    .log();
                return Answer::error(id, &ReplyError::internal());
            }
        };
        let query = HistoryQuery {
            limit: i64::from(req.limit),
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
            Ok(h) => Answer::reply(Reply {
                id,
                history: Some(HistoryResult {
                    publications: publications(&h.publications),
                    epoch: h.epoch,
                    offset: h.offset,
                }),
                ..Reply::default()
            }),
            Err(e) => Answer::error(id, &e),
        }
    }
}

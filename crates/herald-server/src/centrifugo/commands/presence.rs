//! `presence` and `presence_stats`: cluster-wide presence in the storage
//! (`centrifugo/presence.rs`), where the channel's namespace has it.

use std::collections::BTreeSet;

use herald_auth::Principal;

use super::{channel, Answer};
use crate::centrifugo::codes::ReplyError;
use crate::centrifugo::presence;
use crate::centrifugo::replies::{ClientInfo, PresenceResult, PresenceStatsResult, Reply};
use crate::centrifugo::session::Session;

impl Session {
    /// `presence` (or `presence_stats` with `stats`) of a channel the
    /// connection may subscribe to; 108 when its namespace has no
    /// presence.
    pub(super) async fn presence(&self, id: u32, name: &str, stats: bool) -> Answer {
        Answer::of(id, self.presence_result(id, name, stats).await)
    }

    /// The reply of [`Session::presence`].
    ///
    /// # Errors
    /// 107 for a bad channel name, 108 without presence, 103 when the
    /// connection may not subscribe, 100 when the storage fails.
    async fn presence_result(&self, id: u32, name: &str, stats: bool) -> Result<Reply, ReplyError> {
        let channel = channel(name)?;
        if !presence::enabled(&self.state, &channel) {
            return Err(ReplyError::not_available());
        }
        let who = self.who.clone().unwrap_or(Principal::Anonymous);
        if let Err(e) = self.state.shared.auth().may_subscribe(&who, &channel) {
            let command = if stats { "presence_stats" } else { "presence" };
            return Err(self.denied(command, &who, &channel, &e));
        }
        let entries = presence::entries(&self.state, &channel).await?;
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Ok(if stats {
            let users: BTreeSet<&str> = entries.iter().map(|e| e.user.as_str()).collect();
            Reply {
                id,
                presence_stats: Some(PresenceStatsResult {
                    num_clients: count(entries.len()),
                    num_users: count(users.len()),
                }),
                ..Reply::default()
            }
        } else {
            let presence = entries
                .into_iter()
                .map(|e| {
                    let info = ClientInfo {
                        user: e.user,
                        client: e.client.clone(),
                        ..ClientInfo::default()
                    };
                    (e.client, info)
                })
                .collect();
            Reply {
                id,
                presence: Some(PresenceResult { presence }),
                ..Reply::default()
            }
        })
    }
}

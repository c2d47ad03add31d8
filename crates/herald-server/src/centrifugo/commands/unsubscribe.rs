//! `unsubscribe`, and the end of subscriptions (by the client, the server
//! API, a refresh, or the connection's end).

use std::collections::BTreeSet;

use herald_core::ChannelName;
use herald_storage::PresenceEventKind;

use super::{channel, Answer};
use crate::centrifugo::presence;
use crate::centrifugo::protocol::Empty;
use crate::centrifugo::replies::Reply;
use crate::centrifugo::session::{Session, Sub};

impl Session {
    /// The `unsubscribe` command: its presence row is gone when it is
    /// answered.
    pub(super) async fn unsubscribe_command(&mut self, id: u32, name: &str) -> Answer {
        let channel = match channel(name) {
            Ok(channel) => channel,
            Err(e) => return Answer::error(id, &e),
        };
        if self.end_subscription(&channel) {
            presence::remove(&self.state, &self.client, &channel).await;
        }
        Answer::reply(Reply {
            id,
            unsubscribe: Some(Empty {}),
            ..Reply::default()
        })
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
    pub(super) fn end_subscription(&mut self, channel: &ChannelName) -> bool {
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
}

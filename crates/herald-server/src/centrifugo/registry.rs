//! This node's Centrifugo connections, for the server API's `disconnect`,
//! `unsubscribe`, `channels` and `info`: each connection's user and
//! channels, and a way to tell its session to act, whether the call came
//! to this node or to another one (a cluster event, [`Registry::apply`]);
//! with the node's presence session and its join and leave fan-out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use herald_core::ChannelName;
use herald_storage::{ClusterEvent, Storage};
use tokio_util::sync::CancellationToken;

use super::codes;
use super::mailbox::{Control, Mailbox};

/// One connection as the registry knows it.
#[derive(Debug)]
struct Entry {
    /// The token's `sub` ("" for an anonymous connection).
    user: String,
    /// The channels it is subscribed to.
    channels: BTreeSet<ChannelName>,
    /// Its session's mailbox.
    control: Arc<Mailbox>,
}

/// The connections of this node, by client id.
#[derive(Debug)]
pub(crate) struct Registry {
    conns: Mutex<HashMap<String, Entry>>,
    /// When the node started, for `info`'s `uptime`.
    started: std::time::Instant,
    /// This process's presence session (`presence.rs`).
    pub(crate) presence: Arc<super::presence_session::PresenceSession>,
    /// Join and leave pushes (`join_leave.rs`).
    pub(crate) join_leave: super::join_leave::JoinLeave,
}

/// Counts of this node's connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Connections.
    pub(crate) clients: usize,
    /// Distinct users among them.
    pub(crate) users: usize,
    /// Subscriptions.
    pub(crate) subs: usize,
    /// Distinct channels subscribed to.
    pub(crate) channels: usize,
}

impl Registry {
    /// An empty registry; starts the join and leave fan-out on `storage`
    /// (see [`super::join_leave::JoinLeave::start`]).
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        shutdown: CancellationToken,
        span: tracing::Span,
    ) -> Self {
        Self {
            conns: Mutex::default(),
            started: std::time::Instant::now(),
            presence: Arc::default(),
            join_leave: super::join_leave::JoinLeave::start(storage, shutdown, span),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Seconds since the node started.
    pub(crate) fn uptime_s(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// Adds connection `client` of `user`.
    pub(crate) fn insert(&self, client: &str, user: &str, control: Arc<Mailbox>) {
        self.lock().insert(
            client.to_owned(),
            Entry {
                user: user.to_owned(),
                channels: BTreeSet::new(),
                control,
            },
        );
    }

    /// Removes connection `client`.
    pub(crate) fn remove(&self, client: &str) {
        self.lock().remove(client);
    }

    /// Records that `client` is (or no longer is) subscribed to `channel`.
    pub(crate) fn set_subscribed(&self, client: &str, channel: &ChannelName, subscribed: bool) {
        if let Some(entry) = self.lock().get_mut(client) {
            if subscribed {
                entry.channels.insert(channel.clone());
            } else {
                entry.channels.remove(channel);
            }
        }
    }

    /// Sends `control` to every connection of `user` (to those subscribed
    /// to `only_channel`, if given); returns how many got it: every one,
    /// as a mailbox never refuses.
    pub(crate) fn tell_user(
        &self,
        user: &str,
        only_channel: Option<&ChannelName>,
        control: &Control,
    ) -> usize {
        let conns = self.lock();
        conns
            .values()
            .filter(|e| e.user == user)
            .filter(|e| only_channel.is_none_or(|c| e.channels.contains(c)))
            .inspect(|e| e.control.tell(control))
            .count()
    }

    /// Acts on this node's connections as `event` asks: `Unsubscribe`
    /// ends the user's subscriptions to the channel (an `unsubscribe` push,
    /// code 2000), `Disconnect` closes the user's connections with the
    /// event's code (3011 "force reconnect", or else 3503 "force
    /// disconnect", the two codes the server API sends). Returns how many
    /// connections were told.
    pub(crate) fn apply(&self, event: &ClusterEvent) -> usize {
        match event {
            ClusterEvent::Unsubscribe { user, channel } => {
                self.tell_user(user, Some(channel), &Control::Unsubscribe(channel.clone()))
            }
            ClusterEvent::Disconnect { user, code } => {
                let d = if *code == codes::FORCE_RECONNECT.code {
                    codes::FORCE_RECONNECT
                } else {
                    codes::FORCE_NO_RECONNECT
                };
                self.tell_user(user, None, &Control::Disconnect(d))
            }
        }
    }

    /// Subscribers per channel on this node.
    pub(crate) fn subscribers(&self) -> BTreeMap<ChannelName, usize> {
        let mut out = BTreeMap::new();
        for entry in self.lock().values() {
            for channel in &entry.channels {
                *out.entry(channel.clone()).or_insert(0) += 1;
            }
        }
        out
    }

    /// Connection counts on this node.
    pub(crate) fn counts(&self) -> Counts {
        let conns = self.lock();
        let users: BTreeSet<&str> = conns.values().map(|e| e.user.as_str()).collect();
        let channels: BTreeSet<&ChannelName> = conns.values().flat_map(|e| &e.channels).collect();
        Counts {
            clients: conns.len(),
            users: users.len(),
            subs: conns.values().map(|e| e.channels.len()).sum(),
            channels: channels.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever is told reaches the session however much is told before
    /// it looks: a disconnect after many unsubscribes is not dropped (an
    /// 8-slot queue once dropped it while the server API answered
    /// success), and it is taken first.
    #[tokio::test]
    async fn nothing_told_is_dropped() {
        let registry = Registry::new(
            herald_node::testing::MemoryStorage::new(),
            CancellationToken::new(),
            tracing::Span::none(),
        );
        let mailbox = Arc::new(Mailbox::default());
        registry.insert("c1", "ann", Arc::clone(&mailbox));
        let channels: Vec<ChannelName> = (0..40)
            .map(|i| ChannelName::new(format!("news:{i}")).unwrap())
            .collect();
        for channel in &channels {
            registry.set_subscribed("c1", channel, true);
        }
        for channel in &channels {
            let told = registry.apply(&ClusterEvent::Unsubscribe {
                user: "ann".to_owned(),
                channel: channel.clone(),
            });
            assert_eq!(told, 1, "{channel}");
        }
        let told = registry.apply(&ClusterEvent::Disconnect {
            user: "ann".to_owned(),
            code: codes::FORCE_NO_RECONNECT.code,
        });
        assert_eq!(told, 1);
        assert!(matches!(
            mailbox.next().await,
            Control::Disconnect(d) if d == codes::FORCE_NO_RECONNECT
        ));
        let mut unsubscribed = BTreeSet::new();
        while let Some(control) = mailbox.take() {
            match control {
                Control::Unsubscribe(channel) => assert!(unsubscribed.insert(channel)),
                Control::Disconnect(d) => panic!("a second disconnect {d:?}"),
            }
        }
        assert_eq!(unsubscribed, channels.into_iter().collect());
    }
}

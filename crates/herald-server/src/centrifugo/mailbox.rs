//! What reaches a Centrifugo session from outside its connection: the
//! pushes and ends its subscription tasks and the join/leave relay send
//! ([`Out`]), and what the server API tells it through the registry
//! ([`Control`], left in its [`Mailbox`]). Below the session, the
//! registry and the relay, so that they do not import each other.

use std::collections::BTreeSet;
use std::sync::Mutex;

use herald_core::ChannelName;
use tokio::sync::Notify;

use super::codes::Disconnect;

/// What a subscription task sends its session. Small, so that the
/// session's queue, whose slots are allocated a block at a time, costs an
/// idle connection little: a push is boxed.
#[derive(Debug)]
pub(crate) enum Out {
    /// A publication push.
    Push(Box<Push>),
    /// The subscription could not go on: close with this code.
    End(Disconnect),
}

/// A publication push of subscription `generation` of `channel`.
#[derive(Debug)]
pub(crate) struct Push {
    /// The channel.
    pub(crate) channel: ChannelName,
    /// Which subscription to the channel queued it; a push of an ended
    /// one is dropped.
    pub(crate) generation: u64,
    /// The push, one JSON line.
    pub(crate) text: String,
}

/// What the server API asks a session to do.
#[derive(Debug, Clone)]
pub(crate) enum Control {
    /// Close the connection with this code.
    Disconnect(Disconnect),
    /// End the subscription to this channel (push `unsubscribe`).
    Unsubscribe(ChannelName),
}

/// A session's way in for [`Control`]s: what was told waits here until
/// the session takes it, so nothing told is ever dropped (a full queue
/// once made the server API answer success for a `disconnect` that never
/// reached the session). Its size is bounded: one disconnect (the first
/// told wins) and a set of channels to unsubscribe from, each of them a
/// channel the session was subscribed to when told.
#[derive(Debug, Default)]
pub(crate) struct Mailbox {
    pending: Mutex<Pending>,
    /// Wakes the session; a wake-up with nobody waiting is kept for the
    /// next wait.
    notify: Notify,
}

/// What a [`Mailbox`] holds.
#[derive(Debug, Default)]
struct Pending {
    disconnect: Option<Disconnect>,
    unsubscribe: BTreeSet<ChannelName>,
}

impl Mailbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Leaves `control` for the session and wakes it.
    pub(crate) fn tell(&self, control: &Control) {
        {
            let mut pending = self.lock();
            match control {
                Control::Disconnect(d) => {
                    pending.disconnect.get_or_insert(*d);
                }
                Control::Unsubscribe(channel) => {
                    pending.unsubscribe.insert(channel.clone());
                }
            }
        }
        self.notify.notify_one();
    }

    /// The next thing told, a disconnect before any unsubscribe; waits
    /// until there is one. Cancel-safe: nothing is taken unless returned.
    pub(crate) async fn next(&self) -> Control {
        loop {
            if let Some(control) = self.take() {
                return control;
            }
            self.notify.notified().await;
        }
    }

    /// The next thing told, a disconnect first, if there is one.
    pub(crate) fn take(&self) -> Option<Control> {
        let mut pending = self.lock();
        if let Some(d) = pending.disconnect.take() {
            return Some(Control::Disconnect(d));
        }
        pending.unsubscribe.pop_first().map(Control::Unsubscribe)
    }
}

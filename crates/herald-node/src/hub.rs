//! Live fan-out: one `tokio::sync::broadcast` per channel that has
//! subscribers on this node.
//!
//! A channel's sender is created by its first subscriber and dropped with
//! its last one, so channels nobody follows cost nothing. Notices come from
//! the writer after each commit (on the holder) and from the standby feed
//! (on a standby). The hub only fans out; gap detection and catch-up are the
//! subscriber's job (`subscription.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use herald_core::{ChannelName, Message, Offset};
use tokio::sync::broadcast;

/// "The channel's head moved", with the new messages when the sender has
/// them. Shared between subscribers behind an `Arc`.
#[derive(Debug)]
pub struct Notice {
    /// The channel whose head moved.
    pub channel: ChannelName,
    /// The channel's head after the change.
    pub head: Offset,
    /// The committed messages in offset order, when known; empty means "read
    /// up to `head` from the storage".
    pub messages: Vec<Message>,
    /// `Some(n)`: the channel was deleted by deletion number `n`
    /// (`Storage::record_deletion`; its messages up to `head` removed,
    /// `head` kept): every subscription to it that began before that
    /// deletion ends with a final `deleted` event; one that began after it
    /// ignores the notice (it may come late, or more than once).
    pub deleted: Option<u64>,
}

/// Per-channel broadcast senders.
#[derive(Debug)]
pub struct Hub {
    /// Senders of the channels that have at least one subscriber.
    ///
    /// A `std::sync::Mutex`, not tokio's: the lock is never held across an
    /// `.await`, and what it guards is short and never blocks (one map
    /// insert, lookup or remove, and `broadcast::Sender::send`, which
    /// stores the notice in the channel's buffer and wakes the receivers),
    /// so no task waits on it for long; and [`HubReceiver`]'s `Drop`, which
    /// cannot await, must take it too. An async mutex would only add cost
    /// (tokio's documentation of its `Mutex`, "Which kind of mutex should
    /// you use?").
    channels: Mutex<HashMap<ChannelName, broadcast::Sender<Arc<Notice>>>>,
    /// Notices buffered per channel before a slow receiver lags.
    capacity: usize,
}

impl Hub {
    /// A hub whose channels buffer `capacity` notices (at least 1).
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            channels: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<ChannelName, broadcast::Sender<Arc<Notice>>>> {
        // The map stays consistent even if a holder panicked: every
        // operation on it is a single insert, lookup or remove.
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts receiving the notices of `channel` published from now on.
    pub fn subscribe(self: &Arc<Self>, channel: &ChannelName) -> HubReceiver {
        let rx = self
            .lock()
            .entry(channel.clone())
            .or_insert_with(|| broadcast::channel(self.capacity).0)
            .subscribe();
        HubReceiver {
            rx: Some(rx),
            hub: Arc::clone(self),
            channel: channel.clone(),
        }
    }

    /// Sends `notice` to the channel's current subscribers, if any.
    pub fn publish(&self, notice: Notice) {
        let map = self.lock();
        if let Some(tx) = map.get(&notice.channel) {
            // An error only means that the last receiver is being dropped
            // right now; it removes the sender itself.
            let _ = tx.send(Arc::new(notice));
        }
    }

    /// Number of channels with a live sender.
    #[cfg(test)]
    pub fn channel_count(&self) -> usize {
        self.lock().len()
    }
}

/// One subscriber's end of a channel's broadcast. Dropping the last one of
/// a channel drops the channel's sender.
#[derive(Debug)]
pub struct HubReceiver {
    /// Always `Some` until drop.
    rx: Option<broadcast::Receiver<Arc<Notice>>>,
    hub: Arc<Hub>,
    channel: ChannelName,
}

impl HubReceiver {
    /// The next notice.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe, as `broadcast::Receiver::recv` is: if it
    /// is dropped before it returned (a branch of a `select!` that lost),
    /// no notice was taken, and the next call returns it.
    ///
    /// # Errors
    /// `Lagged(n)` when this receiver missed `n` notices (the subscriber
    /// must read from the storage), `Closed` never while the hub holds the
    /// sender.
    pub async fn recv(&mut self) -> Result<Arc<Notice>, broadcast::error::RecvError> {
        match self.rx.as_mut() {
            Some(rx) => rx.recv().await,
            None => Err(broadcast::error::RecvError::Closed),
        }
    }
}

impl Drop for HubReceiver {
    fn drop(&mut self) {
        drop(self.rx.take());
        let mut map = self.hub.lock();
        if map
            .get(&self.channel)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            map.remove(&self.channel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    fn msg(offset: Offset) -> Message {
        Message {
            offset,
            data: Arc::from(RawValue::from_string(offset.to_string()).unwrap()),
            published_at_ms: 0,
            tags: herald_core::Tags::default(),
        }
    }

    #[tokio::test]
    async fn senders_live_exactly_as_long_as_their_receivers() {
        let hub = Hub::new(8);
        let a = ChannelName::new("a").unwrap();
        let r1 = hub.subscribe(&a);
        let r2 = hub.subscribe(&a);
        assert_eq!(hub.channel_count(), 1);
        drop(r1);
        assert_eq!(hub.channel_count(), 1);
        drop(r2);
        assert_eq!(hub.channel_count(), 0);
        // Publishing to a channel without subscribers creates nothing.
        hub.publish(Notice {
            deleted: None,
            channel: a.clone(),
            head: 1,
            messages: vec![msg(1)],
        });
        assert_eq!(hub.channel_count(), 0);
    }

    #[tokio::test]
    async fn notices_reach_only_their_channel() {
        let hub = Hub::new(8);
        let a = ChannelName::new("a").unwrap();
        let b = ChannelName::new("b").unwrap();
        let mut ra = hub.subscribe(&a);
        let mut rb = hub.subscribe(&b);
        hub.publish(Notice {
            deleted: None,
            channel: a.clone(),
            head: 1,
            messages: vec![msg(1)],
        });
        let n = ra.recv().await.unwrap();
        assert_eq!((n.head, n.messages[0].offset), (1, 1));
        assert!(matches!(
            rb.rx.as_mut().unwrap().try_recv(),
            Err(broadcast::error::TryRecvError::Empty)
        ));
    }

    #[tokio::test]
    async fn a_slow_receiver_lags_instead_of_growing() {
        let hub = Hub::new(2);
        let a = ChannelName::new("a").unwrap();
        let mut r = hub.subscribe(&a);
        for head in 1..=5 {
            hub.publish(Notice {
                deleted: None,
                channel: a.clone(),
                head,
                messages: vec![],
            });
        }
        assert!(matches!(
            r.recv().await,
            Err(broadcast::error::RecvError::Lagged(3))
        ));
        assert_eq!(r.recv().await.unwrap().head, 4);
    }
}

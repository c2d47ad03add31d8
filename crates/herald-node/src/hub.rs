//! Live fan-out: one buffer of the latest notices per channel that has
//! subscribers on this node.
//!
//! A channel's buffer is created by its first subscriber and dropped with
//! its last one, so channels nobody follows cost nothing. Notices come from
//! the writer after each commit (on the holder) and from the standby feed
//! (on a standby). The hub only fans out; gap detection and catch-up are the
//! subscriber's job (`subscription.rs`).
//!
//! Each buffer behaves as a `tokio::sync::broadcast` channel does (every
//! receiver gets every notice sent after it subscribed, in order; one that
//! falls more than the capacity behind gets `Lagged(n)` and goes on with
//! the oldest notice kept; a notice is dropped as soon as every receiver
//! has had it), with one difference: it grows with what it holds, where
//! `broadcast` allocates all its slots when the channel is created (about
//! 33 KB at the default capacity of 1 024), which subscribers spread over
//! many channels would pay once per channel.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use herald_core::{ChannelName, Message, Offset};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::Notify;

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
    /// This write closed the channel (a Durable Streams stream: no append
    /// is accepted after it) at `head`: a subscription that ends at
    /// closure ends once it handed out every message up to `head`
    /// (`subscription.rs`). On a standby, the standby feed sets it when it
    /// read the stream closed at the notice's head; `false` there means
    /// "not known closed", and a close that appends nothing moves no head,
    /// so the feed never announces it (a follower looks at the stream
    /// itself from time to time).
    pub closed: bool,
}

/// Locks `mutex`; what the hub's mutexes guard stays consistent even if a
/// holder panicked (every change to it is one step).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One channel's live buffer.
#[derive(Debug)]
struct Live {
    ring: Mutex<Ring>,
    /// Woken at every notice.
    sent: Notify,
}

/// The notices a channel keeps, numbered from `first`.
#[derive(Debug)]
struct Ring {
    /// Number of the oldest notice kept (the first of `notices`).
    first: u64,
    /// Each notice with how many receivers have yet to take it.
    notices: VecDeque<(Arc<Notice>, usize)>,
    /// Receivers of the channel.
    receivers: usize,
    /// Most notices kept.
    capacity: usize,
    /// The highest head of the notices published to this buffer; `None`
    /// before its first one.
    head: Option<Offset>,
    /// Receivers that end at the channel's closure
    /// ([`HubReceiver::watch_closure`]).
    closure_watchers: usize,
}

impl Ring {
    /// Number of the next notice to be sent.
    fn end(&self) -> u64 {
        self.first + self.notices.len() as u64
    }

    /// Drops the notices at the front that every receiver has had.
    fn drop_taken(&mut self) {
        while self.notices.front().is_some_and(|(_, left)| *left == 0) {
            self.notices.pop_front();
            self.first += 1;
        }
        if self.notices.is_empty() && self.notices.capacity() > 0 {
            // Nothing kept: give the room back.
            self.notices = VecDeque::new();
        }
    }
}

/// Per-channel live buffers.
#[derive(Debug)]
pub struct Hub {
    /// Buffers of the channels that have at least one subscriber.
    ///
    /// A `std::sync::Mutex`, not tokio's: the lock is never held across an
    /// `.await`, and what it guards is short and never blocks (one map
    /// insert, lookup or remove, and storing a notice in a channel's
    /// buffer), so no task waits on it for long; and [`HubReceiver`]'s
    /// `Drop`, which cannot await, must take it too. An async mutex would
    /// only add cost (tokio's documentation of its `Mutex`, "Which kind of
    /// mutex should you use?").
    channels: Mutex<HashMap<ChannelName, Arc<Live>>>,
    /// Notices kept per channel before a slow receiver lags.
    capacity: usize,
    /// Receivers alive, over every channel (read without the map's lock).
    receivers: AtomicUsize,
}

impl Hub {
    /// A hub whose channels keep at most `capacity` notices (at least 1).
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            channels: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
            receivers: AtomicUsize::new(0),
        })
    }

    /// Starts receiving the notices of `channel` published from now on.
    pub fn subscribe(self: &Arc<Self>, channel: &ChannelName) -> HubReceiver {
        let mut map = lock(&self.channels);
        let live = map
            .entry(channel.clone())
            .or_insert_with(|| {
                Arc::new(Live {
                    ring: Mutex::new(Ring {
                        first: 0,
                        notices: VecDeque::new(),
                        receivers: 0,
                        capacity: self.capacity,
                        head: None,
                        closure_watchers: 0,
                    }),
                    sent: Notify::new(),
                })
            })
            .clone();
        let next = {
            let mut ring = lock(&live.ring);
            ring.receivers += 1;
            ring.end()
        };
        self.receivers.fetch_add(1, Ordering::Relaxed);
        drop(map);
        HubReceiver {
            live,
            next,
            hub: Arc::clone(self),
            channel: channel.clone(),
            watches_closure: false,
        }
    }

    /// Sends `notice` to the channel's current subscribers, if any.
    pub fn publish(&self, notice: Notice) {
        let map = lock(&self.channels);
        let Some(live) = map.get(&notice.channel) else {
            return;
        };
        {
            let mut ring = lock(&live.ring);
            let receivers = ring.receivers;
            ring.head = Some(ring.head.map_or(notice.head, |h| h.max(notice.head)));
            ring.notices.push_back((Arc::new(notice), receivers));
            if ring.notices.len() > ring.capacity {
                // The oldest goes, read or not: a receiver behind it lags.
                ring.notices.pop_front();
                ring.first += 1;
            }
        }
        live.sent.notify_waiters();
    }

    /// The highest head announced to `channel`'s subscribers on this node:
    /// `None` when nobody here follows the channel, or nothing was
    /// published to it since its first current subscriber came. A sender
    /// that knows the channel's new head uses it to read only the messages
    /// the subscribers have not been sent (the standby feed).
    pub fn last_head(&self, channel: &ChannelName) -> Option<Offset> {
        let map = lock(&self.channels);
        let live = map.get(channel)?;
        let head = lock(&live.ring).head;
        head
    }

    /// Whether a subscriber on this node ends at `channel`'s closure
    /// ([`HubReceiver::watch_closure`]): a sender that must read the
    /// storage to know whether a change closed the channel (the standby
    /// feed) reads only for such channels.
    pub fn closure_watched(&self, channel: &ChannelName) -> bool {
        let map = lock(&self.channels);
        map.get(channel)
            .is_some_and(|live| lock(&live.ring).closure_watchers > 0)
    }

    /// Subscribers on this node over every channel (live subscriptions of
    /// every protocol), read without taking the hub's lock.
    pub fn subscriber_total(&self) -> usize {
        self.receivers.load(Ordering::Relaxed)
    }

    /// Every channel followed on this node, with its number of
    /// subscribers (live subscriptions of every protocol), by name.
    pub fn subscriber_counts(&self) -> BTreeMap<ChannelName, usize> {
        let map = lock(&self.channels);
        map.iter()
            .map(|(channel, live)| (channel.clone(), lock(&live.ring).receivers))
            .filter(|&(_, n)| n > 0)
            .collect()
    }

    /// Number of channels with a live buffer.
    #[cfg(test)]
    pub fn channel_count(&self) -> usize {
        lock(&self.channels).len()
    }
}

/// One subscriber's end of a channel's live buffer. Dropping the last one
/// of a channel drops the channel's buffer.
#[derive(Debug)]
pub struct HubReceiver {
    live: Arc<Live>,
    /// Number of the next notice this receiver takes.
    next: u64,
    hub: Arc<Hub>,
    channel: ChannelName,
    /// Counted in its channel's `closure_watchers`.
    watches_closure: bool,
}

impl HubReceiver {
    /// Marks this receiver as one that ends at the channel's closure, so
    /// that [`Hub::closure_watched`] answers `true` while it lives.
    pub fn watch_closure(&mut self) {
        if !self.watches_closure {
            self.watches_closure = true;
            lock(&self.live.ring).closure_watchers += 1;
        }
    }

    /// The next notice.
    ///
    /// # Cancel safety
    ///
    /// This method is cancel safe: if it is dropped before it returned (a
    /// branch of a `select!` that lost), no notice was taken, and the next
    /// call returns it.
    ///
    /// # Errors
    /// `Lagged(n)` when this receiver missed `n` notices (the subscriber
    /// must read from the storage; the next call returns the oldest notice
    /// kept), never `Closed`.
    pub async fn recv(&mut self) -> Result<Arc<Notice>, RecvError> {
        loop {
            // Registered before looking, so that a notice sent between the
            // look and the wait still wakes this receiver.
            let sent = self.live.sent.notified();
            tokio::pin!(sent);
            sent.as_mut().enable();
            if let Some(taken) = take(&self.live, &mut self.next) {
                return taken;
            }
            sent.await;
        }
    }

    /// The next notice if one is there (or the lag, as [`HubReceiver::recv`]
    /// reports it), without waiting: `None` when none is.
    pub fn try_recv(&mut self) -> Option<Result<Arc<Notice>, RecvError>> {
        take(&self.live, &mut self.next)
    }
}

/// Takes notice number `*next` of `live` if it is there (advancing
/// `*next`), or reports the lag when it was dropped already.
fn take(live: &Live, next: &mut u64) -> Option<Result<Arc<Notice>, RecvError>> {
    let mut ring = lock(&live.ring);
    if *next < ring.first {
        let missed = ring.first - *next;
        *next = ring.first;
        return Some(Err(RecvError::Lagged(missed)));
    }
    let at = usize::try_from(*next - ring.first).ok()?;
    let (notice, left) = ring.notices.get_mut(at)?;
    let notice = Arc::clone(notice);
    *left -= 1;
    *next += 1;
    ring.drop_taken();
    Some(Ok(notice))
}

impl Drop for HubReceiver {
    fn drop(&mut self) {
        self.hub.receivers.fetch_sub(1, Ordering::Relaxed);
        let mut map = lock(&self.hub.channels);
        let last = {
            let mut ring = lock(&self.live.ring);
            // What this receiver has not taken no longer waits for it.
            let from = usize::try_from(self.next.saturating_sub(ring.first)).unwrap_or(usize::MAX);
            for (_, left) in ring.notices.iter_mut().skip(from) {
                *left -= 1;
            }
            ring.drop_taken();
            ring.receivers -= 1;
            if self.watches_closure {
                ring.closure_watchers -= 1;
            }
            ring.receivers == 0
        };
        if last
            && map
                .get(&self.channel)
                .is_some_and(|live| Arc::ptr_eq(live, &self.live))
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
            data: herald_core::Payload::Json(Arc::from(
                RawValue::from_string(offset.to_string()).unwrap(),
            )),
            published_at_ms: 0,
            tags: herald_core::Tags::default(),
        }
    }

    #[test]
    fn subscribers_are_counted_per_channel_and_in_total() {
        let hub = Hub::new(8);
        let (a, b) = (
            ChannelName::new("a").unwrap(),
            ChannelName::new("b").unwrap(),
        );
        let a1 = hub.subscribe(&a);
        let a2 = hub.subscribe(&a);
        let b1 = hub.subscribe(&b);
        assert_eq!(hub.subscriber_total(), 3);
        let counts: Vec<(String, usize)> = hub
            .subscriber_counts()
            .into_iter()
            .map(|(c, n)| (c.as_str().to_owned(), n))
            .collect();
        assert_eq!(counts, [("a".to_owned(), 2), ("b".to_owned(), 1)]);
        drop(a1);
        drop(b1);
        assert_eq!(hub.subscriber_total(), 1);
        assert_eq!(hub.subscriber_counts().len(), 1);
        drop(a2);
        assert_eq!(hub.subscriber_total(), 0);
        assert!(hub.subscriber_counts().is_empty());
    }

    /// A channel is watched for closure exactly while a receiver that
    /// ends at closure lives, however many others follow it.
    #[test]
    fn closure_is_watched_while_a_watching_receiver_lives() {
        let hub = Hub::new(8);
        let a = ChannelName::new("a").unwrap();
        let plain = hub.subscribe(&a);
        assert!(!hub.closure_watched(&a));
        let mut watching = hub.subscribe(&a);
        watching.watch_closure();
        watching.watch_closure();
        assert!(hub.closure_watched(&a));
        drop(plain);
        assert!(hub.closure_watched(&a));
        let again = hub.subscribe(&a);
        drop(watching);
        assert!(!hub.closure_watched(&a));
        drop(again);
        assert!(!hub.closure_watched(&a));
    }

    #[test]
    fn the_last_head_is_the_highest_told_to_current_subscribers() {
        let hub = Hub::new(8);
        let a = ChannelName::new("a").unwrap();
        let notice = |head| Notice {
            deleted: None,
            closed: false,
            channel: a.clone(),
            head,
            messages: Vec::new(),
        };
        // Nobody follows `a`: nothing is known, whatever was published.
        hub.publish(notice(4));
        assert_eq!(hub.last_head(&a), None);
        let r = hub.subscribe(&a);
        assert_eq!(hub.last_head(&a), None);
        hub.publish(notice(5));
        hub.publish(notice(3));
        assert_eq!(hub.last_head(&a), Some(5));
        // The buffer goes with the last subscriber, and so does its head.
        drop(r);
        let _r = hub.subscribe(&a);
        assert_eq!(hub.last_head(&a), None);
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
            closed: false,
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
            closed: false,
            channel: a.clone(),
            head: 1,
            messages: vec![msg(1)],
        });
        let n = ra.recv().await.unwrap();
        assert_eq!((n.head, n.messages[0].offset), (1, 1));
        assert!(rb.try_recv().is_none());
    }

    #[tokio::test]
    async fn a_slow_receiver_lags_instead_of_growing() {
        let hub = Hub::new(2);
        let a = ChannelName::new("a").unwrap();
        let mut r = hub.subscribe(&a);
        for head in 1..=5 {
            hub.publish(Notice {
                deleted: None,
                closed: false,
                channel: a.clone(),
                head,
                messages: vec![],
            });
        }
        assert!(matches!(r.recv().await, Err(RecvError::Lagged(3))));
        assert_eq!(r.recv().await.unwrap().head, 4);
    }

    fn notice(channel: &ChannelName, head: Offset) -> Notice {
        Notice {
            deleted: None,
            closed: false,
            channel: channel.clone(),
            head,
            messages: vec![msg(head)],
        }
    }

    /// Notices kept in `r`'s channel, and room for them.
    fn kept(r: &HubReceiver) -> (usize, usize) {
        let ring = lock(&r.live.ring);
        (ring.notices.len(), ring.notices.capacity())
    }

    #[tokio::test]
    async fn a_notice_is_dropped_once_every_receiver_has_had_it() {
        let hub = Hub::new(8);
        let a = ChannelName::new("a").unwrap();
        let mut r1 = hub.subscribe(&a);
        let mut r2 = hub.subscribe(&a);
        assert_eq!(kept(&r1), (0, 0), "an idle channel keeps no room");
        for head in 1..=3 {
            hub.publish(notice(&a, head));
        }
        let first = r1.recv().await.unwrap();
        assert_eq!(kept(&r1).0, 3);
        assert_eq!(r2.recv().await.unwrap().head, 1);
        assert_eq!(kept(&r1).0, 2, "taken by both: dropped");
        drop(first);
        for want in 2..=3 {
            assert_eq!(r1.recv().await.unwrap().head, want);
        }
        assert_eq!(kept(&r1).0, 2, "r2 has not had them yet");
        // A receiver that goes away no longer holds anything back.
        drop(r2);
        assert_eq!(kept(&r1), (0, 0));
        // One subscribing now gets only what comes next.
        let mut r3 = hub.subscribe(&a);
        hub.publish(notice(&a, 4));
        assert_eq!(r3.recv().await.unwrap().head, 4);
        assert_eq!(r1.recv().await.unwrap().head, 4);
        assert_eq!(kept(&r1), (0, 0));
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken_by_the_next_notice() {
        let hub = Hub::new(8);
        let a = ChannelName::new("a").unwrap();
        let mut waiting = hub.subscribe(&a);
        let (started, mut started_rx) = tokio::sync::mpsc::channel(1);
        let task = tokio::spawn(async move {
            let mut recv = std::pin::pin!(waiting.recv());
            // Polled once (registered as waiting) before the notice is sent.
            let first = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(std::future::Future::poll(recv.as_mut(), cx))
            })
            .await;
            assert!(first.is_pending());
            started.send(()).await.unwrap();
            recv.await.unwrap().head
        });
        started_rx.recv().await.unwrap();
        hub.publish(notice(&a, 7));
        assert_eq!(task.await.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_lagged_receiver_goes_on_with_the_oldest_notice_kept_and_holds_nothing_back() {
        let hub = Hub::new(2);
        let a = ChannelName::new("a").unwrap();
        let mut slow = hub.subscribe(&a);
        let mut quick = hub.subscribe(&a);
        for head in 1..=4 {
            hub.publish(notice(&a, head));
            assert_eq!(quick.recv().await.unwrap().head, head);
        }
        assert!(matches!(slow.recv().await, Err(RecvError::Lagged(2))));
        assert_eq!(slow.recv().await.unwrap().head, 3);
        assert_eq!(slow.recv().await.unwrap().head, 4);
        assert_eq!(kept(&slow), (0, 0));
    }
}

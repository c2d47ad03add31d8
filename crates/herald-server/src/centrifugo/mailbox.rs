//! What reaches a Centrifugo session from outside its connection: the
//! pushes and ends its subscription tasks and the join/leave relay send
//! ([`Out`]), and what the server API tells it through the registry
//! ([`Control`], left in its [`Mailbox`]). Below the session, the
//! registry and the relay, so that they do not import each other.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use herald_core::ChannelName;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::codec::Encoded;
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
    /// The push, encoded for the session's connection.
    pub(crate) encoded: Encoded,
    /// The bytes it counts for in the session's [`QueueBudget`]: its
    /// encoded length for a publication, 0 for a push not counted (a join
    /// or leave, which a full queue drops instead).
    pub(crate) queued_bytes: usize,
}

/// The bytes of publication pushes a session's queue holds, against its
/// budget (`subscriber_queue_bytes`), shared by the session and its
/// subscription tasks. A push that would take the queue past the budget
/// is not queued: the queue is marked overflowed, its subscription task
/// ends, and the session closes with 3008 "slow" (also while a write
/// waits on the client), so a client that stops reading holds at most
/// the budget in its queue.
#[derive(Debug)]
pub(crate) struct QueueBudget {
    queued: AtomicUsize,
    budget: usize,
    overflowed: CancellationToken,
}

impl QueueBudget {
    /// An empty queue of `budget` bytes.
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            queued: AtomicUsize::new(0),
            budget,
            overflowed: CancellationToken::new(),
        }
    }

    /// Counts a push of `len` bytes into the queue; `false`, counting
    /// nothing and marking the queue overflowed, when the queue holds
    /// something and `len` more would take it past the budget (a push
    /// into an empty queue is always taken, so every subscriber
    /// progresses), or when it overflowed already.
    pub(crate) fn admit(&self, len: usize) -> bool {
        let admitted = !self.overflowed.is_cancelled()
            && self
                .queued
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                    (queued == 0 || queued.saturating_add(len) <= self.budget)
                        .then_some(queued.saturating_add(len))
                })
                .is_ok();
        if !admitted {
            self.overflowed.cancel();
        }
        admitted
    }

    /// Uncounts a push of `len` bytes taken out of the queue.
    pub(crate) fn release(&self, len: usize) {
        self.queued.fetch_sub(len, Ordering::AcqRel);
    }

    /// Completes once a push was refused: the session closes with 3008.
    pub(crate) async fn overflowed(&self) {
        self.overflowed.cancelled().await;
    }

    /// Bytes queued now.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_budget_refuses_what_would_pass_it_and_stays_overflowed() {
        let queue = QueueBudget::new(100);
        // Into an empty queue, whatever the size: a reader progresses.
        assert!(queue.admit(150));
        queue.release(150);
        assert!(queue.admit(60));
        assert!(queue.admit(40));
        assert_eq!(queue.queued(), 100);
        assert!(!queue.admit(1), "one byte past the budget");
        assert_eq!(queue.queued(), 100, "a refused push is not counted");
        queue.release(100);
        assert!(!queue.admit(1), "an overflowed queue takes nothing more");
    }
}

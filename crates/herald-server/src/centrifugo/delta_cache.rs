//! The node's Fossil deltas (`fossil_delta.rs` is a subscription's side):
//! one delta per publication per channel, shared by every subscription
//! that sent the same previous publication, computed away from the async
//! workers and within a CPU budget.
//!
//! The `fossil-delta` crate's cost grows faster than its input (a hash
//! chain of up to 250 candidates per byte of the target, and for unrelated
//! texts a cost that grows with the square of the size): measured on a
//! 2-core node, an unrelated text costs 0.4 ms at 16 KiB, 3.4 ms at
//! 64 KiB, 60–130 ms at 256 KiB and 1.3–2.5 s at 1 MiB; text built to
//! fill the hash chains costs about 0.4 µs a byte at every size (7 ms at
//! 16 KiB, 30–40 ms at 64 KiB). So:
//!
//! - a publication whose JSON text, or that of the one before it, is
//!   larger than [`MAX_DELTA_BYTES`] (16 KiB, a few ms at worst) goes
//!   whole, without a delta being computed;
//! - a delta runs on the blocking pool (`spawn_blocking`), at most
//!   [`COMPUTING_AT_ONCE`] at a time on the node, never on the async
//!   workers that serve requests and renew the lease;
//! - the time deltas take is charged to a budget of [`BUDGET_PER_S`] a
//!   second ([`BUDGET_BURST`] at once): once it is spent, publications go
//!   whole until it refills;
//! - subscriptions of a channel that ask for the same delta (the same
//!   previous publication and the same next one) wait for one computation
//!   and share its result ([`RECENT_PER_CHANNEL`] kept per channel, while
//!   the channel has a delta subscription on this node).
//!
//! A publication sent whole to a delta subscription (`delta: false`) is
//! allowed by Centrifugo's protocol, and the SDKs take it as the new base:
//! delivery stays once, in order, at its offset.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use herald_core::{ChannelName, Offset};
use tokio::sync::{OnceCell, Semaphore};
use tokio::time::Instant;

/// The largest JSON text, in bytes, of a publication sent as a delta, and
/// of the publication before it that the delta starts from: 16 KiB keeps
/// one delta to a few milliseconds whatever the text (see the module
/// documentation for the measured curve).
pub(crate) const MAX_DELTA_BYTES: usize = 16 * 1024;

/// The time deltas may take on the node per second: a fifth of one core.
pub(crate) const BUDGET_PER_S: Duration = Duration::from_millis(200);

/// The time deltas may take at once before the budget is spent.
pub(crate) const BUDGET_BURST: Duration = Duration::from_millis(200);

/// Deltas computed at the same time on the node (each on a thread of the
/// blocking pool).
pub(crate) const COMPUTING_AT_ONCE: usize = 1;

/// Deltas kept per channel for the subscriptions that have not asked for
/// them yet (the subscriptions of a channel follow it each at its own pace,
/// some a few publications behind the others in a burst): at most 16 texts
/// and deltas of at most [`MAX_DELTA_BYTES`] each, about 0.5 MiB, per
/// channel that has a delta subscription on the node.
pub(crate) const RECENT_PER_CHANNEL: usize = 16;

/// A publication as a delta subscription last sent it: its offset and its
/// JSON text (shared by the subscriptions that sent the same one).
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    /// The publication's offset.
    pub(crate) offset: Offset,
    /// Its JSON text, at most [`MAX_DELTA_BYTES`].
    pub(crate) text: Arc<str>,
}

impl Sent {
    /// The same publication: same offset and same text.
    fn is(&self, offset: Offset, text: &str) -> bool {
        self.offset == offset && *self.text == *text
    }
}

/// One delta of a channel: from `from` to `to`, computed once.
#[derive(Debug)]
struct Slot {
    from: Sent,
    to: Sent,
    /// The delta, or `None` when the publication goes whole (over budget,
    /// or a delta that is not UTF-8 text).
    delta: OnceCell<Option<Arc<str>>>,
}

/// A channel's recent deltas and its delta subscriptions on this node.
#[derive(Debug, Default)]
struct Recent {
    subscriptions: usize,
    slots: VecDeque<Arc<Slot>>,
}

/// Time spent on deltas, refilled at a rate (a token bucket of seconds).
#[derive(Debug)]
struct Budget {
    /// Seconds left; below zero after a delta that took more than was left.
    left_s: f64,
    burst_s: f64,
    per_s: f64,
    at: Instant,
}

impl Budget {
    fn refill(&mut self) {
        let now = Instant::now();
        let elapsed = now.duration_since(self.at).as_secs_f64();
        self.left_s = (self.left_s + elapsed * self.per_s).min(self.burst_s);
        self.at = now;
    }
}

/// The node's deltas: see the module documentation.
#[derive(Debug)]
pub(crate) struct DeltaCache {
    channels: Mutex<HashMap<ChannelName, Recent>>,
    computing: Arc<Semaphore>,
    budget: Arc<Mutex<Budget>>,
    /// Deltas computed so far.
    computed: AtomicU64,
}

impl Default for DeltaCache {
    fn default() -> Self {
        Self::with_budget(BUDGET_PER_S, BUDGET_BURST)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DeltaCache {
    /// A cache whose deltas may take `per_s` of time a second, `burst` at
    /// once.
    pub(crate) fn with_budget(per_s: Duration, burst: Duration) -> Self {
        Self {
            channels: Mutex::default(),
            computing: Arc::new(Semaphore::new(COMPUTING_AT_ONCE)),
            budget: Arc::new(Mutex::new(Budget {
                left_s: burst.as_secs_f64(),
                burst_s: burst.as_secs_f64(),
                per_s: per_s.as_secs_f64(),
                at: Instant::now(),
            })),
            computed: AtomicU64::new(0),
        }
    }

    /// Deltas computed so far on the node.
    #[cfg(test)]
    pub(crate) fn computed(&self) -> u64 {
        self.computed.load(Ordering::Relaxed)
    }

    /// Counts a delta subscription of `channel` until the registration is
    /// dropped; the channel's recent deltas are kept while it has one.
    pub(crate) fn register(self: &Arc<Self>, channel: &ChannelName) -> Registration {
        lock(&self.channels)
            .entry(channel.clone())
            .or_default()
            .subscriptions += 1;
        Registration {
            cache: Arc::clone(self),
            channel: channel.clone(),
        }
    }

    /// The delta of `channel`'s publication at `offset`, of JSON text
    /// `text` (at most [`MAX_DELTA_BYTES`]), from `from`, the publication
    /// the subscription sent before: computed by the first subscription
    /// that asks, which the others wait for. Returns the publication as
    /// sent (its text shared with the other subscriptions) and the delta,
    /// or `None` when it goes whole.
    pub(crate) async fn delta(
        &self,
        channel: &ChannelName,
        from: &Sent,
        offset: Offset,
        text: &str,
    ) -> (Sent, Option<Arc<str>>) {
        let slot = self.slot(channel, from, offset, text);
        let delta = slot
            .delta
            .get_or_init(|| self.compute(Arc::clone(&slot.from.text), Arc::clone(&slot.to.text)))
            .await
            .clone();
        (slot.to.clone(), delta)
    }

    /// The channel's slot for the delta from `from` to (`offset`, `text`),
    /// made if there is none yet (the oldest one of the channel dropped
    /// past [`RECENT_PER_CHANNEL`]).
    fn slot(&self, channel: &ChannelName, from: &Sent, offset: Offset, text: &str) -> Arc<Slot> {
        let mut channels = lock(&self.channels);
        let recent = channels.get_mut(channel);
        if let Some(found) = recent.as_ref().and_then(|r| {
            r.slots.iter().find(|s| {
                s.to.is(offset, text)
                    && s.from.offset == from.offset
                    && (Arc::ptr_eq(&s.from.text, &from.text) || s.from.text == from.text)
            })
        }) {
            return Arc::clone(found);
        }
        let slot = Arc::new(Slot {
            from: from.clone(),
            to: Sent {
                offset,
                text: Arc::from(text),
            },
            delta: OnceCell::new(),
        });
        // A channel without a registration (none is made so) is not kept.
        if let Some(recent) = recent {
            if recent.slots.len() >= RECENT_PER_CHANNEL {
                recent.slots.pop_front();
            }
            recent.slots.push_back(Arc::clone(&slot));
        }
        slot
    }

    /// Computes the delta from `source` to `target` on the blocking pool,
    /// once a place among [`COMPUTING_AT_ONCE`] is free and if the budget
    /// has time left; `None` otherwise, or when the delta is not UTF-8.
    async fn compute(&self, source: Arc<str>, target: Arc<str>) -> Option<Arc<str>> {
        let permit = Arc::clone(&self.computing).acquire_owned().await.ok()?;
        {
            let mut budget = lock(&self.budget);
            budget.refill();
            if budget.left_s <= 0.0 {
                tracing::debug!(bytes = target.len(), "fossil delta over budget; sent whole");
                return None;
            }
        }
        self.computed.fetch_add(1, Ordering::Relaxed);
        let budget = Arc::clone(&self.budget);
        // The place and the charge go with the computation, which runs to
        // its end even when every subscription waiting for it is gone.
        let computed = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let started = std::time::Instant::now();
            let delta = fossil_delta::delta(target.as_bytes(), source.as_bytes());
            let took = started.elapsed();
            lock(&budget).left_s -= took.as_secs_f64();
            String::from_utf8(delta).ok().map(Arc::from)
        })
        .await;
        computed.ok().flatten()
    }
}

/// A delta subscription of a channel, counted by the node's
/// [`DeltaCache`] until dropped.
#[derive(Debug)]
pub(crate) struct Registration {
    cache: Arc<DeltaCache>,
    channel: ChannelName,
}

impl Registration {
    /// The node's deltas.
    pub(crate) fn cache(&self) -> &DeltaCache {
        &self.cache
    }

    /// The subscription's channel.
    pub(crate) fn channel(&self) -> &ChannelName {
        &self.channel
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut channels = lock(&self.cache.channels);
        if let Some(recent) = channels.get_mut(&self.channel) {
            recent.subscriptions -= 1;
            if recent.subscriptions == 0 {
                channels.remove(&self.channel);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel() -> ChannelName {
        ChannelName::new("d").unwrap()
    }

    fn sent(offset: Offset, text: &str) -> Sent {
        Sent {
            offset,
            text: Arc::from(text),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn subscriptions_that_sent_the_same_publication_share_one_delta() {
        let cache = Arc::new(DeltaCache::default());
        let registrations: Vec<_> = (0..16).map(|_| cache.register(&channel())).collect();
        let first = format!(r#"{{"n":1,"pad":"{}"}}"#, "a".repeat(4000));
        let second = format!(r#"{{"n":2,"pad":"{}"}}"#, "a".repeat(4000));
        // Each subscription kept its own copy of the first publication.
        let asked = registrations.iter().map(|r| {
            let (from, second) = (sent(1, &first), second.clone());
            async move { r.cache().delta(r.channel(), &from, 2, &second).await }
        });
        let answers = futures::future::join_all(asked).await;
        assert_eq!(cache.computed(), 1, "one delta for 16 subscriptions");
        let (to, delta) = &answers[0];
        let delta = delta.as_ref().expect("a delta");
        for (other_to, other) in &answers {
            assert!(Arc::ptr_eq(&to.text, &other_to.text), "the text is shared");
            assert_eq!(other.as_deref(), Some(&**delta));
        }
        let applied = fossil_delta::apply(first.as_bytes(), delta.as_bytes()).unwrap();
        assert_eq!(applied, second.as_bytes());
        // A later subscription with another previous publication gets its
        // own delta.
        let (_, own) = cache.delta(&channel(), &sent(7, "[7]"), 2, &second).await;
        assert!(own.is_some());
        assert_eq!(cache.computed(), 2);
        drop(registrations);
        assert!(
            lock(&cache.channels).is_empty(),
            "nothing kept without subscriptions"
        );
    }

    #[tokio::test]
    async fn a_spent_budget_sends_whole_without_computing() {
        let cache = Arc::new(DeltaCache::with_budget(Duration::ZERO, Duration::ZERO));
        let _registration = cache.register(&channel());
        let (to, delta) = cache.delta(&channel(), &sent(1, "[1]"), 2, "[2]").await;
        assert!(delta.is_none(), "whole");
        assert_eq!(&*to.text, "[2]");
        assert_eq!(cache.computed(), 0);
    }
}

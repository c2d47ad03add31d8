//! Appends of an idempotent producer that arrive ahead of their turn. A
//! client that pipelines its appends (the official client sends the next
//! batch before the last is answered) may have them reach the writing
//! node out of order: through a standby's forward, or over separate
//! connections. An append whose `Producer-Seq` is ahead of the next one
//! expected waits here, up to `durable_streams.producer_gap_wait`, for a
//! commit of the same producer on the same stream (this node's, the
//! holder's), and is then tried again; only when the wait ends without
//! its turn is it answered 409 `producer_seq_gap` (PROTOCOL.md of
//! durable-streams/durable-streams, "Idempotent producers").
//!
//! The table holds only the producers that have an append waiting, and
//! at most [`MAX_WAITING`] appends wait at once on a node: past that, a
//! gap is answered at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use herald_core::ChannelName;
use metrics::gauge;
use tokio::sync::Notify;

/// The gauge of appends waiting for their turn on this node (named with
/// every other metric family, in herald-http's `metrics.rs`).
pub(crate) use herald_http::metrics::APPENDS_WAITING;

/// Most appends that wait for their turn at once on one node.
const MAX_WAITING: usize = 10_000;

/// A stream and a `Producer-Id` on it.
type Key = (ChannelName, String);

/// The producers with appends waiting for their turn, each with what wakes
/// them. Shared by the node's requests.
#[derive(Debug, Default)]
pub(crate) struct ProducerWaits {
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    /// The waking signal of each producer with a waiting append, and how
    /// many of its appends wait.
    producers: HashMap<Key, (Arc<Notify>, usize)>,
    /// Appends waiting, over every producer.
    waiting: usize,
}

impl ProducerWaits {
    /// Marks an append of producer `id` on `channel` as waiting for its
    /// turn until the returned guard drops: `None` when [`MAX_WAITING`]
    /// appends wait already (the append is answered at once).
    pub(crate) fn wait(self: &Arc<Self>, channel: &ChannelName, id: &str) -> Option<Waiting> {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if table.waiting >= MAX_WAITING {
            return None;
        }
        table.waiting += 1;
        gauge!(APPENDS_WAITING).increment(1.0);
        let key = (channel.clone(), id.to_owned());
        let entry = table
            .producers
            .entry(key.clone())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        let notify = Arc::clone(&entry.0);
        Some(Waiting {
            waits: Arc::clone(self),
            key,
            notify,
        })
    }

    /// Wakes every waiting append of producer `id` on `channel`: one of
    /// its appends committed.
    pub(crate) fn committed(&self, channel: &ChannelName, id: &str) {
        let table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if table.producers.is_empty() {
            return;
        }
        if let Some((notify, _)) = table.producers.get(&(channel.clone(), id.to_owned())) {
            notify.notify_waiters();
        }
    }
}

/// One append waiting for its turn; dropping it ends the wait.
#[derive(Debug)]
pub(crate) struct Waiting {
    waits: Arc<ProducerWaits>,
    key: Key,
    notify: Arc<Notify>,
}

impl Waiting {
    /// What the producer's next commit wakes: create its `notified()`
    /// future before trying the append again, so that a commit in between
    /// is not missed.
    pub(crate) fn signal(&self) -> Arc<Notify> {
        Arc::clone(&self.notify)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut table = self.waits.table.lock().unwrap_or_else(|e| e.into_inner());
        table.waiting = table.waiting.saturating_sub(1);
        gauge!(APPENDS_WAITING).decrement(1.0);
        if let Some(entry) = table.producers.get_mut(&self.key) {
            entry.1 = entry.1.saturating_sub(1);
            if entry.1 == 0 {
                table.producers.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_commit_wakes_the_producers_waiting_appends_and_the_table_empties() {
        let waits = Arc::new(ProducerWaits::default());
        let channel = ChannelName::new("s").unwrap();
        let waiting = waits.wait(&channel, "p").unwrap();
        let signal = waiting.signal();
        let woken = signal.notified();
        waits.committed(&channel, "other");
        waits.committed(&channel, "p");
        woken.await;
        drop(waiting);
        let table = waits.table.lock().unwrap();
        assert!(table.producers.is_empty());
        assert_eq!(table.waiting, 0);
    }
}

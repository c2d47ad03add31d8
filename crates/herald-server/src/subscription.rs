//! One subscriber's ordered message sequence: history from the storage,
//! then live notices from the hub, without a gap or a repeat however many
//! messages arrive during the switch. Shared by SSE and WebSocket.
//!
//! The algorithm:
//! 1. subscribe to the hub **first**, so that nothing committed from now on
//!    can be missed;
//! 2. read the history after `last` in pages until a short page;
//! 3. for each notice: drop the messages at or below `last`; if the first
//!    remaining one is beyond `last + 1`, or the notice carries no messages
//!    and its head is beyond `last`, or the receiver lagged, read from the
//!    storage after `last` first; then take the notice's messages that
//!    continue at `last + 1`.
//!
//! `last` is the offset of the newest message handed out (or queued to be),
//! so every message is delivered once, in offset order.

use std::collections::VecDeque;
use std::sync::Arc;

use herald_core::{ChannelName, Message, Offset};
use herald_storage::Storage;
use tokio::sync::broadcast::error::RecvError;

use crate::hub::{Hub, HubReceiver, Notice};
use crate::metrics::{self, SubscriberGauge};
use crate::writer::log_storage_error;
use crate::{Error, Result};

/// Messages read from the storage per request.
pub(crate) const PAGE_LIMIT: usize = 1000;

/// A live subscription to one channel (see the module docs).
pub(crate) struct Subscription {
    storage: Arc<dyn Storage>,
    channel: ChannelName,
    live: HubReceiver,
    /// Offset of the newest message queued in `ready` or already handed out.
    last: Offset,
    /// Messages to hand out, in offset order, all `<= last`.
    ready: VecDeque<Message>,
    /// `false` until the history read met a short page.
    history_done: bool,
    /// Set when the live receiver lagged: read the storage until a short page.
    lagged: bool,
    /// The notice being applied; kept here so that a cancelled `next` loses
    /// nothing.
    notice: Option<Arc<Notice>>,
    /// Counts this subscription in `herald_subscribers` while it lives.
    _gauge: SubscriberGauge,
}

impl Subscription {
    /// Subscribes to `channel` live, then reads the first history page after
    /// `after`, so that a storage failure becomes an HTTP error rather than
    /// an empty stream. `transport` labels the subscriber gauge.
    ///
    /// # Errors
    /// [`Error::StorageUnavailable`] when the first read fails.
    pub(crate) async fn start(
        storage: Arc<dyn Storage>,
        hub: &Arc<Hub>,
        channel: ChannelName,
        after: Offset,
        transport: &'static str,
    ) -> Result<Self> {
        let live = hub.subscribe(&channel);
        let mut sub = Self {
            storage,
            channel,
            live,
            last: after,
            ready: VecDeque::new(),
            history_done: false,
            lagged: false,
            notice: None,
            _gauge: SubscriberGauge::new(transport),
        };
        if sub.read_page().await? < PAGE_LIMIT {
            sub.history_done = true;
        }
        Ok(sub)
    }

    /// The channel followed.
    pub(crate) fn channel(&self) -> &ChannelName {
        &self.channel
    }

    /// The next message in offset order; waits for one to be committed.
    /// `Ok(None)` when the live feed ended (never while the hub lives).
    ///
    /// Cancel-safe: every state change happens after an await completed, so
    /// a `next` dropped in a `select!` loses no message.
    ///
    /// # Errors
    /// [`Error::StorageUnavailable`] when a storage read failed; the caller
    /// ends the subscription (the client resumes from its last offset).
    pub(crate) async fn next(&mut self) -> Result<Option<Message>> {
        loop {
            if let Some(message) = self.ready.pop_front() {
                return Ok(Some(message));
            }
            if !self.history_done {
                if self.read_page().await? < PAGE_LIMIT {
                    self.history_done = true;
                }
                continue;
            }
            if self.lagged {
                metrics::catchup_read();
                if self.read_page().await? < PAGE_LIMIT {
                    self.lagged = false;
                }
                continue;
            }
            if let Some(notice) = self.notice.clone() {
                match catch_up_target(&notice, self.last) {
                    Some(target) => {
                        metrics::catchup_read();
                        let read = self.read_page().await?;
                        if self.last < target && read < PAGE_LIMIT {
                            // The storage does not have what the notice
                            // promises; never skip ahead of it.
                            tracing::warn!(
                                channel = %self.channel,
                                offset = self.last,
                                head = target,
                                "storage is behind a live notice; waiting for the next one"
                            );
                            self.notice = None;
                        }
                    }
                    None => {
                        self.take_contiguous(&notice);
                        // A gap inside the notice (never sent so, but
                        // cheap to honour) makes it a catch-up next turn.
                        if catch_up_target(&notice, self.last).is_none() {
                            self.notice = None;
                        }
                    }
                }
                continue;
            }
            match self.live.recv().await {
                Ok(notice) => self.notice = Some(notice),
                Err(RecvError::Lagged(missed)) => {
                    tracing::debug!(channel = %self.channel, missed, "subscriber lagged; reading from storage");
                    self.lagged = true;
                }
                Err(RecvError::Closed) => return Ok(None),
            }
        }
    }

    /// Reads one page after `last` and queues it; returns the page's length.
    async fn read_page(&mut self) -> Result<usize> {
        let page = self
            .storage
            .read(&self.channel, self.last, PAGE_LIMIT)
            .await
            .map_err(|e| {
                log_storage_error("read", Some(&self.channel), &e);
                Error::StorageUnavailable
            })?;
        let len = page.messages.len();
        for message in page.messages {
            if message.offset == self.last + 1 {
                self.last = message.offset;
                self.ready.push_back(message);
            }
        }
        Ok(len)
    }

    /// Queues the notice's messages that continue at `last + 1`.
    fn take_contiguous(&mut self, notice: &Notice) {
        for message in &notice.messages {
            if message.offset == self.last + 1 {
                self.last = message.offset;
                self.ready.push_back(message.clone());
            }
        }
    }
}

/// The offset the subscriber must read up to from the storage before it can
/// apply `notice`, or `None` when the notice continues at `last + 1` (or
/// brings nothing new).
fn catch_up_target(notice: &Notice, last: Offset) -> Option<Offset> {
    match notice.messages.iter().find(|m| m.offset > last) {
        Some(first) if first.offset > last + 1 => Some(first.offset - 1),
        Some(_) => None,
        None if notice.messages.is_empty() && notice.head > last => Some(notice.head),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::testing::MemoryStorage;

    fn msg(offset: Offset) -> Message {
        Message {
            offset,
            data: Arc::from(serde_json::value::RawValue::from_string(offset.to_string()).unwrap()),
            published_at_ms: 0,
        }
    }

    /// A head-moved notice without messages, as the standby feed sends.
    fn bare(channel: &str, head: Offset) -> Notice {
        Notice {
            channel: ChannelName::new(channel).unwrap(),
            head,
            messages: Vec::new(),
        }
    }

    fn notice(channel: &str, head: Offset, offsets: std::ops::RangeInclusive<Offset>) -> Notice {
        Notice {
            channel: ChannelName::new(channel).unwrap(),
            head,
            messages: offsets.map(msg).collect(),
        }
    }

    #[test]
    fn catch_up_only_on_gaps_and_bare_heads() {
        assert_eq!(catch_up_target(&notice("a", 5, 4..=5), 3), None);
        assert_eq!(catch_up_target(&notice("a", 5, 1..=5), 3), None);
        assert_eq!(catch_up_target(&notice("a", 7, 6..=7), 3), Some(5));
        assert_eq!(catch_up_target(&bare("a", 9), 3), Some(9));
        assert_eq!(catch_up_target(&bare("a", 3), 3), None);
        assert_eq!(catch_up_target(&notice("a", 3, 1..=3), 3), None);
    }

    async fn collect(sub: &mut Subscription, n: usize) -> Vec<Offset> {
        let mut out = Vec::new();
        for _ in 0..n {
            let m = tokio::time::timeout(Duration::from_secs(5), sub.next())
                .await
                .expect("subscription stalled")
                .unwrap()
                .unwrap();
            out.push(m.offset);
        }
        out
    }

    #[tokio::test]
    async fn history_in_pages_then_live_without_repeats() {
        let storage = MemoryStorage::new();
        for i in 0..2500 {
            storage.append_as_other_node("a", &i.to_string());
        }
        let hub = Hub::new(16);
        let mut sub = Subscription::start(
            storage.clone(),
            &hub,
            ChannelName::new("a").unwrap(),
            10,
            "sse",
        )
        .await
        .unwrap();
        // Committed after subscribing, and also announced: must come once.
        storage.append_as_other_node("a", "2501");
        hub.publish(Notice {
            channel: ChannelName::new("a").unwrap(),
            head: 2501,
            messages: vec![msg(2501)],
        });
        let got = collect(&mut sub, 2491).await;
        assert_eq!(got, (11..=2501).collect::<Vec<_>>());
        // A notice with old and new messages: only the new ones.
        storage.append_as_other_node("a", "2502");
        hub.publish(notice("a", 2502, 2500..=2502));
        assert_eq!(collect(&mut sub, 1).await, vec![2502]);
        assert!(tokio::time::timeout(Duration::from_millis(50), sub.next())
            .await
            .is_err());
    }

    #[tokio::test]
    async fn gaps_and_bare_heads_are_read_from_storage() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        let a = ChannelName::new("a").unwrap();
        let mut sub = Subscription::start(storage.clone(), &hub, a.clone(), 0, "ws")
            .await
            .unwrap();
        for i in 1..=3 {
            storage.append_as_other_node("a", &i.to_string());
        }
        // Only 3 is announced with its message: 1 and 2 come from storage.
        hub.publish(notice("a", 3, 3..=3));
        assert_eq!(collect(&mut sub, 3).await, vec![1, 2, 3]);
        // A head-moved notice (standby feed) with no messages.
        storage.append_as_other_node("a", "4");
        storage.append_as_other_node("a", "5");
        hub.publish(bare("a", 5));
        assert_eq!(collect(&mut sub, 2).await, vec![4, 5]);
    }

    #[tokio::test]
    async fn a_gap_inside_a_notice_is_read_from_storage() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        let a = ChannelName::new("a").unwrap();
        let mut sub = Subscription::start(storage.clone(), &hub, a.clone(), 0, "sse")
            .await
            .unwrap();
        for i in 1..=4 {
            storage.append_as_other_node("a", &i.to_string());
        }
        hub.publish(Notice {
            channel: a,
            head: 4,
            messages: vec![msg(1), msg(2), msg(4)],
        });
        assert_eq!(collect(&mut sub, 4).await, vec![1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn a_lagged_subscriber_catches_up_from_storage() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(2);
        let mut sub = Subscription::start(
            storage.clone(),
            &hub,
            ChannelName::new("a").unwrap(),
            0,
            "sse",
        )
        .await
        .unwrap();
        for i in 1..=50u64 {
            storage.append_as_other_node("a", &i.to_string());
            hub.publish(notice("a", i, i..=i));
        }
        assert_eq!(collect(&mut sub, 50).await, (1..=50).collect::<Vec<_>>());
        storage.append_as_other_node("a", "51");
        hub.publish(notice("a", 51, 51..=51));
        assert_eq!(collect(&mut sub, 1).await, vec![51]);
    }

    #[tokio::test]
    async fn next_is_cancel_safe() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        let mut sub = Subscription::start(
            storage.clone(),
            &hub,
            ChannelName::new("a").unwrap(),
            0,
            "ws",
        )
        .await
        .unwrap();
        // Cancel `next` many times while it waits; then deliver.
        for _ in 0..10 {
            assert!(tokio::time::timeout(Duration::from_millis(1), sub.next())
                .await
                .is_err());
        }
        storage.append_as_other_node("a", "1");
        hub.publish(notice("a", 1, 1..=1));
        assert_eq!(collect(&mut sub, 1).await, vec![1]);
    }

    #[tokio::test]
    async fn storage_failure_ends_with_an_error() {
        let storage = MemoryStorage::new();
        let hub = Hub::new(16);
        storage.fail_reads(true);
        let start = Subscription::start(
            storage.clone(),
            &hub,
            ChannelName::new("a").unwrap(),
            0,
            "sse",
        )
        .await;
        assert!(matches!(start, Err(Error::StorageUnavailable)));
        // The failed start left no sender behind.
        assert_eq!(hub.channel_count(), 0);
    }
}

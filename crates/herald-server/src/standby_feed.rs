//! Live notices on a standby: another process on the same database writes,
//! so this node learns of new messages by asking the storage which channels
//! moved (`Storage::changes_since`) every `standby_poll_interval`, and
//! publishes a head-moved notice (no messages) per moved channel. Subscribers
//! read the messages themselves.
//!
//! While this node is holder its own writer publishes notices; the feed then
//! polls once more (to announce what the previous holder committed last) and
//! waits for the role to change, without polling.

use std::sync::Arc;
use std::time::Duration;

use herald_storage::Storage;
use tokio_util::sync::CancellationToken;

use crate::hub::{Hub, Notice};
use crate::role::LeaseView;

/// The standby feed task's state.
pub(crate) struct StandbyFeed {
    storage: Arc<dyn Storage>,
    lease: Arc<dyn LeaseView>,
    hub: Arc<Hub>,
    /// Position in the storage's commit order up to which notices were sent.
    cursor: u64,
    interval: Duration,
    /// `true` while the last poll failed (to log transitions only).
    failing: bool,
}

impl StandbyFeed {
    /// A feed that announces changes committed after `cursor`.
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        lease: Arc<dyn LeaseView>,
        hub: Arc<Hub>,
        cursor: u64,
        interval: Duration,
    ) -> Self {
        Self {
            storage,
            lease,
            hub,
            cursor,
            interval,
            failing: false,
        }
    }

    /// Runs until `shutdown` is cancelled.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let mut states = self.lease.subscribe();
        // `false` once the supervisor is gone: its state no longer changes.
        let mut states_alive = true;
        loop {
            if self.lease.is_holder() {
                self.poll().await;
                while self.lease.is_holder() && states_alive {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        changed = states.changed() => states_alive = changed.is_ok(),
                    }
                }
                if self.lease.is_holder() {
                    // Supervisor gone while holder: nothing will change any
                    // more; the node is stopping.
                    shutdown.cancelled().await;
                    return;
                }
                continue;
            }
            self.poll().await;
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.interval) => {}
                changed = states.changed(), if states_alive => states_alive = changed.is_ok(),
            }
        }
    }

    /// Announces every channel that moved since the cursor.
    async fn poll(&mut self) {
        match self.storage.changes_since(self.cursor).await {
            Ok(feed) => {
                if self.failing {
                    tracing::info!("standby feed: storage answers again");
                    self.failing = false;
                }
                self.cursor = feed.cursor;
                for moved in feed.changed {
                    self.hub.publish(Notice {
                        channel: moved.name,
                        head: moved.head,
                        messages: Vec::new(),
                    });
                }
            }
            Err(e) => {
                if !self.failing {
                    tracing::warn!(error = %e, "standby feed: cannot read changes; live subscribers wait");
                    self.failing = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use herald_core::{ChannelName, FencingToken};

    use super::*;
    use crate::testing::{FakeLease, MemoryStorage};

    #[tokio::test]
    async fn a_standby_announces_what_another_node_commits() {
        let storage = MemoryStorage::new();
        storage.append_as_other_node("a", "0");
        let lease = FakeLease::holder(FencingToken(1));
        lease.set_standby(Some("http://other"));
        let hub = Hub::new(16);
        let cursor = storage.change_cursor().await.unwrap();
        let feed = StandbyFeed::new(
            storage.clone(),
            lease.clone(),
            hub.clone(),
            cursor,
            Duration::from_millis(5),
        );
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(feed.run(shutdown.clone()));
        let mut rx = hub.subscribe(&ChannelName::new("a").unwrap());
        storage.append_as_other_node("a", "1");
        storage.append_as_other_node("a", "2");
        let n = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(n.messages.is_empty());
        // Both commits may come in one poll or two; the last head is 3.
        let mut head = n.head;
        assert!(
            head >= 2,
            "the commit before the start cursor was announced"
        );
        while head < 3 {
            head = rx.recv().await.unwrap().head;
        }
        assert_eq!(head, 3);
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn a_holder_polls_once_then_idles_until_it_is_standby_again() {
        let storage = MemoryStorage::new();
        let lease = FakeLease::holder(FencingToken(1));
        let hub = Hub::new(64);
        let mut rx = hub.subscribe(&ChannelName::new("a").unwrap());
        // Committed by the previous holder before this node took over.
        storage.append_as_other_node("a", "0");
        let feed = StandbyFeed::new(
            storage.clone(),
            lease.clone(),
            hub.clone(),
            0,
            Duration::from_millis(5),
        );
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(feed.run(shutdown.clone()));
        let n = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n.head, 1);
        // While holder, commits are not polled for.
        storage.append_as_other_node("a", "1");
        assert!(tokio::time::timeout(Duration::from_millis(100), rx.recv())
            .await
            .is_err());
        // Standby again: polling resumes.
        lease.set_standby(None);
        let n = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n.head, 2);
        shutdown.cancel();
        task.await.unwrap();
    }
}

//! The node's one writer task: group commit of queued publishes.
//!
//! Handlers hand a validated message to the writer over a bounded queue
//! ([`WriterHandle::submit`] never waits: a full queue is `queue_full`). The
//! writer takes one request, then whatever else is already queued up to
//! `max_batch`, and appends them in one fenced storage transaction under the
//! lease it holds. Only after the storage returned (after the commit) does it
//! fan the new messages out to live subscribers and answer each request. On
//! any error nothing was committed and every request of the batch gets the
//! error: no publish is ever acknowledged without being stored.
//!
//! Except under the test-only fault switch `ack_before_commit` (cargo
//! feature `fault-switches`), which breaks exactly that rule: see
//! [`Writer::ack_before_commit`].

use std::collections::HashMap;
use std::sync::Arc;
#[cfg(feature = "fault-switches")]
use std::time::{SystemTime, UNIX_EPOCH};

#[cfg(feature = "fault-switches")]
use herald_core::fault_switches::{self, FaultSwitch};
use herald_core::{Appended, ChannelName, Message, NewMessage};
#[cfg(feature = "fault-switches")]
use herald_core::{Lease, Offset};
use herald_storage::Storage;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::StorageFailure;
use crate::hub::{Hub, Notice};
use crate::role::LeaseView;
use crate::{metrics, Error, Result};

/// One publish waiting for the writer.
#[derive(Debug)]
pub(crate) struct PublishRequest {
    message: NewMessage,
    reply: oneshot::Sender<Result<Appended>>,
}

/// The handlers' end of the writer's queue.
#[derive(Debug, Clone)]
pub(crate) struct WriterHandle {
    tx: mpsc::Sender<PublishRequest>,
}

impl WriterHandle {
    /// Queues `message` without waiting; the receiver yields the outcome
    /// once the writer has committed (or failed) its batch.
    ///
    /// # Errors
    /// [`Error::QueueFull`] when the queue is full, [`Error::Draining`]
    /// once the writer has closed its queue.
    pub(crate) fn submit(
        &self,
        message: NewMessage,
    ) -> Result<oneshot::Receiver<Result<Appended>>> {
        let (reply, rx) = oneshot::channel();
        match self.tx.try_send(PublishRequest { message, reply }) {
            Ok(()) => Ok(rx),
            Err(mpsc::error::TrySendError::Full(_)) => Err(Error::QueueFull),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(Error::Draining),
        }
    }

    /// Requests waiting in the queue.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

/// The writer task's state.
pub(crate) struct Writer {
    storage: Arc<dyn Storage>,
    lease: Arc<dyn LeaseView>,
    hub: Arc<Hub>,
    rx: mpsc::Receiver<PublishRequest>,
    max_batch: usize,
    /// The head each channel will have after the batches acknowledged so
    /// far. Used only under the test-only fault switch `ack_before_commit`
    /// (empty otherwise); compiled only with the cargo feature
    /// `fault-switches`.
    #[cfg(feature = "fault-switches")]
    predicted_heads: HashMap<ChannelName, Offset>,
}

impl Writer {
    /// A writer and its queue of `capacity` requests (at least 1); batches
    /// hold at most `max_batch` messages (at least 1).
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        lease: Arc<dyn LeaseView>,
        hub: Arc<Hub>,
        capacity: usize,
        max_batch: usize,
    ) -> (Self, WriterHandle) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let writer = Self {
            storage,
            lease,
            hub,
            rx,
            max_batch: max_batch.max(1),
            #[cfg(feature = "fault-switches")]
            predicted_heads: HashMap::new(),
        };
        (writer, WriterHandle { tx })
    }

    /// Commits batches until `shutdown` is cancelled (or every handle is
    /// gone), then closes the queue, so that new publishes get `draining`,
    /// and commits (or fails) what is still queued before returning.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                first = self.rx.recv() => match first {
                    Some(first) => self.commit_batch(first).await,
                    None => return,
                },
            }
        }
        self.rx.close();
        let mut drained = 0usize;
        while let Some(first) = self.rx.recv().await {
            drained += 1;
            self.commit_batch(first).await;
        }
        metrics::queue_depth(0);
        tracing::debug!(batches = drained, "writer drained its queue");
    }

    /// Takes `first` and what else is queued, up to `max_batch`, and commits
    /// them in one transaction.
    async fn commit_batch(&mut self, first: PublishRequest) {
        let mut messages = Vec::with_capacity(self.max_batch.min(64));
        let mut replies = Vec::with_capacity(self.max_batch.min(64));
        messages.push(first.message);
        replies.push(first.reply);
        while messages.len() < self.max_batch {
            match self.rx.try_recv() {
                Ok(request) => {
                    messages.push(request.message);
                    replies.push(request.reply);
                }
                Err(_) => break,
            }
        }
        metrics::queue_depth(self.rx.len());

        // Every publish reaches the writer only after its handler saw this
        // node holder; a lease that is not writable now was lost in between
        // (the safety deadline passed, the watchdog or a lost lease stopped
        // the node). `lease_lost` tells the client just that: nothing was
        // stored, retry on the new holder.
        let Some(lease) = self.lease.writable_lease() else {
            tracing::debug!(
                messages = messages.len(),
                "lease not writable: batch refused"
            );
            for reply in replies {
                let _ = reply.send(Err(Error::LeaseLost));
            }
            return;
        };
        #[cfg(feature = "fault-switches")]
        if fault_switches::enabled(FaultSwitch::AckBeforeCommit) {
            self.ack_before_commit(&lease, messages, replies).await;
            return;
        }

        match self.storage.append(&lease, &messages).await {
            Ok(appended) if appended.len() == messages.len() => {
                metrics::batch_committed(messages.len());
                self.fan_out(&messages, &appended);
                for (reply, outcome) in replies.into_iter().zip(appended) {
                    // A dropped receiver means the client went away; the
                    // message is stored all the same.
                    let _ = reply.send(Ok(outcome));
                }
            }
            Ok(appended) => {
                tracing::error!(
                    token = lease.token.0,
                    sent = messages.len(),
                    returned = appended.len(),
                    "storage returned a result count different from the batch size"
                );
                for reply in replies {
                    let _ = reply.send(Err(Error::Internal(
                        "storage answered a batch incompletely".to_owned(),
                    )));
                }
            }
            Err(herald_storage::Error::LeaseLost { name, token }) => {
                tracing::warn!(
                    lease = %name,
                    token = token.0,
                    messages = messages.len(),
                    "fenced write found the lease lost; batch failed"
                );
                self.lease.report_lease_lost(lease.token);
                for reply in replies {
                    let _ = reply.send(Err(Error::LeaseLost));
                }
            }
            Err(e) => {
                // One failure for the whole batch: logged once, here.
                StorageFailure::new("append", None, e).log();
                for reply in replies {
                    let _ = reply.send(Err(Error::StorageUnavailable));
                }
            }
        }
    }

    /// **Test-only**, the fault switch `ack_before_commit`: answers every
    /// request of the batch *before* appending it, with the offsets it
    /// predicts (each message new: the channel's head + 1, + 2, ...;
    /// published now on this node's clock), then appends. The head of a
    /// channel comes from the writer's `predicted_heads`, or, when it has none,
    /// from the storage (a read of the channel with limit 0, which returns
    /// its head). After the append the cache holds the real heads; after a
    /// failed append it is cleared, and the answers already sent stay sent:
    /// that is the bug this switch injects (acknowledged, never stored; or
    /// acknowledged with a wrong offset, e.g. for a duplicate).
    #[cfg(feature = "fault-switches")]
    async fn ack_before_commit(
        &mut self,
        lease: &Lease,
        messages: Vec<NewMessage>,
        replies: Vec<oneshot::Sender<Result<Appended>>>,
    ) {
        let published_at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let mut predicted = Vec::with_capacity(messages.len());
        for message in &messages {
            let head = match self.predicted_heads.get(&message.channel) {
                Some(&head) => head,
                None => match self.storage.read(&message.channel, 0, 0).await {
                    Ok(page) => page.head,
                    Err(e) => {
                        StorageFailure::new("read", Some(&message.channel), e).log();
                        self.predicted_heads.clear();
                        for reply in replies {
                            let _ = reply.send(Err(Error::StorageUnavailable));
                        }
                        return;
                    }
                },
            };
            self.predicted_heads
                .insert(message.channel.clone(), head + 1);
            predicted.push(Appended {
                channel: message.channel.clone(),
                offset: head + 1,
                published_at_ms,
                duplicate: false,
            });
        }
        for (reply, outcome) in replies.into_iter().zip(predicted) {
            let _ = reply.send(Ok(outcome));
        }
        match self.storage.append(lease, &messages).await {
            Ok(appended) if appended.len() == messages.len() => {
                metrics::batch_committed(messages.len());
                self.fan_out(&messages, &appended);
                // The real heads: the largest new offset of each channel;
                // a channel that got only duplicates is read again.
                for message in &messages {
                    self.predicted_heads.remove(&message.channel);
                }
                for outcome in appended.iter().filter(|a| !a.duplicate) {
                    let head = self
                        .predicted_heads
                        .entry(outcome.channel.clone())
                        .or_default();
                    *head = (*head).max(outcome.offset);
                }
            }
            outcome => {
                self.predicted_heads.clear();
                match outcome {
                    Err(e) => {
                        if matches!(e, herald_storage::Error::LeaseLost { .. }) {
                            self.lease.report_lease_lost(lease.token);
                        }
                        StorageFailure::new("append", None, e).log();
                    }
                    Ok(appended) => tracing::error!(
                        token = lease.token.0,
                        sent = messages.len(),
                        returned = appended.len(),
                        "storage returned a result count different from the batch size"
                    ),
                }
                tracing::error!(
                    token = lease.token.0,
                    messages = messages.len(),
                    fault_switch = FaultSwitch::AckBeforeCommit.as_str(),
                    "append failed after its publishes were acknowledged"
                );
            }
        }
    }

    /// Publishes the batch's new (non-duplicate) messages to the hub, one
    /// notice per channel, in offset order.
    fn fan_out(&self, messages: &[NewMessage], appended: &[Appended]) {
        let mut by_channel: HashMap<&ChannelName, Vec<Message>> = HashMap::new();
        for (new, outcome) in messages.iter().zip(appended) {
            if outcome.duplicate {
                continue;
            }
            by_channel.entry(&new.channel).or_default().push(Message {
                offset: outcome.offset,
                data: Arc::clone(&new.data),
                published_at_ms: outcome.published_at_ms,
            });
        }
        for (channel, mut committed) in by_channel {
            committed.sort_by_key(|m| m.offset);
            let head = committed.last().map_or(0, |m| m.offset);
            self.hub.publish(Notice {
                channel: channel.clone(),
                head,
                messages: committed,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use herald_core::FencingToken;
    use serde_json::value::RawValue;

    use super::*;
    use crate::testing::{FakeLease, MemoryStorage};

    fn new_message(channel: &str, data: &str, key: Option<&str>) -> NewMessage {
        NewMessage {
            channel: ChannelName::new(channel).unwrap(),
            data: Arc::from(RawValue::from_string(data.to_owned()).unwrap()),
            idempotency_key: key.map(|k| herald_core::IdempotencyKey::new(k).unwrap()),
        }
    }

    struct Rig {
        storage: Arc<MemoryStorage>,
        lease: Arc<FakeLease>,
        hub: Arc<Hub>,
        handle: WriterHandle,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    fn rig(capacity: usize, max_batch: usize) -> Rig {
        let storage = MemoryStorage::new();
        let lease = FakeLease::holder(FencingToken(1));
        let hub = Hub::new(16);
        let (writer, handle) = Writer::new(
            storage.clone(),
            lease.clone(),
            hub.clone(),
            capacity,
            max_batch,
        );
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(writer.run(shutdown.clone()));
        Rig {
            storage,
            lease,
            hub,
            handle,
            shutdown,
            task,
        }
    }

    #[tokio::test]
    async fn queued_requests_commit_together_and_fan_out() {
        let r = rig(16, 512);
        let gate = r.storage.hold_appends().await;
        let a = ChannelName::new("a").unwrap();
        let mut live = r.hub.subscribe(&a);
        // The first request is taken alone and blocks in append; the next
        // five queue up behind it and must form one batch.
        let first = r.handle.submit(new_message("a", "0", None)).unwrap();
        r.storage.wait_for_appends_started(1).await;
        let rest: Vec<_> = (1..=5)
            .map(|i| {
                r.handle
                    .submit(new_message("a", &i.to_string(), None))
                    .unwrap()
            })
            .collect();
        drop(gate);
        assert_eq!(first.await.unwrap().unwrap().offset, 1);
        for (i, rx) in rest.into_iter().enumerate() {
            let appended = rx.await.unwrap().unwrap();
            assert_eq!(appended.offset, i as u64 + 2);
            assert!(!appended.duplicate);
        }
        assert_eq!(r.storage.batch_sizes(), vec![1, 5]);
        let n1 = live.recv().await.unwrap();
        assert_eq!(n1.messages.len(), 1);
        let n2 = live.recv().await.unwrap();
        assert_eq!(n2.head, 6);
        let offsets: Vec<_> = n2.messages.iter().map(|m| m.offset).collect();
        assert_eq!(offsets, vec![2, 3, 4, 5, 6]);
        assert_eq!(n2.messages[4].data.get(), "5");
        r.shutdown.cancel();
        r.task.await.unwrap();
    }

    #[tokio::test]
    async fn full_queue_is_refused_at_once() {
        let r = rig(1, 512);
        let gate = r.storage.hold_appends().await;
        let first = r.handle.submit(new_message("a", "1", None)).unwrap();
        r.storage.wait_for_appends_started(1).await;
        let second = r.handle.submit(new_message("a", "2", None)).unwrap();
        let third = r.handle.submit(new_message("a", "3", None));
        assert!(matches!(third, Err(Error::QueueFull)));
        drop(gate);
        assert_eq!(first.await.unwrap().unwrap().offset, 1);
        assert_eq!(second.await.unwrap().unwrap().offset, 2);
        r.shutdown.cancel();
        r.task.await.unwrap();
        assert_eq!(r.storage.head("a"), 2);
    }

    #[tokio::test]
    async fn duplicates_answer_the_original_and_are_not_fanned_out() {
        let r = rig(16, 512);
        let a = ChannelName::new("a").unwrap();
        let mut live = r.hub.subscribe(&a);
        let one = r.handle.submit(new_message("a", "1", Some("k"))).unwrap();
        let one = one.await.unwrap().unwrap();
        let two = r.handle.submit(new_message("a", "2", Some("k"))).unwrap();
        let two = two.await.unwrap().unwrap();
        assert!(two.duplicate);
        assert_eq!(
            (two.offset, two.published_at_ms),
            (one.offset, one.published_at_ms)
        );
        assert_eq!(live.recv().await.unwrap().head, 1);
        // The duplicate produced no notice.
        let more = tokio::time::timeout(Duration::from_millis(50), live.recv()).await;
        assert!(more.is_err());
        r.shutdown.cancel();
        r.task.await.unwrap();
    }

    /// A publish queued while this node was holder, whose batch finds the
    /// lease gone: `lease_lost` (`not_holder` is only for a forwarded
    /// request that reached a standby), and nothing is stored.
    #[tokio::test]
    async fn a_writer_without_a_writable_lease_answers_lease_lost() {
        let r = rig(16, 512);
        r.lease.set_standby(Some("http://holder:7"));
        let rx = r.handle.submit(new_message("a", "1", None)).unwrap();
        match rx.await.unwrap() {
            Err(Error::LeaseLost) => {}
            other => panic!("expected lease_lost, got {other:?}"),
        }
        assert_eq!(r.storage.head("a"), 0);
        r.shutdown.cancel();
        r.task.await.unwrap();
    }

    #[tokio::test]
    async fn a_fenced_out_write_is_reported_and_fails() {
        let r = rig(16, 512);
        r.storage.set_current_token(FencingToken(2));
        let rx = r.handle.submit(new_message("a", "1", None)).unwrap();
        assert!(matches!(rx.await.unwrap(), Err(Error::LeaseLost)));
        assert_eq!(r.lease.reported_lost(), vec![FencingToken(1)]);
        assert_eq!(r.storage.head("a"), 0);
        r.shutdown.cancel();
        r.task.await.unwrap();
    }

    #[tokio::test]
    async fn storage_failure_fails_the_batch() {
        let r = rig(16, 512);
        r.storage.fail_appends(true);
        let rx = r.handle.submit(new_message("a", "1", None)).unwrap();
        assert!(matches!(rx.await.unwrap(), Err(Error::StorageUnavailable)));
        r.shutdown.cancel();
        r.task.await.unwrap();
    }

    #[tokio::test]
    async fn drain_commits_what_is_queued_then_refuses() {
        let r = rig(16, 2);
        let gate = r.storage.hold_appends().await;
        let first = r.handle.submit(new_message("a", "1", None)).unwrap();
        r.storage.wait_for_appends_started(1).await;
        let queued: Vec<_> = (2..=5)
            .map(|i| {
                r.handle
                    .submit(new_message("a", &i.to_string(), None))
                    .unwrap()
            })
            .collect();
        r.shutdown.cancel();
        drop(gate);
        assert_eq!(first.await.unwrap().unwrap().offset, 1);
        for (i, rx) in queued.into_iter().enumerate() {
            assert_eq!(rx.await.unwrap().unwrap().offset, i as u64 + 2);
        }
        r.task.await.unwrap();
        assert!(matches!(
            r.handle.submit(new_message("a", "6", None)),
            Err(Error::Draining)
        ));
        // max_batch 2: the four queued requests took two transactions.
        assert_eq!(r.storage.batch_sizes(), vec![1, 2, 2]);
        assert_eq!(r.storage.head("a"), 5);
    }

    /// The path behind the test-only fault switch `ack_before_commit`,
    /// called directly (the switch itself is read from the environment
    /// once per process): it acknowledges before the append, and a failed
    /// append leaves the acknowledgements sent.
    #[cfg(feature = "fault-switches")]
    #[tokio::test]
    async fn ack_before_commit_acknowledges_predicted_offsets_even_when_the_append_fails() {
        let storage = MemoryStorage::new();
        storage.append_as_other_node("a", "0");
        storage.append_as_other_node("a", "1");
        let lease = FakeLease::holder(FencingToken(1));
        let (mut writer, _handle) =
            Writer::new(storage.clone(), lease.clone(), Hub::new(16), 16, 512);
        let held = lease.writable_lease().unwrap();
        let batch = |messages: Vec<NewMessage>| {
            let (replies, answers): (Vec<_>, Vec<_>) =
                messages.iter().map(|_| oneshot::channel()).unzip();
            (messages, replies, answers)
        };
        let offsets = |answers: Vec<oneshot::Receiver<Result<Appended>>>| {
            answers
                .into_iter()
                .map(|mut rx| rx.try_recv().unwrap().unwrap().offset)
                .collect::<Vec<_>>()
        };

        // Cache miss: heads read from storage (a: 2, b: 0).
        let (messages, replies, answers) = batch(vec![
            new_message("a", "2", None),
            new_message("b", "0", None),
            new_message("a", "3", None),
        ]);
        writer.ack_before_commit(&held, messages, replies).await;
        assert_eq!(offsets(answers), vec![3, 1, 4]);
        assert_eq!((storage.head("a"), storage.head("b")), (4, 1));

        // A failed append: acknowledged all the same, nothing stored.
        storage.fail_appends(true);
        let (messages, replies, answers) = batch(vec![new_message("a", "4", None)]);
        writer.ack_before_commit(&held, messages, replies).await;
        assert_eq!(offsets(answers), vec![5]);
        assert_eq!(storage.head("a"), 4);
        assert!(writer.predicted_heads.is_empty());
    }
}

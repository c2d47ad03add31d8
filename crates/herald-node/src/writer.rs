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
//! Except under the test-only fault switch `ack_before_commit`, which
//! breaks exactly that rule (`writer/fault.rs`).

mod fault;

use std::collections::HashMap;
use std::sync::Arc;

use herald_core::fault_switches::{self, FaultSwitch};
use herald_core::{Appended, ChannelName, Message, NewMessage};
use herald_storage::Storage;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::hub::{Hub, Notice};
use crate::metrics;
use crate::node_error::StorageFailure;
use crate::node_error::{NodeError, NodeResult};
use crate::role::LeaseView;

/// One publish request waiting for the writer: one message, or a batch
/// publish's messages, which are always committed in one transaction.
#[derive(Debug)]
pub struct PublishRequest {
    messages: Vec<NewMessage>,
    reply: Reply,
}

/// Where the outcome of a [`PublishRequest`] goes.
#[derive(Debug)]
pub enum Reply {
    /// A single publish: one outcome.
    One(oneshot::Sender<NodeResult<Appended>>),
    /// A batch publish: one outcome per message, in order.
    Batch(oneshot::Sender<NodeResult<Vec<Appended>>>),
}

impl Reply {
    /// Sends `error`.
    fn fail(self, error: NodeError) {
        match self {
            Self::One(tx) => {
                let _ = tx.send(Err(error));
            }
            Self::Batch(tx) => {
                let _ = tx.send(Err(error));
            }
        }
    }
}

/// The requests of one transaction: how many messages each has, in order,
/// and where its outcome goes.
pub(super) type Replies = Vec<(usize, Reply)>;

/// Answers every request of a batch from `outcomes` (one per message, in
/// batch order).
/// A dropped receiver means the client went away; what was committed
/// stays committed.
pub(super) fn answer(replies: Replies, outcomes: Vec<Appended>) {
    let mut outcomes = outcomes.into_iter();
    for (count, reply) in replies {
        match reply {
            // A single publish (the common case) gets its outcome as is,
            // without a vector of one.
            Reply::One(tx) => {
                if let Some(outcome) = outcomes.next() {
                    let _ = tx.send(Ok(outcome));
                }
            }
            Reply::Batch(tx) => {
                let _ = tx.send(Ok(outcomes.by_ref().take(count).collect()));
            }
        }
    }
}

/// Fails every request of a batch with the error `error` makes.
pub(super) fn fail_all(replies: Replies, error: impl Fn() -> NodeError) {
    for (_, reply) in replies {
        reply.fail(error());
    }
}

/// Takes the request that holds message `index` of the batch out of
/// `messages` and `replies`, and answers it `idempotency_key_reused` (for a
/// batch publish, naming its entry). `false` when `index` is outside the
/// batch.
fn refuse_request(
    messages: &mut Vec<NewMessage>,
    replies: &mut Replies,
    index: usize,
    error: impl Fn() -> NodeError,
) -> bool {
    let mut start = 0;
    for position in 0..replies.len() {
        let count = replies[position].0;
        if index < start + count {
            let (_, reply) = replies.remove(position);
            messages.drain(start..start + count);
            match reply {
                Reply::One(tx) => {
                    let _ = tx.send(Err(error()));
                }
                Reply::Batch(tx) => {
                    let _ = tx.send(Err(NodeError::InBatchEntry {
                        index: index - start,
                        error: Box::new(error()),
                    }));
                }
            }
            return true;
        }
        start += count;
    }
    false
}

/// The handlers' end of the writer's queue.
#[derive(Debug, Clone)]
pub struct WriterHandle {
    tx: mpsc::Sender<PublishRequest>,
}

impl WriterHandle {
    /// Queues `message` without waiting; the receiver yields the outcome
    /// once the writer has committed (or failed) its batch.
    ///
    /// # Errors
    /// [`NodeError::QueueFull`] when the queue is full, [`NodeError::Draining`]
    /// once the writer has closed its queue.
    pub fn submit(
        &self,
        message: NewMessage,
    ) -> NodeResult<oneshot::Receiver<NodeResult<Appended>>> {
        let (reply, rx) = oneshot::channel();
        self.queue(vec![message], Reply::One(reply))?;
        Ok(rx)
    }

    /// Queues a batch publish's `messages` (at least one) without waiting;
    /// the writer commits them all in one transaction, never split, and the
    /// receiver yields one outcome per message, in order, or one error for
    /// all (then nothing of them was stored).
    ///
    /// # Errors
    /// As [`WriterHandle::submit`].
    pub fn submit_batch(
        &self,
        messages: Vec<NewMessage>,
    ) -> NodeResult<oneshot::Receiver<NodeResult<Vec<Appended>>>> {
        let (reply, rx) = oneshot::channel();
        self.queue(messages, Reply::Batch(reply))?;
        Ok(rx)
    }

    fn queue(&self, messages: Vec<NewMessage>, reply: Reply) -> NodeResult<()> {
        match self.tx.try_send(PublishRequest { messages, reply }) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => Err(NodeError::QueueFull),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(NodeError::Draining),
        }
    }

    /// Requests waiting in the queue.
    #[cfg(any(test, feature = "testing"))]
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

/// The writer task's state.
pub struct Writer {
    storage: Arc<dyn Storage>,
    lease: Arc<dyn LeaseView>,
    hub: Arc<Hub>,
    rx: mpsc::Receiver<PublishRequest>,
    max_batch: usize,
    /// A request taken from the queue that did not fit in the previous
    /// batch: the first of the next one.
    held_over: Option<PublishRequest>,
    /// State of the test-only fault switch (`writer/fault.rs`); empty while
    /// it is off.
    fault: fault::FaultState,
}

impl Writer {
    /// A writer and its queue of `capacity` requests (at least 1); batches
    /// hold at most `max_batch` messages (at least 1).
    pub fn new(
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
            held_over: None,
            fault: fault::FaultState::default(),
        };
        (writer, WriterHandle { tx })
    }

    /// Commits batches until `shutdown` is cancelled (or every handle is
    /// gone), then closes the queue, so that new publishes get `draining`,
    /// and commits (or fails) what is still queued before returning.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            if let Some(first) = self.held_over.take() {
                self.commit_batch(first).await;
                continue;
            }
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
        loop {
            let first = match self.held_over.take() {
                Some(first) => first,
                None => match self.rx.recv().await {
                    Some(first) => first,
                    None => break,
                },
            };
            drained += 1;
            self.commit_batch(first).await;
        }
        metrics::queue_depth(0);
        tracing::debug!(batches = drained, "writer drained its queue");
    }

    /// Takes `first` and what else is queued, whole requests only, up to
    /// `max_batch` messages (a larger batch publish goes alone), and
    /// commits them in one transaction.
    async fn commit_batch(&mut self, first: PublishRequest) {
        let mut messages = Vec::with_capacity(self.max_batch.min(64));
        let mut replies: Replies = Vec::with_capacity(self.max_batch.min(64));
        replies.push((first.messages.len(), first.reply));
        messages.extend(first.messages);
        while messages.len() < self.max_batch {
            match self.rx.try_recv() {
                Ok(request) if messages.len() + request.messages.len() <= self.max_batch => {
                    replies.push((request.messages.len(), request.reply));
                    messages.extend(request.messages);
                }
                Ok(request) => {
                    self.held_over = Some(request);
                    break;
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
            fail_all(replies, || NodeError::LeaseLost);
            return;
        };
        if fault_switches::enabled(FaultSwitch::AckBeforeCommit) {
            // Test-only: acknowledge first, then append (`writer/fault.rs`).
            return self.ack_before_commit(&lease, messages, replies).await;
        }

        let mut outcome = self.storage.append(&lease, &messages).await;
        // A request that reuses an idempotency key for another message, or
        // publishes to a closed stream or a stream of bytes, rolled the
        // whole transaction back: answer it, and commit the others without
        // it (each round removes one request).
        loop {
            let (index, error): (usize, fn() -> NodeError) = match outcome {
                Err(herald_storage::Error::IdempotencyKeyReused { index }) => {
                    (index, || NodeError::IdempotencyKeyReused)
                }
                Err(herald_storage::Error::ChannelRefuses {
                    index,
                    refusal: herald_storage::Refusal::Closed,
                }) => (index, || NodeError::ChannelClosed),
                Err(herald_storage::Error::ChannelRefuses {
                    index,
                    refusal: herald_storage::Refusal::ContentType,
                }) => (index, || NodeError::ContentTypeMismatch),
                Err(herald_storage::Error::ChannelRefuses {
                    index,
                    refusal: herald_storage::Refusal::Expired,
                }) => (index, || NodeError::StreamExpired),
                _ => break,
            };
            if !refuse_request(&mut messages, &mut replies, index, error) {
                tracing::error!(index, "storage named a message outside the batch");
                fail_all(replies, || {
                    NodeError::Internal("storage named a message outside the batch".to_owned())
                });
                return;
            }
            if messages.is_empty() {
                return;
            }
            outcome = self.storage.append(&lease, &messages).await;
        }
        match outcome {
            Ok(appended) if appended.len() == messages.len() => {
                metrics::batch_committed(messages.len());
                self.fan_out(&messages, &appended);
                answer(replies, appended);
            }
            Ok(appended) => {
                tracing::error!(
                    token = lease.token.0,
                    sent = messages.len(),
                    returned = appended.len(),
                    "storage returned a result count different from the batch size"
                );
                fail_all(replies, || {
                    NodeError::Internal("storage answered a batch incompletely".to_owned())
                });
            }
            Err(herald_storage::Error::LeaseLost { name, token }) => {
                tracing::warn!(
                    lease = %name,
                    token = token.0,
                    messages = messages.len(),
                    "fenced write found the lease lost; batch failed"
                );
                self.lease.report_lease_lost(lease.token);
                fail_all(replies, || NodeError::LeaseLost);
            }
            Err(e) => {
                StorageFailure::new("append", None, e).log();
                fail_all(replies, || NodeError::StorageUnavailable);
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
                data: new.data.clone(),
                published_at_ms: outcome.published_at_ms,
                tags: new.tags.clone(),
            });
        }
        for (channel, mut committed) in by_channel {
            committed.sort_by_key(|m| m.offset);
            let head = committed.last().map_or(0, |m| m.offset);
            self.hub.publish(Notice {
                deleted: None,
                closed: false,
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

    pub(super) fn new_message(channel: &str, data: &str, key: Option<&str>) -> NewMessage {
        NewMessage {
            channel: ChannelName::new(channel).unwrap(),
            data: herald_core::Payload::Json(Arc::from(
                RawValue::from_string(data.to_owned()).unwrap(),
            )),
            idempotency_key: key.map(|k| herald_core::IdempotencyKey::new(k).unwrap()),
            tags: herald_core::Tags::default(),
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
        assert_eq!(n2.messages[4].data.to_json_text(), "5");
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
        assert!(matches!(third, Err(NodeError::QueueFull)));
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
        let two = r.handle.submit(new_message("a", "1", Some("k"))).unwrap();
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

    /// A request that reuses a key for another message is answered
    /// `idempotency_key_reused`; the other requests of its transaction are
    /// committed without it, and a batch publish is refused whole.
    #[tokio::test]
    async fn a_reused_key_refuses_its_request_only() {
        let r = rig(16, 512);
        let gate = r.storage.hold_appends().await;
        let first = r.handle.submit(new_message("a", "0", None)).unwrap();
        r.storage.wait_for_appends_started(1).await;
        let keyed = r.handle.submit(new_message("a", "1", Some("k"))).unwrap();
        let reused = r.handle.submit(new_message("a", "2", Some("k"))).unwrap();
        let batch = r
            .handle
            .submit_batch(vec![
                new_message("b", "1", None),
                new_message("a", "3", Some("k")),
            ])
            .unwrap();
        let retry = r.handle.submit(new_message("a", "1", Some("k"))).unwrap();
        drop(gate);
        assert_eq!(first.await.unwrap().unwrap().offset, 1);
        let keyed = keyed.await.unwrap().unwrap();
        assert_eq!((keyed.offset, keyed.duplicate), (2, false));
        assert!(matches!(
            reused.await.unwrap(),
            Err(NodeError::IdempotencyKeyReused)
        ));
        match batch.await.unwrap() {
            Err(NodeError::InBatchEntry { index: 1, error }) => {
                assert!(matches!(*error, NodeError::IdempotencyKeyReused));
            }
            other => panic!("expected messages[1] idempotency_key_reused, got {other:?}"),
        }
        let retry = retry.await.unwrap().unwrap();
        assert_eq!((retry.offset, retry.duplicate), (2, true));
        assert_eq!(r.storage.head("a"), 2);
        assert_eq!(r.storage.head("b"), 0, "nothing of the refused batch");
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
            Err(NodeError::LeaseLost) => {}
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
        assert!(matches!(rx.await.unwrap(), Err(NodeError::LeaseLost)));
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
        assert!(matches!(
            rx.await.unwrap(),
            Err(NodeError::StorageUnavailable)
        ));
        r.shutdown.cancel();
        r.task.await.unwrap();
    }

    /// A batch publish is never split across transactions: one that does
    /// not fit in the batch being formed waits for the next, and one larger
    /// than `max_batch` goes alone.
    #[tokio::test]
    async fn batch_requests_are_never_split() {
        let r = rig(16, 4);
        let gate = r.storage.hold_appends().await;
        let first = r.handle.submit(new_message("a", "0", None)).unwrap();
        r.storage.wait_for_appends_started(1).await;
        let batch = |n: usize| -> Vec<NewMessage> {
            (0..n)
                .map(|i| new_message("b", &i.to_string(), None))
                .collect()
        };
        let two = r.handle.submit_batch(batch(2)).unwrap();
        let three = r.handle.submit_batch(batch(3)).unwrap();
        let six = r.handle.submit_batch(batch(6)).unwrap();
        let one = r.handle.submit(new_message("a", "1", None)).unwrap();
        drop(gate);
        assert_eq!(first.await.unwrap().unwrap().offset, 1);
        let offsets = |v: Vec<Appended>| v.iter().map(|a| a.offset).collect::<Vec<_>>();
        assert_eq!(offsets(two.await.unwrap().unwrap()), [1, 2]);
        assert_eq!(offsets(three.await.unwrap().unwrap()), [3, 4, 5]);
        assert_eq!(offsets(six.await.unwrap().unwrap()), [6, 7, 8, 9, 10, 11]);
        assert_eq!(one.await.unwrap().unwrap().offset, 2);
        // In queue order: two (three does not fit after it: 2 + 3 > 4),
        // three (six does not fit after it), six alone (over max_batch),
        // then one.
        assert_eq!(r.storage.batch_sizes(), vec![1, 2, 3, 6, 1]);
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
            Err(NodeError::Draining)
        ));
        // max_batch 2: the four queued requests took two transactions.
        assert_eq!(r.storage.batch_sizes(), vec![1, 2, 2]);
        assert_eq!(r.storage.head("a"), 5);
    }
}

//! The node's one writer task: group commit of every holder-side write.
//!
//! Handlers hand a validated write to the writer over a bounded queue
//! ([`WriterHandle::submit`] and its siblings never wait: a full queue is
//! `queue_full`): a publish's message, a batch publish's messages, a
//! stream append (with its closure), or a stream's creation. The writer
//! takes one request, then whatever else is already queued up to
//! `max_batch` entries, and writes them in one fenced storage transaction
//! (`Storage::write`) under the lease it holds; a creation, which may copy
//! a whole fork, is a transaction of its own (`Storage::create_stream`),
//! still made here and in queue order. Only after the storage returned
//! (after the commit) does it fan the new messages out to live
//! subscribers ([`Writer::fan_out`], the one way the hub hears of this
//! node's writes) and answer each request. A request that its channel
//! refuses is answered alone and the rest commit: a stream append's
//! refusal is its outcome; a message's (a reused idempotency key, a
//! closed or expired stream, another kind of payload) rolls the
//! transaction back, and the writer writes the group again without that
//! request. On any other error nothing was committed and every request of
//! the batch gets the error: no write is ever acknowledged without being
//! stored.
//!
//! Except under the test-only fault switch `ack_before_commit`, which
//! breaks exactly that rule for publishes (`writer/fault.rs`).

mod fault;

use std::collections::HashMap;
use std::sync::Arc;

use herald_core::fault_switches::{self, FaultSwitch};
use herald_core::{
    Appended, ChannelName, Message, NewMessage, Offset, StreamAppend, StreamAppended, StreamCreate,
    StreamCreated, Tags, WriteOutcome, WriteRequest,
};
use herald_storage::Storage;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::hub::{Hub, Notice};
use crate::metrics;
use crate::node_error::StorageFailure;
use crate::node_error::{NodeError, NodeResult};
use crate::role::LeaseView;

/// One request waiting for the writer.
#[derive(Debug)]
pub enum Queued {
    /// Entries written in one transaction with the rest of their group: a
    /// publish's message, a batch publish's messages (never split), or one
    /// stream append.
    Write {
        /// The entries, in order.
        entries: Vec<WriteRequest>,
        /// Where the outcome goes.
        reply: Reply,
    },
    /// A stream's creation, in a transaction of its own.
    Create {
        /// What to create.
        create: Box<StreamCreate>,
        /// Where the outcome goes.
        reply: oneshot::Sender<NodeResult<StreamCreated>>,
    },
}

/// Where the outcome of a [`Queued::Write`] goes.
#[derive(Debug)]
pub enum Reply {
    /// A single publish: one outcome.
    One(oneshot::Sender<NodeResult<Appended>>),
    /// A batch publish: one outcome per message, in order.
    Batch(oneshot::Sender<NodeResult<Vec<Appended>>>),
    /// A stream append: its outcome (its refusals included).
    Stream(oneshot::Sender<NodeResult<StreamAppended>>),
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
            Self::Stream(tx) => {
                let _ = tx.send(Err(error));
            }
        }
    }
}

/// The requests of one transaction: how many entries each has, in order,
/// and where its outcome goes.
pub(super) type Replies = Vec<(usize, Reply)>;

/// The outcome that answers a request whose entry the storage answered
/// with the other kind: a broken storage.
fn mismatched() -> NodeError {
    tracing::error!("storage answered an entry with an outcome of another kind");
    NodeError::Internal("storage answered an entry with an outcome of another kind".to_owned())
}

/// Answers every request of a batch from `outcomes` (one per entry, in
/// batch order).
/// A dropped receiver means the client went away; what was committed
/// stays committed.
pub(super) fn answer(replies: Replies, outcomes: Vec<WriteOutcome>) {
    let mut outcomes = outcomes.into_iter();
    for (count, reply) in replies {
        match reply {
            // A single publish (the common case) gets its outcome as is,
            // without a vector of one.
            Reply::One(tx) => {
                let outcome = match outcomes.next() {
                    Some(WriteOutcome::Message(appended)) => Ok(appended),
                    Some(WriteOutcome::Stream(_)) => Err(mismatched()),
                    None => continue,
                };
                let _ = tx.send(outcome);
            }
            Reply::Batch(tx) => {
                let outcome = outcomes
                    .by_ref()
                    .take(count)
                    .map(|outcome| match outcome {
                        WriteOutcome::Message(appended) => Ok(appended),
                        WriteOutcome::Stream(_) => Err(mismatched()),
                    })
                    .collect();
                let _ = tx.send(outcome);
            }
            Reply::Stream(tx) => {
                let outcome = match outcomes.next() {
                    Some(WriteOutcome::Stream(appended)) => Ok(appended),
                    Some(WriteOutcome::Message(_)) => Err(mismatched()),
                    None => continue,
                };
                let _ = tx.send(outcome);
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

/// Takes the request that holds entry `index` of the batch out of
/// `entries` and `replies`, and answers it with `error` (for a batch
/// publish, naming its entry). `false` when `index` is outside the batch.
fn refuse_request(
    entries: &mut Vec<WriteRequest>,
    replies: &mut Replies,
    index: usize,
    error: impl Fn() -> NodeError,
) -> bool {
    let mut start = 0;
    for position in 0..replies.len() {
        let count = replies[position].0;
        if index < start + count {
            let (_, reply) = replies.remove(position);
            entries.drain(start..start + count);
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
                Reply::Stream(tx) => {
                    let _ = tx.send(Err(error()));
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
    tx: mpsc::Sender<Queued>,
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
        self.queue(vec![WriteRequest::Message(message)], Reply::One(reply))?;
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
        let entries = messages.into_iter().map(WriteRequest::Message).collect();
        self.queue(entries, Reply::Batch(reply))?;
        Ok(rx)
    }

    /// Queues a stream append (with its closure) without waiting; the
    /// writer commits it with the rest of its group, and the receiver
    /// yields its outcome: `Appended` or `Duplicate`, or the refusal its
    /// stream's guards answered (then it wrote nothing, and the rest of
    /// the group committed without it).
    ///
    /// # Errors
    /// As [`WriterHandle::submit`].
    pub fn submit_stream(
        &self,
        append: StreamAppend,
    ) -> NodeResult<oneshot::Receiver<NodeResult<StreamAppended>>> {
        let (reply, rx) = oneshot::channel();
        self.queue(vec![WriteRequest::Stream(append)], Reply::Stream(reply))?;
        Ok(rx)
    }

    /// Queues a stream's creation without waiting; the writer makes it in
    /// a transaction of its own, in queue order, and the receiver yields
    /// its outcome (see `Storage::create_stream`).
    ///
    /// # Errors
    /// As [`WriterHandle::submit`].
    pub fn submit_create(
        &self,
        create: StreamCreate,
    ) -> NodeResult<oneshot::Receiver<NodeResult<StreamCreated>>> {
        let (reply, rx) = oneshot::channel();
        self.send(Queued::Create {
            create: Box::new(create),
            reply,
        })?;
        Ok(rx)
    }

    fn queue(&self, entries: Vec<WriteRequest>, reply: Reply) -> NodeResult<()> {
        self.send(Queued::Write { entries, reply })
    }

    fn send(&self, queued: Queued) -> NodeResult<()> {
        match self.tx.try_send(queued) {
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
    rx: mpsc::Receiver<Queued>,
    max_batch: usize,
    /// A request taken from the queue that did not fit in the previous
    /// batch: the first of the next one.
    held_over: Option<Queued>,
    /// State of the test-only fault switch (`writer/fault.rs`); empty while
    /// it is off.
    fault: fault::FaultState,
}

impl Writer {
    /// A writer and its queue of `capacity` requests (at least 1); batches
    /// hold at most `max_batch` entries (at least 1).
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
    /// gone), then closes the queue, so that new writes get `draining`,
    /// and commits (or fails) what is still queued before returning.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            if let Some(first) = self.held_over.take() {
                self.commit(first).await;
                continue;
            }
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                first = self.rx.recv() => match first {
                    Some(first) => self.commit(first).await,
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
            self.commit(first).await;
        }
        metrics::queue_depth(0);
        tracing::debug!(batches = drained, "writer drained its queue");
    }

    /// Commits `first`: a creation alone, or a group that starts with it.
    async fn commit(&mut self, first: Queued) {
        match first {
            Queued::Write { entries, reply } => self.commit_batch(entries, reply).await,
            Queued::Create { create, reply } => {
                let outcome = self.create(&create).await;
                let _ = reply.send(outcome);
            }
        }
    }

    /// Creates the stream `create` describes, in a transaction of its own,
    /// and fans its initial messages out.
    async fn create(&mut self, create: &StreamCreate) -> NodeResult<StreamCreated> {
        metrics::queue_depth(self.rx.len());
        let Some(lease) = self.lease.writable_lease() else {
            return Err(NodeError::LeaseLost);
        };
        match self.storage.create_stream(&lease, create).await {
            Ok(created) => {
                if let StreamCreated::Created {
                    info,
                    published_at_ms,
                } = &created
                {
                    let count = create.messages.len() as Offset;
                    if count > 0 {
                        let first = info.head + 1 - count;
                        self.hub.publish(Notice {
                            deleted: None,
                            closed: info.closed,
                            channel: create.channel.clone(),
                            head: info.head,
                            messages: stream_messages(&create.messages, first, *published_at_ms),
                        });
                    }
                }
                Ok(created)
            }
            Err(herald_storage::Error::LeaseLost { name, token }) => {
                tracing::warn!(
                    lease = %name,
                    token = token.0,
                    "fenced stream creation found the lease lost"
                );
                self.lease.report_lease_lost(lease.token);
                Err(NodeError::LeaseLost)
            }
            Err(e) => Err(NodeError::Storage(StorageFailure::new(
                "create_stream",
                Some(&create.channel),
                e,
            ))),
        }
    }

    /// Takes `entries` (the first request's) and what else is queued,
    /// whole requests only, up to `max_batch` entries (a larger batch
    /// publish goes alone; a creation waits for the next round), and
    /// commits them in one transaction.
    async fn commit_batch(&mut self, first: Vec<WriteRequest>, reply: Reply) {
        let mut entries = Vec::with_capacity(self.max_batch.min(64));
        let mut replies: Replies = Vec::with_capacity(self.max_batch.min(64));
        replies.push((first.len(), reply));
        entries.extend(first);
        while entries.len() < self.max_batch {
            match self.rx.try_recv() {
                Ok(Queued::Write {
                    entries: more,
                    reply,
                }) if entries.len() + more.len() <= self.max_batch => {
                    replies.push((more.len(), reply));
                    entries.extend(more);
                }
                Ok(request) => {
                    self.held_over = Some(request);
                    break;
                }
                Err(_) => break,
            }
        }
        metrics::queue_depth(self.rx.len());

        // Every write reaches the writer only after its handler saw this
        // node holder; a lease that is not writable now was lost in between
        // (the safety deadline passed, the watchdog or a lost lease stopped
        // the node). `lease_lost` tells the client just that: nothing was
        // stored, retry on the new holder.
        let Some(lease) = self.lease.writable_lease() else {
            tracing::debug!(entries = entries.len(), "lease not writable: batch refused");
            fail_all(replies, || NodeError::LeaseLost);
            return;
        };
        if fault_switches::enabled(FaultSwitch::AckBeforeCommit)
            && entries
                .iter()
                .all(|e| matches!(e, WriteRequest::Message(_)))
        {
            // Test-only: acknowledge first, then append (`writer/fault.rs`);
            // publishes only.
            return self.ack_before_commit(&lease, entries, replies).await;
        }

        let mut outcome = self.storage.write(&lease, &entries).await;
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
            if !refuse_request(&mut entries, &mut replies, index, error) {
                tracing::error!(index, "storage named an entry outside the batch");
                fail_all(replies, || {
                    NodeError::Internal("storage named an entry outside the batch".to_owned())
                });
                return;
            }
            if entries.is_empty() {
                return;
            }
            outcome = self.storage.write(&lease, &entries).await;
        }
        match outcome {
            Ok(written) if written.len() == entries.len() => {
                metrics::batch_committed(entries.len());
                self.fan_out(&entries, &written);
                answer(replies, written);
            }
            Ok(written) => {
                tracing::error!(
                    token = lease.token.0,
                    sent = entries.len(),
                    returned = written.len(),
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
                    entries = entries.len(),
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

    /// Publishes the batch's new messages to the hub, one notice per
    /// channel, in offset order: the messages that are not duplicates, and
    /// the stream appends that wrote (a closure alone too, so that live
    /// readers see the end).
    fn fan_out(&self, entries: &[WriteRequest], written: &[WriteOutcome]) {
        let mut by_channel: HashMap<&ChannelName, (Offset, Vec<Message>, bool)> = HashMap::new();
        for (entry, outcome) in entries.iter().zip(written) {
            match (entry, outcome) {
                (WriteRequest::Message(new), WriteOutcome::Message(outcome)) => {
                    if outcome.duplicate {
                        continue;
                    }
                    let (head, messages, _) = by_channel.entry(&new.channel).or_default();
                    *head = (*head).max(outcome.offset);
                    messages.push(Message {
                        offset: outcome.offset,
                        data: new.data.clone(),
                        published_at_ms: outcome.published_at_ms,
                        tags: new.tags.clone(),
                    });
                }
                (
                    WriteRequest::Stream(append),
                    WriteOutcome::Stream(StreamAppended::Appended {
                        first,
                        head: after,
                        published_at_ms,
                        closed: now_closed,
                    }),
                ) => {
                    let (head, messages, closed) = by_channel.entry(&append.channel).or_default();
                    *head = (*head).max(*after);
                    // A close alone wakes the live readers too: they see the end.
                    *closed |= *now_closed;
                    messages.extend(stream_messages(&append.messages, *first, *published_at_ms));
                }
                _ => {}
            }
        }
        for (channel, (head, mut committed, closed)) in by_channel {
            committed.sort_by_key(|m| m.offset);
            self.hub.publish(Notice {
                deleted: None,
                closed,
                channel: channel.clone(),
                head,
                messages: committed,
            });
        }
    }
}

/// A stream's new `payloads` as the messages `first..` committed at
/// `published_at_ms` (streams carry no tags).
fn stream_messages(
    payloads: &[herald_core::Payload],
    first: Offset,
    published_at_ms: i64,
) -> Vec<Message> {
    payloads
        .iter()
        .zip(first..)
        .map(|(data, offset)| Message {
            offset,
            data: data.clone(),
            published_at_ms,
            tags: Tags::default(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use herald_core::FencingToken;
    use herald_storage::{MessageLog, StreamStore};
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

    /// Stream appends are group-committed with publishes: queued
    /// together, they are written in one transaction (one commit time),
    /// each refused append (a closed stream, a producer's sequence gap) is
    /// answered alone while the rest commits, a producer's retry is a
    /// duplicate, and the hub hears one notice per channel from the
    /// writer's one fan-out.
    #[tokio::test]
    async fn stream_appends_commit_in_the_group_and_refusals_fail_alone() {
        use herald_core::{
            Candidate, Payload, Producer, ProducerLimits, StreamConfig, StreamCreate,
        };
        use herald_storage::sqlite::{SqliteOptions, SqliteStorage};
        use herald_storage::LeaseStore;

        let dir = std::env::temp_dir().join(format!(
            "herald-writer-streams-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        let storage = Arc::new(
            SqliteStorage::open(&dir, SqliteOptions::default())
                .await
                .unwrap(),
        );
        let candidate = Candidate {
            lease_name: herald_core::DEFAULT_LEASE_NAME.to_owned(),
            node_id: "node-a".to_owned(),
            advertise_url: "http://node-a".to_owned(),
        };
        let lease = match storage
            .acquire(&candidate, Duration::from_secs(60))
            .await
            .unwrap()
        {
            herald_storage::Acquire::Acquired { lease, .. } => lease,
            other => panic!("expected the lease, got {other:?}"),
        };
        let view = FakeLease::holder(lease.token);
        let stream = |name: &str, closed: bool| StreamCreate {
            channel: ChannelName::new(name).unwrap(),
            config: StreamConfig {
                content_type: "text/plain".to_owned(),
                ttl_s: None,
                expires_at_ms: None,
            },
            closed,
            messages: Vec::new(),
            fork: None,
            may_convert: false,
        };
        for create in [stream("s", false), stream("shut", true)] {
            storage.create_stream(&lease, &create).await.unwrap();
        }
        let append = |name: &str, data: &[u8], seq: Option<u64>| StreamAppend {
            channel: ChannelName::new(name).unwrap(),
            content_type: Some("text/plain".to_owned()),
            messages: vec![Payload::Bytes(Arc::from(data))],
            producer: seq.map(|seq| Producer {
                id: "p".to_owned(),
                epoch: 0,
                seq,
            }),
            stream_seq: None,
            close: false,
            producer_limits: ProducerLimits::default(),
        };
        let hub = Hub::new(16);
        let (writer, handle) = Writer::new(storage.clone(), view, hub.clone(), 16, 512);
        let mut live_s = hub.subscribe(&ChannelName::new("s").unwrap());
        let mut live_a = hub.subscribe(&ChannelName::new("a").unwrap());
        // Queued before the writer runs: one group.
        let published = handle.submit(new_message("a", "1", None)).unwrap();
        let first = handle.submit_stream(append("s", b"x", Some(0))).unwrap();
        let closed = handle.submit_stream(append("shut", b"y", None)).unwrap();
        let gap = handle.submit_stream(append("s", b"z", Some(5))).unwrap();
        let next = handle.submit_stream(append("s", b"w", Some(1))).unwrap();
        let retry = handle.submit_stream(append("s", b"x", Some(0))).unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(writer.run(shutdown.clone()));

        let published = published.await.unwrap().unwrap();
        assert_eq!((published.offset, published.duplicate), (1, false));
        let at = published.published_at_ms;
        assert_eq!(
            first.await.unwrap().unwrap(),
            StreamAppended::Appended {
                first: 1,
                head: 1,
                published_at_ms: at,
                closed: false
            }
        );
        assert_eq!(
            closed.await.unwrap().unwrap(),
            StreamAppended::Closed { head: 0 }
        );
        assert_eq!(
            gap.await.unwrap().unwrap(),
            StreamAppended::SeqGap {
                expected: 1,
                received: 5
            }
        );
        assert_eq!(
            next.await.unwrap().unwrap(),
            StreamAppended::Appended {
                first: 2,
                head: 2,
                published_at_ms: at,
                closed: false
            }
        );
        assert_eq!(
            retry.await.unwrap().unwrap(),
            StreamAppended::Duplicate {
                head: 2,
                last_seq: 1,
                closed: false
            }
        );
        let notice = live_s.recv().await.unwrap();
        assert_eq!(notice.head, 2);
        let data: Vec<_> = notice.messages.iter().map(|m| m.data.clone()).collect();
        assert_eq!(
            data,
            [
                Payload::Bytes(Arc::from(&b"x"[..])),
                Payload::Bytes(Arc::from(&b"w"[..]))
            ]
        );
        assert_eq!(live_a.recv().await.unwrap().head, 1);
        let page = storage
            .read(&ChannelName::new("shut").unwrap(), 0, 10)
            .await
            .unwrap();
        assert_eq!(page.head, 0, "nothing of the refused append");
        shutdown.cancel();
        task.await.unwrap();
        drop(storage);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

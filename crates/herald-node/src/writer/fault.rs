//! The writer's test-only fault switch `ack_before_commit`; what it breaks
//! is explained at [`FaultSwitch::AckBeforeCommit`]. `Writer::commit_batch`
//! calls [`Writer::ack_before_commit`] instead of appending when the switch
//! is on, which it never is without the cargo feature `fault-switches`
//! (`fault_switches::enabled` is then a constant `false`, and this code is
//! dead); nothing else of the writer knows of the switch.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use super::{answer, fail_all, Replies, Writer};
use crate::metrics;
use crate::node_error::NodeError;
use crate::node_error::StorageFailure;
use herald_core::fault_switches::FaultSwitch;
use herald_core::{Appended, ChannelName, Lease, NewMessage, Offset, WriteOutcome, WriteRequest};

/// The writer's state for its fault switch; empty while the switch is off.
#[derive(Debug, Default)]
pub(super) struct FaultState {
    /// The head each channel will have after the batches acknowledged so
    /// far.
    predicted_heads: HashMap<ChannelName, Offset>,
}

impl Writer {
    /// Under `ack_before_commit`, in place of the append of
    /// `Writer::commit_batch`: answers every request of the batch *before*
    /// appending it, with the offsets it predicts (each message new: the
    /// channel's head + 1, + 2, ...; published now on this node's clock),
    /// then appends. The head of a channel comes from
    /// [`FaultState`]'s `predicted_heads`, or, when it has none, from the
    /// storage (a read of the channel with limit 0, which returns its
    /// head). After the append the cache holds the real heads; after a
    /// failed append it is cleared, and the answers already sent stay sent:
    /// that is the bug this switch injects (acknowledged, never stored; or
    /// acknowledged with a wrong offset, e.g. for a duplicate).
    pub(super) async fn ack_before_commit(
        &mut self,
        lease: &Lease,
        entries: Vec<WriteRequest>,
        replies: Replies,
    ) {
        let messages: Vec<&NewMessage> = entries
            .iter()
            .filter_map(|entry| match entry {
                WriteRequest::Message(message) => Some(message),
                WriteRequest::Stream(_) => None,
            })
            .collect();
        let published_at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let mut predicted = Vec::with_capacity(messages.len());
        for message in messages.iter().copied() {
            let head = match self.fault.predicted_heads.get(&message.channel) {
                Some(&head) => head,
                None => match self.storage.read(&message.channel, 0, 0).await {
                    Ok(page) => page.head,
                    Err(e) => {
                        StorageFailure::new("read", Some(&message.channel), e).log();
                        self.fault.predicted_heads.clear();
                        fail_all(replies, || NodeError::StorageUnavailable);
                        return;
                    }
                },
            };
            self.fault
                .predicted_heads
                .insert(message.channel.clone(), head + 1);
            predicted.push(WriteOutcome::Message(Appended {
                channel: message.channel.clone(),
                offset: head + 1,
                published_at_ms,
                duplicate: false,
            }));
        }
        answer(replies, predicted);
        match self.storage.write(lease, &entries).await {
            Ok(written) if written.len() == entries.len() => {
                metrics::batch_committed(entries.len());
                self.fan_out(&entries, &written);
                // The real heads: the largest new offset of each channel;
                // a channel that got only duplicates is read again.
                for message in &messages {
                    self.fault.predicted_heads.remove(&message.channel);
                }
                let appended = written.iter().filter_map(|outcome| match outcome {
                    WriteOutcome::Message(appended) => Some(appended),
                    WriteOutcome::Stream(_) => None,
                });
                for outcome in appended.filter(|a| !a.duplicate) {
                    let head = self
                        .fault
                        .predicted_heads
                        .entry(outcome.channel.clone())
                        .or_default();
                    *head = (*head).max(outcome.offset);
                }
            }
            outcome => {
                self.fault.predicted_heads.clear();
                match outcome {
                    Err(e) => {
                        if matches!(e, herald_storage::Error::LeaseLost { .. }) {
                            self.lease.report_lease_lost(lease.token);
                        }
                        StorageFailure::new("append", None, e).log();
                    }
                    Ok(written) => tracing::error!(
                        token = lease.token.0,
                        sent = entries.len(),
                        returned = written.len(),
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
}

#[cfg(test)]
mod tests {
    use herald_core::FencingToken;

    use super::*;
    use crate::hub::Hub;
    use crate::node_error::NodeResult;
    use crate::role::LeaseView;
    use crate::testing::{FakeLease, MemoryStorage};
    use crate::writer::tests::new_message;
    use crate::writer::Reply;
    use tokio::sync::oneshot;

    /// The path behind the switch, called directly (the switch itself is
    /// read from the environment once per process): it acknowledges before
    /// the append, and a failed append leaves the acknowledgements sent.
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
            let (replies, answers): (Replies, Vec<_>) = messages
                .iter()
                .map(|_| {
                    let (tx, rx) = oneshot::channel();
                    ((1, Reply::One(tx)), rx)
                })
                .unzip();
            let entries: Vec<WriteRequest> =
                messages.into_iter().map(WriteRequest::Message).collect();
            (entries, replies, answers)
        };
        let offsets = |answers: Vec<oneshot::Receiver<NodeResult<Appended>>>| {
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
        assert!(writer.fault.predicted_heads.is_empty());
    }
}

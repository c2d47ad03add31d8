//! The task that follows one subscription and queues its publication
//! pushes, encoded for the connection.

use std::sync::Arc;

use herald_node::subscription::{Item, Subscription};

use crate::centrifugo::codec::Encoded;
use crate::centrifugo::codec::Encoding;
use crate::centrifugo::codes;
use crate::centrifugo::fossil_delta::FossilDelta;
use crate::centrifugo::mailbox::{Out, Push, QueueBudget};
use crate::centrifugo::replies::{publication_push, Publication};
use crate::centrifugo::tags_filter::FilterNode;

/// How a subscription hands its publications out: only those its tags
/// `filter` passes; as Fossil deltas when `delta` is on.
#[derive(Debug, Default)]
pub(super) struct Follow {
    pub(super) filter: Option<Arc<FilterNode>>,
    pub(super) delta: Option<FossilDelta>,
}

/// Follows one subscription: queues a push per publication (encoded
/// in `encoding`), in offset order, until the session drops it (the
/// task is aborted), the storage fails with an error that is not transient (3004, the client
/// reconnects and recovers), or `queue` refuses a push that would take
/// it past its byte budget (the session closes with 3008 "slow", the
/// client reconnects and recovers). When retention trimmed messages this
/// subscriber had not got yet, or the channel was deleted, the session
/// ends with 3010 "insufficient state": the client reconnects and its
/// recovery answers `recovered: false`, never a silent gap.
pub(super) async fn follow(
    mut live: Subscription,
    generation: u64,
    out: tokio::sync::mpsc::Sender<Out>,
    how: Follow,
    encoding: Encoding,
    queue: Arc<QueueBudget>,
) {
    let Follow { filter, mut delta } = how;
    let channel = live.channel().clone();
    loop {
        match live.next_item().await {
            Ok(Some(
                Item::Truncated { .. }
                | Item::Withheld { .. }
                | Item::Deleted { .. }
                | Item::Closed { .. },
            )) => {
                let _ = out.send(Out::End(codes::INSUFFICIENT_STATE)).await;
                return;
            }
            Ok(Some(Item::Message(message)))
                if filter.as_ref().is_some_and(|f| !f.matches(&message.tags)) => {}
            Ok(Some(Item::Message(message))) => {
                let push = match delta.as_mut() {
                    Some(delta) => delta.push(&message).await,
                    None => publication_push(channel.as_str(), Publication::from(&message)),
                };
                let encoded = Encoded::of(encoding, &push);
                let queued_bytes = encoded.len();
                if !queue.admit(queued_bytes) {
                    tracing::debug!(channel = %channel, "the connection's queue is over its byte budget: a slow consumer");
                    return;
                }
                let push = Out::Push(Box::new(Push {
                    channel: channel.clone(),
                    generation,
                    encoded,
                    queued_bytes,
                }));
                if out.send(push).await.is_err() {
                    return;
                }
            }
            Ok(None) => {
                let _ = out.send(Out::End(codes::SHUTDOWN)).await;
                return;
            }
            Err(e) => {
                e.log();
                let _ = out.send(Out::End(codes::SERVER_ERROR)).await;
                return;
            }
        }
    }
}

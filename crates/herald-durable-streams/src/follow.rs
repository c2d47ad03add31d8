//! What the live reads (long-poll and SSE) share: a stream followed as a
//! [`Subscription`] of the node core to its channel, whose items are
//! gathered into the batches one answer or one `event: data` carries.
//!
//! The subscription holds the algorithm (history after the offset, then the
//! hub's notices, gap-free, aware of truncation, deletion and closure;
//! storage reads that fail transiently are waited out): a follower reads
//! the storage only for what a notice did not carry, never once per notice
//! per follower. The stream's properties (closed, still there) come from
//! the read that opened the stream, from the notices (`Notice::closed`),
//! and from the follower's caller, which looks at the stream from time to
//! time (`sse.rs`, every `long_poll_timeout`).

use herald_core::{Message, Offset, StreamInfo};
use herald_node::node_error::NodeResult;
use herald_node::subscription::{Item, StartAt, Subscription};

use crate::state::StreamsState;
use herald_http::error::Result;

/// A batch stops taking messages once their bytes reach this (1 MiB), as a
/// catch-up chunk does (`chunk.rs`); it always holds at least one whole
/// message.
const BATCH_BYTES: usize = 1024 * 1024;

/// The label of Durable Streams followers in `herald_subscribers`.
const TRANSPORT: &str = "durable_streams";

/// How a followed stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Closed, and every message up to its last was handed out.
    Closed,
    /// Deleted (or expired, which deletes it).
    Deleted,
    /// Messages the follower had not got yet were removed (retention, a
    /// deletion): it must read again from its offset (`410`).
    Truncated {
        /// The stream's earliest offset now.
        earliest: Offset,
    },
    /// The live feed ended (the node stops).
    Stopped,
}

/// What [`Follower::next_batch`] hands out.
#[derive(Debug)]
pub(crate) struct Batch {
    /// The messages after the previous batch, in offset order (may be
    /// empty).
    pub(crate) messages: Vec<Message>,
    /// The offset a next read continues after: the last message's.
    pub(crate) next: Offset,
    /// Whether `next` reached the stream's head as the follower knows it.
    pub(crate) up_to_date: bool,
    /// Set when the stream ended after `messages`; nothing follows.
    pub(crate) end: Option<End>,
}

/// One live reader of a stream.
pub(crate) struct Follower {
    sub: Subscription,
    /// The offset of the last message handed out (or gathered).
    next: Offset,
    /// Messages gathered for the next batch; kept here so that a
    /// cancelled [`Follower::next_batch`] loses none.
    gathered: Vec<Message>,
    /// Their bytes.
    bytes: usize,
    /// An end that came after gathered messages, handed out alone next.
    end: Option<End>,
    /// The offset of the last batch handed out up to date: an idle stream
    /// is announced once.
    told_up_to_date: Option<Offset>,
    /// Set once an end was handed out.
    ended: bool,
}

impl Follower {
    /// Follows `info`'s stream after `after` (an offset within it, see
    /// `chunk::start`): subscribes to its channel, which reads the first
    /// page of what is stored after `after` (a transient read failure is
    /// waited out later, in [`Follower::next_batch`]).
    ///
    /// # Errors
    /// [`herald_http::error::Error::StorageUnavailable`] when that read fails
    /// with an error that is not transient.
    pub(crate) async fn start(
        state: &StreamsState,
        info: &StreamInfo,
        after: Offset,
    ) -> Result<Self> {
        let shared = &state.shared;
        let mut sub = Subscription::start_paged(
            shared.node.storage().clone(),
            shared.node.hub(),
            info.channel.clone(),
            StartAt::After(after),
            TRANSPORT,
            shared.settings.read_page_messages(),
        )
        .await?;
        sub.end_at_closure(info.closed.then_some(info.head));
        Ok(Self {
            sub,
            next: after,
            gathered: Vec::new(),
            bytes: 0,
            end: None,
            told_up_to_date: None,
            ended: false,
        })
    }

    /// Tells the follower that the stream is closed at `head`, as its
    /// properties read now show (see [`Subscription::closed_at`]).
    pub(crate) fn closed_at(&mut self, head: Offset) {
        self.sub.closed_at(head);
    }

    /// The number of the stream's channel's latest deletion before the
    /// follower began, for an `ETag`.
    pub(crate) fn deletion(&self) -> u64 {
        self.sub.deletion()
    }

    /// The next batch: the messages that are there without waiting for a
    /// new one, up to [`BATCH_BYTES`]; or, when there are none and the
    /// follower is at the head, an empty batch `up_to_date` (once per
    /// offset); or the end. Waits for a message to be committed, and while
    /// a storage read fails transiently, for the storage to answer again.
    /// After a batch with an `end`, waits forever.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: what was gathered before a cancellation stays gathered
    /// ([`Subscription::next_item`] is cancel safe, and the follower's own
    /// state changes only after an await completed).
    ///
    /// # Errors
    /// [`herald_node::node_error::NodeError::Storage`] when a storage read failed with
    /// an error that is not transient.
    pub(crate) async fn next_batch(&mut self) -> NodeResult<Batch> {
        if self.ended {
            return std::future::pending().await;
        }
        loop {
            if self.gathered.is_empty() {
                if let Some(end) = self.end.take() {
                    return Ok(self.take(Some(end), false));
                }
            }
            if self.bytes >= BATCH_BYTES || self.end.is_some() {
                let up_to_date = self.end.is_none() && self.sub.waits_for_notice();
                return Ok(self.take(None, up_to_date));
            }
            let item = match self.sub.next_item_ready().await? {
                Some(item) => item,
                // Everything known was taken: the batch reaches the head.
                None if !self.gathered.is_empty() || self.told_up_to_date != Some(self.next) => {
                    return Ok(self.take(None, true));
                }
                None => match self.sub.next_item().await? {
                    Some(item) => item,
                    None => {
                        self.end = Some(End::Stopped);
                        continue;
                    }
                },
            };
            let end = match item {
                Item::Message(message) => {
                    self.bytes += message.data.len();
                    self.next = message.offset;
                    self.gathered.push(message);
                    continue;
                }
                // The end of the messages gathered: handed out with them.
                Item::Closed { .. } => {
                    let mut batch = self.take(None, true);
                    self.ended = true;
                    batch.end = Some(End::Closed);
                    return Ok(batch);
                }
                Item::Deleted { .. } => End::Deleted,
                Item::Truncated { earliest, .. } => End::Truncated { earliest },
                // Never for a subscription started after an offset; as a
                // gap if it ever came.
                Item::Withheld { head, .. } => End::Truncated { earliest: head + 1 },
            };
            // After the messages gathered, if any.
            self.end = Some(end);
        }
    }

    /// The gathered messages as a batch, `up_to_date` or not, ending
    /// with `end`.
    fn take(&mut self, end: Option<End>, up_to_date: bool) -> Batch {
        if up_to_date {
            self.told_up_to_date = Some(self.next);
        }
        if end.is_some() {
            self.ended = true;
        }
        self.bytes = 0;
        Batch {
            messages: std::mem::take(&mut self.gathered),
            next: self.next,
            up_to_date,
            end,
        }
    }
}

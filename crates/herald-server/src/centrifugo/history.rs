//! `history` for the client protocol and the server API, with
//! Centrifugo's meaning of its parameters (Centrifugo's documentation,
//! "History and recovery"):
//! - `limit`: 0 asks only for the stream position (`offset`, `epoch`);
//!   a negative limit asks for as many as allowed, here
//!   [`MAX_HISTORY_LIMIT`]; larger limits are cut to it;
//! - `since {offset, epoch}`: only publications after `offset` (before it
//!   with `reverse`); an epoch that is not the channel's, an offset beyond
//!   the head, or publications after `offset` that the storage no longer
//!   holds give error 112 "unrecoverable position";
//! - `reverse`: newest first.
//!
//! An answer also holds at most [`Budget::bytes`] of publications (at
//! least one): fewer than `limit` when they are large. The storage is
//! read in pages of [`Budget::page`] messages, so that no read holds more
//! than the budget either. A client pages on with `since`.

use herald_core::{ChannelName, Message, Offset};
use herald_storage::Storage;

use super::codes::ReplyError;
use super::protocol::StreamPosition;

/// Most publications one history answer holds.
pub(crate) const MAX_HISTORY_LIMIT: usize = 1000;

/// What one answer may hold, and how many messages one storage read asks
/// for so that it holds no more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    /// Bytes of publications (see [`cost`]).
    pub(crate) bytes: usize,
    /// Messages per storage read: the budget over `max_message_bytes`, at
    /// least 1.
    pub(crate) page: usize,
}

impl Budget {
    /// `bytes` for messages of at most `max_message_bytes`.
    pub(crate) fn new(bytes: usize, max_message_bytes: usize) -> Self {
        Self {
            bytes,
            page: (bytes / max_message_bytes.max(1)).max(1),
        }
    }

    /// The budget of one answer (a `history` reply, a subscribe's or
    /// connect's recovery) on this node: `read_budget_bytes` (8 MiB by
    /// default).
    pub(crate) fn of(settings: &herald_http::shared::Settings) -> Self {
        Self::new(settings.read_budget_bytes, settings.max_message_bytes)
    }
}

/// The bytes a message counts for against a [`Budget`]: its data, its
/// tags and the fields around them.
pub(crate) fn cost(m: &Message) -> usize {
    m.data.len() + m.tags.byte_len() + 64
}

/// A history answer: publications, and the stream position.
#[derive(Debug)]
pub(crate) struct History {
    /// The publications, oldest first (newest first with `reverse`).
    pub(crate) publications: Vec<Message>,
    /// The channel's epoch.
    pub(crate) epoch: String,
    /// The channel's head offset.
    pub(crate) offset: Offset,
}

/// The parameters of a history request.
#[derive(Debug, Default)]
pub(crate) struct HistoryQuery {
    /// See the module docs.
    pub(crate) limit: i64,
    /// See the module docs.
    pub(crate) since: Option<StreamPosition>,
    /// See the module docs.
    pub(crate) reverse: bool,
}

/// Reads the history of `channel` (epoch `epoch`) as `query` asks, within
/// `budget`.
///
/// # Errors
/// 112 for an unrecoverable `since`; 100 when the storage fails (logged).
pub(crate) async fn history(
    storage: &dyn Storage,
    channel: &ChannelName,
    epoch: String,
    query: &HistoryQuery,
    budget: Budget,
) -> Result<History, ReplyError> {
    let limit = match usize::try_from(query.limit) {
        Ok(limit) => limit.min(MAX_HISTORY_LIMIT),
        Err(_) => MAX_HISTORY_LIMIT,
    };
    let read = |after: Offset, limit: usize| async move {
        storage.read(channel, after, limit).await.map_err(|e| {
            herald_node::node_error::StorageFailure::new("read", Some(channel), e).log();
            ReplyError::internal()
        })
    };
    if let Some(since) = &query.since {
        if since.epoch != epoch {
            return Err(ReplyError::unrecoverable_position());
        }
    }
    if limit == 0 {
        let page = read(Offset::MAX, 1).await?;
        return Ok(History {
            publications: Vec::new(),
            epoch,
            offset: page.head,
        });
    }
    // Adds `m` to `out` unless the budget is spent (the first always
    // goes in); `false` once it is.
    let mut bytes = 0usize;
    let mut keep = |out: &mut Vec<Message>, m: Message| {
        let c = cost(&m);
        if !out.is_empty() && bytes + c > budget.bytes {
            return false;
        }
        bytes += c;
        out.push(m);
        true
    };
    let mut publications = Vec::new();
    let head;
    if query.reverse {
        // The newest `limit` before `since.offset` (before the head + 1
        // without it): windows of a page each, read in offset order from
        // the newest down, each turned round.
        head = read(Offset::MAX, 1).await?.head;
        let end = query.since.as_ref().map_or(head + 1, |s| s.offset);
        if query.since.is_some() && end > head + 1 {
            return Err(ReplyError::unrecoverable_position());
        }
        let mut top = end.saturating_sub(1);
        'windows: while top > 0 && publications.len() < limit {
            let want = (limit - publications.len()).min(budget.page);
            let bottom = top.saturating_sub(want as Offset);
            let page = read(bottom, want).await?;
            let earliest = page.earliest;
            for m in page.messages.into_iter().rev().filter(|m| m.offset <= top) {
                if !keep(&mut publications, m) {
                    break 'windows;
                }
            }
            if bottom < earliest {
                break;
            }
            top = bottom;
        }
    } else {
        let mut after = query.since.as_ref().map_or(0, |s| s.offset);
        let first = read(after, limit.min(budget.page)).await?;
        if let Some(since) = &query.since {
            let gap = first
                .messages
                .first()
                .is_some_and(|m| m.offset != since.offset + 1)
                || (first.messages.is_empty() && first.head != since.offset);
            if since.offset > first.head || gap {
                return Err(ReplyError::unrecoverable_position());
            }
        }
        head = first.head;
        let mut page = first;
        'pages: loop {
            let asked = (limit - publications.len()).min(budget.page);
            let got = page.messages.len();
            for m in page.messages {
                // Pages follow one another with no gap (a trim between
                // two reads ends the answer where the gap starts).
                if !publications.is_empty() && m.offset != after + 1 {
                    break 'pages;
                }
                after = m.offset;
                if !keep(&mut publications, m) {
                    break 'pages;
                }
            }
            if got < asked || publications.len() >= limit {
                break;
            }
            let want = (limit - publications.len()).min(budget.page);
            page = read(after, want).await?;
        }
    }
    Ok(History {
        publications,
        epoch,
        offset: head,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_node::testing::MemoryStorage;

    /// 50 messages of 1000 bytes (1066 each against a budget) in `news:b`.
    fn channel_of_50() -> (std::sync::Arc<MemoryStorage>, ChannelName) {
        let storage = MemoryStorage::new();
        let data = format!("\"{}\"", "x".repeat(998));
        for _ in 0..50 {
            storage.append_as_other_node("news:b", &data);
        }
        (storage, ChannelName::new("news:b").unwrap())
    }

    fn offsets(h: &History) -> Vec<Offset> {
        h.publications.iter().map(|m| m.offset).collect()
    }

    #[tokio::test]
    async fn an_answer_holds_at_most_its_budget() {
        let (storage, channel) = channel_of_50();
        // 9 messages fit in 10 000 bytes; reads ask for 10 at most.
        let budget = Budget::new(10_000, 1_000);
        assert_eq!(budget.page, 10);
        let ask = |limit, since: Option<Offset>, reverse| HistoryQuery {
            limit,
            since: since.map(|offset| StreamPosition {
                offset,
                epoch: "e".to_owned(),
            }),
            reverse,
        };
        let read = |query: HistoryQuery, budget: Budget| {
            let storage = storage.clone();
            let channel = channel.clone();
            async move {
                history(&*storage, &channel, "e".to_owned(), &query, budget)
                    .await
                    .unwrap()
            }
        };
        let h = read(ask(100, None, false), budget).await;
        assert_eq!(offsets(&h), (1..=9).collect::<Vec<_>>());
        assert_eq!(h.offset, 50);
        let h = read(ask(100, Some(20), false), budget).await;
        assert_eq!(offsets(&h), (21..=29).collect::<Vec<_>>());
        let h = read(ask(-1, None, true), budget).await;
        assert_eq!(offsets(&h), (42..=50).rev().collect::<Vec<_>>());
        let h = read(ask(100, Some(30), true), budget).await;
        assert_eq!(offsets(&h), (21..=29).rev().collect::<Vec<_>>());
        // A message larger than the budget is still answered, alone.
        let h = read(ask(5, None, false), Budget::new(10, 1_000)).await;
        assert_eq!(offsets(&h), vec![1]);
        // Within a larger budget, the pages follow one another.
        let h = read(ask(45, Some(2), false), Budget::new(1 << 20, 100_000)).await;
        assert_eq!(offsets(&h), (3..=47).collect::<Vec<_>>());
        let h = read(ask(45, None, true), Budget::new(1 << 20, 100_000)).await;
        assert_eq!(offsets(&h), (6..=50).rev().collect::<Vec<_>>());
        assert_eq!(Budget::new(1 << 20, 100_000).page, 10);
    }
}

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

use herald_core::{ChannelName, Message, Offset};
use herald_storage::Storage;

use super::codes::ReplyError;
use super::protocol::StreamPosition;

/// Most publications one history answer holds.
pub(crate) const MAX_HISTORY_LIMIT: usize = 1000;

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

/// Reads the history of `channel` (epoch `epoch`) as `query` asks.
///
/// # Errors
/// 112 for an unrecoverable `since`; 100 when the storage fails (logged).
pub(crate) async fn history(
    storage: &dyn Storage,
    channel: &ChannelName,
    epoch: String,
    query: &HistoryQuery,
) -> Result<History, ReplyError> {
    let limit = match usize::try_from(query.limit) {
        Ok(limit) => limit.min(MAX_HISTORY_LIMIT),
        Err(_) => MAX_HISTORY_LIMIT,
    };
    let read = |after: Offset, limit: usize| async move {
        storage.read(channel, after, limit).await.map_err(|e| {
            crate::StorageFailure::new("read", Some(channel), e).log();
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
    let (page, publications) = match (&query.since, query.reverse) {
        (None, false) => {
            let page = read(0, limit).await?;
            let publications = page.messages.clone();
            (page, publications)
        }
        (Some(since), false) => {
            let page = read(since.offset, limit).await?;
            let gap = page
                .messages
                .first()
                .is_some_and(|m| m.offset != since.offset + 1)
                || (page.messages.is_empty() && page.head != since.offset);
            if since.offset > page.head || gap {
                return Err(ReplyError::unrecoverable_position());
            }
            let publications = page.messages.clone();
            (page, publications)
        }
        (since, true) => {
            // The newest `limit` before `since.offset` (before the head + 1
            // without it): read them in offset order, then turn them round.
            let head = read(Offset::MAX, 1).await?.head;
            let end = since.as_ref().map_or(head + 1, |s| s.offset);
            if since.is_some() && end > head + 1 {
                return Err(ReplyError::unrecoverable_position());
            }
            let before = end.saturating_sub(1);
            let page = read(before.saturating_sub(limit as Offset), limit).await?;
            let mut publications: Vec<Message> = page
                .messages
                .iter()
                .filter(|m| m.offset < end)
                .cloned()
                .collect();
            publications.reverse();
            (page, publications)
        }
    };
    Ok(History {
        publications,
        epoch,
        offset: page.head,
    })
}

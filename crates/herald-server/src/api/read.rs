//! `GET /v1/channels/{channel}/messages` and `GET /v1/channels`.

use axum::extract::State;
use axum::Json;
use herald_core::{ChannelName, Message, Offset};
use serde::Serialize;

use super::state::ApiState;
use herald_http::auth_extract::Caller;
use herald_http::error::{Error, Result};
use herald_http::extract::{ChannelPath, FromQuery, QueryParams, ValidQuery};
use herald_node::node_error::StorageContext;

/// `limit` of a history read when the query has none, in messages.
pub(crate) const DEFAULT_LIMIT: usize = 100;
/// Largest `limit` of a history read, in messages.
pub(crate) const MAX_LIMIT: usize = 1000;

/// `?after=N&limit=M`.
#[derive(Debug)]
pub(crate) struct HistoryQuery {
    after: Option<Offset>,
    limit: Option<usize>,
}

impl FromQuery for HistoryQuery {
    fn from_query(params: &QueryParams) -> Result<Self> {
        Ok(Self {
            after: params.integer("after", 0, Offset::MAX)?,
            limit: params
                .integer("limit", 1, MAX_LIMIT as u64)?
                .map(|n| n as usize),
        })
    }
}

/// One page of a channel's history.
#[derive(Debug, Serialize)]
pub(crate) struct History {
    channel: ChannelName,
    head: Offset,
    /// The channel's oldest stored offset (`head + 1` when none is stored).
    earliest: Offset,
    /// True when `after` was below `earliest − 1`: messages after it were
    /// trimmed or deleted, and the page starts at `earliest`.
    truncated: bool,
    messages: Vec<Message>,
}

/// Up to `limit` messages after `after`, in offset order, with the head
/// and earliest offset: fewer when their bytes could pass
/// `read_budget_bytes` (each storage read asks for at most as many
/// messages of `max_message_bytes` as fit in what is left of the budget,
/// and the page ends before a message that would pass it, at least one
/// message); the reader continues after the last offset while it is
/// below `head`. `409 offset_beyond_head` when `after` is
/// beyond the head. An `after` below `earliest − 1` is answered from `earliest`
/// with `truncated: true`. Needs the right to read the channel's history
/// (`auth`).
pub(crate) async fn history(
    State(state): State<ApiState>,
    Caller(who): Caller,
    ChannelPath(channel): ChannelPath,
    ValidQuery(query): ValidQuery<HistoryQuery>,
) -> Result<Json<History>> {
    state.shared.auth().may_read_history(&who, &channel)?;
    let after = query.after.unwrap_or(0);
    let config = state.settings();
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    let storage = state.shared.node.storage();
    // Each read asks for no more messages of `max_message_bytes` than fit
    // in what is left of the budget, so the page never holds more.
    let fits = |bytes: usize| {
        config.read_budget_bytes.saturating_sub(bytes) / config.max_message_bytes.max(1)
    };
    let mut page = storage
        .read(&channel, after, limit.min(fits(0).max(1)))
        .await
        .during("read", Some(&channel))?;
    // The head comes from the same storage read as the page: never a
    // cached view that may lag behind the database.
    if after > page.head {
        return Err(Error::OffsetBeyondHead {
            after,
            head: page.head,
        });
    }
    let mut bytes: usize = page.messages.iter().map(|m| m.data.len()).sum();
    let mut full = page.messages.len() == limit.min(fits(0).max(1));
    // More while the last read was full, `limit` is not reached and
    // another message of the largest size fits in the budget.
    while full && page.messages.len() < limit && fits(bytes) > 0 {
        let Some(last) = page.messages.last().map(|m| m.offset) else {
            break;
        };
        let ask = (limit - page.messages.len()).min(fits(bytes));
        let more = storage
            .read(&channel, last, ask)
            .await
            .during("read", Some(&channel))?;
        if more.earliest > last + 1 {
            // Trimmed meanwhile: the reader goes on from `last` and is
            // told then.
            break;
        }
        full = more.messages.len() == ask;
        bytes += more.messages.iter().map(|m| m.data.len()).sum::<usize>();
        page.head = more.head;
        page.messages.extend(more.messages);
    }
    within_budget(&mut page.messages, config.read_budget_bytes);
    Ok(Json(History {
        channel,
        head: page.head,
        earliest: page.earliest,
        truncated: after.saturating_add(1) < page.earliest,
        messages: page.messages,
    }))
}

/// Cuts `messages` before the first one that takes their bytes past
/// `budget`, keeping at least one, so that a page read before the
/// messages were held to `max_message_bytes` still answers within the
/// budget.
pub(crate) fn within_budget(messages: &mut Vec<Message>, budget: usize) {
    let mut bytes = 0usize;
    let keep = messages
        .iter()
        .position(|m| {
            bytes = bytes.saturating_add(m.data.len());
            bytes > budget
        })
        .map_or(messages.len(), |at| at.max(1));
    messages.truncate(keep);
}

/// One channel of `GET /v1/channels`.
#[derive(Debug, Serialize)]
pub(crate) struct ChannelEntry {
    name: ChannelName,
    head: Offset,
    /// Oldest stored offset (`head + 1` when none is stored).
    earliest: Offset,
    /// Messages stored.
    messages: u64,
    /// Bytes of message data stored (the JSON texts' UTF-8 lengths).
    bytes: u64,
}

/// Every channel with its head, earliest offset and size.
#[derive(Debug, Serialize)]
pub(crate) struct Channels {
    channels: Vec<ChannelEntry>,
}

/// Lists the channels, ordered by name. Needs `admin` (`auth`).
pub(crate) async fn channels(
    State(state): State<ApiState>,
    Caller(who): Caller,
) -> Result<Json<Channels>> {
    state.shared.auth().may_admin(&who)?;
    let channels = state
        .shared
        .node
        .storage()
        .channel_stats()
        .await
        .during("channels", None)?
        .into_iter()
        .map(|c| ChannelEntry {
            name: c.name,
            head: c.head,
            earliest: c.earliest,
            messages: c.messages,
            bytes: c.bytes,
        })
        .collect();
    Ok(Json(Channels { channels }))
}

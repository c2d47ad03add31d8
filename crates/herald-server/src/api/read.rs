//! `GET /v1/channels/{channel}/messages` and `GET /v1/channels`.

use axum::extract::State;
use axum::Json;
use herald_core::{ChannelName, Message, Offset};
use serde::Serialize;

use super::state::ApiState;
use crate::auth_extract::Caller;
use crate::error::{Error, Result};
use crate::extract::{ChannelPath, FromQuery, QueryParams, ValidQuery};
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
/// and earliest offset; `409 offset_beyond_head` when `after` is beyond
/// the head. An `after` below `earliest − 1` is answered from `earliest`
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
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    let page = state
        .shared
        .node
        .storage()
        .read(&channel, after, limit)
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
    Ok(Json(History {
        channel,
        head: page.head,
        earliest: page.earliest,
        truncated: after.saturating_add(1) < page.earliest,
        messages: page.messages,
    }))
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

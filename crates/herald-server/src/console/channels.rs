//! `GET /v1/admin/channels?search=&after=&limit=`: one page of channels
//! for the console's list, by name in byte order, with each channel's
//! sizes, retention policy, subscribers across the cluster and last
//! publish time. Needs `admin`.

use axum::extract::State;
use axum::Json;
use herald_core::{format_rfc3339_ms, ChannelName, Offset};
use herald_storage::MAX_CHANNEL_PAGE;
use serde::Serialize;

use super::ConsoleState;
use herald_http::auth_extract::Caller;
use herald_http::error::{Error, Result};
use herald_http::extract::{FromQuery, QueryParams, ValidQuery};
use herald_node::node_error::StorageContext;

/// Channels per page when the query names no `limit`.
const DEFAULT_LIMIT: usize = 50;

/// Longest `search`, in bytes (a channel name's limit).
const MAX_SEARCH_BYTES: usize = 255;

/// `?search=<substring>&after=<name>&limit=<1..500>`.
#[derive(Debug)]
pub(crate) struct ChannelsQuery {
    search: String,
    after: Option<ChannelName>,
    limit: usize,
}

impl FromQuery for ChannelsQuery {
    fn from_query(params: &QueryParams) -> Result<Self> {
        let search = params.get("search")?.unwrap_or("").to_owned();
        if search.len() > MAX_SEARCH_BYTES {
            return Err(Error::InvalidQuery(format!(
                "search is longer than {MAX_SEARCH_BYTES} bytes"
            )));
        }
        let after = params
            .get("after")?
            .filter(|a| !a.is_empty())
            .map(|a| {
                ChannelName::new(a)
                    .map_err(|_| Error::InvalidQuery("after is not a channel name".to_owned()))
            })
            .transpose()?;
        let limit = params
            .integer("limit", 1, MAX_CHANNEL_PAGE as u64)?
            .map_or(DEFAULT_LIMIT, |n| n as usize);
        Ok(Self {
            search,
            after,
            limit,
        })
    }
}

/// A channel's retention policy in force on this node.
#[derive(Debug, Serialize)]
struct Retention {
    max_messages: Option<u64>,
    /// In seconds.
    max_age_s: Option<u64>,
    max_bytes: Option<u64>,
}

/// One channel of a page.
#[derive(Debug, Serialize)]
struct ChannelRow {
    name: ChannelName,
    head: Offset,
    /// Oldest stored offset (`head + 1` when none is stored).
    earliest: Offset,
    messages: u64,
    /// Bytes of payload stored.
    bytes: u64,
    /// `null` when the channel keeps everything.
    retention: Option<Retention>,
    /// Live subscriptions across the cluster, as of each node's last
    /// report (every 3 s).
    subscribers: u64,
    /// RFC 3339 (ms, UTC) publish time of the head message; `null` when
    /// it is not stored.
    last_published_at: Option<String>,
    /// A Durable Streams stream's content type; `null` for a plain
    /// channel.
    stream: Option<StreamRow>,
}

/// What a page says of a Durable Streams stream.
#[derive(Debug, Serialize)]
struct StreamRow {
    content_type: String,
}

/// One page.
#[derive(Debug, Serialize)]
pub(crate) struct ChannelsPage {
    channels: Vec<ChannelRow>,
    /// The last name of this page when more may follow (pass it as
    /// `after`); `null` on the last page.
    next_after: Option<ChannelName>,
}

/// The page (see the module docs). Errors: `400 invalid_query`, `401`,
/// `403`, `503 storage_unavailable`.
pub(crate) async fn channels(
    State(state): State<ConsoleState>,
    Caller(who): Caller,
    ValidQuery(query): ValidQuery<ChannelsQuery>,
) -> Result<Json<ChannelsPage>> {
    state.shared.auth().may_admin(&who)?;
    let page = state
        .shared
        .node
        .storage()
        .channel_page(&query.search, query.after.as_ref(), query.limit)
        .await
        .during("channel_page", None)?;
    let next_after = (page.len() == query.limit)
        .then(|| page.last().map(|c| c.name.clone()))
        .flatten();
    let retention = state.shared.node.config().retention.current();
    let channels = page
        .into_iter()
        .map(|c| {
            let limits = retention.policy_for(&c.name).limits();
            let retention = (!limits.is_unbounded()).then(|| Retention {
                max_messages: limits.max_messages,
                max_age_s: limits.max_age_ms.map(|ms| ms / 1000),
                max_bytes: limits.max_bytes,
            });
            ChannelRow {
                head: c.head,
                earliest: c.earliest,
                messages: c.messages,
                bytes: c.bytes,
                retention,
                subscribers: c.subscribers,
                last_published_at: c.last_published_at_ms.map(format_rfc3339_ms),
                stream: c
                    .content_type
                    .map(|content_type| StreamRow { content_type }),
                name: c.name,
            }
        })
        .collect();
    Ok(Json(ChannelsPage {
        channels,
        next_after,
    }))
}

//! What every read of a stream shares: the stream as the storage holds it,
//! where a read starts, and the body messages make; and a catch-up's
//! stored messages after an offset (a chunk of about 1 MiB).

use herald_core::{is_json_media, ChannelName, Message, Offset, Payload, StreamInfo};
use herald_node::node_error::StorageContext;

use super::offset::ReadFrom;
use crate::state::StreamsState;
use herald_http::error::{Error, Result};

/// Most messages read from the storage per call (fewer when
/// `ServerConfig::read_page_messages` is smaller).
const PAGE_MESSAGES: usize = 1000;
/// Messages of a read's first call: a page grows only while the messages
/// read so far are small, so that a stream of large messages is never read
/// a thousand at a time.
const FIRST_PAGE_MESSAGES: usize = 8;
/// A catch-up answer stops adding messages once its body is this long, in
/// bytes (1 MiB); it always holds at least one whole message.
const CHUNK_BYTES: usize = 1024 * 1024;

/// The stream `channel` as the storage holds it now.
pub(crate) async fn info(
    state: &StreamsState,
    channel: &ChannelName,
) -> Result<Option<StreamInfo>> {
    Ok(state
        .shared
        .node
        .storage()
        .stream_info(channel)
        .await
        .during("stream_info", Some(channel))?)
}

/// The Herald offset a read continues after.
///
/// # Errors
/// 410 `offset_gone` for an offset before what is stored.
pub(crate) fn start(info: &StreamInfo, from: ReadFrom) -> Result<Offset> {
    match from {
        ReadFrom::Start => Ok(info.earliest - 1),
        ReadFrom::Now => Ok(info.head),
        ReadFrom::After(after) if after < info.earliest - 1 => Err(Error::OffsetGone {
            earliest: info.earliest,
        }),
        ReadFrom::After(after) => Ok(after.min(info.head)),
    }
}

/// Stored messages after an offset, up to about [`CHUNK_BYTES`].
pub(crate) struct Chunk {
    /// The messages, in offset order.
    pub(crate) messages: Vec<Message>,
    /// The offset a next read continues after.
    pub(crate) next: Offset,
    /// Whether `next` reached the head the storage read.
    pub(crate) up_to_date: bool,
    /// The channel's deletion number, for the `ETag`.
    pub(crate) deletion: u64,
}

/// Reads the messages after `after`.
pub(crate) async fn read_chunk(
    state: &StreamsState,
    channel: &ChannelName,
    after: Offset,
) -> Result<Chunk> {
    let storage = state.shared.node.storage();
    let mut messages = Vec::new();
    let mut next = after;
    let mut bytes = 0usize;
    // Never more messages per read than fit in the read budget: a page
    // of messages of `max_message_bytes` holds at most that much.
    let most = PAGE_MESSAGES.min(state.shared.settings.read_page_messages());
    let mut limit = FIRST_PAGE_MESSAGES.min(most);
    loop {
        let page = storage
            .read(channel, next, limit)
            .await
            .during("read", Some(channel))?;
        if page.earliest > next + 1 {
            // Removed while reading: the client reads again from its offset.
            return Err(Error::OffsetGone {
                earliest: page.earliest,
            });
        }
        let full = page.messages.len() == limit;
        for message in page.messages {
            if bytes >= CHUNK_BYTES {
                return Ok(Chunk {
                    messages,
                    next,
                    up_to_date: false,
                    deletion: page.deletion,
                });
            }
            bytes += message.data.len();
            next = message.offset;
            messages.push(message);
        }
        // The next page: as many messages of the average size so far as
        // fit in what is left of the chunk.
        let average = (bytes / messages.len().max(1)).max(1);
        limit = (CHUNK_BYTES.saturating_sub(bytes) / average).clamp(1, most);
        if !full {
            return Ok(Chunk {
                messages,
                next,
                up_to_date: next >= page.head,
                deletion: page.deletion,
            });
        }
    }
}

/// The body of `messages` for a stream of `content_type`: in JSON mode a
/// JSON array of them, else their bytes one after the other.
pub(crate) fn body(content_type: &str, messages: &[Message]) -> Vec<u8> {
    if is_json_media(content_type) {
        let mut out =
            Vec::with_capacity(2 + messages.iter().map(|m| m.data.len() + 1).sum::<usize>());
        out.push(b'[');
        for (i, m) in messages.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(m.data.to_json_text().as_bytes());
        }
        out.push(b']');
        return out;
    }
    let mut out = Vec::with_capacity(messages.iter().map(|m| m.data.len()).sum());
    for m in messages {
        match &m.data {
            Payload::Bytes(b) => out.extend_from_slice(b),
            Payload::Json(j) => out.extend_from_slice(j.get().as_bytes()),
        }
    }
    out
}

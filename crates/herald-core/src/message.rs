use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

use crate::channel::ChannelName;
use crate::idempotency::IdempotencyKey;
use crate::payload::Payload;
use crate::tags::Tags;
use crate::time::format_rfc3339_ms;

/// A message's position in its channel: 1 for the first message, then
/// contiguous, never reused.
pub type Offset = u64;

/// A stored message, as history and subscriptions deliver it.
///
/// Serializes to `{"offset": u64, "data": <JSON>, "published_at": "<RFC 3339>"}`,
/// plus `"tags": {"<key>": "<value>", ...}` when it has tags. A message
/// whose payload is bytes (a Durable Streams byte stream) has
/// `"data_base64": "<standard base64>"` instead of `"data"`.
#[derive(Debug, Clone)]
pub struct Message {
    /// The message's offset in its channel.
    pub offset: Offset,
    /// What the publisher sent: a JSON value as its exact text, or bytes.
    pub data: Payload,
    /// Commit time in milliseconds since the Unix epoch, from the storage's clock.
    pub published_at_ms: i64,
    /// The tags the publisher sent with it (usually none).
    pub tags: Tags,
}

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let fields = if self.tags.is_empty() { 3 } else { 4 };
        let mut st = s.serialize_struct("Message", fields)?;
        st.serialize_field("offset", &self.offset)?;
        match &self.data {
            Payload::Json(json) => st.serialize_field("data", &**json)?,
            Payload::Bytes(_) => st.serialize_field(
                "data_base64",
                &RawValue::from_string(self.data.to_json_text().into_owned())
                    .map_err(serde::ser::Error::custom)?,
            )?,
        }
        st.serialize_field("published_at", &format_rfc3339_ms(self.published_at_ms))?;
        if self.tags.is_empty() {
            st.skip_field("tags")?;
        } else {
            st.serialize_field("tags", &self.tags)?;
        }
        st.end()
    }
}

impl PartialEq for Message {
    fn eq(&self, other: &Self) -> bool {
        self.offset == other.offset
            && self.data == other.data
            && self.published_at_ms == other.published_at_ms
            && self.tags == other.tags
    }
}

/// A message a publisher asks to append, validated, before it has an offset.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// Target channel.
    pub channel: ChannelName,
    /// What to store: a JSON value as its exact text (Herald's API and
    /// Centrifugo only send JSON), or bytes.
    pub data: Payload,
    /// Optional key that makes the publish idempotent per channel.
    pub idempotency_key: Option<IdempotencyKey>,
    /// Tags stored and delivered with the message (usually none).
    pub tags: Tags,
}

/// The outcome of appending one [`NewMessage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// The channel written.
    pub channel: ChannelName,
    /// The offset the message has (the original one for a duplicate).
    pub offset: Offset,
    /// Commit time in ms since the Unix epoch (the original one for a duplicate).
    pub published_at_ms: i64,
    /// `true` when the idempotency key was already used on this channel and
    /// nothing was added.
    pub duplicate: bool,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn message(tags: &[(&str, &str)]) -> Message {
        Message {
            offset: 7,
            data: Payload::Json(Arc::from(
                RawValue::from_string(r#"{"a": 1}"#.to_owned()).unwrap(),
            )),
            published_at_ms: 0,
            tags: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn tags_are_serialized_only_when_there_are_some() {
        assert_eq!(
            serde_json::to_string(&message(&[])).unwrap(),
            r#"{"offset":7,"data":{"a": 1},"published_at":"1970-01-01T00:00:00.000Z"}"#
        );
        assert_eq!(
            serde_json::to_string(&message(&[("k", "v")])).unwrap(),
            r#"{"offset":7,"data":{"a": 1},"published_at":"1970-01-01T00:00:00.000Z","tags":{"k":"v"}}"#
        );
        assert_ne!(message(&[("k", "v")]), message(&[]));
    }
}

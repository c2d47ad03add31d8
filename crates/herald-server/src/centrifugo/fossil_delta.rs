//! Fossil delta for stream subscriptions (Centrifugo's delta compression,
//! `delta: "fossil"` on subscribe, where the channel's namespace has
//! `fossil_delta`): after the first publication a subscriber gets, each
//! one's `data` is the Fossil delta (the format of the Fossil SCM's
//! `delta.c`, as centrifuge-js's `fossil.ts` applies it) from the previous
//! one it got, with `delta: true`. Every publication is still delivered,
//! once, in order, at its offset: only how its bytes travel changes, so
//! the log's promises are untouched.
//!
//! In the JSON form the SDK takes every publication's `data` of such a
//! subscription as a JSON string: the value's JSON text when whole, the
//! delta otherwise; in the protobuf form `data` is bytes either way. A
//! delta that is not UTF-8 text (it can cut a multi-byte character) is not
//! sent: the publication goes whole.

use herald_core::Message;

use super::protocol::{publication_push_with, DataForm};
use super::transport::Encoding;

/// The delta state of one subscription.
#[derive(Debug)]
pub(crate) struct FossilDelta {
    /// Whole publications are written as JSON strings (the JSON form).
    wrap: bool,
    /// The JSON text of the last publication sent.
    previous: Option<Vec<u8>>,
}

impl FossilDelta {
    /// A subscription's state before its first publication, for a
    /// connection speaking `encoding`.
    pub(crate) fn new(encoding: Encoding) -> Self {
        Self {
            wrap: encoding == Encoding::Json,
            previous: None,
        }
    }

    /// The form whole publications take in this subscription (those of
    /// its subscribe reply's recovery too).
    pub(crate) fn whole(&self) -> DataForm<'static> {
        if self.wrap {
            DataForm::Wrapped
        } else {
            DataForm::Plain
        }
    }

    /// The push of `message` on `channel`: a delta from the previous one
    /// sent when there is one, else whole; `message` becomes the previous
    /// one.
    pub(crate) fn push(&mut self, channel: &str, message: &Message) -> String {
        let text = message.data.to_json_text();
        let delta = self.previous.as_deref().and_then(|previous| {
            String::from_utf8(fossil_delta::delta(text.as_bytes(), previous)).ok()
        });
        let push = match &delta {
            Some(delta) => publication_push_with(channel, message, DataForm::Delta(delta)),
            None => publication_push_with(channel, message, self.whole()),
        };
        self.previous = Some(text.as_bytes().to_vec());
        push
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use herald_core::{Payload, Tags};
    use serde_json::{json, Value};

    use super::*;

    fn message(offset: u64, data: &str) -> Message {
        Message {
            offset,
            data: Payload::Json(Arc::from(
                serde_json::value::RawValue::from_string(data.to_owned()).unwrap(),
            )),
            published_at_ms: 1,
            tags: Tags::default(),
        }
    }

    #[test]
    fn the_first_publication_is_whole_then_deltas_apply_to_the_previous() {
        let mut json = FossilDelta::new(Encoding::Json);
        let first = format!(r#"{{"n":1,"pad":"{}"}}"#, "a".repeat(300));
        let second = format!(r#"{{"n":2,"pad":"{}"}}"#, "a".repeat(300));
        let push: Value = serde_json::from_str(&json.push("c", &message(1, &first))).unwrap();
        let publication = &push["push"]["pub"];
        assert_eq!(publication["data"], json!(first), "whole, as a JSON string");
        assert_eq!(publication["delta"], json!(null));
        let push: Value = serde_json::from_str(&json.push("c", &message(2, &second))).unwrap();
        let publication = &push["push"]["pub"];
        assert_eq!(publication["delta"], true);
        assert_eq!(publication["offset"], 2);
        let delta = publication["data"].as_str().unwrap();
        assert!(
            delta.len() < second.len() / 4,
            "a delta, not the text: {delta}"
        );
        let applied = fossil_delta::apply(first.as_bytes(), delta.as_bytes()).unwrap();
        assert_eq!(applied, second.as_bytes());

        let mut binary = FossilDelta::new(Encoding::Protobuf);
        let push: Value = serde_json::from_str(&binary.push("c", &message(1, &first))).unwrap();
        assert_eq!(push["push"]["pub"]["data"]["n"], 1, "whole, as the value");
    }
}

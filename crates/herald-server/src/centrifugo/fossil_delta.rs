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
//!
//! The delta itself comes from the node's [`DeltaCache`]
//! (`delta_cache.rs`): computed once for every subscription that sent the
//! same previous publication, away from the async workers, within a CPU
//! budget. A publication whose JSON text, or that of the one before it, is
//! larger than [`MAX_DELTA_BYTES`] goes whole, and so does one the budget
//! has no time for: Centrifugo's protocol allows whole data (no `delta`)
//! in a delta subscription, and the SDK takes it as the next base.

use std::sync::Arc;

use herald_core::{ChannelName, Message, Payload};

use super::codec::Encoding;
use super::delta_cache::{DeltaCache, Registration, Sent, MAX_DELTA_BYTES};
use super::replies::{publication_push, DataForm, Publication, Reply};

/// The delta state of one subscription.
#[derive(Debug)]
pub(crate) struct FossilDelta {
    /// Whole publications are written as JSON strings (the JSON form).
    wrap: bool,
    /// The node's deltas, and the subscription's channel.
    deltas: Registration,
    /// The last publication sent, when a delta may start from it (`None`
    /// before the first one, and after one larger than
    /// [`MAX_DELTA_BYTES`]).
    previous: Option<Sent>,
}

/// The length in bytes of `data`'s JSON text
/// ([`Payload::to_json_text`]), without making it: bytes are a JSON
/// string of their padded base64 (RFC 4648, section 4).
fn json_text_len(data: &Payload) -> usize {
    match data {
        Payload::Json(json) => json.get().len(),
        Payload::Bytes(bytes) => bytes.len().div_ceil(3).saturating_mul(4).saturating_add(2),
    }
}

impl FossilDelta {
    /// A subscription's state before its first publication, for a
    /// connection speaking `encoding`, subscribed to `channel`, with the
    /// node's `deltas`.
    pub(crate) fn new(encoding: Encoding, deltas: &Arc<DeltaCache>, channel: &ChannelName) -> Self {
        Self {
            wrap: encoding == Encoding::Json,
            deltas: deltas.register(channel),
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

    /// The push of `message`: a delta from the previous one sent when
    /// there is one and both are at most [`MAX_DELTA_BYTES`] and the
    /// node's budget has time for it, else whole; `message` becomes the
    /// previous one.
    pub(crate) async fn push(&mut self, message: &Message) -> Reply {
        let channel = self.deltas.channel().as_str();
        if json_text_len(&message.data) > MAX_DELTA_BYTES {
            // No delta starts from it either: nothing of it is kept.
            self.previous = None;
            return publication_push(channel, Publication::with_form(message, self.whole()));
        }
        let text = message.data.to_json_text();
        let (sent, delta) = match self.previous.take() {
            Some(from) => {
                let deltas = &self.deltas;
                deltas
                    .cache()
                    .delta(deltas.channel(), &from, message.offset, &text)
                    .await
            }
            None => (
                Sent {
                    offset: message.offset,
                    text: Arc::from(&*text),
                },
                None,
            ),
        };
        let form = match &delta {
            Some(delta) => DataForm::Delta(delta),
            None => self.whole(),
        };
        let push = publication_push(channel, Publication::with_form(message, form));
        self.previous = Some(sent);
        push
    }
}

#[cfg(test)]
mod tests {
    use herald_core::Tags;
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

    fn deltas() -> Arc<DeltaCache> {
        Arc::new(DeltaCache::default())
    }

    fn channel() -> ChannelName {
        ChannelName::new("c").unwrap()
    }

    async fn push_of(delta: &mut FossilDelta, message: &Message) -> Value {
        serde_json::to_value(delta.push(message).await).unwrap()
    }

    #[tokio::test]
    async fn the_first_publication_is_whole_then_deltas_apply_to_the_previous() {
        let deltas = deltas();
        let mut json = FossilDelta::new(Encoding::Json, &deltas, &channel());
        let first = format!(r#"{{"n":1,"pad":"{}"}}"#, "a".repeat(300));
        let second = format!(r#"{{"n":2,"pad":"{}"}}"#, "a".repeat(300));
        let push = push_of(&mut json, &message(1, &first)).await;
        let publication = &push["push"]["pub"];
        assert_eq!(publication["data"], json!(first), "whole, as a JSON string");
        assert_eq!(publication["delta"], json!(null));
        let push = push_of(&mut json, &message(2, &second)).await;
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

        let mut binary = FossilDelta::new(Encoding::Protobuf, &deltas, &channel());
        let push = push_of(&mut binary, &message(1, &first)).await;
        assert_eq!(push["push"]["pub"]["data"]["n"], 1, "whole, as the value");
    }

    /// N subscriptions that got the same publication cause one delta
    /// computation for the next one, and each sends it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn subscriptions_with_the_same_previous_publication_compute_one_delta() {
        let deltas = deltas();
        let mut subscriptions: Vec<FossilDelta> = (0..32)
            .map(|_| FossilDelta::new(Encoding::Json, &deltas, &channel()))
            .collect();
        let texts: Vec<String> = (1..=3)
            .map(|n| format!(r#"{{"n":{n},"pad":"{}"}}"#, "b".repeat(8000)))
            .collect();
        for (i, text) in texts.iter().enumerate() {
            let offset = i as u64 + 1;
            let pushes = futures::future::join_all(
                subscriptions
                    .iter_mut()
                    .map(|s| async move { push_of(s, &message(offset, text)).await }),
            )
            .await;
            for push in &pushes {
                let publication = &push["push"]["pub"];
                assert_eq!(publication["offset"], offset);
                if i == 0 {
                    assert_eq!(publication["delta"], json!(null), "the first is whole");
                } else {
                    let delta = publication["data"].as_str().unwrap();
                    let applied = fossil_delta::apply(texts[i - 1].as_bytes(), delta.as_bytes());
                    assert_eq!(applied.unwrap(), text.as_bytes());
                }
            }
            assert_eq!(
                deltas.computed(),
                offset - 1,
                "one computation per publication after the first, for 32 subscriptions"
            );
        }
    }

    /// A publication over [`MAX_DELTA_BYTES`] goes whole without a delta
    /// computed, and so does the next one, whose delta would start from
    /// it; the one after gets a delta again.
    #[tokio::test]
    async fn a_publication_over_the_bound_goes_whole_and_so_does_the_next() {
        let deltas = deltas();
        let mut json = FossilDelta::new(Encoding::Json, &deltas, &channel());
        let small = |n: u32| format!(r#"{{"n":{n},"pad":"{}"}}"#, "c".repeat(1000));
        let large = format!(r#"{{"pad":"{}"}}"#, "c".repeat(MAX_DELTA_BYTES));
        push_of(&mut json, &message(1, &small(1))).await;
        let push = push_of(&mut json, &message(2, &large)).await;
        assert_eq!(push["push"]["pub"]["delta"], json!(null), "whole");
        assert_eq!(push["push"]["pub"]["data"], json!(large));
        let push = push_of(&mut json, &message(3, &small(3))).await;
        assert_eq!(push["push"]["pub"]["delta"], json!(null), "whole");
        assert_eq!(deltas.computed(), 0);
        let push = push_of(&mut json, &message(4, &small(4))).await;
        assert_eq!(push["push"]["pub"]["delta"], true);
        assert_eq!(deltas.computed(), 1);
        // Bytes count as their base64 JSON string.
        let bytes = Payload::Bytes(Arc::from(vec![0u8; MAX_DELTA_BYTES / 4 * 3]));
        assert!(json_text_len(&bytes) > MAX_DELTA_BYTES);
        assert_eq!(json_text_len(&bytes), bytes.to_json_text().len());
    }

    /// Over budget, a publication goes whole, at its offset, and the next
    /// delta starts from it.
    #[tokio::test]
    async fn over_budget_a_publication_goes_whole() {
        let spent = Arc::new(DeltaCache::with_budget(
            std::time::Duration::ZERO,
            std::time::Duration::ZERO,
        ));
        let mut json = FossilDelta::new(Encoding::Json, &spent, &channel());
        let text = |n: u32| format!(r#"{{"n":{n},"pad":"{}"}}"#, "d".repeat(500));
        push_of(&mut json, &message(1, &text(1))).await;
        let push = push_of(&mut json, &message(2, &text(2))).await;
        let publication = &push["push"]["pub"];
        assert_eq!(publication["delta"], json!(null), "whole");
        assert_eq!(publication["data"], json!(text(2)));
        assert_eq!(publication["offset"], 2);
        assert_eq!(spent.computed(), 0);
    }
}

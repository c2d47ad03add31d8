//! The digest stored with an idempotency key, so that the key's reuse for a
//! different message is told from a retry of the same one (the IETF
//! Idempotency-Key draft, draft-ietf-httpapi-idempotency-key-header,
//! suggests a fingerprint of the request payload).

use herald_core::{NewMessage, Payload};
use sha2::{Digest, Sha256};

/// A SHA-256 digest (FIPS 180-4), 32 bytes.
pub type IdempotencyDigest = [u8; 32];

/// The SHA-256 of `message` as it is stored: its channel name, one zero
/// byte (which no channel name contains), then its `data` as its exact
/// JSON text, and, only when it has tags, another zero byte (which no
/// JSON text contains unescaped) and the canonical JSON text of its tags
/// ([`herald_core::Tags::to_json`]). Two publishes of the same data and
/// tags to the same channel have the same digest; any other difference,
/// whitespace in `data` or a tag included, gives another one. A message
/// without tags has the digest it had before tags existed. The
/// idempotency key itself is not part of it.
pub fn idempotency_digest(message: &NewMessage) -> IdempotencyDigest {
    let mut hasher = Sha256::new();
    hasher.update(message.channel.as_str().as_bytes());
    hasher.update([0u8]);
    if let Payload::Bytes(_) = message.data {
        // Bytes never hash like JSON text of the same bytes.
        hasher.update([1u8]);
    }
    hasher.update(message.data.as_bytes());
    if let Some(tags) = message.tags.to_json() {
        hasher.update([0u8]);
        hasher.update(tags.as_bytes());
    }
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use herald_core::ChannelName;
    use serde_json::value::RawValue;

    use super::*;

    fn message(channel: &str, data: &str) -> NewMessage {
        NewMessage {
            channel: ChannelName::new(channel).unwrap(),
            data: herald_core::Payload::Json(Arc::from(
                RawValue::from_string(data.to_owned()).unwrap(),
            )),
            idempotency_key: None,
            tags: herald_core::Tags::default(),
        }
    }

    #[test]
    fn digest_covers_channel_and_exact_data() {
        let a = idempotency_digest(&message("a", r#"{"x":1}"#));
        assert_eq!(a, idempotency_digest(&message("a", r#"{"x":1}"#)));
        assert_ne!(a, idempotency_digest(&message("a", r#"{"x": 1}"#)));
        assert_ne!(a, idempotency_digest(&message("b", r#"{"x":1}"#)));
        // The separator keeps channel and data apart.
        assert_ne!(
            idempotency_digest(&message("a1", "2")),
            idempotency_digest(&message("a", "12"))
        );
        // SHA-256 of "a\0null", as computed by `printf 'a\0null' | sha256sum`.
        let hex: String = idempotency_digest(&message("a", "null"))
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "bcdb18adab247bb2ffb06e162e7c02624077dd5cd2333ccd76ee03969f6c5753"
        );
    }

    #[test]
    fn tags_change_the_digest_and_no_tags_keep_the_old_one() {
        let plain = message("a", r#"{"x":1}"#);
        let tagged = |pairs: &[(&str, &str)]| {
            let mut m = message("a", r#"{"x":1}"#);
            m.tags = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            m
        };
        let d = idempotency_digest(&tagged(&[("k", "v")]));
        assert_ne!(d, idempotency_digest(&plain));
        assert_eq!(d, idempotency_digest(&tagged(&[("k", "v")])));
        assert_ne!(d, idempotency_digest(&tagged(&[("k", "w")])));
        assert_eq!(idempotency_digest(&tagged(&[])), idempotency_digest(&plain));
        // SHA-256 of "a\0null\0{\"k\":\"v\"}", as computed by
        // `printf 'a\0null\0{"k":"v"}' | sha256sum`.
        let mut m = message("a", "null");
        m.tags = tagged(&[("k", "v")]).tags;
        let hex: String = idempotency_digest(&m)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "23830d71afe1618549b160d16e9c069b550c810db4fa2113ba272905b8ce1122"
        );
    }
}

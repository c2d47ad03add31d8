use std::sync::Arc;

use base64::Engine as _;
use serde_json::value::RawValue;

/// What a message carries: a JSON value (every channel written through
/// Herald's API or Centrifugo, and Durable Streams' JSON mode), or bytes of
/// any other content type (a Durable Streams byte stream's chunk, stored
/// byte for byte).
#[derive(Debug, Clone)]
pub enum Payload {
    /// A JSON value, kept as its exact text.
    Json(Arc<RawValue>),
    /// Raw bytes, never interpreted.
    Bytes(Arc<[u8]>),
}

impl Payload {
    /// The JSON value, or `None` for bytes.
    pub fn as_json(&self) -> Option<&RawValue> {
        match self {
            Self::Json(json) => Some(json),
            Self::Bytes(_) => None,
        }
    }

    /// The stored bytes: a JSON value's text, or the raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Json(json) => json.get().as_bytes(),
            Self::Bytes(bytes) => bytes,
        }
    }

    /// Size of [`Payload::as_bytes`] in bytes.
    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// Whether [`Payload::as_bytes`] is empty (never for JSON).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The payload as JSON text for a client that only speaks JSON: the
    /// value itself, or for bytes a JSON string of their standard base64
    /// (RFC 4648, section 4, with padding).
    pub fn to_json_text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Self::Json(json) => std::borrow::Cow::Borrowed(json.get()),
            Self::Bytes(bytes) => std::borrow::Cow::Owned(format!(
                "\"{}\"",
                base64::engine::general_purpose::STANDARD.encode(bytes)
            )),
        }
    }
}

impl From<Arc<RawValue>> for Payload {
    fn from(json: Arc<RawValue>) -> Self {
        Self::Json(json)
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Json(a), Self::Json(b)) => a.get() == b.get(),
            (Self::Bytes(a), Self::Bytes(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Payload {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_reach_json_clients_as_a_base64_string() {
        let bytes = Payload::Bytes(Arc::from(&b"\x00\xffhi"[..]));
        assert_eq!(bytes.to_json_text(), "\"AP9oaQ==\"");
        assert_eq!(bytes.len(), 4);
        let json = Payload::Json(Arc::from(RawValue::from_string("[1]".to_owned()).unwrap()));
        assert_eq!(json.to_json_text(), "[1]");
        assert_ne!(json, Payload::Bytes(Arc::from(&b"[1]"[..])));
    }
}

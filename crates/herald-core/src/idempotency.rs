use std::fmt;

/// Longest `Idempotency-Key` accepted, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

/// A validated idempotency key: 1 to [`MAX_IDEMPOTENCY_KEY_BYTES`] bytes of
/// visible ASCII (`0x21..=0x7E`). A key is unique per channel: a second
/// publish with the same key on the same channel returns the first message.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a string is not a valid [`IdempotencyKey`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidIdempotencyKey {
    /// The key is empty.
    #[error("idempotency key is empty")]
    Empty,
    /// The key is longer than [`MAX_IDEMPOTENCY_KEY_BYTES`].
    #[error("idempotency key is {0} bytes long, the limit is {MAX_IDEMPOTENCY_KEY_BYTES}")]
    TooLong(usize),
    /// The key holds a byte outside visible ASCII.
    #[error("idempotency key must be visible ASCII (0x21-0x7E)")]
    BadChar,
}

impl IdempotencyKey {
    /// Validates `key`.
    ///
    /// # Errors
    /// [`InvalidIdempotencyKey`] says which rule the key breaks.
    pub fn new(key: impl Into<String>) -> Result<Self, InvalidIdempotencyKey> {
        let key = key.into();
        if key.is_empty() {
            return Err(InvalidIdempotencyKey::Empty);
        }
        if key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
            return Err(InvalidIdempotencyKey::TooLong(key.len()));
        }
        if !key.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(InvalidIdempotencyKey::BadChar);
        }
        Ok(Self(key))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_keys() {
        assert!(IdempotencyKey::new("order-42/retry#1").is_ok());
        assert_eq!(IdempotencyKey::new(""), Err(InvalidIdempotencyKey::Empty));
        assert_eq!(
            IdempotencyKey::new("a b"),
            Err(InvalidIdempotencyKey::BadChar)
        );
        assert_eq!(
            IdempotencyKey::new("k".repeat(256)),
            Err(InvalidIdempotencyKey::TooLong(256))
        );
    }
}

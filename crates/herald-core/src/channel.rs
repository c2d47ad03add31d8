use std::fmt;

use serde::{Serialize, Serializer};

/// Longest channel name accepted, in bytes.
pub const MAX_CHANNEL_NAME_BYTES: usize = 128;

/// A validated channel name.
///
/// Rules (documented in `docs/api.md`): 1 to [`MAX_CHANNEL_NAME_BYTES`] bytes
/// of ASCII letters, digits, `_`, `-`, `.` and `:`, starting with a letter or
/// a digit. The rules keep names safe in URL paths, SQL, logs and metric
/// labels without escaping.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelName(String);

/// Why a string is not a valid [`ChannelName`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidChannelName {
    /// The name is empty.
    #[error("channel name is empty")]
    Empty,
    /// The name is longer than [`MAX_CHANNEL_NAME_BYTES`].
    #[error("channel name is {0} bytes long, the limit is {MAX_CHANNEL_NAME_BYTES}")]
    TooLong(usize),
    /// The name does not start with an ASCII letter or digit.
    #[error("channel name must start with an ASCII letter or digit")]
    BadStart,
    /// The name holds a character outside `[A-Za-z0-9_.:-]`.
    #[error("channel name holds {0:?}; allowed are ASCII letters, digits, '_', '-', '.', ':'")]
    BadChar(char),
}

impl ChannelName {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`InvalidChannelName`] says which rule the name breaks.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidChannelName> {
        let name = name.into();
        if name.is_empty() {
            return Err(InvalidChannelName::Empty);
        }
        if name.len() > MAX_CHANNEL_NAME_BYTES {
            return Err(InvalidChannelName::TooLong(name.len()));
        }
        if let Some(c) = name.chars().find(|c| !is_name_char(*c)) {
            return Err(InvalidChannelName::BadChar(c));
        }
        if !name.as_bytes()[0].is_ascii_alphanumeric() {
            return Err(InvalidChannelName::BadStart);
        }
        Ok(Self(name))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')
}

impl fmt::Display for ChannelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ChannelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl Serialize for ChannelName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// A channel and its head: the offset of its newest message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChannelHead {
    /// The channel's name.
    pub name: ChannelName,
    /// Offset of the channel's newest message (offsets start at 1).
    pub head: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_documented_alphabet() {
        for ok in ["a", "orders", "Orders-2026.eu:west_1", "9lives"] {
            assert_eq!(ChannelName::new(ok).unwrap().as_str(), ok);
        }
        let longest = "x".repeat(MAX_CHANNEL_NAME_BYTES);
        assert!(ChannelName::new(longest).is_ok());
    }

    #[test]
    fn rejects_everything_else() {
        assert_eq!(ChannelName::new(""), Err(InvalidChannelName::Empty));
        assert_eq!(
            ChannelName::new("x".repeat(MAX_CHANNEL_NAME_BYTES + 1)),
            Err(InvalidChannelName::TooLong(MAX_CHANNEL_NAME_BYTES + 1))
        );
        assert_eq!(ChannelName::new("-a"), Err(InvalidChannelName::BadStart));
        assert_eq!(ChannelName::new(".a"), Err(InvalidChannelName::BadStart));
        assert_eq!(
            ChannelName::new("a b"),
            Err(InvalidChannelName::BadChar(' '))
        );
        assert_eq!(
            ChannelName::new("a/b"),
            Err(InvalidChannelName::BadChar('/'))
        );
        assert_eq!(ChannelName::new("é"), Err(InvalidChannelName::BadChar('é')));
    }
}

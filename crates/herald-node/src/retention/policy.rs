//! Retention policies: how much history each channel keeps, per namespace
//! (the part of a channel's name before its first `:`), with a default.
//!
//! The shape is the `[retention]` section of the node's configuration
//! file (TOML):
//!
//! ```toml
//! [retention]
//! max_messages = 100000      # the default policy
//! max_age = "7d"             # humantime durations
//!
//! [retention.namespaces.chat]
//! max_messages = 1000
//! max_bytes = 10485760
//! ```
//!
//! A namespace's policy replaces the default entirely (a bound it leaves
//! out is unbounded). Absent bounds are unbounded: without any, history
//! grows forever, as before retention existed.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use herald_core::ChannelName;
use herald_storage::TrimLimits;
use serde::{Deserialize, Deserializer};
use tokio::sync::watch;

/// How much history one channel keeps: every bound that is set applies
/// (a message goes when it is beyond any of them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionPolicy {
    /// Keep at most this many newest messages (at least 1 in the file: 0
    /// is refused, absent means unbounded).
    #[serde(default, deserialize_with = "positive_opt")]
    pub max_messages: Option<u64>,
    /// Remove messages published at least this long ago (storage clock).
    /// In the file: a humantime duration such as `"90s"`, `"12h"`, `"7d"`
    /// (the `humantime` crate's syntax); a zero duration is refused.
    #[serde(default, deserialize_with = "humantime_opt")]
    pub max_age: Option<Duration>,
    /// Keep at most this many bytes of message data (the JSON texts' UTF-8
    /// lengths), counting from the newest message (at least 1 in the file).
    #[serde(default, deserialize_with = "positive_opt")]
    pub max_bytes: Option<u64>,
}

impl RetentionPolicy {
    /// True when no bound is set (history grows forever).
    pub fn is_unbounded(&self) -> bool {
        self.limits().is_unbounded()
    }

    /// The bounds as the storage's trim takes them.
    pub fn limits(&self) -> TrimLimits {
        TrimLimits {
            max_messages: self.max_messages,
            max_age_ms: self
                .max_age
                .map(|a| u64::try_from(a.as_millis()).unwrap_or(u64::MAX)),
            max_bytes: self.max_bytes,
            up_to: None,
        }
    }
}

/// A duration as the config file spells it (a `humantime` duration): each
/// unit from days down to nanoseconds that is not zero, largest first, with
/// no space: `7d`, `90s` is `1m30s`, `1500ms` is `1s500ms`. `0s` for zero.
/// `humantime::parse_duration` reads it back to the same duration.
pub fn duration_text(d: Duration) -> String {
    const UNITS: [(&str, u128); 7] = [
        ("d", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];
    let mut rest = d.as_nanos();
    if rest == 0 {
        return "0s".to_owned();
    }
    let mut text = String::new();
    for (unit, nanos) in UNITS {
        let n = rest / nanos;
        if n > 0 {
            text.push_str(&format!("{n}{unit}"));
            rest %= nanos;
        }
    }
    text
}

/// One line: the bounds that are set as `max_messages=N max_age=D
/// max_bytes=N` (durations as [`duration_text`]), or `unbounded`.
impl fmt::Display for RetentionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut bounds = Vec::new();
        if let Some(n) = self.max_messages {
            bounds.push(format!("max_messages={n}"));
        }
        if let Some(age) = self.max_age {
            bounds.push(format!("max_age={}", duration_text(age)));
        }
        if let Some(n) = self.max_bytes {
            bounds.push(format!("max_bytes={n}"));
        }
        if bounds.is_empty() {
            f.write_str("unbounded")
        } else {
            f.write_str(&bounds.join(" "))
        }
    }
}

/// The policies of a node: a default and one per namespace. The
/// `[retention]` section of the configuration file: the default's bounds
/// at its top level, each namespace's in `[retention.namespaces.<name>]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "RetentionSection")]
pub struct RetentionConfig {
    /// The policy of every channel whose namespace has none of its own.
    pub default: RetentionPolicy,
    /// Policies by namespace (the part of a channel's name before its first
    /// `:`; a name without `:` has no namespace and gets the default).
    pub namespaces: BTreeMap<String, RetentionPolicy>,
}

/// [`RetentionConfig`] as the file spells it (serde's `flatten` does not
/// combine with `deny_unknown_fields`, so the default's fields are listed).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetentionSection {
    #[serde(default, deserialize_with = "positive_opt")]
    max_messages: Option<u64>,
    #[serde(default, deserialize_with = "humantime_opt")]
    max_age: Option<Duration>,
    #[serde(default, deserialize_with = "positive_opt")]
    max_bytes: Option<u64>,
    #[serde(default)]
    namespaces: BTreeMap<String, RetentionPolicy>,
}

impl From<RetentionSection> for RetentionConfig {
    fn from(s: RetentionSection) -> Self {
        Self {
            default: RetentionPolicy {
                max_messages: s.max_messages,
                max_age: s.max_age,
                max_bytes: s.max_bytes,
            },
            namespaces: s.namespaces,
        }
    }
}

/// One line for logs: `default: <policy>` and then `; namespace <name>:
/// <policy>` for each namespace in name order, each policy as its
/// [`fmt::Display`] (`unbounded` when it has no bound).
impl fmt::Display for RetentionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "default: {}", self.default)?;
        for (name, policy) in &self.namespaces {
            write!(f, "; namespace {name}: {policy}")?;
        }
        Ok(())
    }
}

impl RetentionConfig {
    /// The policy of `channel`.
    pub fn policy_for(&self, channel: &ChannelName) -> &RetentionPolicy {
        channel
            .as_str()
            .split_once(':')
            .and_then(|(namespace, _)| self.namespaces.get(namespace))
            .unwrap_or(&self.default)
    }

    /// True when no policy bounds anything: the trimmer then reads nothing.
    pub fn is_unbounded(&self) -> bool {
        self.default.is_unbounded() && self.namespaces.values().all(RetentionPolicy::is_unbounded)
    }
}

/// The policies in force on a node, replaceable while it runs (reload):
/// the trimmer reads the current ones at the start of every sweep. Clones
/// share the same policies.
#[derive(Clone)]
pub struct RetentionHandle {
    tx: Arc<watch::Sender<Arc<RetentionConfig>>>,
}

impl RetentionHandle {
    /// A handle with `config` in force.
    pub fn new(config: RetentionConfig) -> Self {
        Self {
            tx: Arc::new(watch::channel(Arc::new(config)).0),
        }
    }

    /// The policies in force now.
    pub fn current(&self) -> Arc<RetentionConfig> {
        Arc::clone(&self.tx.borrow())
    }

    /// Puts `config` in force from the trimmer's next sweep on.
    pub fn replace(&self, config: RetentionConfig) {
        self.tx.send_replace(Arc::new(config));
    }
}

impl Default for RetentionHandle {
    fn default() -> Self {
        Self::new(RetentionConfig::default())
    }
}

impl std::fmt::Debug for RetentionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.current().fmt(f)
    }
}

/// Two handles are equal when the policies in force are.
impl PartialEq for RetentionHandle {
    fn eq(&self, other: &Self) -> bool {
        self.current() == other.current()
    }
}

impl Eq for RetentionHandle {}

/// Reads an optional humantime duration (`"7d"`, `"90s"`).
fn humantime_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let Some(text) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    let age = humantime::parse_duration(&text)
        .map_err(|e| serde::de::Error::custom(format!("invalid duration {text:?}: {e}")))?;
    if age.is_zero() {
        return Err(serde::de::Error::custom(
            "max_age must be longer than 0 (leave it out for no bound)",
        ));
    }
    Ok(Some(age))
}

/// An optional bound of at least 1: a bound of 0 would remove every
/// message, which is what deleting a channel is for, and is easily meant
/// as "unbounded"; so it is refused, and no bound is written by leaving
/// the key out.
fn positive_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match Option::<u64>::deserialize(d)? {
        Some(0) => Err(serde::de::Error::custom(
            "a retention bound must be at least 1 (leave it out for no bound)",
        )),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> ChannelName {
        ChannelName::new(s).unwrap()
    }

    #[test]
    fn a_bound_of_zero_is_refused_not_read_as_remove_everything() {
        for bad in [
            serde_json::json!({"max_messages": 0}),
            serde_json::json!({"max_bytes": 0}),
            serde_json::json!({"max_age": "0s"}),
            serde_json::json!({"namespaces": {"news": {"max_messages": 0}}}),
        ] {
            let e = serde_json::from_value::<RetentionConfig>(bad.clone()).unwrap_err();
            assert!(e.to_string().contains("leave it out"), "{bad}: {e}");
        }
        let one: RetentionConfig =
            serde_json::from_value(serde_json::json!({"max_messages": 1})).unwrap();
        assert_eq!(one.default.max_messages, Some(1));
    }

    #[test]
    fn namespaces_get_their_policy_and_the_rest_the_default() {
        let config: RetentionConfig = serde_json::from_value(serde_json::json!({
            "max_messages": 100,
            "namespaces": {"chat": {"max_age": "1h", "max_bytes": 1000}}
        }))
        .unwrap();
        assert_eq!(config.policy_for(&name("news")).max_messages, Some(100));
        assert_eq!(config.policy_for(&name("news:x")).max_messages, Some(100));
        let chat = config.policy_for(&name("chat:room-1"));
        assert_eq!(chat.max_messages, None);
        assert_eq!(chat.max_age, Some(Duration::from_secs(3600)));
        assert_eq!(chat.limits().max_age_ms, Some(3_600_000));
        assert_eq!(chat.max_bytes, Some(1000));
        assert!(!config.is_unbounded());
        assert!(RetentionConfig::default().is_unbounded());
    }

    #[test]
    fn durations_are_written_as_the_file_spells_them_and_read_back() {
        for (secs, nanos, text) in [
            (7 * 86_400, 0, "7d"),
            (12 * 3600, 0, "12h"),
            (90, 0, "1m30s"),
            (1, 500_000_000, "1s500ms"),
            (86_400 + 1, 0, "1d1s"),
            (0, 1, "1ns"),
            (0, 0, "0s"),
        ] {
            let d = Duration::new(secs, nanos);
            assert_eq!(duration_text(d), text);
            assert_eq!(humantime::parse_duration(text).unwrap(), d, "{text}");
        }
    }

    #[test]
    fn the_policies_read_as_one_line() {
        let config: RetentionConfig = serde_json::from_value(serde_json::json!({
            "max_messages": 2,
            "max_age": "7d",
            "namespaces": {"chat": {"max_bytes": 1000}, "audit": {}}
        }))
        .unwrap();
        assert_eq!(
            config.to_string(),
            "default: max_messages=2 max_age=7d; namespace audit: unbounded; \
             namespace chat: max_bytes=1000"
        );
        assert_eq!(RetentionConfig::default().to_string(), "default: unbounded");
    }

    #[test]
    fn bad_durations_and_unknown_fields_are_refused() {
        let bad = serde_json::from_value::<RetentionConfig>(serde_json::json!({"max_age": "soon"}));
        assert!(bad.unwrap_err().to_string().contains("invalid duration"));
        let unknown =
            serde_json::from_value::<RetentionConfig>(serde_json::json!({"max_mesages": 1}));
        assert!(unknown.is_err());
    }

    #[test]
    fn a_replaced_config_is_seen_by_every_clone() {
        let handle = RetentionHandle::default();
        let clone = handle.clone();
        handle.replace(RetentionConfig {
            default: RetentionPolicy {
                max_messages: Some(5),
                ..RetentionPolicy::default()
            },
            ..RetentionConfig::default()
        });
        assert_eq!(clone.current().default.max_messages, Some(5));
    }
}

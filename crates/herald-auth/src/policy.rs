//! Channel patterns and namespace rules: which rule applies to a channel,
//! and whether a pattern list covers it.

use herald_core::ChannelName;

use crate::config::{NamespaceRule, NamespacesConfig};

/// A channel pattern: `*` matches any run of characters (`:` included),
/// every other character itself. `news:*` covers `news:` and
/// `news:sport:uk`; `*` covers every channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    /// The pattern `text`.
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// `true` when the pattern covers `name`.
    pub fn matches(&self, name: &str) -> bool {
        glob_matches(self.0.as_bytes(), name.as_bytes())
    }
}

/// Wildcard match with `*` only, in O(pattern × name) at worst: on a
/// mismatch, the last `*` takes one more character.
fn glob_matches(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    p = sp + 1;
                    n = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// A list of patterns; `None` (no list) covers every channel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Patterns(Option<Vec<Pattern>>);

impl Patterns {
    /// Every channel.
    pub(crate) fn all() -> Self {
        Self(None)
    }

    /// Exactly the channels the `patterns` cover (none for an empty list).
    pub(crate) fn of<S: AsRef<str>>(patterns: &[S]) -> Self {
        Self(Some(
            patterns.iter().map(|p| Pattern::new(p.as_ref())).collect(),
        ))
    }

    /// `true` when some pattern covers `channel` (always without a list).
    pub(crate) fn covers(&self, channel: &ChannelName) -> bool {
        match &self.0 {
            None => true,
            Some(list) => list.iter().any(|p| p.matches(channel.as_str())),
        }
    }
}

/// One entry of a token's `channels` or `publish` claim.
///
/// Apps ported from Centrifugo list exact channel names there, so an entry
/// without `*` is exactly one channel name (`user:42` covers `user:42`,
/// not `user:420`). `*` is allowed only as a whole segment after the
/// namespace (`user:*`, `chat:*:typing`), where it stands for exactly one
/// segment: a non-empty run of characters without `:` (`user:*` covers
/// `user:42`, not `user:`, `user:42:private` nor `user`). Any other `*`
/// (`*`, `user:42*`, `*:x`, `a:b*`) is refused by [`TokenPattern::parse`],
/// and with it the whole token. Channel names never contain `*`
/// (`herald_core::ChannelName`), so the two forms cannot be confused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TokenPattern {
    /// An exact channel name.
    Exact(String),
    /// Segments separated by `:`, some of them `*` (`None`).
    Segments(Vec<Option<String>>),
}

impl TokenPattern {
    /// The entry `text` of a token's claim.
    ///
    /// # Errors
    /// Why `text` is refused: a `*` that is not a whole segment after the
    /// first `:`.
    pub(crate) fn parse(text: &str) -> Result<Self, &'static str> {
        if !text.contains('*') {
            return Ok(Self::Exact(text.to_owned()));
        }
        let mut segments = Vec::new();
        for (i, segment) in text.split(':').enumerate() {
            match segment {
                "*" if i > 0 => segments.push(None),
                "*" => {
                    return Err("* may not stand for the namespace (the part before the first :)")
                }
                s if s.contains('*') => return Err(
                    "* must be a whole segment after a : (user:*), never part of one (user:42*)",
                ),
                s => segments.push(Some(s.to_owned())),
            }
        }
        Ok(Self::Segments(segments))
    }

    /// `true` when the entry covers the channel `name`.
    pub(crate) fn matches(&self, name: &str) -> bool {
        match self {
            Self::Exact(exact) => exact == name,
            Self::Segments(segments) => {
                let mut parts = name.split(':');
                for segment in segments {
                    match (segment, parts.next()) {
                        (Some(want), Some(part)) if want == part => {}
                        (None, Some(part)) if !part.is_empty() => {}
                        _ => return false,
                    }
                }
                parts.next().is_none()
            }
        }
    }
}

/// A token's `channels` or `publish` claim: the channels its entries
/// cover (none for an absent or empty claim).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TokenPatterns(Vec<TokenPattern>);

impl TokenPatterns {
    /// The entries of claim `claim`.
    ///
    /// # Errors
    /// A message naming the first refused entry by its claim and index
    /// (`channels[2]`), not quoting it.
    pub(crate) fn parse<S: AsRef<str>>(claim: &str, entries: &[S]) -> Result<Self, String> {
        entries
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                TokenPattern::parse(entry.as_ref()).map_err(|why| format!("{claim}[{i}]: {why}"))
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// `true` when some entry covers `channel`.
    pub(crate) fn covers(&self, channel: &ChannelName) -> bool {
        self.0.iter().any(|p| p.matches(channel.as_str()))
    }
}

/// The namespace rules, with the default for channels without a namespace
/// or in a namespace not listed.
#[derive(Debug, Clone, Default)]
pub(crate) struct Namespaces {
    rules: NamespacesConfig,
    default: NamespaceRule,
}

impl Namespaces {
    /// `rules` by namespace name, and `default` for the rest.
    pub(crate) fn new(rules: NamespacesConfig, default: NamespaceRule) -> Self {
        Self { rules, default }
    }

    /// The rule of `channel`: its namespace's (the name before the first
    /// `:`), else the default.
    pub(crate) fn rule(&self, channel: &ChannelName) -> &NamespaceRule {
        channel
            .as_str()
            .split_once(':')
            .and_then(|(namespace, _)| self.rules.get(namespace))
            .unwrap_or(&self.default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SubscribeRule;

    fn ch(name: &str) -> ChannelName {
        ChannelName::new(name).unwrap()
    }

    #[test]
    fn patterns_glob_on_the_whole_name() {
        let m = |p: &str, n: &str| Pattern::new(p).matches(n);
        assert!(m("news:*", "news:uk"));
        assert!(m("news:*", "news:"));
        assert!(m("news:*", "news:sport:uk"));
        assert!(!m("news:*", "news"));
        assert!(!m("news:*", "xnews:uk"));
        assert!(m("*", "anything"));
        assert!(m("a*b*c", "aXXbYYc"));
        assert!(!m("a*b*c", "aXXbYY"));
        assert!(m("exact", "exact"));
        assert!(!m("exact", "exact2"));
        assert!(m("*:room-*", "chat:room-7"));
        assert!(!Patterns::of::<&str>(&[]).covers(&ch("a")));
        assert!(Patterns::all().covers(&ch("a")));
    }

    #[test]
    fn token_entries_are_exact_names_or_whole_segment_stars() {
        let m = |p: &str, n: &str| TokenPattern::parse(p).unwrap().matches(n);
        // Without *: exactly the name, never a prefix.
        assert!(m("user:42", "user:42"));
        assert!(!m("user:42", "user:420"));
        assert!(!m("user:42", "user:42:x"));
        // * is one whole segment, never a `:` nor an empty segment.
        assert!(m("user:*", "user:42"));
        assert!(!m("user:*", "user:42:private"));
        assert!(!m("user:*", "user:"));
        assert!(!m("user:*", "user"));
        assert!(!m("user:*", "users:42"));
        assert!(m("chat:*:typing", "chat:7:typing"));
        assert!(!m("chat:*:typing", "chat:7:typing:x"));
        assert!(!m("chat:*:typing", "chat:7:8:typing"));
        assert!(m("a:*:*", "a:b:c"));
        assert!(!m("a:*:*", "a:b"));
        // Every other * is refused.
        for bad in ["*", "user:42*", "*:x", "a:b*", "a:*b", "**", "a:**", "*a:b"] {
            assert!(TokenPattern::parse(bad).is_err(), "{bad}");
        }
        let list = TokenPatterns::parse("channels", &["news:*", "user:42"]).unwrap();
        assert!(list.covers(&ch("news:uk")));
        assert!(list.covers(&ch("user:42")));
        assert!(!list.covers(&ch("user:420")));
        assert!(!TokenPatterns::default().covers(&ch("a")));
        let error = TokenPatterns::parse("publish", &["ok:*", "user:42*"]).unwrap_err();
        assert_eq!(
            error,
            "publish[1]: * must be a whole segment after a : (user:*), never part of one (user:42*)"
        );
    }

    #[test]
    fn the_namespace_is_the_name_before_the_first_colon() {
        let mut rules = NamespacesConfig::new();
        let public = NamespaceRule {
            subscribe: SubscribeRule::Public,
            ..NamespaceRule::default()
        };
        rules.insert("pub".to_owned(), public);
        let ns = Namespaces::new(rules, NamespaceRule::default());
        assert_eq!(ns.rule(&ch("pub:a:b")).subscribe, SubscribeRule::Public);
        assert_eq!(ns.rule(&ch("pub")).subscribe, SubscribeRule::Token);
        assert_eq!(ns.rule(&ch("other:a")).subscribe, SubscribeRule::Token);
        assert_eq!(ns.rule(&ch("a:pub:b")).subscribe, SubscribeRule::Token);
    }
}

#[cfg(test)]
mod token_entries {
    //! A token's `channels`/`publish` entries against the documented rule
    //! (`super::super::TokenPattern`): never a prefix, never across
    //! a `:`, `*` only as a whole segment after the namespace.

    use proptest::prelude::*;

    use crate::policy::TokenPattern;

    /// Segments that make prefixes, stars in and out of place, and empty
    /// ones.
    fn segment() -> impl Strategy<Value = String> {
        proptest::sample::select(vec!["user", "42", "420", "4", "*", "42*", "*2", "", "a-b"])
            .prop_map(str::to_owned)
    }

    fn text() -> impl Strategy<Value = String> {
        proptest::collection::vec(segment(), 1..5).prop_map(|s| s.join(":"))
    }

    /// A channel-like name: the same segments without stars.
    fn name() -> impl Strategy<Value = String> {
        text().prop_map(|t| t.replace('*', ""))
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 2048,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// An entry is refused exactly when a `*` is not a whole segment
        /// after the first `:`; one without `*` covers only its own
        /// spelling; one with `*`s covers a name only segment by segment,
        /// each `*` one non-empty segment.
        #[test]
        fn an_entry_covers_only_what_the_rule_says(entry in text(), name in name()) {
            let segments: Vec<&str> = entry.split(':').collect();
            let allowed = !entry.contains('*')
                || (!segments[0].contains('*')
                    && segments.iter().all(|s| !s.contains('*') || *s == "*"));
            let parsed = TokenPattern::parse(&entry);
            prop_assert_eq!(parsed.is_ok(), allowed, "{}", entry);
            let Ok(pattern) = parsed else { return Ok(()) };
            // The rule, written out segment by segment.
            let rule = |name: &str| {
                let parts: Vec<&str> = name.split(':').collect();
                if entry.contains('*') {
                    parts.len() == segments.len()
                        && segments
                            .iter()
                            .zip(&parts)
                            .all(|(s, p)| if *s == "*" { !p.is_empty() } else { s == p })
                } else {
                    entry == name
                }
            };
            prop_assert_eq!(pattern.matches(&name), rule(&name), "{} {}", entry, name);
            // Never a prefix: a name one character longer is covered only
            // when the rule covers it (spelled out, or through a `*`).
            let longer = format!("{name}0");
            prop_assert_eq!(pattern.matches(&longer), rule(&longer), "{} {}", entry, longer);
        }
    }
}

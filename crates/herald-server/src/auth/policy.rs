//! Channel patterns and namespace rules: which rule applies to a channel,
//! and whether a pattern list covers it.

use herald_core::ChannelName;

use super::config::{NamespaceRule, NamespacesConfig};

/// A channel pattern: `*` matches any run of characters (`:` included),
/// every other character itself. `news:*` covers `news:` and
/// `news:sport:uk`; `*` covers every channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pattern(String);

impl Pattern {
    /// The pattern `text`.
    pub(crate) fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// `true` when the pattern covers `name`.
    pub(crate) fn matches(&self, name: &str) -> bool {
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
    use crate::auth::config::SubscribeRule;

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

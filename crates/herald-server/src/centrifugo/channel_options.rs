//! Centrifugo's channel options that Herald keeps per namespace
//! (Centrifugo's documentation, "Channels", "Channel options"):
//! `presence`, `join_leave`, `force_push_join_leave` and `fossil_delta`
//! (Centrifugo's `allowed_delta_types = ["fossil"]`), from the
//! channel's namespace rule (`[namespaces.<name>]`, or
//! `[auth.default_namespace]`), each defaulting to the `[centrifugo]`
//! setting of the same name when the rule does not say.

use herald_auth::NamespaceRule;
use herald_core::ChannelName;

use super::config::CentrifugoConfig;
use super::context::CentrifugoState;

/// The options in force for one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChannelOptions {
    /// `presence` and `presence_stats` are answered (else 108) and
    /// subscribers are recorded in the storage's presence.
    pub(crate) presence: bool,
    /// Subscribes and unsubscribes are announced as joins and leaves.
    pub(crate) join_leave: bool,
    /// Joins and leaves go to every subscriber, asked or not.
    pub(crate) force_push_join_leave: bool,
    /// A subscriber that asks for `delta: "fossil"` gets deltas (the
    /// namespace's `fossil_delta`; off when it does not say).
    pub(crate) fossil_delta: bool,
}

impl ChannelOptions {
    /// The options of `channel` on this node.
    pub(crate) fn of(state: &CentrifugoState, channel: &ChannelName) -> Self {
        let shared = &state.shared;
        Self::resolve(shared.auth().namespace_rule(channel), state.config())
    }

    /// `rule`'s options, `defaults`' where it has none.
    fn resolve(rule: &NamespaceRule, defaults: &CentrifugoConfig) -> Self {
        Self {
            presence: rule.presence.unwrap_or(defaults.presence),
            join_leave: rule.join_leave.unwrap_or(defaults.join_leave),
            force_push_join_leave: rule
                .force_push_join_leave
                .unwrap_or(defaults.force_push_join_leave),
            fossil_delta: rule.fossil_delta.unwrap_or(false),
        }
    }

    /// Whether a subscriber gets the channel's join and leave pushes:
    /// the channel has `join_leave`, and the subscriber's subscribe asked
    /// for them (`asked`, its `join_leave` field) or the channel forces
    /// them, as Centrifugo decides.
    pub(crate) fn pushes_join_leave(&self, asked: bool) -> bool {
        self.join_leave && (asked || self.force_push_join_leave)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_overrides_the_defaults_only_where_it_says() {
        let defaults = CentrifugoConfig {
            presence: true,
            ..CentrifugoConfig::default()
        };
        let silent = NamespaceRule::default();
        assert_eq!(
            ChannelOptions::resolve(&silent, &defaults),
            ChannelOptions {
                presence: true,
                join_leave: false,
                force_push_join_leave: false,
                fossil_delta: false,
            }
        );
        let chat = NamespaceRule {
            presence: Some(false),
            join_leave: Some(true),
            fossil_delta: Some(true),
            ..NamespaceRule::default()
        };
        let options = ChannelOptions::resolve(&chat, &defaults);
        assert_eq!(
            options,
            ChannelOptions {
                presence: false,
                join_leave: true,
                force_push_join_leave: false,
                fossil_delta: true,
            }
        );
        assert!(options.pushes_join_leave(true));
        assert!(!options.pushes_join_leave(false));
        let forced = ChannelOptions {
            force_push_join_leave: true,
            ..options
        };
        assert!(forced.pushes_join_leave(false));
        let off = ChannelOptions {
            join_leave: false,
            ..forced
        };
        assert!(!off.pushes_join_leave(true));
    }
}

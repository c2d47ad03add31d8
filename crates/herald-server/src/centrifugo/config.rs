//! The settings of the Centrifugo protocols.

use std::time::Duration;

use herald_node::node_error::StartError;

/// Settings of `/connection/websocket` (see `docs/centrifugo.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CentrifugoConfig {
    /// How often the server sends its `{}` ping to a connected client, and
    /// the `ping` it advertises in the connect reply, in whole seconds
    /// (Centrifugo's `client.ping_interval`, default 25 s). At least 1 s.
    pub ping_interval: Duration,
    /// How long after a ping the client's `{}` pong may take before the
    /// server closes the connection with 3012 "no pong" (Centrifugo's
    /// `client.pong_timeout`, default 8 s). Must be shorter than
    /// `ping_interval`.
    pub pong_timeout: Duration,
    /// How long a client may take to send its `connect` command after the
    /// upgrade before the server closes with 3502 "stale" (Centrifugo's
    /// `client.stale_close_delay`, default 10 s).
    pub connect_timeout: Duration,
    /// The longest one write to a client's socket may wait (a client that
    /// stops reading leaves the server's writes waiting on a full TCP
    /// window) before the server closes the connection with 3012
    /// (default 10 s). Must be above 0.
    pub write_timeout: Duration,
    /// Whether `presence` and `presence_stats` are answered (default
    /// off: error 108 "not available", as Centrifugo without presence).
    /// On, every subscription is recorded in the storage's presence rows,
    /// seen by every node. The default for channels whose namespace has
    /// no `presence` of its own ([`herald_auth::NamespaceRule::presence`]).
    pub presence: bool,
    /// How long a node's presence rows outlive its last heartbeat; the
    /// node renews them every third of it (default 30 s). A node that dies
    /// drops out of presence within this long.
    pub presence_ttl: Duration,
    /// Whether subscribes and unsubscribes are pushed to the channel's
    /// subscribers as joins and leaves (Centrifugo's `join_leave`, default
    /// off); the default for channels whose namespace has no `join_leave`
    /// of its own ([`herald_auth::NamespaceRule::join_leave`]).
    pub join_leave: bool,
    /// Whether joins and leaves go to every subscriber, not only to those
    /// whose subscribe asked (Centrifugo's `force_push_join_leave`,
    /// default off); the default for namespaces that do not say
    /// ([`herald_auth::NamespaceRule::force_push_join_leave`]).
    pub force_push_join_leave: bool,
    /// The most channels one connection may be subscribed to at once,
    /// client-side and server-side subscriptions together (Centrifugo's
    /// `client.channel_limit`, default 128). A subscribe beyond it answers
    /// 106 "limit exceeded"; a `connect` whose token's `subs` name more
    /// closes with 3505 "channel limit". At least 1: unlike Centrifugo,
    /// where 0 means no limit, Herald always has one.
    pub channel_limit: usize,
    /// Whether a `connect` without a token is accepted as an anonymous
    /// connection (empty user) when access control is on (Centrifugo's
    /// `client.allow_anonymous_connect_without_token`, default off: such a
    /// connect is closed with 3501 "bad request", as Centrifugo does). An
    /// anonymous connection may subscribe to public namespaces only. A
    /// node without access control accepts every connect, as it allows
    /// every request.
    pub anonymous_connect: bool,
}

impl Default for CentrifugoConfig {
    fn default() -> Self {
        Self {
            ping_interval: Duration::from_secs(25),
            pong_timeout: Duration::from_secs(8),
            connect_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            presence: false,
            presence_ttl: Duration::from_secs(30),
            join_leave: false,
            force_push_join_leave: false,
            channel_limit: 128,
            anonymous_connect: false,
        }
    }
}

impl CentrifugoConfig {
    /// Checks the periods and the channel limit.
    ///
    /// # Errors
    /// [`StartError::Config`] naming the first unusable one.
    pub fn validate(&self) -> Result<(), StartError> {
        if self.ping_interval < Duration::from_secs(1) || self.ping_interval.subsec_nanos() != 0 {
            return Err(StartError::Config(
                "centrifugo ping_interval must be a whole number of seconds, at least 1".to_owned(),
            ));
        }
        if self.pong_timeout.is_zero() || self.pong_timeout >= self.ping_interval {
            return Err(StartError::Config(
                "centrifugo pong_timeout must be above 0 and below ping_interval".to_owned(),
            ));
        }
        if self.connect_timeout.is_zero() {
            return Err(StartError::Config(
                "centrifugo connect_timeout must be above 0".to_owned(),
            ));
        }
        if self.write_timeout.is_zero() {
            return Err(StartError::Config(
                "centrifugo write_timeout must be above 0".to_owned(),
            ));
        }
        if self.presence_ttl < Duration::from_millis(30) {
            return Err(StartError::Config(
                "centrifugo presence_ttl must be at least 30 ms".to_owned(),
            ));
        }
        if self.channel_limit == 0 {
            return Err(StartError::Config(
                "centrifugo channel_limit must be at least 1".to_owned(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_centrifugos_and_valid() {
        let c = CentrifugoConfig::default();
        assert_eq!(c.ping_interval, Duration::from_secs(25));
        assert_eq!(c.pong_timeout, Duration::from_secs(8));
        assert_eq!(c.connect_timeout, Duration::from_secs(10));
        assert_eq!(c.write_timeout, Duration::from_secs(10));
        assert!(!c.presence);
        assert!(!c.join_leave);
        assert!(!c.force_push_join_leave);
        assert_eq!(c.presence_ttl, Duration::from_secs(30));
        assert_eq!(c.channel_limit, 128);
        assert!(!c.anonymous_connect);
        c.validate().unwrap();
    }

    #[test]
    fn rejects_unusable_periods() {
        let bad = [
            CentrifugoConfig {
                ping_interval: Duration::from_millis(1500),
                ..CentrifugoConfig::default()
            },
            CentrifugoConfig {
                ping_interval: Duration::ZERO,
                ..CentrifugoConfig::default()
            },
            CentrifugoConfig {
                pong_timeout: Duration::from_secs(25),
                ..CentrifugoConfig::default()
            },
            CentrifugoConfig {
                pong_timeout: Duration::ZERO,
                ..CentrifugoConfig::default()
            },
            CentrifugoConfig {
                connect_timeout: Duration::ZERO,
                ..CentrifugoConfig::default()
            },
            CentrifugoConfig {
                write_timeout: Duration::ZERO,
                ..CentrifugoConfig::default()
            },
            CentrifugoConfig {
                presence_ttl: Duration::ZERO,
                ..CentrifugoConfig::default()
            },
            CentrifugoConfig {
                channel_limit: 0,
                ..CentrifugoConfig::default()
            },
        ];
        for c in bad {
            assert!(
                matches!(c.validate(), Err(StartError::Config(_))),
                "{c:?} was accepted"
            );
        }
    }
}

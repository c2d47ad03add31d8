//! Access control: who may publish, read, subscribe and administer.
//!
//! - `config.rs`: the `[auth]` and `[namespaces]` settings;
//! - `api_keys.rs`: server-side API keys (SHA-256 hashes, constant-time
//!   lookup, key generation);
//! - `jwt.rs`: client tokens (JWT) and what they grant;
//! - `jwks.rs`: JWKS documents and their keys, and a JWKS served at a
//!   URL (cached, refetched for an unknown `kid` within a rate limit);
//! - `wall_clock.rs`: the clock that `jwt.rs` and `jwks.rs` read;
//! - `policy.rs`: channel patterns and namespace rules;
//! - `extract.rs`: credentials from a request (headers, `?token=`), the
//!   cluster secret of forwarded publishes, and the extractors handlers
//!   use;
//! - `rate_limit.rs`: publish rate per API key and per token subject;
//! - `error.rs`: [`AuthError`], folded into [`crate::Error::Auth`].
//!
//! [`Auth`] holds the checked settings and answers every question. With
//! neither an API key nor a JWT key configured, access control is off:
//! every request is allowed, as on a development node on loopback.
//! `docs/security.md` describes the model.

mod api_keys;
mod config;
mod error;
mod extract;
mod jwks;
mod jwt;
mod log_limit;
mod policy;
#[cfg(test)]
mod proptests;
mod rate_limit;
mod wall_clock;

use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};

use herald_core::ChannelName;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub use api_keys::{api_key_sha256, generate_api_key};
pub use config::{
    ApiKeyConfig, AuthConfig, JwtConfig, NamespaceRule, NamespacesConfig, OneOrMany, Permission,
    PublishRule, Secret, SubscribeRule, DEFAULT_HISTORY_RESUME_WINDOW,
};
pub use error::{AuthError, KeyReloadError};
pub(crate) use extract::{Caller, Credential, Subscriber, CLUSTER_SECRET};
pub(crate) use jwt::TokenGrant;

use api_keys::{ApiKey, ApiKeys};
use jwt::JwtVerifier;
use policy::Namespaces;
pub(crate) use policy::Pattern;
use rate_limit::{Limit, PublishLimits, Rate, DEFAULT_RATE_PER_S};

use crate::node_error::StartError;

/// Who is asking, once the request's credentials are checked.
#[derive(Debug, Clone)]
pub(crate) enum Principal {
    /// No credentials (or access control is off).
    Anonymous,
    /// A configured API key.
    Key(Arc<ApiKey>),
    /// A verified client token.
    Token(Arc<TokenGrant>),
    /// A publish forwarded by a node of the cluster, with the cluster
    /// secret: the forwarding node checked the client's credentials.
    Cluster,
}

impl Principal {
    /// The token, for a token principal (its `exp` bounds a subscription).
    pub(crate) fn token(&self) -> Option<&TokenGrant> {
        match self {
            Self::Token(grant) => Some(grant),
            _ => None,
        }
    }
}

/// What a subscriber asks of a channel, as a refusal names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Subscribing (SSE, WebSocket, Centrifugo's `subscribe`).
    Subscribe,
    /// Reading its history (`GET .../messages`, Centrifugo's `history`).
    History,
}

impl Access {
    /// The request in words: `subscribing to orders`, `reading the
    /// history of orders`.
    fn of(self, channel: &ChannelName) -> String {
        match self {
            Self::Subscribe => format!("subscribing to {channel}"),
            Self::History => format!("reading the history of {channel}"),
        }
    }
}

/// The node's access control, built from [`AuthConfig`] and
/// [`NamespacesConfig`] by [`Auth::new`].
#[derive(Debug)]
pub struct Auth {
    enabled: bool,
    keys: ApiKeys,
    jwt: Option<Arc<JwtVerifier>>,
    /// SHA-256 of the cluster secret (compared as digests, so that the
    /// comparison's time does not depend on the length either).
    cluster_secret: Option<[u8; 32]>,
    namespaces: Namespaces,
    limits: PublishLimits,
    protect_metrics: bool,
    /// [`AuthConfig::history_resume_window`], or its default.
    history_resume_window: std::time::Duration,
    /// The WARN of a forwarded request refused for its cluster secret, at
    /// most one a minute.
    forward_refusals: log_limit::LogLimit,
}

impl Auth {
    /// Checks `config` and `namespaces` and builds the access control: API
    /// key hashes decoded, JWT key files read, rate limits set up.
    ///
    /// # Errors
    /// [`StartError::Config`] naming the setting that is wrong (a hash that
    /// is not 64 hex digits, an unreadable key file, a bad rate ...).
    pub fn new(config: &AuthConfig, namespaces: &NamespacesConfig) -> Result<Self, StartError> {
        let keys = ApiKeys::new(&config.api_keys).map_err(StartError::Config)?;
        let jwt = config
            .jwt
            .as_ref()
            .map(JwtVerifier::new)
            .transpose()
            .map_err(StartError::Config)?
            .map(Arc::new);
        let rate = |per_s: Option<f64>, burst: Option<u32>, what: &str| {
            Rate::new(per_s.unwrap_or(DEFAULT_RATE_PER_S), burst)
                .map_err(|e| StartError::Config(format!("{what}: {e}")))
        };
        let auth_sets_rate = config.publish_rate_per_s.is_some() || config.publish_burst.is_some();
        let auth_setting = if auth_sets_rate {
            "[auth] publish_rate_per_s and publish_burst".to_owned()
        } else {
            format!(
                "the default for token subjects, {DEFAULT_RATE_PER_S}/s; \
                 change it with [auth] publish_rate_per_s and publish_burst"
            )
        };
        let subject_limit =
            rate(config.publish_rate_per_s, config.publish_burst, "auth")?.map(|rate| Limit {
                rate,
                setting: auth_setting.clone(),
            });
        let mut key_limits = Vec::new();
        for key in &config.api_keys {
            // A key's own rate; else `[auth]`'s, when it sets one; else
            // none: a backend's key is not limited by default.
            let own = if key.publish_rate_per_s.is_some() || key.publish_burst.is_some() {
                rate(
                    key.publish_rate_per_s.or(config.publish_rate_per_s),
                    key.publish_burst.or(config.publish_burst),
                    &format!("auth.api_keys \"{}\"", key.name),
                )?
                .map(|rate| Limit {
                    rate,
                    setting: format!(
                        "publish_rate_per_s and publish_burst of [[auth.api_keys]] \"{}\"",
                        key.name
                    ),
                })
            } else if auth_sets_rate {
                subject_limit.clone()
            } else {
                None
            };
            key_limits.push((key.name.clone(), own));
        }
        if let Some(secret) = &config.cluster_secret {
            if secret.expose().len() < 16 {
                return Err(StartError::Config(
                    "auth.cluster_secret must be at least 16 bytes".to_owned(),
                ));
            }
        }
        Ok(Self {
            enabled: config.enabled(),
            keys,
            jwt,
            cluster_secret: config
                .cluster_secret
                .as_ref()
                .map(|s| Sha256::digest(s.expose().as_bytes()).into()),
            namespaces: Namespaces::new(namespaces.clone(), config.default_namespace),
            limits: PublishLimits::new(key_limits, subject_limit),
            protect_metrics: config.protect_metrics,
            history_resume_window: config.history_resume_window(),
            forward_refusals: log_limit::LogLimit::default(),
        })
    }

    /// Reads the JWT key files again (PEM files and `jwks_file`), and
    /// makes the next token fetch `jwks_url` again; the number of keys the
    /// files hold now. Without `[auth.jwt]`, nothing to do.
    ///
    /// # Errors
    /// [`KeyReloadError`] naming the file that cannot be read or holds no
    /// usable key; the keys in force stay.
    pub fn reload_jwt_keys(&self) -> Result<usize, KeyReloadError> {
        match &self.jwt {
            Some(jwt) => jwt.reload().map_err(KeyReloadError),
            None => Ok(0),
        }
    }

    /// The publish rates in force, one line each, as `herald config check`
    /// shows them: token subjects, then each API key.
    pub fn publish_rates(&self) -> Vec<String> {
        if !self.enabled {
            return vec!["none: access control is off, publishes are not counted".to_owned()];
        }
        let mut lines = vec![match self.limits.subject_limit() {
            Some(limit) => format!("token subjects: {} ({})", limit.rate, limit.setting),
            None => "token subjects: no limit ([auth] publish_rate_per_s = 0)".to_owned(),
        }];
        for name in self.keys.names() {
            lines.push(match self.limits.key_limit(name) {
                Some(limit) => format!("API key \"{name}\": {} ({})", limit.rate, limit.setting),
                None => format!(
                    "API key \"{name}\": no limit (the default for API keys; set \
                     publish_rate_per_s in its [[auth.api_keys]] entry or in [auth] to limit it)"
                ),
            });
        }
        lines
    }

    /// The rule of `channel`'s namespace (the default rule for a channel
    /// without one, or in a namespace not listed).
    pub(crate) fn namespace_rule(&self, channel: &ChannelName) -> &NamespaceRule {
        self.namespaces.rule(channel)
    }

    /// `true` when API keys or JWT keys are configured: requests are then
    /// checked.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// `true` when `presented` is the cluster secret (constant time).
    fn is_cluster_secret(&self, presented: &[u8]) -> bool {
        let Some(expected) = &self.cluster_secret else {
            return false;
        };
        let digest: [u8; 32] = Sha256::digest(presented).into();
        expected.ct_eq(&digest).into()
    }

    /// May `who` publish to `channel`?
    ///
    /// # Errors
    /// [`AuthError::MissingCredentials`] without credentials,
    /// [`AuthError::Forbidden`] when they do not allow it.
    pub(crate) fn may_publish(
        &self,
        who: &Principal,
        channel: &ChannelName,
    ) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        match who {
            Principal::Cluster => Ok(()),
            Principal::Anonymous => Err(AuthError::MissingCredentials(
                "publishing needs an API key (or a token where the namespace allows it)".to_owned(),
            )),
            Principal::Key(key) => {
                if key.can(Permission::Publish) && key.channels.covers(channel) {
                    Ok(())
                } else {
                    Err(AuthError::Forbidden(format!(
                        "API key \"{}\" may not publish to {channel}",
                        key.name
                    )))
                }
            }
            Principal::Token(grant) => {
                if self.namespaces.rule(channel).publish != PublishRule::Token {
                    Err(AuthError::Forbidden(format!(
                        "{channel} takes publishes from API keys only"
                    )))
                } else if grant.may_publish(channel) {
                    Ok(())
                } else {
                    Err(AuthError::Forbidden(format!(
                        "this token may not publish to {channel}"
                    )))
                }
            }
        }
    }

    /// May `who` subscribe to `channel` (SSE, WebSocket, Centrifugo)?
    ///
    /// # Errors
    /// As [`Auth::may_publish`]; the message says what the channel's
    /// namespace rule needs and what the credentials lack.
    pub(crate) fn may_subscribe(
        &self,
        who: &Principal,
        channel: &ChannelName,
    ) -> Result<(), AuthError> {
        self.may_follow(who, channel, Access::Subscribe)
    }

    /// May `who` take `access` to `channel` under its namespace's
    /// `subscribe` rule? (Reading history, when the namespace's `history`
    /// is on, follows the same rule.)
    fn may_follow(
        &self,
        who: &Principal,
        channel: &ChannelName,
        access: Access,
    ) -> Result<(), AuthError> {
        let rule = self.namespaces.rule(channel).subscribe;
        if !self.enabled || rule == SubscribeRule::Public {
            return Ok(());
        }
        let doing = access.of(channel);
        match (who, rule) {
            (Principal::Key(key), _) => self.key_may_read(key, channel),
            (Principal::Anonymous, SubscribeRule::Key) => Err(AuthError::MissingCredentials(
                format!("{doing} needs an API key with read on it (its namespace's subscribe = \"key\")"),
            )),
            (Principal::Anonymous, SubscribeRule::Authenticated) => {
                Err(AuthError::MissingCredentials(format!(
                    "{doing} needs a token (any valid one with a sub) or an API key with read"
                )))
            }
            (Principal::Anonymous, _) => Err(AuthError::MissingCredentials(format!(
                "{doing} needs a token that grants it (in its channels, channel or subs claim) \
                 or an API key with read"
            ))),
            (Principal::Token(_), SubscribeRule::Key) => Err(AuthError::Forbidden(format!(
                "{doing} needs an API key with read; its namespace's subscribe = \"key\" \
                 takes no token"
            ))),
            // Centrifugo's `allow_subscribe_for_client`: any authenticated
            // client, that is a token whose `sub` names a user.
            (Principal::Token(grant), SubscribeRule::Authenticated) => {
                if grant.subject.is_empty() && !grant.may_read(channel) {
                    Err(AuthError::Forbidden(format!(
                        "{doing} needs a token whose sub names a user; this one's sub is empty"
                    )))
                } else {
                    Ok(())
                }
            }
            (Principal::Token(grant), _) => {
                if grant.may_read(channel) {
                    Ok(())
                } else {
                    Err(AuthError::Forbidden(format!(
                        "{doing}: this token does not grant {channel} (no entry of its \
                         channels claim covers it, nor its channel or subs claim)"
                    )))
                }
            }
            (Principal::Cluster, _) => Err(AuthError::Forbidden(
                "the cluster secret is for writes forwarded between nodes only".to_owned(),
            )),
        }
    }

    /// May `who` read the history of `channel`? An API key with `read`
    /// may; others as for subscribing, if the namespace's `history` is on.
    ///
    /// # Errors
    /// As [`Auth::may_publish`].
    pub(crate) fn may_read_history(
        &self,
        who: &Principal,
        channel: &ChannelName,
    ) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        if let Principal::Key(key) = who {
            return self.key_may_read(key, channel);
        }
        if self.namespaces.rule(channel).history {
            return self.may_follow(who, channel, Access::History);
        }
        match who {
            Principal::Anonymous => Err(AuthError::MissingCredentials(format!(
                "reading the history of {channel} needs an API key with read \
                 (its namespace's history = false)"
            ))),
            _ => Err(AuthError::Forbidden(format!(
                "reading the history of {channel} needs an API key with read; its \
                 namespace's history = false gives tokens live messages only"
            ))),
        }
    }

    /// For a subscriber `who` that may subscribe to `channel`: `None` when
    /// it may also read the channel's history ([`Auth::may_read_history`]),
    /// else the history resume window: such a subscriber starts at the
    /// head, and a resume point below it is honoured only when the oldest
    /// message after it was published less than this long ago (see
    /// `docs/security.md`, "History and live-only subscribers").
    pub(crate) fn live_only_window(
        &self,
        who: &Principal,
        channel: &ChannelName,
    ) -> Option<std::time::Duration> {
        self.may_read_history(who, channel)
            .is_err()
            .then_some(self.history_resume_window)
    }

    fn key_may_read(&self, key: &ApiKey, channel: &ChannelName) -> Result<(), AuthError> {
        if key.can(Permission::Read) && key.channels.covers(channel) {
            Ok(())
        } else {
            Err(AuthError::Forbidden(format!(
                "API key \"{}\" may not read {channel}",
                key.name
            )))
        }
    }

    /// May `who` use the admin routes (`/v1/channels`, `/v1/status`
    /// details)?
    ///
    /// # Errors
    /// As [`Auth::may_publish`].
    pub(crate) fn may_admin(&self, who: &Principal) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        match who {
            Principal::Key(key) if key.can(Permission::Admin) => Ok(()),
            Principal::Anonymous => Err(AuthError::MissingCredentials(
                "this route needs an API key with admin".to_owned(),
            )),
            _ => Err(AuthError::Forbidden(
                "this route needs an API key with admin".to_owned(),
            )),
        }
    }

    /// May `who` read `/metrics`? Anyone, unless `protect_metrics`.
    ///
    /// # Errors
    /// As [`Auth::may_admin`].
    pub(crate) fn may_scrape(&self, who: &Principal) -> Result<(), AuthError> {
        if self.protect_metrics {
            self.may_admin(who)
        } else {
            Ok(())
        }
    }

    /// Takes `messages` publishes from `who`'s rate (per API key, per token
    /// subject; forwarded and anonymous publishes are not counted here).
    ///
    /// # Errors
    /// [`AuthError::RateLimited`] with the wait.
    pub(crate) fn take_publishes(&self, who: &Principal, messages: usize) -> Result<(), AuthError> {
        match who {
            Principal::Key(key) => self.limits.check_key(&key.name, messages),
            Principal::Token(grant) => self.limits.check_subject(&grant.subject, messages),
            Principal::Anonymous | Principal::Cluster => Ok(()),
        }
    }
}

/// The access control in force on one node. A reload
/// ([`AuthReload::replace`]) swaps it whole; each request reads it once
/// ([`AuthSlot::load`]) and is judged by one version throughout.
#[derive(Debug)]
pub(crate) struct AuthSlot(RwLock<Arc<Auth>>);

impl AuthSlot {
    /// A slot holding `auth`.
    pub(crate) fn new(auth: Auth) -> Self {
        Self(RwLock::new(Arc::new(auth)))
    }

    /// The access control in force now.
    pub(crate) fn load(&self) -> Arc<Auth> {
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn store(&self, auth: Auth) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(auth);
    }
}

/// Reloads the access control of the nodes started with a
/// [`crate::ServerConfig`] holding it: `herald serve` calls
/// [`AuthReload::replace`] on SIGHUP when the config file's `[auth]` or
/// `[namespaces]` changed (API keys, JWT keys, namespace rules, publish
/// rates, `protect_metrics`, `history_resume_window`), and
/// [`AuthReload::reload_jwt_keys`] when they did not, so that a key added
/// to the JWKS file for a rotation is accepted without a restart. Clones
/// share the same nodes. It is not a setting: two handles compare equal.
#[derive(Clone, Default)]
pub struct AuthReload(Arc<Mutex<Vec<Weak<AuthSlot>>>>);

impl AuthReload {
    /// Has the access control in `slot` reloaded by this handle from now
    /// on.
    pub(crate) fn attach(&self, slot: &Arc<AuthSlot>) {
        let mut nodes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        nodes.retain(|node| node.strong_count() > 0);
        nodes.push(Arc::downgrade(slot));
    }

    /// The slots of the nodes still running.
    fn slots(&self) -> Vec<Arc<AuthSlot>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Reads the JWT key files of every running node attached again; the
    /// number of keys they hold now (summed over the nodes).
    ///
    /// # Errors
    /// [`KeyReloadError`] naming the file that cannot be read or holds no
    /// usable key; that node keeps the keys in force.
    pub fn reload_jwt_keys(&self) -> Result<usize, KeyReloadError> {
        let mut keys = 0;
        for slot in self.slots() {
            keys += slot.load().reload_jwt_keys()?;
        }
        Ok(keys)
    }

    /// Puts `config` and `namespaces` in force on every running node
    /// attached, checked as at the start ([`Auth::new`]: key files read
    /// again). Requests from then on are judged by them; subscriptions
    /// already open stay open (a token's still end at its `exp`). The
    /// publish rate buckets start full again. The cluster secret in force
    /// stays: the forwarder sends the one it started with, so a new one
    /// takes effect at the next restart. Returns the number of nodes
    /// whose access control was replaced.
    ///
    /// # Errors
    /// [`StartError::Config`] naming the setting that is wrong, or when
    /// the new settings would turn access control off (no API key, no
    /// `[auth.jwt]`) on a node that has it on: that needs a restart, which
    /// checks the exposure again. The settings in force stay.
    pub fn replace(
        &self,
        config: &AuthConfig,
        namespaces: &NamespacesConfig,
    ) -> Result<usize, StartError> {
        let slots = self.slots();
        let mut built = Vec::with_capacity(slots.len());
        for slot in &slots {
            let current = slot.load();
            let mut next = Auth::new(config, namespaces)?;
            if current.enabled && !next.enabled {
                return Err(StartError::Config(
                    "the new [auth] has neither API keys nor [auth.jwt]: turning access control \
                     off needs a restart"
                        .to_owned(),
                ));
            }
            next.cluster_secret = current.cluster_secret;
            built.push(next);
        }
        for (slot, next) in slots.iter().zip(built) {
            slot.store(next);
        }
        Ok(slots.len())
    }
}

impl std::fmt::Debug for AuthReload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthReload")
    }
}

/// Not a setting: every handle equals every other.
impl PartialEq for AuthReload {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for AuthReload {}

//! [`Auth`]: the node's access control, built from the checked settings,
//! and [`Principal`], who is asking once a credential is checked. `Auth`
//! answers every question: `may_publish`, `may_subscribe`,
//! `may_read_history`, `may_admin`, `may_scrape`, `take_publishes`.
//!
//! With neither an API key nor a JWT key configured, access control is
//! off: every request is allowed, as on a development node on loopback.
//! `docs/security.md` describes the model.

use std::sync::Arc;

use herald_core::ChannelName;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::api_keys::{ApiKey, ApiKeys};
use crate::config::{
    AuthConfig, NamespaceRule, NamespacesConfig, Permission, PublishRule, SubscribeRule,
};
use crate::error::AuthError;
use crate::jwks::JwksFetch;
use crate::jwt::{JwtVerifier, TokenGrant};
use crate::log_limit::LogLimit;
use crate::policy::Namespaces;
use crate::rate_limit::{Limit, PublishLimits, Rate, DEFAULT_RATE_PER_S};

/// A credential as presented, whatever carried it (a header, `?token=`,
/// a WebSocket's first frame, a Centrifugo command).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential<'a> {
    /// `Authorization: Bearer`: an API key or a token.
    Bearer(&'a str),
    /// `X-API-Key`: an API key only.
    ApiKey(&'a str),
    /// `?token=` or a WebSocket's first frame: a token only.
    Token(&'a str),
}

/// Who is asking, once the request's credentials are checked.
#[derive(Debug, Clone)]
pub enum Principal {
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
    /// Who this is, for audit logs, never a secret: `key:<name>` (the API
    /// key's configured name, not the key), `token:<sub>`, `cluster` (a
    /// request another node forwarded) or `anonymous`.
    pub fn actor(&self) -> String {
        match self {
            Self::Anonymous => "anonymous".to_owned(),
            Self::Key(key) => format!("key:{}", key.name),
            Self::Token(grant) => format!("token:{}", grant.subject),
            Self::Cluster => "cluster".to_owned(),
        }
    }

    /// The token, for a token principal (its `exp` bounds a subscription).
    pub fn token(&self) -> Option<&TokenGrant> {
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
    forward_refusals: LogLimit,
    /// Fetches `[auth.jwt] jwks_url` for this access control and the
    /// next one a reload builds.
    jwks_fetch: Arc<dyn JwksFetch>,
}

impl Auth {
    /// Checks `config` and `namespaces` and builds the access control: API
    /// key hashes decoded, JWT key files read, rate limits set up. A
    /// `jwks_url` is fetched through `jwks_fetch` when a token first needs
    /// it (the caller's HTTP client; [`crate::jwks::NoFetch`] where no
    /// token is verified, as in a config check).
    ///
    /// # Errors
    /// [`AuthError::Config`] naming the setting that is wrong (a hash that
    /// is not 64 hex digits, an unreadable key file, a bad rate ...).
    pub fn new(
        config: &AuthConfig,
        namespaces: &NamespacesConfig,
        jwks_fetch: Arc<dyn JwksFetch>,
    ) -> Result<Self, AuthError> {
        let keys = ApiKeys::new(&config.api_keys).map_err(AuthError::Config)?;
        let jwt = config
            .jwt
            .as_ref()
            .map(|jwt| JwtVerifier::new(jwt, Arc::clone(&jwks_fetch)))
            .transpose()
            .map_err(AuthError::Config)?
            .map(Arc::new);
        let rate = |per_s: Option<f64>, burst: Option<u32>, what: &str| {
            Rate::new(per_s.unwrap_or(DEFAULT_RATE_PER_S), burst)
                .map_err(|e| AuthError::Config(format!("{what}: {e}")))
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
                return Err(AuthError::Config(
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
            forward_refusals: LogLimit::default(),
            jwks_fetch,
        })
    }

    /// Reads the JWT key files again (PEM files and `jwks_file`), and
    /// makes the next token fetch `jwks_url` again; the number of keys the
    /// files hold now. Without `[auth.jwt]`, nothing to do.
    ///
    /// # Errors
    /// [`AuthError::KeyReload`] naming the file that cannot be read or
    /// holds no usable key; the keys in force stay.
    pub fn reload_jwt_keys(&self) -> Result<usize, AuthError> {
        match &self.jwt {
            Some(jwt) => jwt.reload().map_err(AuthError::KeyReload),
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
    pub fn namespace_rule(&self, channel: &ChannelName) -> &NamespaceRule {
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
    pub fn may_publish(&self, who: &Principal, channel: &ChannelName) -> Result<(), AuthError> {
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
    pub fn may_subscribe(&self, who: &Principal, channel: &ChannelName) -> Result<(), AuthError> {
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
    pub fn may_read_history(
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
    pub fn live_only_window(
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
    pub fn may_admin(&self, who: &Principal) -> Result<(), AuthError> {
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

    /// May `who` create, close or delete the Durable Streams stream
    /// `channel` (its right to publish there is checked apart, by
    /// [`Auth::may_publish`])? An API key with `admin` may; anyone else
    /// only where the channel's namespace has `streams = true`. A forwarded
    /// write ([`Principal::Cluster`]) was checked by the node that
    /// forwarded it, with the client's own credentials.
    ///
    /// # Errors
    /// As [`Auth::may_publish`]; the message names the namespace rule.
    pub fn may_manage_stream(
        &self,
        who: &Principal,
        channel: &ChannelName,
    ) -> Result<(), AuthError> {
        if !self.enabled || self.namespaces.rule(channel).streams == Some(true) {
            return Ok(());
        }
        match who {
            Principal::Cluster => Ok(()),
            Principal::Key(key) if key.can(Permission::Admin) => Ok(()),
            Principal::Anonymous => Err(AuthError::MissingCredentials(format!(
                "creating, closing or deleting the stream {channel} needs an API key with \
                 admin (its namespace's streams = false)"
            ))),
            _ => Err(AuthError::Forbidden(format!(
                "creating, closing or deleting the stream {channel} needs an API key with \
                 admin, or its namespace's streams = true"
            ))),
        }
    }

    /// May `who` read `/metrics`? Anyone, unless `protect_metrics`.
    ///
    /// # Errors
    /// As [`Auth::may_admin`].
    pub fn may_scrape(&self, who: &Principal) -> Result<(), AuthError> {
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
    pub fn take_publishes(&self, who: &Principal, messages: usize) -> Result<(), AuthError> {
        match who {
            Principal::Key(key) => self.limits.check_key(&key.name, messages),
            Principal::Token(grant) => self.limits.check_subject(&grant.subject, messages),
            Principal::Anonymous | Principal::Cluster => Ok(()),
        }
    }
}

impl Auth {
    /// Who presents `credential` (none: [`Principal::Anonymous`]). With
    /// access control off, always anonymous.
    ///
    /// # Errors
    /// [`AuthError::InvalidCredentials`] for an unknown API key or a token
    /// that does not verify; [`AuthError::TokenExpired`] for an expired
    /// one.
    pub async fn resolve(
        &self,
        credential: Option<Credential<'_>>,
    ) -> Result<Principal, AuthError> {
        if !self.enabled {
            return Ok(Principal::Anonymous);
        }
        match credential {
            None => Ok(Principal::Anonymous),
            Some(Credential::ApiKey(text)) => self
                .keys
                .find(text)
                .map(Principal::Key)
                .ok_or_else(|| AuthError::InvalidCredentials("unknown API key".to_owned())),
            Some(Credential::Token(text)) => self.token(text).await,
            Some(Credential::Bearer(text)) => match self.keys.find(text) {
                Some(key) => Ok(Principal::Key(key)),
                // A JWT has three dot-separated parts; an API key has none.
                None if text.contains('.') => self.token(text).await,
                None => Err(AuthError::InvalidCredentials(
                    "unknown API key or invalid token".to_owned(),
                )),
            },
        }
    }

    /// The principal of the client token `text`.
    async fn token(&self, text: &str) -> Result<Principal, AuthError> {
        match &self.jwt {
            Some(jwt) => jwt.verify(text).await.map(|g| Principal::Token(g.into())),
            None => Err(AuthError::InvalidCredentials(
                "this server accepts API keys only, no tokens".to_owned(),
            )),
        }
    }

    /// The principal of a write forwarded by another node, which presents
    /// the cluster secret `presented` (if any) and names itself
    /// `forwarded_by` (its node id, for the log): [`Principal::Cluster`]
    /// with the cluster secret; without it, refused once a cluster secret
    /// or access control is configured (and anonymous on an open node, as
    /// before).
    ///
    /// # Errors
    /// [`AuthError::InvalidCredentials`] without the right cluster secret;
    /// such a refusal is logged (WARN, at most one a minute).
    pub fn forwarded(
        &self,
        presented: Option<&[u8]>,
        forwarded_by: &str,
    ) -> Result<Principal, AuthError> {
        if self.cluster_secret.is_none() && !self.enabled {
            return Ok(Principal::Anonymous);
        }
        match presented {
            Some(secret) if self.is_cluster_secret(secret) => Ok(Principal::Cluster),
            _ => {
                self.warn_forward_refused(forwarded_by, presented.is_some());
                Err(AuthError::InvalidCredentials(
                    "a forwarded request needs the cluster secret".to_owned(),
                ))
            }
        }
    }

    /// Logs a WARN (at most one per [`crate::log_limit::LOG_INTERVAL`])
    /// for a forwarded request refused for its cluster secret: without
    /// it, every publish that reaches a standby fails with 401 and the
    /// operator would hear of it only from the clients.
    fn warn_forward_refused(&self, forwarded_by: &str, presented: bool) {
        let Some(held_back) = self.forward_refusals.allow() else {
            return;
        };
        let forwarded_by = forwarded_by.get(..64).unwrap_or(forwarded_by);
        let reason = match (presented, self.cluster_secret.is_some()) {
            (_, false) => "this node has no auth.cluster_secret",
            (false, true) => "the request carries no cluster secret",
            (true, true) => "the request's cluster secret differs from this node's",
        };
        tracing::warn!(
            forwarded_by,
            reason,
            refused_since_last_warning = held_back,
            "refused a forwarded request (401): give every node the same auth.cluster_secret"
        );
    }

    /// The fetcher of `jwks_url` this access control was built with.
    pub(crate) fn jwks_fetch(&self) -> Arc<dyn JwksFetch> {
        Arc::clone(&self.jwks_fetch)
    }

    /// Keeps the cluster secret of `current`: a reload does not change
    /// it (the forwarder sends the one it started with).
    pub(crate) fn keep_cluster_secret(&mut self, current: &Self) {
        self.cluster_secret = current.cluster_secret;
    }
}

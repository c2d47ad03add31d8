//! The access-control settings as the config file spells them: the
//! `[auth]` section ([`AuthConfig`]) and the `[namespaces.<name>]` tables
//! ([`NamespacesConfig`]). `docs/security.md` documents every key.
//!
//! These are plain data; [`crate::access::Auth::new`] checks them and builds
//! what the server uses (hashes decoded, JWT keys read from their files).
//! They serialize with every [`Secret`] masked as `"***"`, to show the
//! effective settings without their secrets.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

/// A secret from the config (a JWT secret, the cluster secret): its
/// `Debug` form and its serialized form are `"***"`, so that it never
/// reaches a log or a printed config. Deserialized from a plain TOML
/// string.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself; never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("***")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

/// One value or a list of them: `hs256_secret = "s"` or
/// `hs256_secret = ["new", "old"]` (several at once while rotating).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    /// A single value.
    One(T),
    /// Several values, all accepted.
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    /// The values, in order.
    pub fn as_slice(&self) -> &[T] {
        match self {
            Self::One(value) => std::slice::from_ref(value),
            Self::Many(values) => values,
        }
    }
}

impl<T> Default for OneOrMany<T> {
    fn default() -> Self {
        Self::Many(Vec::new())
    }
}

/// What an API key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// Publish (single and batch) to the key's channels.
    Publish,
    /// Read history of, and subscribe (SSE, WebSocket) to, the key's
    /// channels.
    Read,
    /// `/v1/status` details, `/v1/channels`, and `/metrics` when
    /// [`AuthConfig::protect_metrics`] is set.
    Admin,
}

/// The `[auth]` section. With neither an API key nor a JWT key configured,
/// access control is off and every request is allowed (the development
/// default on loopback); see `docs/security.md`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// `[[auth.api_keys]]`: the server-side keys backends use.
    #[serde(default)]
    pub api_keys: Vec<ApiKeyConfig>,
    /// `[auth.jwt]`: how client tokens are verified.
    #[serde(default)]
    pub jwt: Option<JwtConfig>,
    /// Shared by every node of a cluster: a standby sends it with each
    /// publish it forwards, and the holder trusts a forwarded publish only
    /// when it carries it. Required for forwarding once auth is on.
    #[serde(default)]
    pub cluster_secret: Option<Secret>,
    /// When `true`, `/metrics` needs an API key with `admin` (default
    /// `false`: open, for scrapers on a private network).
    #[serde(default)]
    pub protect_metrics: bool,
    /// Publishes per second allowed to each API key and each token subject
    /// (`sub`) that has no rate of its own; default 100. `0` turns the
    /// limit off; a fraction (`0.5`) is one publish every 2 s. Each message
    /// of a batch counts.
    #[serde(default)]
    pub publish_rate_per_s: Option<f64>,
    /// Publishes allowed at once above the steady rate (the token bucket's
    /// size), default twice the rate.
    #[serde(default)]
    pub publish_burst: Option<u32>,
    /// Rules for channels without a namespace (no `:` in the name) and for
    /// namespaces not listed under `[namespaces]`.
    #[serde(default)]
    pub default_namespace: NamespaceRule,
    /// How recent stored messages must be for a subscriber that may not
    /// read a channel's history (`history = false`) to get them on a
    /// resume: its resume point is honoured only when the oldest message
    /// after it was published less than this long ago, else it starts at
    /// the head (SSE `history_withheld`, Centrifugo `recovered: false`).
    /// In the file a humantime duration (`"30s"`); absent:
    /// [`DEFAULT_HISTORY_RESUME_WINDOW`]; `"0s"`: never.
    #[serde(
        default,
        deserialize_with = "duration_opt",
        serialize_with = "duration_text_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub history_resume_window: Option<Duration>,
}

/// [`AuthConfig::history_resume_window`] when the file does not set it:
/// long enough for a client to notice a dropped connection and reconnect,
/// short enough that a late joiner reads almost nothing it did not see.
pub const DEFAULT_HISTORY_RESUME_WINDOW: Duration = Duration::from_secs(30);

/// A humantime duration (`"30s"`, `"2m"`) from the file.
fn duration_opt<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("{e} (write e.g. 30s, 2m)")))
}

/// A duration as the file writes it (`"30s"`).
fn duration_text_opt<S: Serializer>(value: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
        None => s.serialize_none(),
    }
}

// The rates are finite (checked by `Auth::new`), so equality is total.
impl Eq for AuthConfig {}

impl AuthConfig {
    /// `true` when access control is on: at least one API key or a
    /// `[auth.jwt]` section is configured. Without, every request is
    /// allowed (see `docs/security.md`, "The safe default").
    pub fn enabled(&self) -> bool {
        !self.api_keys.is_empty() || self.jwt.is_some()
    }

    /// [`AuthConfig::history_resume_window`], or its default.
    pub fn history_resume_window(&self) -> Duration {
        self.history_resume_window
            .unwrap_or(DEFAULT_HISTORY_RESUME_WINDOW)
    }
}

/// `[[auth.api_keys]]`: one server-side API key.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// A name for humans and logs (the key itself is never logged).
    pub name: String,
    /// SHA-256 of the key, 64 hex digits (`herald keys generate` prints
    /// it).
    pub sha256: String,
    /// What the key may do.
    pub permissions: Vec<Permission>,
    /// Channel patterns the key applies to (`*` matches any run of
    /// characters); absent means every channel.
    #[serde(default)]
    pub channels: Option<Vec<String>>,
    /// This key's publish rate, per second (overrides
    /// [`AuthConfig::publish_rate_per_s`]; `0`: no limit).
    #[serde(default)]
    pub publish_rate_per_s: Option<f64>,
    /// This key's burst (overrides [`AuthConfig::publish_burst`]).
    #[serde(default)]
    pub publish_burst: Option<u32>,
}

impl Eq for ApiKeyConfig {}

/// `[auth.jwt]`: the keys that verify client tokens (RFC 7519). Several
/// may be given at once, so that keys rotate without downtime.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// HS256 shared secret(s).
    #[serde(default)]
    pub hs256_secret: OneOrMany<Secret>,
    /// File(s) holding an RSA public key in PEM, for RS256.
    #[serde(default)]
    pub rsa_public_key_pem: OneOrMany<PathBuf>,
    /// File(s) holding a P-256 public key in PEM, for ES256.
    #[serde(default)]
    pub ec_public_key_pem: OneOrMany<PathBuf>,
    /// A JWKS file (RFC 7517 §5); the key is picked by the token's `kid`.
    /// Read at the start and again on SIGHUP.
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// A JWKS served at this URL (`https`, or `http` to a loopback host),
    /// fetched when a token first needs it, then again when
    /// [`JwtConfig::jwks_cache_ttl_s`] has passed or a token names a `kid`
    /// it does not hold (at most once per
    /// [`JwtConfig::jwks_refetch_interval_s`]). Each fetch may take 5 s
    /// and 256 KiB at most, and follows no redirect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_url: Option<String>,
    /// Seconds a fetched `jwks_url` set is used before it is fetched
    /// again (default 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_cache_ttl_s: Option<u64>,
    /// Shortest time between two fetches of `jwks_url`, seconds (default
    /// 10): tokens with unknown `kid`s cause at most one fetch per
    /// interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_refetch_interval_s: Option<u64>,
    /// If set, a token's `aud` must name it.
    #[serde(default)]
    pub audience: Option<String>,
    /// If set, a token's `iss` must be it.
    #[serde(default)]
    pub issuer: Option<String>,
}

/// Who may subscribe to a namespace's channels (SSE, WebSocket).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SubscribeRule {
    /// Anyone, without credentials.
    Public,
    /// A token granting the channel, or an API key with `read` on it.
    #[default]
    Token,
    /// Only an API key with `read` on the channel.
    Key,
    /// Any valid token whose `sub` is not empty (an authenticated user),
    /// whatever channels it lists, or an API key with `read` on the
    /// channel: Centrifugo's namespace option `allow_subscribe_for_client`.
    Authenticated,
}

/// Who may publish to a namespace's channels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PublishRule {
    /// Only an API key with `publish` on the channel.
    #[default]
    Key,
    /// Also a token whose `publish` claim matches the channel.
    Token,
}

/// The rules of one namespace (`[namespaces.<name>]`) or of the default
/// one (`[auth.default_namespace]`). Every field has a safe default:
/// subscribe with a token, publish with a key, history readable by
/// subscribers. The last three are Centrifugo's channel options of the
/// same names (Centrifugo's documentation, "Channels", "Channel
/// options"); absent, the `[centrifugo]` setting of the same name (off
/// by default) applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceRule {
    /// Who may subscribe (default `token`).
    #[serde(default)]
    pub subscribe: SubscribeRule,
    /// Who may publish (default `key`).
    #[serde(default)]
    pub publish: PublishRule,
    /// Whether those allowed to subscribe may also read history (default
    /// `true`); when `false`, history needs an API key with `read`.
    #[serde(default = "yes")]
    pub history: bool,
    /// Whether Centrifugo's `presence` and `presence_stats` are answered
    /// for the namespace's channels (off: error 108 "not available") and
    /// its subscribers recorded in the storage's presence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence: Option<bool>,
    /// Whether a Centrifugo client's subscribe and unsubscribe (or
    /// disconnect) in the namespace's channels are announced to the
    /// channel's subscribers as join and leave pushes, on every node;
    /// a subscriber gets them when its subscribe asked (`join_leave`)
    /// or `force_push_join_leave` is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join_leave: Option<bool>,
    /// With `join_leave`, push joins and leaves to every subscriber,
    /// whether or not its subscribe asked for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_push_join_leave: Option<bool>,
    /// Whether a Centrifugo subscriber that asks for `delta: "fossil"`
    /// gets its publications after the first as Fossil deltas of the
    /// previous one (Centrifugo's `allowed_delta_types = ["fossil"]`);
    /// absent or `false`: the subscribe result says no delta, and every
    /// publication comes whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fossil_delta: Option<bool>,
    /// Whether those who may publish to the namespace's channels may also
    /// create, close and delete Durable Streams streams there (`true`);
    /// absent or `false`, that takes an API key with `admin` as well
    /// (docs/durable-streams.md, "Rights"). A stream's closure or deletion
    /// takes its channel from every other writer, so it is a right of its
    /// own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<bool>,
}

fn yes() -> bool {
    true
}

impl Default for NamespaceRule {
    fn default() -> Self {
        Self {
            subscribe: SubscribeRule::default(),
            publish: PublishRule::default(),
            history: true,
            presence: None,
            join_leave: None,
            force_push_join_leave: None,
            fossil_delta: None,
            streams: None,
        }
    }
}

/// The `[namespaces]` tables: namespace name (the part of a channel name
/// before its first `:`) to its rules.
pub type NamespacesConfig = BTreeMap<String, NamespaceRule>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses() {
        let text = r#"
            cluster_secret = "c"
            protect_metrics = true
            publish_rate_per_s = 5
            [[api_keys]]
            name = "backend"
            sha256 = "00"
            permissions = ["publish", "read"]
            channels = ["news:*"]
            [jwt]
            hs256_secret = ["new", "old"]
            audience = "herald"
            [default_namespace]
            subscribe = "public"
        "#;
        let auth: AuthConfig = toml::from_str(text).unwrap();
        assert_eq!(
            auth.api_keys[0].permissions,
            [Permission::Publish, Permission::Read]
        );
        assert_eq!(auth.jwt.as_ref().unwrap().hs256_secret.as_slice().len(), 2);
        assert_eq!(auth.default_namespace.subscribe, SubscribeRule::Public);
        assert!(auth.default_namespace.history);
        assert_eq!(auth.history_resume_window(), DEFAULT_HISTORY_RESUME_WINDOW);
        let window: AuthConfig = toml::from_str("history_resume_window = \"2m\"").unwrap();
        assert_eq!(window.history_resume_window(), Duration::from_secs(120));
        let shown = toml::to_string(&window).unwrap();
        assert!(shown.contains("history_resume_window = \"2m\""), "{shown}");
        assert!(toml::from_str::<AuthConfig>("history_resume_window = 30").is_err());
        assert!(toml::from_str::<AuthConfig>("history_resume_window = \"soon\"").is_err());
        let namespaces: NamespacesConfig =
            toml::from_str("[chat]\nsubscribe = \"key\"\npublish = \"token\"\nhistory = false\n")
                .unwrap();
        assert_eq!(namespaces["chat"].publish, PublishRule::Token);
        assert!(!namespaces["chat"].history);
        assert_eq!(namespaces["chat"].presence, None);
        let namespaces: NamespacesConfig = toml::from_str(
            "[chat]\npresence = true\njoin_leave = true\nforce_push_join_leave = false\n",
        )
        .unwrap();
        let chat = namespaces["chat"];
        assert_eq!(
            (chat.presence, chat.join_leave, chat.force_push_join_leave),
            (Some(true), Some(true), Some(false))
        );
        assert!(toml::from_str::<NamespacesConfig>("[chat]\njoinleave = true").is_err());
        assert!(toml::from_str::<NamespacesConfig>("[chat]\npresence = \"yes\"").is_err());
    }

    #[test]
    fn unknown_keys_and_values_are_refused() {
        assert!(toml::from_str::<AuthConfig>("api_key = []").is_err());
        assert!(toml::from_str::<NamespacesConfig>("[a]\nsubscribe = \"anyone\"").is_err());
        assert!(toml::from_str::<AuthConfig>(
            "[[api_keys]]\nname=\"a\"\nsha256=\"0\"\npermissions=[\"write\"]"
        )
        .is_err());
    }

    #[test]
    fn secrets_are_masked_in_debug() {
        let auth: AuthConfig =
            toml::from_str("cluster_secret = \"hunter2\"\n[jwt]\nhs256_secret = \"s3cr3t\"")
                .unwrap();
        let shown = format!("{auth:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("s3cr3t"),
            "{shown}"
        );
    }
}

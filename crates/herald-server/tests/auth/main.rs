//! Access control end to end, on SQLite and PostgreSQL: nodes served
//! in-process on a real listener with an `[auth]` config
//! (`herald_testkit::node::Node` on a `herald_testkit::place::Place`),
//! driven over HTTP, SSE and WebSocket; and Centrifugo's protocols on top
//! of it (`centrifugo/`).

mod centrifugo;
mod exp_boundary;
mod expiry;
mod forwarding;
mod history_rights;
mod keys;
mod limits;
mod secrets;
mod streams;
mod tokens;

use herald_auth::{
    api_key_sha256, generate_api_key, ApiKeyConfig, AuthConfig, JwtConfig, NamespaceRule,
    NamespacesConfig, OneOrMany, Permission, PublishRule, Secret, SubscribeRule,
};
use herald_server::ServerConfig;
pub(crate) use herald_testkit::node::{Node, Role};
pub(crate) use herald_testkit::place::{Backend, Place};
use jsonwebtoken::{encode, EncodingKey, Header};
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

/// The credentials of a test, all generated now.
pub(crate) struct Creds {
    /// `publish` on `news:*`, `room:*`, `open:*`.
    pub(crate) publisher: String,
    /// `read` on `news:*`.
    pub(crate) reader: String,
    /// `admin`.
    pub(crate) admin: String,
    /// `publish`, `read` and `admin` on every channel, as an application
    /// backend's key for Centrifugo's server API.
    pub(crate) backend: String,
    /// `publish` on every channel, 3 at once then one per 1000 s.
    pub(crate) limited: String,
    pub(crate) jwt_secret: String,
    pub(crate) cluster_secret: String,
}

impl Creds {
    pub(crate) fn new() -> Self {
        Self {
            publisher: generate_api_key(),
            reader: generate_api_key(),
            admin: generate_api_key(),
            backend: generate_api_key(),
            limited: generate_api_key(),
            jwt_secret: generate_api_key(),
            cluster_secret: generate_api_key(),
        }
    }

    /// `Authorization: Bearer <credential>`.
    pub(crate) fn bearer(credential: &str) -> String {
        format!("Bearer {credential}")
    }

    /// An HS256 token with `claims`, signed with this test's secret.
    pub(crate) fn token(&self, claims: Value) -> String {
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(self.jwt_secret.as_bytes()),
        )
        .unwrap()
    }

    /// A token for `sub`, valid for 5 minutes, with `extra` claims.
    pub(crate) fn token_for(&self, sub: &str, extra: Value) -> String {
        let mut claims = json!({ "sub": sub, "exp": now_s() + 300, "iat": now_s() });
        for (k, v) in extra.as_object().unwrap() {
            claims[k] = v.clone();
        }
        self.token(claims)
    }

    /// The server config of the tests: the keys above, the JWT secret,
    /// the cluster secret, namespaces `open` (public subscribe), `keyonly`
    /// (subscribe with a key), `room` (token publishes, no history for
    /// tokens); default rules elsewhere; protected metrics; no rate limit
    /// except the `limited` key's.
    pub(crate) fn config(&self) -> ServerConfig {
        let key = |name: &str,
                   key: &str,
                   permissions: Vec<Permission>,
                   channels: Option<Vec<&str>>| ApiKeyConfig {
            name: name.to_owned(),
            sha256: api_key_sha256(key),
            permissions,
            channels: channels.map(|c| c.into_iter().map(str::to_owned).collect()),
            publish_rate_per_s: None,
            publish_burst: None,
        };
        let mut limited = key("limited", &self.limited, vec![Permission::Publish], None);
        limited.publish_rate_per_s = Some(0.001);
        limited.publish_burst = Some(3);
        let auth = AuthConfig {
            api_keys: vec![
                key(
                    "publisher",
                    &self.publisher,
                    vec![Permission::Publish],
                    Some(vec!["news:*", "room:*", "open:*"]),
                ),
                key(
                    "reader",
                    &self.reader,
                    vec![Permission::Read],
                    Some(vec!["news:*"]),
                ),
                key("admin", &self.admin, vec![Permission::Admin], None),
                key(
                    "backend",
                    &self.backend,
                    vec![Permission::Publish, Permission::Read, Permission::Admin],
                    None,
                ),
                limited,
            ],
            jwt: Some(JwtConfig {
                hs256_secret: OneOrMany::One(Secret::new(&self.jwt_secret)),
                ..JwtConfig::default()
            }),
            cluster_secret: Some(Secret::new(&self.cluster_secret)),
            protect_metrics: true,
            publish_rate_per_s: Some(0.0),
            ..AuthConfig::default()
        };
        let mut namespaces = NamespacesConfig::new();
        let rule = |subscribe, publish, history| NamespaceRule {
            subscribe,
            publish,
            history,
            ..NamespaceRule::default()
        };
        namespaces.insert(
            "open".to_owned(),
            rule(SubscribeRule::Public, PublishRule::Key, true),
        );
        namespaces.insert(
            "keyonly".to_owned(),
            rule(SubscribeRule::Key, PublishRule::Key, true),
        );
        namespaces.insert(
            "room".to_owned(),
            rule(SubscribeRule::Token, PublishRule::Token, false),
        );
        ServerConfig {
            auth,
            namespaces,
            ..ServerConfig::default()
        }
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn now_s() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

/// Runs `attempt(exp)` with `exp` the current second, the attempt signing
/// a token with that `exp` and returning whether the node refused it,
/// until [`EXP_SAMPLES`] attempts both started and ended within that same
/// second: the node then checked the token at `exp == now`, which must be
/// refused (RFC 7519 §4.1.4). An attempt that crossed into the next
/// second proves nothing and is tried again; each starts just after a
/// second begins, so a busy machine has most of a second to answer.
///
/// # Errors
/// A message naming `what` when such an attempt was accepted (so that a
/// test can report every route that accepts one).
pub(crate) async fn refused_at_exp<F, Fut>(what: &str, mut attempt: F) -> Result<(), String>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut samples = 0;
    for _ in 0..40 {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        // To the start of the next second (the wall clock has no event to
        // await).
        tokio::time::sleep(std::time::Duration::from_nanos(
            1_000_000_000 - u64::from(since_epoch.subsec_nanos()),
        ))
        .await;
        let exp = now_s();
        let refused = attempt(exp).await;
        if now_s() == exp {
            if !refused {
                return Err(format!("{what}: a token with exp == now was accepted"));
            }
            samples += 1;
            if samples == EXP_SAMPLES {
                return Ok(());
            }
        }
    }
    panic!("{what}: {samples} of {EXP_SAMPLES} attempts ended within their second");
}

/// Attempts [`refused_at_exp`] needs within their second.
pub(crate) const EXP_SAMPLES: usize = 2;

/// GETs `path` on `node` with `headers`.
pub(crate) async fn get(
    node: &Node,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, HeaderMap, Value) {
    node.call("GET", path, headers, None).await
}

/// Publishes `{"data": data}` to `channel` on `node` with
/// `Authorization: <authorization>`.
pub(crate) async fn publish_as(
    node: &Node,
    channel: &str,
    authorization: &str,
    data: Value,
) -> (u16, HeaderMap, Value) {
    node.publish_with(channel, &[("authorization", authorization)], data)
        .await
}

/// The two tests of a scenario `async fn(Backend)`: `$sqlite` runs it on
/// SQLite, `$postgres` on PostgreSQL.
macro_rules! on_both_backends {
    ($scenario:ident: $sqlite:ident, $postgres:ident) => {
        #[tokio::test]
        async fn $sqlite() {
            $scenario($crate::Backend::Sqlite).await;
        }

        #[tokio::test]
        async fn $postgres() {
            $scenario($crate::Backend::Postgres).await;
        }
    };
}
pub(crate) use on_both_backends;

/// Asserts an error answer's status and code.
pub(crate) fn assert_refused(answer: &(u16, HeaderMap, Value), status: u16, code: &str) {
    assert_eq!(answer.0, status, "{}", answer.2);
    assert_eq!(answer.2["error"]["code"], code, "{}", answer.2);
}

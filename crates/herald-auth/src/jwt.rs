//! Client tokens: JWTs (RFC 7519) verified with the `jsonwebtoken` crate,
//! HS256 with a shared secret, RS256/ES256 with a PEM public key, a JWKS
//! file or a JWKS URL (RFC 7517, `jwks.rs`), the key picked by the
//! token's `alg` and `kid`. The key files are read again by
//! [`JwtVerifier::reload`] (on SIGHUP).
//!
//! Claims (names as Centrifugo's where it has them):
//! - `sub` (required): the user; publishes are rate-limited per `sub`;
//! - `exp` (required, seconds since the epoch): no leeway; refused once
//!   `exp <= now` (RFC 7519 §4.1.4: not accepted "on or after" it), on
//!   Herald's clock ([`WallClock`]); a live subscription ends at that
//!   moment;
//! - `nbf` (optional): refused while `now < nbf`; `iat` (optional, not
//!   checked); `aud`, `iss` checked when configured;
//! - `channels` (optional list of channel entries, see
//!   `TokenPattern` in `policy.rs`: exact names, or `*` as a whole
//!   segment after the namespace): may subscribe to and read them (a
//!   connection token);
//! - `channel` (optional, one exact channel name): a subscription token,
//!   which may subscribe to and read that channel;
//! - `publish` (optional list of channel entries, as `channels`): may
//!   publish there, in namespaces whose rule is `publish = "token"`;
//! - `info` (optional, any JSON value): Centrifugo's information about the
//!   connection (a connection token) or the subscription (a subscription
//!   token), shown to other subscribers in join and leave pushes as
//!   `conn_info` and `chan_info`.
//! - `subs` (optional map of exact channel names to options, Centrifugo's
//!   claim): server-side subscriptions of a Centrifugo connection, made at
//!   connect; the token may subscribe to and read these channels. Of the
//!   options only `data` (any JSON, handed to the client in the connect
//!   reply) is used; `info`, `b64info`, `b64data` and `override` are
//!   ignored.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Header, Validation};
use serde::Deserialize;
use serde_json::value::RawValue;

use herald_core::ChannelName;

use crate::config::JwtConfig;
use crate::error::AuthError;
use crate::jwks::{self, JwksFetch, Key, RemoteJwks};
use crate::policy::TokenPatterns;
use crate::wall_clock::WallClock;

/// What a verified token allows.
#[derive(Debug, Clone)]
pub struct TokenGrant {
    /// The `sub` claim.
    pub subject: String,
    /// The `exp` claim, seconds since the Unix epoch.
    pub expires_at_s: u64,
    /// Channels it may subscribe to and read (`channels`).
    channels: TokenPatterns,
    /// The one channel of a subscription token (`channel`).
    channel: Option<String>,
    /// Channels it may publish to (`publish`).
    publish: TokenPatterns,
    /// The `info` claim as JSON text (`null` counts as absent).
    pub info: Option<String>,
    /// Server-side subscriptions (`subs`), with each one's `data`.
    subs: BTreeMap<ChannelName, Option<Box<RawValue>>>,
}

impl TokenGrant {
    /// `true` when the token may subscribe to and read `channel`.
    pub fn may_read(&self, channel: &ChannelName) -> bool {
        self.channel.as_deref() == Some(channel.as_str())
            || self.channels.covers(channel)
            || self.subs.contains_key(channel)
    }

    /// The server-side subscriptions the token asks for (`subs`), by
    /// channel, each with the `data` to hand the client (if any).
    pub fn server_subs(&self) -> &BTreeMap<ChannelName, Option<Box<RawValue>>> {
        &self.subs
    }

    /// `true` when the token may publish to `channel`.
    pub fn may_publish(&self, channel: &ChannelName) -> bool {
        self.publish.covers(channel)
    }

    /// Time left until `exp`, from the system clock (zero once past).
    pub fn time_left(&self) -> Duration {
        let expires = UNIX_EPOCH + Duration::from_secs(self.expires_at_s);
        expires
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO)
    }
}

/// The claims Herald reads; others are ignored.
struct Claims {
    sub: String,
    exp: u64,
    nbf: Option<u64>,
    channels: Vec<String>,
    channel: Option<String>,
    publish: Vec<String>,
    info: Option<Box<RawValue>>,
    subs: BTreeMap<String, SubOptions>,
}

/// A token's claims as sent: each claim's name and its JSON text.
type RawClaims = BTreeMap<String, Box<RawValue>>;

/// [`RawClaims`] decoded from a token, where a claim given twice makes the
/// claims invalid (as a struct's fields would), so that no reader can take
/// another copy of a claim than this one did.
struct UniqueClaims(RawClaims);

impl<'de> Deserialize<'de> for UniqueClaims {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = UniqueClaims;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object of claims")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut claims = RawClaims::new();
                while let Some((name, value)) = map.next_entry::<String, Box<RawValue>>()? {
                    if claims.contains_key(&name) {
                        return Err(serde::de::Error::custom(format!(
                            "the {name} claim is given twice"
                        )));
                    }
                    claims.insert(name, value);
                }
                Ok(UniqueClaims(claims))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

impl Claims {
    /// The claims Herald reads, each checked on its own, so that a refusal
    /// names the claim that is missing or of the wrong type (and never
    /// quotes a value).
    ///
    /// # Errors
    /// A message naming the claim: `the sub claim is missing ...`,
    /// `the exp claim must be ...`.
    fn from_raw(mut raw: RawClaims) -> Result<Self, String> {
        let sub = required(&mut raw, "sub", "a string (the user)")?;
        let exp = required(&mut raw, "exp", "a whole number of seconds since the epoch")?;
        Ok(Self {
            sub,
            exp,
            nbf: optional(&mut raw, "nbf", "a whole number of seconds since the epoch")?,
            channels: optional(&mut raw, "channels", "a list of strings (channel names)")?
                .unwrap_or_default(),
            channel: optional(&mut raw, "channel", "a string (one channel name)")?,
            publish: optional(&mut raw, "publish", "a list of strings (channel names)")?
                .unwrap_or_default(),
            info: raw.remove("info"),
            subs: optional(
                &mut raw,
                "subs",
                "an object of channel names to objects (their options)",
            )?
            .unwrap_or_default(),
        })
    }
}

/// The claim `name` of `raw`, of type `T`, described as `shape`.
///
/// # Errors
/// When it is missing (or `null`), or not of that type.
fn required<T: serde::de::DeserializeOwned>(
    raw: &mut RawClaims,
    name: &str,
    shape: &str,
) -> Result<T, String> {
    optional(raw, name, shape)?.ok_or_else(|| {
        format!("the {name} claim is missing; a token needs sub (a string: the user) and exp (seconds since the epoch)")
    })
}

/// The claim `name` of `raw`, of type `T`, if present and not `null`.
///
/// # Errors
/// When it is there but not of that type: names the claim and `shape`.
fn optional<T: serde::de::DeserializeOwned>(
    raw: &mut RawClaims,
    name: &str,
    shape: &str,
) -> Result<Option<T>, String> {
    match raw.remove(name) {
        None => Ok(None),
        Some(value) if value.get() == "null" => Ok(None),
        Some(value) => serde_json::from_str(value.get()).map(Some).map_err(|_| {
            format!(
                "the {name} claim must be {shape}, not {}",
                json_kind(value.get())
            )
        }),
    }
}

/// What kind of JSON value `text` is, for a message that must not quote it.
fn json_kind(text: &str) -> &'static str {
    match text.trim_start().as_bytes().first() {
        Some(b'"') => "a string",
        Some(b'{') => "an object",
        Some(b'[') => "a list",
        Some(b't' | b'f') => "a boolean",
        Some(b'-' | b'0'..=b'9') if text.contains(['.', 'e', 'E']) => {
            "a number with a fraction or exponent"
        }
        Some(b'-') => "a negative number",
        Some(b'0'..=b'9') => "a number",
        _ => "another kind of value",
    }
}

/// One entry of `subs`: only `data` is read.
#[derive(Deserialize)]
struct SubOptions {
    #[serde(default)]
    data: Option<Box<RawValue>>,
}

/// Why the keys in hand did not verify a token.
enum Refusal {
    /// No key for the token's `alg` and `kid`: a JWKS URL may have it.
    NoKey,
    /// Any other refusal, final.
    Final(AuthError),
}

/// Verifies tokens with the configured keys.
pub struct JwtVerifier {
    /// The settings, for [`JwtVerifier::reload`] to read the files again.
    config: JwtConfig,
    /// HS256 secrets (from the config itself, fixed).
    secrets: Vec<Key>,
    /// Keys of the PEM and JWKS files, replaced by a reload.
    files: RwLock<Arc<Vec<Key>>>,
    /// The JWKS URL's keys, if one is configured.
    remote: Option<RemoteJwks>,
    /// The time that `exp`, `nbf` and the JWKS cache are checked against.
    clock: WallClock,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("secrets", &self.secrets.len())
            .field("files", &self.file_keys().len())
            .field("remote", &self.remote)
            .finish_non_exhaustive()
    }
}

impl JwtVerifier {
    /// The keys of `config`, PEM and JWKS files read now (a JWKS URL is
    /// fetched by `fetch` when a token first needs it).
    ///
    /// # Errors
    /// A message naming the file that cannot be read or holds no usable
    /// key, a refused `jwks_url`, or an empty `[auth.jwt]`.
    pub fn new(config: &JwtConfig, fetch: Arc<dyn JwksFetch>) -> Result<Self, String> {
        Self::with_clock(config, WallClock::default(), fetch)
    }

    /// [`JwtVerifier::new`] reading the time from `clock`.
    ///
    /// # Errors
    /// As [`JwtVerifier::new`].
    pub fn with_clock(
        config: &JwtConfig,
        clock: WallClock,
        fetch: Arc<dyn JwksFetch>,
    ) -> Result<Self, String> {
        let mut secrets = Vec::new();
        for secret in config.hs256_secret.as_slice() {
            if secret.expose().len() < 32 {
                return Err(
                    "auth.jwt.hs256_secret: a secret must be at least 32 bytes (RFC 7518 §3.2)"
                        .to_owned(),
                );
            }
            secrets.push(Key {
                kid: None,
                algorithm: Algorithm::HS256,
                key: DecodingKey::from_secret(secret.expose().as_bytes()),
            });
        }
        let files = file_keys(config)?;
        let remote = match &config.jwks_url {
            Some(text) => Some(RemoteJwks::new(
                jwks::check_url(text)?,
                config.jwks_cache_ttl_s.unwrap_or(jwks::DEFAULT_CACHE_TTL_S),
                config
                    .jwks_refetch_interval_s
                    .unwrap_or(jwks::DEFAULT_REFETCH_INTERVAL_S),
                fetch,
            )),
            None => None,
        };
        if secrets.is_empty() && files.is_empty() && remote.is_none() {
            return Err(
                "auth.jwt: give hs256_secret, rsa_public_key_pem, ec_public_key_pem, jwks_file or jwks_url"
                    .to_owned(),
            );
        }
        Ok(Self {
            config: config.clone(),
            secrets,
            files: RwLock::new(Arc::new(files)),
            remote,
            clock,
        })
    }

    /// Reads the PEM and JWKS files again and puts their keys in force
    /// (a new `kid` in the JWKS file is accepted from now on), and makes
    /// the next token fetch the JWKS URL again (within its rate limit).
    /// On an error the keys in force stay.
    ///
    /// # Errors
    /// As [`JwtVerifier::new`] for the files: the message names the file.
    pub fn reload(&self) -> Result<usize, String> {
        let keys = file_keys(&self.config)?;
        if keys.is_empty() && self.secrets.is_empty() && self.remote.is_none() {
            return Err("auth.jwt: the key files hold no key".to_owned());
        }
        let count = keys.len();
        *self.files.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keys);
        if let Some(remote) = &self.remote {
            remote.mark_stale();
        }
        Ok(count)
    }

    fn file_keys(&self) -> Arc<Vec<Key>> {
        Arc::clone(&self.files.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Verifies `token` and returns what it allows. With a JWKS URL, a
    /// stale set is fetched again in the background while the keys in
    /// hand verify (the first fetch, with no keys yet, is awaited), and a
    /// token whose `kid` is not in the set awaits a fetch (within the
    /// rate limit, or the one in flight).
    ///
    /// # Errors
    /// [`AuthError::TokenExpired`] for a well-signed token whose `exp` is
    /// now or past; [`AuthError::InvalidCredentials`] for anything else
    /// wrong (the message says what, never quoting the token).
    pub async fn verify(&self, token: &str) -> Result<TokenGrant, AuthError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| invalid("not a JWT"))?;
        if let Some(remote) = &self.remote {
            remote.refresh_if_stale(&self.clock).await;
        }
        match self.check(token, &header) {
            Ok(grant) => Ok(grant),
            Err(Refusal::NoKey) => match &self.remote {
                Some(remote) if header.kid.is_some() && remote.refetch(&self.clock).await => {
                    self.check(token, &header).map_err(Refusal::into_error)
                }
                _ => Err(Refusal::NoKey.into_error()),
            },
            Err(refusal) => Err(refusal.into_error()),
        }
    }

    /// Verifies `token` with the keys in hand, at the clock's time.
    fn check(&self, token: &str, header: &Header) -> Result<TokenGrant, Refusal> {
        let files = self.file_keys();
        let remote = self.remote.as_ref().map(RemoteJwks::keys);
        let all = self
            .secrets
            .iter()
            .chain(files.iter())
            .chain(remote.iter().flat_map(|keys| keys.iter()));
        let candidates: Vec<&Key> = all
            .filter(|k| {
                k.algorithm == header.alg
                    && match (&header.kid, &k.kid) {
                        (Some(wanted), Some(kid)) => wanted == kid,
                        _ => true,
                    }
            })
            .collect();
        // A `kid` that no key in hand carries: a JWKS URL may have it now.
        let unknown_kid = header
            .kid
            .as_ref()
            .is_some_and(|wanted| !candidates.iter().any(|k| k.kid.as_ref() == Some(wanted)));
        if candidates.is_empty() {
            return Err(Refusal::NoKey);
        }
        let mut last = Refusal::Final(invalid("bad signature"));
        for key in candidates {
            match jsonwebtoken::decode::<UniqueClaims>(
                token,
                &key.key,
                &self.validation(key.algorithm),
            ) {
                Ok(data) => {
                    let claims = Claims::from_raw(data.claims.0)
                        .map_err(|why| Refusal::Final(invalid(&why)))?;
                    return self.grant_now(claims).map_err(Refusal::Final);
                }
                Err(e) => match e.kind() {
                    ErrorKind::InvalidSignature if unknown_kid => last = Refusal::NoKey,
                    ErrorKind::InvalidSignature => {
                        last = Refusal::Final(invalid("bad signature"));
                    }
                    ErrorKind::InvalidAudience => return Err(Refusal::Final(invalid("wrong aud"))),
                    ErrorKind::InvalidIssuer => return Err(Refusal::Final(invalid("wrong iss"))),
                    // Only `aud` and `iss` are required of the crate.
                    ErrorKind::MissingRequiredClaim(claim) => {
                        return Err(Refusal::Final(invalid(&format!(
                            "the {claim} claim is missing or not a string; this server requires it"
                        ))))
                    }
                    ErrorKind::Json(_) => {
                        return Err(Refusal::Final(invalid(
                            "its claims are not a JSON object, each claim given once",
                        )))
                    }
                    _ => last = Refusal::Final(invalid("malformed")),
                },
            }
        }
        Err(last)
    }

    /// The grant of well-signed `claims`, once `exp` and `nbf` are checked
    /// on the verifier's clock. Herald checks them itself (the crate's
    /// check accepts `exp == now`): refused from the second `exp` on.
    fn grant_now(&self, claims: Claims) -> Result<TokenGrant, AuthError> {
        let now = self.clock.unix_s();
        if claims.exp <= now {
            return Err(AuthError::TokenExpired);
        }
        if claims.nbf.is_some_and(|nbf| now < nbf) {
            return Err(invalid("not valid yet (nbf)"));
        }
        grant(claims)
    }

    fn validation(&self, algorithm: Algorithm) -> Validation {
        let mut v = Validation::new(algorithm);
        v.leeway = 0;
        // `exp` and `nbf` are checked by `grant_now`, on Herald's clock.
        v.validate_exp = false;
        v.validate_nbf = false;
        // A configured aud or iss is also required to be present (the
        // crate checks them only when present otherwise). `sub` and `exp`
        // are required by `Claims::from_raw`, whose refusal names the
        // claim and its type.
        let mut required = Vec::new();
        match &self.config.audience {
            Some(aud) => {
                v.set_audience(&[aud]);
                required.push("aud");
            }
            None => v.validate_aud = false,
        }
        if let Some(iss) = &self.config.issuer {
            v.set_issuer(&[iss]);
            required.push("iss");
        }
        v.set_required_spec_claims(&required);
        v
    }
}

impl Refusal {
    fn into_error(self) -> AuthError {
        match self {
            Self::NoKey => invalid("no configured key for its alg and kid"),
            Self::Final(e) => e,
        }
    }
}

/// [`AuthError::InvalidCredentials`] saying `why` the token is refused.
fn invalid(why: &str) -> AuthError {
    AuthError::InvalidCredentials(format!("invalid token: {why}"))
}

/// The keys of the PEM and JWKS files of `config`, read now.
fn file_keys(config: &JwtConfig) -> Result<Vec<Key>, String> {
    let mut keys = Vec::new();
    for path in config.rsa_public_key_pem.as_slice() {
        let pem = read(path)?;
        let key = DecodingKey::from_rsa_pem(&pem)
            .map_err(|e| format!("{}: not an RSA public key in PEM: {e}", path.display()))?;
        keys.push(Key {
            kid: None,
            algorithm: Algorithm::RS256,
            key,
        });
    }
    for path in config.ec_public_key_pem.as_slice() {
        let pem = read(path)?;
        let key = DecodingKey::from_ec_pem(&pem)
            .map_err(|e| format!("{}: not an EC public key in PEM: {e}", path.display()))?;
        keys.push(Key {
            kid: None,
            algorithm: Algorithm::ES256,
            key,
        });
    }
    if let Some(path) = &config.jwks_file {
        keys.extend(jwks::keys_of(&read(path)?, &path.display().to_string())?);
    }
    Ok(keys)
}

/// What verified `claims` grant.
///
/// # Errors
/// [`AuthError::InvalidCredentials`] for a `subs` key that is not a valid
/// channel name, or a `channels` or `publish` entry with a `*` that is not
/// a whole segment after the namespace.
fn grant(claims: Claims) -> Result<TokenGrant, AuthError> {
    let mut subs = BTreeMap::new();
    for (name, options) in claims.subs {
        let channel = ChannelName::new(name).map_err(|e| {
            AuthError::InvalidCredentials(format!(
                "invalid token: a subs key is not a channel name: {e}"
            ))
        })?;
        subs.insert(channel, options.data);
    }
    let entries = |claim: &str, list: &[String]| {
        TokenPatterns::parse(claim, list)
            .map_err(|e| AuthError::InvalidCredentials(format!("invalid token: {e}")))
    };
    Ok(TokenGrant {
        subject: claims.sub,
        expires_at_s: claims.exp,
        channels: entries("channels", &claims.channels)?,
        channel: claims.channel,
        publish: entries("publish", &claims.publish)?,
        info: claims
            .info
            .map(|raw| raw.get().to_owned())
            .filter(|text| text != "null"),
        subs,
    })
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use crate::testing::{verify, EcKey};
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    use super::*;
    use crate::config::{OneOrMany, Secret};
    use crate::jwks::NoFetch;

    /// No JWKS URL in these tests: nothing to fetch.
    fn no_fetch() -> Arc<dyn JwksFetch> {
        Arc::new(NoFetch)
    }

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    fn verifier(secrets: &[&str]) -> JwtVerifier {
        JwtVerifier::new(
            &JwtConfig {
                hs256_secret: OneOrMany::Many(secrets.iter().map(|s| Secret::new(*s)).collect()),
                ..JwtConfig::default()
            },
            no_fetch(),
        )
        .unwrap()
    }

    fn sign(secret: &str, claims: &serde_json::Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    #[test]
    fn a_good_token_grants_its_claims() {
        let v = verifier(&[SECRET]);
        let t = sign(
            SECRET,
            &json!({"sub": "u1", "exp": now() + 60, "channels": ["news:*"], "publish": ["chat:u1"]}),
        );
        let g = verify(&v, &t).unwrap();
        assert_eq!(g.subject, "u1");
        let ch = |n: &str| ChannelName::new(n).unwrap();
        assert!(g.may_read(&ch("news:a")));
        assert!(!g.may_read(&ch("chat:u1")));
        assert!(g.may_publish(&ch("chat:u1")));
        assert!(!g.may_publish(&ch("news:a")));
        let sub = sign(
            SECRET,
            &json!({"sub": "u1", "exp": now() + 60, "channel": "room:1"}),
        );
        let g = verify(&v, &sub).unwrap();
        assert!(g.may_read(&ch("room:1")));
        assert!(!g.may_read(&ch("room:2")));
        assert!(!g.may_publish(&ch("room:1")));
        assert_eq!(g.info, None);
        let with_info = sign(
            SECRET,
            &json!({"sub": "u1", "exp": now() + 60, "info": {"name": "Ann", "seat": [1, 2]}}),
        );
        let info = verify(&v, &with_info).unwrap().info.unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&info).unwrap(),
            json!({"name": "Ann", "seat": [1, 2]})
        );
        let null = sign(
            SECRET,
            &json!({"sub": "u1", "exp": now() + 60, "info": null}),
        );
        assert_eq!(verify(&v, &null).unwrap().info, None);
    }

    #[test]
    fn the_subs_claim_grants_its_channels_for_server_side_subscriptions() {
        let v = verifier(&[SECRET]);
        let ch = |n: &str| ChannelName::new(n).unwrap();
        let t = sign(
            SECRET,
            &json!({"sub": "u1", "exp": now() + 60,
                    "subs": {"feed:u1": {"data": {"hello": 1}}, "news:all": {"override": {"presence": {"value": true}}}}}),
        );
        let g = verify(&v, &t).unwrap();
        let subs: Vec<(&str, Option<&str>)> = g
            .server_subs()
            .iter()
            .map(|(c, d)| (c.as_str(), d.as_deref().map(RawValue::get)))
            .collect();
        assert_eq!(
            subs,
            [("feed:u1", Some(r#"{"hello":1}"#)), ("news:all", None)]
        );
        assert!(g.may_read(&ch("feed:u1")));
        assert!(!g.may_read(&ch("feed:u2")));
        assert!(!g.may_publish(&ch("feed:u1")));
        // No subs: none.
        let plain = sign(SECRET, &json!({"sub": "u1", "exp": now() + 60}));
        assert!(verify(&v, &plain).unwrap().server_subs().is_empty());
        // A key that is not a channel name, or options that are not an
        // object, make the token invalid.
        for bad in [
            json!({"bad name": {}}),
            json!({"feed:u1": 1}),
            json!(["feed:u1"]),
        ] {
            let t = sign(
                SECRET,
                &json!({"sub": "u1", "exp": now() + 60, "subs": bad}),
            );
            assert_eq!(
                verify(&v, &t).unwrap_err().code_for_tests(),
                "unauthorized",
                "{bad}"
            );
        }
    }

    #[test]
    fn bad_tokens_are_refused_with_the_right_error() {
        let v = verifier(&[SECRET]);
        let expired = sign(SECRET, &json!({"sub": "u", "exp": now() - 1}));
        assert_eq!(verify(&v, &expired).unwrap_err(), AuthError::TokenExpired);
        let other = sign(&"x".repeat(32), &json!({"sub": "u", "exp": now() + 60}));
        assert_eq!(
            verify(&v, &other).unwrap_err().code_for_tests(),
            "unauthorized"
        );
        let no_sub = sign(SECRET, &json!({"exp": now() + 60}));
        assert_eq!(
            verify(&v, &no_sub).unwrap_err().code_for_tests(),
            "unauthorized"
        );
        let no_exp = sign(SECRET, &json!({"sub": "u"}));
        assert_eq!(
            verify(&v, &no_exp).unwrap_err().code_for_tests(),
            "unauthorized"
        );
        let later = sign(
            SECRET,
            &json!({"sub": "u", "exp": now() + 60, "nbf": now() + 30}),
        );
        assert_eq!(
            verify(&v, &later).unwrap_err().code_for_tests(),
            "unauthorized"
        );
        assert_eq!(
            verify(&v, "abc").unwrap_err().code_for_tests(),
            "unauthorized"
        );
        // alg "none" is never accepted.
        let none = format!(
            "{}.{}.",
            "eyJhbGciOiJub25lIn0", "eyJzdWIiOiJ1IiwiZXhwIjo5OTk5OTk5OTk5fQ"
        );
        assert_eq!(
            verify(&v, &none).unwrap_err().code_for_tests(),
            "unauthorized"
        );
    }

    /// RFC 7519 §4.1.4: not accepted on or after `exp`. At the boundary
    /// on a hand-set clock: `exp = now - 1` and `exp = now` are expired,
    /// `exp = now + 1` is accepted; `nbf = now` is accepted, `nbf = now +
    /// 1` is not.
    #[test]
    fn a_token_is_refused_from_the_second_of_its_exp() {
        let clock = WallClock::manual(1_800_000_000_000 + 999);
        let v = JwtVerifier::with_clock(
            &JwtConfig {
                hs256_secret: OneOrMany::One(Secret::new(SECRET)),
                ..JwtConfig::default()
            },
            clock.clone(),
            no_fetch(),
        )
        .unwrap();
        let now = clock.unix_s();
        assert_eq!(now, 1_800_000_000);
        let at = |exp: u64| sign(SECRET, &json!({"sub": "u", "exp": exp}));
        assert_eq!(
            verify(&v, &at(now - 1)).unwrap_err(),
            AuthError::TokenExpired
        );
        assert_eq!(verify(&v, &at(now)).unwrap_err(), AuthError::TokenExpired);
        assert_eq!(verify(&v, &at(now + 1)).unwrap().expires_at_s, now + 1);
        // The next second, the same token is expired.
        let next = at(now + 1);
        clock.advance(Duration::from_millis(1));
        assert_eq!(verify(&v, &next).unwrap_err(), AuthError::TokenExpired);
        let now = clock.unix_s();
        let from = |nbf: u64| sign(SECRET, &json!({"sub": "u", "exp": now + 60, "nbf": nbf}));
        assert!(verify(&v, &from(now)).is_ok());
        assert_eq!(
            verify(&v, &from(now + 1)).unwrap_err().code_for_tests(),
            "unauthorized"
        );
    }

    /// `channels` and `publish` entries are exact names, or `*` as a whole
    /// segment after the namespace; a token with any other `*` is refused.
    #[test]
    fn channel_entries_are_exact_names_and_a_partial_star_refuses_the_token() {
        let v = verifier(&[SECRET]);
        let ch = |n: &str| ChannelName::new(n).unwrap();
        let t = sign(
            SECRET,
            &json!({"sub": "u", "exp": now() + 60, "channels": ["user:42", "news:*"], "publish": ["chat:*:typing"]}),
        );
        let g = verify(&v, &t).unwrap();
        assert!(g.may_read(&ch("user:42")));
        assert!(!g.may_read(&ch("user:420")));
        assert!(!g.may_read(&ch("user:42:private")));
        assert!(g.may_read(&ch("news:uk")));
        assert!(!g.may_read(&ch("news:uk:sport")));
        assert!(g.may_publish(&ch("chat:7:typing")));
        assert!(!g.may_publish(&ch("chat:7")));
        for (claim, bad) in [
            ("channels", json!(["user:42*"])),
            ("channels", json!(["*"])),
            ("channels", json!(["ok:*", "*:x"])),
            ("publish", json!(["room:a*"])),
        ] {
            let mut claims = json!({"sub": "u", "exp": now() + 60});
            claims[claim] = bad.clone();
            let error = verify(&v, &sign(SECRET, &claims)).unwrap_err();
            assert_eq!(error.code_for_tests(), "unauthorized", "{claim} {bad}");
            assert!(error.to_string().contains(claim), "{error}");
        }
    }

    /// A claim given twice makes the token invalid: no reader may take
    /// another copy of it than Herald did.
    #[test]
    fn a_claim_given_twice_refuses_the_token() {
        use base64::Engine;
        let v = verifier(&[SECRET]);
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let claims = format!(
            r#"{{"sub":"u","exp":{},"channels":["a"],"channels":["*:x"]}}"#,
            now() + 60
        );
        let signed = format!(
            "{}.{}",
            b64(br#"{"alg":"HS256","typ":"JWT"}"#),
            b64(claims.as_bytes())
        );
        let signature = {
            use aws_lc_rs::hmac;
            let key = hmac::Key::new(hmac::HMAC_SHA256, SECRET.as_bytes());
            b64(hmac::sign(&key, signed.as_bytes()).as_ref())
        };
        let error = verify(&v, &format!("{signed}.{signature}")).unwrap_err();
        assert_eq!(error.code_for_tests(), "unauthorized");
        assert!(
            error.to_string().contains("each claim given once"),
            "{error}"
        );
    }

    #[test]
    fn every_configured_secret_is_accepted_while_rotating() {
        let old = "o".repeat(32);
        let v = verifier(&[SECRET, &old]);
        for secret in [SECRET, old.as_str()] {
            let t = sign(secret, &json!({"sub": "u", "exp": now() + 60}));
            assert!(verify(&v, &t).is_ok());
        }
    }

    #[test]
    fn audience_and_issuer_are_checked_when_configured() {
        let v = JwtVerifier::new(
            &JwtConfig {
                hs256_secret: OneOrMany::One(Secret::new(SECRET)),
                audience: Some("herald".to_owned()),
                issuer: Some("app".to_owned()),
                ..JwtConfig::default()
            },
            no_fetch(),
        )
        .unwrap();
        let good = sign(
            SECRET,
            &json!({"sub": "u", "exp": now() + 60, "aud": "herald", "iss": "app"}),
        );
        assert!(verify(&v, &good).is_ok());
        let bad = sign(
            SECRET,
            &json!({"sub": "u", "exp": now() + 60, "aud": "other", "iss": "app"}),
        );
        assert!(verify(&v, &bad).is_err());
        let bad = sign(
            SECRET,
            &json!({"sub": "u", "exp": now() + 60, "aud": "herald"}),
        );
        assert!(verify(&v, &bad).is_err());
    }

    /// A PEM "PUBLIC KEY" block (RFC 7468 §13) of SPKI DER.
    fn pem(der: &[u8]) -> String {
        pem_block("PUBLIC KEY", der)
    }

    /// A PEM block of `der` with `label` (RFC 7468 §2).
    fn pem_block(label: &str, der: &[u8]) -> String {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            lines.join("\n")
        )
    }

    #[test]
    fn es256_keys_verify_from_pem_and_from_a_jwks_by_kid() {
        use aws_lc_rs::encoding::AsDer;
        use aws_lc_rs::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
        use base64::Engine;
        let make = || EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING).unwrap();
        let (a, b) = (make(), make());
        let sign_with = |key: &EcdsaKeyPair, kid: Option<&str>| {
            let mut header = Header::new(Algorithm::ES256);
            header.kid = kid.map(str::to_owned);
            encode(
                &header,
                &json!({"sub": "u", "exp": now() + 60}),
                &EncodingKey::from_ec_der(key.to_pkcs8v1().unwrap().as_ref()),
            )
            .unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let pem_path = dir.path().join("a.pem");
        std::fs::write(&pem_path, pem(a.public_key().as_der().unwrap().as_ref())).unwrap();
        let v = JwtVerifier::new(
            &JwtConfig {
                ec_public_key_pem: OneOrMany::One(pem_path),
                ..JwtConfig::default()
            },
            no_fetch(),
        )
        .unwrap();
        assert!(verify(&v, &sign_with(&a, None)).is_ok());
        assert_eq!(
            verify(&v, &sign_with(&b, None))
                .unwrap_err()
                .code_for_tests(),
            "unauthorized"
        );
        let hs = sign(SECRET, &json!({"sub": "u", "exp": now() + 60}));
        assert_eq!(
            verify(&v, &hs).unwrap_err().code_for_tests(),
            "unauthorized"
        );

        // A JWKS with both keys: the token's kid picks one.
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let jwk = |key: &EcdsaKeyPair, kid: &str| {
            // The uncompressed point: 0x04, then x and y, 32 bytes each.
            let point = key.public_key().as_ref();
            json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
                   "x": b64(&point[1..33]), "y": b64(&point[33..65])})
        };
        let jwks_path = dir.path().join("jwks.json");
        let set = json!({"keys": [jwk(&a, "a"), jwk(&b, "b")]});
        std::fs::write(&jwks_path, set.to_string()).unwrap();
        let v = JwtVerifier::new(
            &JwtConfig {
                jwks_file: Some(jwks_path),
                ..JwtConfig::default()
            },
            no_fetch(),
        )
        .unwrap();
        assert!(verify(&v, &sign_with(&b, Some("b"))).is_ok());
        assert!(verify(&v, &sign_with(&a, Some("a"))).is_ok());
        assert!(verify(&v, &sign_with(&b, Some("a"))).is_err());
        assert!(verify(&v, &sign_with(&a, Some("c"))).is_err());
    }

    #[test]
    fn rs256_keys_verify_from_pem_and_several_at_once() {
        use aws_lc_rs::encoding::AsDer;
        use aws_lc_rs::rsa::{KeyPair as RsaKeyPair, KeySize};
        use aws_lc_rs::signature::KeyPair;
        let make = || RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
        let (new, old, other) = (make(), make(), make());
        let sign_with = |key: &RsaKeyPair| {
            let private = pem_block("PRIVATE KEY", key.as_der().unwrap().as_ref());
            encode(
                &Header::new(Algorithm::RS256),
                &json!({"sub": "u", "exp": now() + 60}),
                &EncodingKey::from_rsa_pem(private.as_bytes()).unwrap(),
            )
            .unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let mut paths = Vec::new();
        for (name, key) in [("new.pem", &new), ("old.pem", &old)] {
            let path = dir.path().join(name);
            std::fs::write(&path, pem(key.public_key().as_der().unwrap().as_ref())).unwrap();
            paths.push(path);
        }
        let v = JwtVerifier::new(
            &JwtConfig {
                rsa_public_key_pem: OneOrMany::Many(paths),
                ..JwtConfig::default()
            },
            no_fetch(),
        )
        .unwrap();
        assert!(verify(&v, &sign_with(&new)).is_ok());
        assert!(verify(&v, &sign_with(&old)).is_ok());
        assert_eq!(
            verify(&v, &sign_with(&other)).unwrap_err().code_for_tests(),
            "unauthorized"
        );
    }

    #[test]
    fn unreadable_or_wrong_key_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let missing = JwtConfig {
            rsa_public_key_pem: OneOrMany::One(dir.path().join("none.pem")),
            ..JwtConfig::default()
        };
        assert!(JwtVerifier::new(&missing, no_fetch())
            .unwrap_err()
            .contains("none.pem"));
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a key").unwrap();
        let wrong = JwtConfig {
            ec_public_key_pem: OneOrMany::One(junk.clone()),
            ..JwtConfig::default()
        };
        assert!(JwtVerifier::new(&wrong, no_fetch()).is_err());
        let bad_jwks = JwtConfig {
            jwks_file: Some(junk),
            ..JwtConfig::default()
        };
        assert!(JwtVerifier::new(&bad_jwks, no_fetch()).is_err());
    }

    #[test]
    fn short_secrets_and_empty_configs_are_refused() {
        assert!(JwtVerifier::new(&JwtConfig::default(), no_fetch()).is_err());
        let short = JwtConfig {
            hs256_secret: OneOrMany::One(Secret::new("short")),
            ..JwtConfig::default()
        };
        assert!(JwtVerifier::new(&short, no_fetch()).is_err());
    }

    /// Key rotation in a JWKS file: a new `kid` is refused until the file
    /// is read again (what SIGHUP does), then accepted; a reload that
    /// fails keeps the keys in force.
    #[test]
    fn a_new_kid_in_the_jwks_file_is_accepted_after_a_reload() {
        let (old, new) = (EcKey::new(), EcKey::new());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, json!({"keys": [old.jwk("old")]}).to_string()).unwrap();
        let v = JwtVerifier::new(
            &JwtConfig {
                jwks_file: Some(path.clone()),
                ..JwtConfig::default()
            },
            no_fetch(),
        )
        .unwrap();
        let rotated = new.token("new", now() + 60);
        assert!(verify(&v, &old.token("old", now() + 60)).is_ok());
        std::fs::write(
            &path,
            json!({"keys": [old.jwk("old"), new.jwk("new")]}).to_string(),
        )
        .unwrap();
        assert_eq!(
            verify(&v, &rotated).unwrap_err().code_for_tests(),
            "unauthorized"
        );
        assert_eq!(v.reload().unwrap(), 2);
        assert!(verify(&v, &rotated).is_ok());
        // A broken file: refused, and the keys in force stay.
        std::fs::write(&path, "{not json").unwrap();
        assert!(v.reload().unwrap_err().contains("jwks.json"));
        assert!(verify(&v, &rotated).is_ok());
    }
}

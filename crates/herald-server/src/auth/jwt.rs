//! Client tokens: JWTs (RFC 7519) verified with the `jsonwebtoken` crate,
//! HS256 with a shared secret, RS256/ES256 with a PEM public key or a JWKS
//! file (RFC 7517), the key picked by the token's `alg` and `kid`.
//!
//! Claims (names as Centrifugo's where it has them):
//! - `sub` (required): the user; publishes are rate-limited per `sub`;
//! - `exp` (required, seconds since the epoch): no leeway; a live
//!   subscription ends at that moment;
//! - `nbf`, `iat` (optional); `aud`, `iss` checked when configured;
//! - `channels` (optional list of channel patterns): may subscribe to and
//!   read them (a connection token);
//! - `channel` (optional, one exact channel name): a subscription token,
//!   which may subscribe to and read that channel;
//! - `publish` (optional list of channel patterns): may publish there, in
//!   namespaces whose rule is `publish = "token"`;
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
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::config::JwtConfig;
use super::policy::Patterns;
use super::AuthError;
use herald_core::ChannelName;

/// What a verified token allows.
#[derive(Debug, Clone)]
pub(crate) struct TokenGrant {
    /// The `sub` claim.
    pub(crate) subject: String,
    /// The `exp` claim, seconds since the Unix epoch.
    pub(crate) expires_at_s: u64,
    /// Channels it may subscribe to and read (`channels`).
    channels: Patterns,
    /// The one channel of a subscription token (`channel`).
    channel: Option<String>,
    /// Channels it may publish to (`publish`).
    publish: Patterns,
    /// The `info` claim as JSON text (`null` counts as absent).
    pub(crate) info: Option<String>,
    /// Server-side subscriptions (`subs`), with each one's `data`.
    subs: BTreeMap<ChannelName, Option<Box<RawValue>>>,
}

impl TokenGrant {
    /// `true` when the token may subscribe to and read `channel`.
    pub(crate) fn may_read(&self, channel: &ChannelName) -> bool {
        self.channel.as_deref() == Some(channel.as_str())
            || self.channels.covers(channel)
            || self.subs.contains_key(channel)
    }

    /// The server-side subscriptions the token asks for (`subs`), by
    /// channel, each with the `data` to hand the client (if any).
    pub(crate) fn server_subs(&self) -> &BTreeMap<ChannelName, Option<Box<RawValue>>> {
        &self.subs
    }

    /// `true` when the token may publish to `channel`.
    pub(crate) fn may_publish(&self, channel: &ChannelName) -> bool {
        self.publish.covers(channel)
    }

    /// Time left until `exp`, from the system clock (zero once past).
    pub(crate) fn time_left(&self) -> Duration {
        let expires = UNIX_EPOCH + Duration::from_secs(self.expires_at_s);
        expires
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO)
    }
}

/// The claims Herald reads; others are ignored.
#[derive(Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    #[serde(default)]
    channels: Vec<String>,
    #[serde(default)]
    channel: Option<String>,
    #[serde(default)]
    publish: Vec<String>,
    #[serde(default)]
    info: Option<Box<RawValue>>,
    #[serde(default)]
    subs: BTreeMap<String, SubOptions>,
}

/// One entry of `subs`: only `data` is read.
#[derive(Deserialize)]
struct SubOptions {
    #[serde(default)]
    data: Option<Box<RawValue>>,
}

/// One verification key.
struct Key {
    /// The JWKS `kid`, if the key came from a JWKS file.
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

/// Verifies tokens with the configured keys.
pub(crate) struct JwtVerifier {
    keys: Vec<Key>,
    audience: Option<String>,
    issuer: Option<String>,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl JwtVerifier {
    /// The keys of `config`, PEM and JWKS files read now.
    ///
    /// # Errors
    /// A message naming the file that cannot be read or holds no usable
    /// key, or an empty `[auth.jwt]`.
    pub(crate) fn new(config: &JwtConfig) -> Result<Self, String> {
        let mut keys = Vec::new();
        for secret in config.hs256_secret.as_slice() {
            if secret.expose().len() < 32 {
                return Err(
                    "auth.jwt.hs256_secret: a secret must be at least 32 bytes (RFC 7518 §3.2)"
                        .to_owned(),
                );
            }
            keys.push(Key {
                kid: None,
                algorithm: Algorithm::HS256,
                key: DecodingKey::from_secret(secret.expose().as_bytes()),
            });
        }
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
            let set: JwkSet = serde_json::from_slice(&read(path)?)
                .map_err(|e| format!("{}: not a JWKS document: {e}", path.display()))?;
            for jwk in &set.keys {
                let algorithm = match (&jwk.common.key_algorithm, &jwk.algorithm) {
                    (Some(alg), _) => alg.to_string().parse::<Algorithm>().ok(),
                    (None, AlgorithmParameters::RSA(_)) => Some(Algorithm::RS256),
                    (None, AlgorithmParameters::EllipticCurve(_)) => Some(Algorithm::ES256),
                    _ => None,
                };
                let algorithm = algorithm.filter(|a| {
                    matches!(a, Algorithm::RS256 | Algorithm::ES256 | Algorithm::HS256)
                });
                let (Some(algorithm), Ok(key)) = (algorithm, DecodingKey::from_jwk(jwk)) else {
                    return Err(format!(
                        "{}: key {:?} is not an RS256, ES256 or HS256 key",
                        path.display(),
                        jwk.common.key_id
                    ));
                };
                keys.push(Key {
                    kid: jwk.common.key_id.clone(),
                    algorithm,
                    key,
                });
            }
        }
        if keys.is_empty() {
            return Err(
                "auth.jwt: give hs256_secret, rsa_public_key_pem, ec_public_key_pem or jwks_file"
                    .to_owned(),
            );
        }
        Ok(Self {
            keys,
            audience: config.audience.clone(),
            issuer: config.issuer.clone(),
        })
    }

    /// Verifies `token` and returns what it allows.
    ///
    /// # Errors
    /// [`AuthError::TokenExpired`] for a well-signed token past its `exp`;
    /// [`AuthError::InvalidCredentials`] for anything else wrong (the
    /// message says what, never quoting the token).
    pub(crate) fn verify(&self, token: &str) -> Result<TokenGrant, AuthError> {
        let invalid = |why: &str| AuthError::InvalidCredentials(format!("invalid token: {why}"));
        let header = jsonwebtoken::decode_header(token).map_err(|_| invalid("not a JWT"))?;
        let mut candidates = self.keys.iter().filter(|k| {
            k.algorithm == header.alg
                && match (&header.kid, &k.kid) {
                    (Some(wanted), Some(kid)) => wanted == kid,
                    _ => true,
                }
        });
        let mut last = invalid("no configured key for its alg and kid");
        for key in candidates.by_ref() {
            match jsonwebtoken::decode::<Claims>(token, &key.key, &self.validation(key.algorithm)) {
                Ok(data) => return grant(data.claims),
                Err(e) => match e.kind() {
                    ErrorKind::InvalidSignature => last = invalid("bad signature"),
                    ErrorKind::ExpiredSignature => return Err(AuthError::TokenExpired),
                    ErrorKind::ImmatureSignature => return Err(invalid("not valid yet (nbf)")),
                    ErrorKind::InvalidAudience => return Err(invalid("wrong aud")),
                    ErrorKind::InvalidIssuer => return Err(invalid("wrong iss")),
                    ErrorKind::MissingRequiredClaim(_) => {
                        return Err(invalid("a required claim is missing (sub, exp, and aud or iss when configured)"))
                    }
                    ErrorKind::Json(_) => {
                        return Err(invalid("claims of the wrong type (sub: string, exp: integer, channels/publish: lists of strings, channel: string, subs: object of objects)"))
                    }
                    _ => last = invalid("malformed"),
                },
            }
        }
        Err(last)
    }

    fn validation(&self, algorithm: Algorithm) -> Validation {
        let mut v = Validation::new(algorithm);
        v.leeway = 0;
        v.validate_nbf = true;
        // A configured aud or iss is also required to be present (the
        // crate checks them only when present otherwise).
        let mut required = vec!["exp", "sub"];
        match &self.audience {
            Some(aud) => {
                v.set_audience(&[aud]);
                required.push("aud");
            }
            None => v.validate_aud = false,
        }
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
            required.push("iss");
        }
        v.set_required_spec_claims(&required);
        v
    }
}

/// What verified `claims` grant.
///
/// # Errors
/// [`AuthError::InvalidCredentials`] for a `subs` key that is not a valid
/// channel name.
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
    Ok(TokenGrant {
        subject: claims.sub,
        expires_at_s: claims.exp,
        channels: Patterns::of(&claims.channels),
        channel: claims.channel,
        publish: Patterns::of(&claims.publish),
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
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    use super::*;
    use crate::auth::config::{OneOrMany, Secret};

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    fn verifier(secrets: &[&str]) -> JwtVerifier {
        JwtVerifier::new(&JwtConfig {
            hs256_secret: OneOrMany::Many(secrets.iter().map(|s| Secret::new(*s)).collect()),
            ..JwtConfig::default()
        })
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
        let g = v.verify(&t).unwrap();
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
        let g = v.verify(&sub).unwrap();
        assert!(g.may_read(&ch("room:1")));
        assert!(!g.may_read(&ch("room:2")));
        assert!(!g.may_publish(&ch("room:1")));
        assert_eq!(g.info, None);
        let with_info = sign(
            SECRET,
            &json!({"sub": "u1", "exp": now() + 60, "info": {"name": "Ann", "seat": [1, 2]}}),
        );
        let info = v.verify(&with_info).unwrap().info.unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&info).unwrap(),
            json!({"name": "Ann", "seat": [1, 2]})
        );
        let null = sign(
            SECRET,
            &json!({"sub": "u1", "exp": now() + 60, "info": null}),
        );
        assert_eq!(v.verify(&null).unwrap().info, None);
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
        let g = v.verify(&t).unwrap();
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
        assert!(v.verify(&plain).unwrap().server_subs().is_empty());
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
            assert_eq!(v.verify(&t).unwrap_err().code(), "unauthorized", "{bad}");
        }
    }

    #[test]
    fn bad_tokens_are_refused_with_the_right_error() {
        let v = verifier(&[SECRET]);
        let expired = sign(SECRET, &json!({"sub": "u", "exp": now() - 1}));
        assert_eq!(v.verify(&expired).unwrap_err(), AuthError::TokenExpired);
        let other = sign(&"x".repeat(32), &json!({"sub": "u", "exp": now() + 60}));
        assert_eq!(v.verify(&other).unwrap_err().code(), "unauthorized");
        let no_sub = sign(SECRET, &json!({"exp": now() + 60}));
        assert_eq!(v.verify(&no_sub).unwrap_err().code(), "unauthorized");
        let no_exp = sign(SECRET, &json!({"sub": "u"}));
        assert_eq!(v.verify(&no_exp).unwrap_err().code(), "unauthorized");
        let later = sign(
            SECRET,
            &json!({"sub": "u", "exp": now() + 60, "nbf": now() + 30}),
        );
        assert_eq!(v.verify(&later).unwrap_err().code(), "unauthorized");
        assert_eq!(v.verify("abc").unwrap_err().code(), "unauthorized");
        // alg "none" is never accepted.
        let none = format!(
            "{}.{}.",
            "eyJhbGciOiJub25lIn0", "eyJzdWIiOiJ1IiwiZXhwIjo5OTk5OTk5OTk5fQ"
        );
        assert_eq!(v.verify(&none).unwrap_err().code(), "unauthorized");
    }

    #[test]
    fn every_configured_secret_is_accepted_while_rotating() {
        let old = "o".repeat(32);
        let v = verifier(&[SECRET, &old]);
        for secret in [SECRET, old.as_str()] {
            let t = sign(secret, &json!({"sub": "u", "exp": now() + 60}));
            assert!(v.verify(&t).is_ok());
        }
    }

    #[test]
    fn audience_and_issuer_are_checked_when_configured() {
        let v = JwtVerifier::new(&JwtConfig {
            hs256_secret: OneOrMany::One(Secret::new(SECRET)),
            audience: Some("herald".to_owned()),
            issuer: Some("app".to_owned()),
            ..JwtConfig::default()
        })
        .unwrap();
        let good = sign(
            SECRET,
            &json!({"sub": "u", "exp": now() + 60, "aud": "herald", "iss": "app"}),
        );
        assert!(v.verify(&good).is_ok());
        let bad = sign(
            SECRET,
            &json!({"sub": "u", "exp": now() + 60, "aud": "other", "iss": "app"}),
        );
        assert!(v.verify(&bad).is_err());
        let bad = sign(
            SECRET,
            &json!({"sub": "u", "exp": now() + 60, "aud": "herald"}),
        );
        assert!(v.verify(&bad).is_err());
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
        let v = JwtVerifier::new(&JwtConfig {
            ec_public_key_pem: OneOrMany::One(pem_path),
            ..JwtConfig::default()
        })
        .unwrap();
        assert!(v.verify(&sign_with(&a, None)).is_ok());
        assert_eq!(
            v.verify(&sign_with(&b, None)).unwrap_err().code(),
            "unauthorized"
        );
        let hs = sign(SECRET, &json!({"sub": "u", "exp": now() + 60}));
        assert_eq!(v.verify(&hs).unwrap_err().code(), "unauthorized");

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
        let v = JwtVerifier::new(&JwtConfig {
            jwks_file: Some(jwks_path),
            ..JwtConfig::default()
        })
        .unwrap();
        assert!(v.verify(&sign_with(&b, Some("b"))).is_ok());
        assert!(v.verify(&sign_with(&a, Some("a"))).is_ok());
        assert!(v.verify(&sign_with(&b, Some("a"))).is_err());
        assert!(v.verify(&sign_with(&a, Some("c"))).is_err());
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
        let v = JwtVerifier::new(&JwtConfig {
            rsa_public_key_pem: OneOrMany::Many(paths),
            ..JwtConfig::default()
        })
        .unwrap();
        assert!(v.verify(&sign_with(&new)).is_ok());
        assert!(v.verify(&sign_with(&old)).is_ok());
        assert_eq!(
            v.verify(&sign_with(&other)).unwrap_err().code(),
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
        assert!(JwtVerifier::new(&missing).unwrap_err().contains("none.pem"));
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a key").unwrap();
        let wrong = JwtConfig {
            ec_public_key_pem: OneOrMany::One(junk.clone()),
            ..JwtConfig::default()
        };
        assert!(JwtVerifier::new(&wrong).is_err());
        let bad_jwks = JwtConfig {
            jwks_file: Some(junk),
            ..JwtConfig::default()
        };
        assert!(JwtVerifier::new(&bad_jwks).is_err());
    }

    #[test]
    fn short_secrets_and_empty_configs_are_refused() {
        assert!(JwtVerifier::new(&JwtConfig::default()).is_err());
        let short = JwtConfig {
            hs256_secret: OneOrMany::One(Secret::new("short")),
            ..JwtConfig::default()
        };
        assert!(JwtVerifier::new(&short).is_err());
    }
}

//! Server-side API keys: stored as SHA-256 hashes, looked up in constant
//! time, and made by `herald keys generate` ([`generate_api_key`]).

use std::sync::Arc;

use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{ApiKeyConfig, Permission};
use crate::policy::Patterns;

/// Random bytes in a generated API key (256 bits).
const GENERATED_KEY_BYTES: usize = 32;

/// One configured API key.
#[derive(Debug)]
pub struct ApiKey {
    /// Its name, for logs (never the key).
    pub name: String,
    /// SHA-256 of the key.
    hash: [u8; 32],
    permissions: Vec<Permission>,
    /// The channels it applies to.
    pub(crate) channels: Patterns,
}

impl ApiKey {
    /// `true` when the key has `permission`.
    pub fn can(&self, permission: Permission) -> bool {
        self.permissions.contains(&permission)
    }
}

/// The configured API keys.
#[derive(Debug, Default)]
pub(crate) struct ApiKeys {
    keys: Vec<Arc<ApiKey>>,
}

impl ApiKeys {
    /// The keys of `configs`.
    ///
    /// # Errors
    /// A message naming the key whose `sha256` is not 64 hex digits, or a
    /// name used twice.
    pub(crate) fn new(configs: &[ApiKeyConfig]) -> Result<Self, String> {
        let mut keys: Vec<Arc<ApiKey>> = Vec::with_capacity(configs.len());
        for config in configs {
            let hash = parse_hash(&config.sha256).ok_or_else(|| {
                format!(
                    "auth.api_keys \"{}\": sha256 must be 64 hex digits (the SHA-256 of the key)",
                    config.name
                )
            })?;
            if keys.iter().any(|k| k.name == config.name) {
                return Err(format!(
                    "auth.api_keys: the name \"{}\" is used twice",
                    config.name
                ));
            }
            keys.push(Arc::new(ApiKey {
                name: config.name.clone(),
                hash,
                permissions: config.permissions.clone(),
                channels: config
                    .channels
                    .as_deref()
                    .map_or_else(Patterns::all, Patterns::of),
            }));
        }
        Ok(Self { keys })
    }

    /// The keys' names, in the config's order.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.name.as_str())
    }

    /// The key whose hash is SHA-256 of `presented`, if any. Every
    /// configured hash is compared, each in constant time (`subtle`), so
    /// the time taken tells nothing about which key or how much of a hash
    /// matched.
    pub(crate) fn find(&self, presented: &str) -> Option<Arc<ApiKey>> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for key in &self.keys {
            if bool::from(key.hash.ct_eq(&digest)) {
                found = Some(Arc::clone(key));
            }
        }
        found
    }
}

/// 64 hex digits (either case) as 32 bytes.
fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

/// SHA-256 of `key`, as 64 lowercase hex digits: what `sha256` in
/// `[[auth.api_keys]]` holds.
pub fn api_key_sha256(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A new API key: 32 random bytes from `rand`'s thread generator (a
/// cryptographically secure generator seeded by the operating system, per
/// `rand`'s docs), base64url without padding (RFC 4648 §5), 43 characters.
/// A key never starts with `-`, which a command line would read as an
/// option (`--api-key -J79…`): such a draw (1 in 64) is drawn again.
pub fn generate_api_key() -> String {
    loop {
        let bytes: [u8; GENERATED_KEY_BYTES] = rand::random();
        let key = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        if !key.starts_with('-') {
            return key;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_never_starts_with_a_dash() {
        // 1 in 64 draws starts with `-`: 2000 keys miss one with
        // probability (63/64)^2000, below 1e-13.
        for _ in 0..2000 {
            let key = generate_api_key();
            assert!(!key.starts_with('-'), "{key}");
            assert_eq!(key.len(), 43);
        }
    }

    fn config(name: &str, key: &str) -> ApiKeyConfig {
        ApiKeyConfig {
            name: name.to_owned(),
            sha256: api_key_sha256(key),
            permissions: vec![Permission::Publish],
            channels: None,
            publish_rate_per_s: None,
            publish_burst: None,
        }
    }

    #[test]
    fn keys_are_found_by_their_hash_only() {
        let keys = ApiKeys::new(&[config("a", "key-a"), config("b", "key-b")]).unwrap();
        assert_eq!(keys.find("key-b").unwrap().name, "b");
        assert_eq!(keys.find("key-a").unwrap().name, "a");
        assert!(keys.find("key-c").is_none());
        assert!(keys.find(&api_key_sha256("key-a")).is_none());
        assert!(keys.find("").is_none());
    }

    #[test]
    fn bad_hashes_and_twice_used_names_are_refused() {
        let mut bad = config("a", "k");
        bad.sha256 = "abc".to_owned();
        assert!(ApiKeys::new(&[bad.clone()]).unwrap_err().contains("\"a\""));
        bad.sha256 = "g".repeat(64);
        assert!(ApiKeys::new(&[bad]).is_err());
        let upper = ApiKeyConfig {
            sha256: api_key_sha256("k").to_uppercase(),
            ..config("u", "k")
        };
        assert!(ApiKeys::new(&[upper]).unwrap().find("k").is_some());
        assert!(ApiKeys::new(&[config("a", "x"), config("a", "y")]).is_err());
    }

    #[test]
    fn generated_keys_are_long_and_differ() {
        let (a, b) = (generate_api_key(), generate_api_key());
        assert_eq!(a.len(), 43);
        assert_ne!(a, b);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
        assert_eq!(api_key_sha256(&a).len(), 64);
    }
}

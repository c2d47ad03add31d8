//! The run's config file. Access control is on, as on a cluster
//! reachable from a network, so that the faults also hit authenticated
//! publishes, subscriptions and the forwarding of a standby's publishes
//! with the cluster secret; the Centrifugo subscribers connect with a
//! client token (HS256); and the namespace `trim` has a retention policy,
//! so that trimming runs under the faults too.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use jsonwebtoken::{encode, EncodingKey, Header};
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use sha2::{Digest, Sha256};

/// How long the Centrifugo subscribers' token is valid: far beyond any
/// run (a connection whose token expires is closed with 3005).
const TOKEN_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

/// Messages kept per channel of the namespace `trim` (retention), by the
/// run's config file.
pub(crate) const TRIM_MAX_MESSAGES: u64 = 20;

/// The run's API key (every permission, every channel), its client token
/// for the Centrifugo subscribers, and the config file that holds the
/// key's SHA-256, the token's HS256 secret and the cluster secret.
#[derive(Debug)]
pub(crate) struct Access {
    /// `Authorization: Bearer <key>`, marked sensitive.
    headers: HeaderMap,
    /// An HS256 connection token of the user `chaos` that may subscribe to
    /// every channel of the run (`channels` lists them: a token's entries
    /// are exact names).
    centrifugo_token: String,
    /// The config file given to every node as `--config`.
    config_file: PathBuf,
}

impl Access {
    /// Draws a random API key, HS256 secret and cluster secret (32 bytes
    /// each, as hex), mints the client token for `channels` (the run's
    /// channels), and writes
    /// `dir/herald.toml` with them and the retention policy of the
    /// namespace `trim`.
    ///
    /// # Errors
    /// When the file cannot be written or the token not signed.
    pub(crate) fn create(dir: &Path, channels: &[&str]) -> anyhow::Result<Self> {
        let key = random_hex();
        let cluster_secret = random_hex();
        let jwt_secret = random_hex();
        let sha256 = Sha256::digest(key.as_bytes())
            .iter()
            .fold(String::new(), |mut hex, byte| {
                let _ = write!(hex, "{byte:02x}");
                hex
            });
        let config_file = dir.join("herald.toml");
        let text = format!(
            "[auth]\n\
             cluster_secret = \"{cluster_secret}\"\n\
             # No rate limit: the run's publishers are one client.\n\
             publish_rate_per_s = 0\n\
             \n\
             [[auth.api_keys]]\n\
             name = \"chaos\"\n\
             sha256 = \"{sha256}\"\n\
             permissions = [\"publish\", \"read\", \"admin\"]\n\
             \n\
             # The Centrifugo subscribers' connection token.\n\
             [auth.jwt]\n\
             hs256_secret = \"{jwt_secret}\"\n\
             \n\
             # Retention: the namespace `trim` keeps its newest messages only.\n\
             [retention.namespaces.trim]\n\
             max_messages = {TRIM_MAX_MESSAGES}\n"
        );
        std::fs::write(&config_file, text)
            .with_context(|| format!("write {}", config_file.display()))?;
        let mut value =
            HeaderValue::from_str(&format!("Bearer {key}")).context("the key is a header value")?;
        value.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, value);
        let exp = (SystemTime::now() + TOKEN_LIFETIME)
            .duration_since(UNIX_EPOCH)
            .context("the clock is after 1970")?
            .as_secs();
        let centrifugo_token = encode(
            &Header::default(),
            &serde_json::json!({ "sub": "chaos", "exp": exp, "channels": channels }),
            &EncodingKey::from_secret(jwt_secret.as_bytes()),
        )
        .context("sign the client token")?;
        Ok(Self {
            headers,
            centrifugo_token,
            config_file,
        })
    }

    /// The Centrifugo subscribers' connection token.
    pub(crate) fn centrifugo_token(&self) -> String {
        self.centrifugo_token.clone()
    }

    /// The headers every client request carries.
    pub(crate) fn headers(&self) -> HeaderMap {
        self.headers.clone()
    }

    /// The config file of every node.
    pub(crate) fn config_file(&self) -> &Path {
        &self.config_file
    }
}

/// 32 random bytes as 64 lowercase hex digits.
fn random_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().fold(String::new(), |mut hex, byte| {
        let _ = write!(hex, "{byte:02x}");
        hex
    })
}

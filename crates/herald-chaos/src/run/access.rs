//! The run's config file. Access control is on, as on a cluster
//! reachable from a network, so that the faults also hit authenticated
//! publishes, subscriptions and the forwarding of a standby's publishes
//! with the cluster secret; and the namespace `trim` has a retention
//! policy, so that trimming runs under the faults too.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use sha2::{Digest, Sha256};

use super::node::TRIM_MAX_MESSAGES;

/// The run's API key (every permission, every channel) and the config
/// file that holds its SHA-256 and the cluster secret.
#[derive(Debug)]
pub(crate) struct Access {
    /// `Authorization: Bearer <key>`, marked sensitive.
    headers: HeaderMap,
    /// The config file given to every node as `--config`.
    config_file: PathBuf,
}

impl Access {
    /// Draws a random API key and cluster secret (32 bytes each, as hex)
    /// and writes `dir/herald.toml` with them and the retention policy of
    /// the namespace `trim`.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub(crate) fn create(dir: &Path) -> anyhow::Result<Self> {
        let key = random_hex();
        let cluster_secret = random_hex();
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
        Ok(Self {
            headers,
            config_file,
        })
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

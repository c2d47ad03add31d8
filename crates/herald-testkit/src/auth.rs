//! Access control for tests of the `herald serve` binary: a config file
//! with an API key, an HS256 secret for client tokens and the cluster
//! secret (which a node on PostgreSQL with access control requires), and
//! tokens signed with that secret.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::json;

/// How long a token of [`hs256_token`] is valid, seconds.
pub const TOKEN_LIFETIME_S: u64 = 300;

/// The credentials of a config file written by [`write_auth_config`].
#[derive(Debug, Clone)]
pub struct AuthFile {
    /// The API key named `backend` (plaintext; the file holds its SHA-256).
    pub key: String,
    /// The HS256 secret that signs client tokens.
    pub secret: String,
}

/// Writes to `path` a config file with one API key named `backend` that
/// has `permissions` (e.g. `["publish", "read"]`) on every channel, an
/// HS256 secret for client tokens and a cluster secret, each newly
/// generated. Panics when the file cannot be written.
pub fn write_auth_config(path: &Path, permissions: &[&str]) -> AuthFile {
    let key = herald_auth::generate_api_key();
    let secret = herald_auth::generate_api_key();
    let cluster_secret = herald_auth::generate_api_key();
    let permissions = permissions
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join(", ");
    std::fs::write(
        path,
        format!(
            "[auth]\n\
             cluster_secret = \"{cluster_secret}\"\n\
             api_keys = [{{ name = \"backend\", sha256 = \"{}\", permissions = [{permissions}] }}]\n\
             \n\
             [auth.jwt]\n\
             hs256_secret = \"{secret}\"\n",
            herald_auth::api_key_sha256(&key)
        ),
    )
    .expect("write the config file");
    AuthFile { key, secret }
}

/// A client token for user `sub` that may subscribe to `channels`,
/// signed with the HS256 `secret`, valid for [`TOKEN_LIFETIME_S`] from now.
pub fn hs256_token(secret: &str, sub: &str, channels: &[&str]) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs();
    let claims = json!({ "sub": sub, "exp": now + TOKEN_LIFETIME_S, "channels": channels });
    encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("sign the token")
}

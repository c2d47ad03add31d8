//! JWT key rotation on the real binary: a key added to the `jwks_file`
//! (a new `kid`) is refused until SIGHUP, then accepted; a reload of a
//! broken file fails with an ERROR and keeps the keys in force.

use std::path::Path;

use herald_testkit::process::Server;
use herald_testkit::WAIT;
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::{json, Value};

/// A JWKS of HS256 keys (`kty: oct`), each `(kid, secret)`.
fn jwks(keys: &[(&str, &str)]) -> String {
    let keys: Vec<Value> = keys
        .iter()
        .map(|(kid, secret)| {
            // base64url without padding (RFC 7515 §2).
            let k = base64url(secret.as_bytes());
            json!({"kty": "oct", "kid": kid, "alg": "HS256", "k": k})
        })
        .collect();
    json!({ "keys": keys }).to_string()
}

fn base64url(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A token for `news:*` with `kid`, signed with `secret`.
fn token(kid: &str, secret: &str) -> String {
    let header = Header {
        kid: Some(kid.to_owned()),
        ..Header::default()
    };
    let exp = jsonwebtoken::get_current_timestamp() + 300;
    encode(
        &header,
        &json!({"sub": "u", "exp": exp, "channels": ["news:*"]}),
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

/// The status of a history read on `server` with `token`.
async fn history_status(server: &Server, token: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("{}/v1/channels/news:a/messages", server.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn write(path: &Path, text: &str) {
    // Replaced whole, as a deployment would (no half-written file read).
    let next = path.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_accepts_a_new_kid_of_the_jwks_file_and_a_failed_reload_keeps_the_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (
        "old-secret-0123456789abcdef0123456789",
        "new-secret-0123456789abcdef0123456789",
    );
    let jwks_path = dir.path().join("jwks.json");
    write(&jwks_path, &jwks(&[("old", old)]));
    let config = dir.path().join("herald.toml");
    std::fs::write(
        &config,
        format!(
            "[auth.jwt]\njwks_file = {}\n",
            toml_string(jwks_path.to_str().unwrap())
        ),
    )
    .unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    )
    .await;
    let rotated = token("new", new);
    assert_eq!(history_status(&server, &token("old", old)).await, 200);
    write(&jwks_path, &jwks(&[("old", old), ("new", new)]));
    assert_eq!(
        history_status(&server, &rotated).await,
        401,
        "before SIGHUP"
    );

    server.signal(rustix::process::Signal::HUP);
    server
        .wait_log_record("the reload", WAIT, |r| r["message"] == "JWT keys reloaded")
        .await;
    assert_eq!(history_status(&server, &rotated).await, 200, "after SIGHUP");

    write(&jwks_path, "{not json");
    server.signal(rustix::process::Signal::HUP);
    let failed = server
        .wait_log_record("the failed reload", WAIT, |r| {
            r["message"] == "JWT key reload failed; the keys in force stay"
        })
        .await;
    assert_eq!(failed["level"], "ERROR", "{failed}");
    assert_eq!(history_status(&server, &rotated).await, 200);
}

/// `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    format!("{text:?}")
}

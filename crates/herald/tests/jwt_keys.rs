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

/// Runs `herald ARGS`; returns its exit code, stdout and stderr.
async fn run_herald(args: &[&str]) -> (Option<i32>, String, String) {
    let out = herald_testkit::within(
        "herald token",
        WAIT,
        herald_testkit::process::herald().args(args).output(),
    )
    .await
    .unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// `herald token create` makes a token that the server with the same
/// config accepts for the channels it names and for no other, and
/// `herald token check` says whether a token is accepted and why not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_token_creates_tokens_the_server_accepts_and_checks_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("herald.toml");
    std::fs::write(
        &config,
        "[auth.jwt]\nhs256_secret = \"token-secret-0123456789abcdef012345\"\naudience = \"app\"\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let server = Server::start_with(&dir.path().join("data"), &["--config", config]).await;

    let (code, stdout, stderr) = run_herald(&[
        "token",
        "create",
        "--config",
        config,
        "--sub",
        "alice",
        "--ttl",
        "10m",
        "--channels",
        "news:*",
    ])
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    let token = stdout.trim();
    assert_eq!(history_status(&server, token).await, 200);
    let other = reqwest::Client::new()
        .get(format!("{}/v1/channels/sport:a/messages", server.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 403, "a channel the token does not name");

    let (code, stdout, stderr) = run_herald(&["token", "check", "--config", config, token]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.starts_with("valid: sub alice, expires in "),
        "{stderr}"
    );
    let claims: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(claims["aud"], "app", "{claims}");
    assert_eq!(claims["channels"], json!(["news:*"]), "{claims}");

    // Signed with another secret: refused by both, and the check says so.
    let forged = token_with("other-secret-0123456789abcdef0123456");
    assert_eq!(history_status(&server, &forged).await, 401);
    let (code, _, stderr) = run_herald(&["token", "check", "--config", config, &forged]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.starts_with("refused: "), "{stderr}");

    // A config without a secret to sign with is named.
    let bare = dir.path().join("bare.toml");
    std::fs::write(&bare, "").unwrap();
    let (code, _, stderr) = run_herald(&[
        "token",
        "create",
        "--config",
        bare.to_str().unwrap(),
        "--sub",
        "a",
    ])
    .await;
    assert_eq!(code, Some(1));
    assert!(stderr.contains("no [auth.jwt] section"), "{stderr}");
}

/// A token for `news:*` audience `app`, without a `kid`, signed with `secret`.
fn token_with(secret: &str) -> String {
    let exp = jsonwebtoken::get_current_timestamp() + 300;
    encode(
        &Header::default(),
        &json!({"sub": "u", "exp": exp, "aud": "app", "channels": ["news:*"]}),
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

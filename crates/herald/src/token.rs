//! `herald token create` and `herald token check`: client tokens (JWTs,
//! RFC 7519) made and checked with the keys of a config file's
//! `[auth.jwt]`, for a first test of `?token=` or a Centrifugo SDK without
//! a JWT library, and to see why a token is refused.
//!
//! `create` signs HS256 with the first `hs256_secret` (RFC 7518 §3.2) and
//! sets `aud` and `iss` when the config checks them. The claims are those
//! docs/security.md describes: `sub`, `exp`, `channels`, `channel`,
//! `publish`, `info`. `check` verifies exactly as `herald serve` does
//! (same keys, same clock rules), except that keys behind `jwks_url` are
//! not fetched.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context};
use base64::Engine as _;
use herald_auth::config::JwtConfig;
use herald_auth::jwt::JwtVerifier;
use serde_json::{json, Map, Value};

use crate::config_file;
use crate::serve::settings::serve_command;

/// `herald token` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum TokenCommand {
    /// Print a new client token (HS256, signed with the config's first
    /// `[auth.jwt] hs256_secret`) on stdout.
    Create(CreateArgs),
    /// Verify a token with the config's `[auth.jwt]` keys; print its
    /// claims (stdout) and whether it is valid (stderr, and the exit
    /// status: 0 valid, 1 refused).
    Check(CheckArgs),
}

/// Flags of `herald token create`.
#[derive(Debug, clap::Args)]
pub(crate) struct CreateArgs {
    /// The config file whose `[auth.jwt] hs256_secret` signs the token.
    #[arg(long)]
    config: PathBuf,
    /// The user (`sub`): publishes are rate-limited per user.
    #[arg(long)]
    sub: String,
    /// How long the token is valid (`exp` = now + ttl), e.g. 10m, 1h.
    #[arg(long, default_value = "1h", value_parser = crate::duration::parse_duration)]
    ttl: Duration,
    /// Channels it may subscribe to and read (`channels`), comma-separated
    /// (`ns:*` for a namespace's channels).
    #[arg(long, value_delimiter = ',')]
    channels: Vec<String>,
    /// The one channel of a subscription token (`channel`).
    #[arg(long)]
    channel: Option<String>,
    /// Channels it may publish to (`publish`), in namespaces whose rule is
    /// `publish = "token"`; comma-separated.
    #[arg(long, value_delimiter = ',')]
    publish: Vec<String>,
    /// Centrifugo's connection information (`info`), as JSON.
    #[arg(long)]
    info: Option<String>,
}

/// Flags of `herald token check`.
#[derive(Debug, clap::Args)]
pub(crate) struct CheckArgs {
    /// The config file whose `[auth.jwt]` keys verify the token.
    #[arg(long)]
    config: PathBuf,
    /// The token.
    token: String,
}

/// Runs a `herald token` subcommand.
///
/// # Errors
/// The config file cannot be read or has no usable key (`create`: no
/// `hs256_secret`); the message names what to add.
pub(crate) async fn run(command: TokenCommand) -> anyhow::Result<ExitCode> {
    match command {
        TokenCommand::Create(args) => {
            let jwt = jwt_config(&args.config)?;
            let token = create(&jwt, &args, SystemTime::now())?;
            writeln!(std::io::stdout().lock(), "{token}")?;
            Ok(ExitCode::SUCCESS)
        }
        TokenCommand::Check(args) => {
            let jwt = jwt_config(&args.config)?;
            check(&jwt, args.token.trim()).await
        }
    }
}

/// The `[auth.jwt]` section of the config file at `path`.
fn jwt_config(path: &std::path::Path) -> anyhow::Result<JwtConfig> {
    let file = config_file::load(path, &serve_command())?;
    file.auth.and_then(|auth| auth.jwt).ok_or_else(|| {
        anyhow!(
            "config file {}: no [auth.jwt] section; add one with hs256_secret (docs/security.md)",
            path.display()
        )
    })
}

/// The signed token `args` describes, issued at `now`.
fn create(jwt: &JwtConfig, args: &CreateArgs, now: SystemTime) -> anyhow::Result<String> {
    let secret = jwt.hs256_secret.as_slice().first().ok_or_else(|| {
        anyhow!(
            "[auth.jwt] has no hs256_secret: herald token create signs with one (tokens of \
             RSA or EC keys are made by the application that holds the private key)"
        )
    })?;
    let iat = now.duration_since(UNIX_EPOCH)?.as_secs();
    let mut claims = Map::new();
    claims.insert("sub".into(), json!(args.sub));
    claims.insert("iat".into(), json!(iat));
    claims.insert("exp".into(), json!(iat + args.ttl.as_secs().max(1)));
    if !args.channels.is_empty() {
        claims.insert("channels".into(), json!(args.channels));
    }
    if let Some(channel) = &args.channel {
        claims.insert("channel".into(), json!(channel));
    }
    if !args.publish.is_empty() {
        claims.insert("publish".into(), json!(args.publish));
    }
    if let Some(info) = &args.info {
        let info: Value = serde_json::from_str(info).context("--info is not JSON")?;
        claims.insert("info".into(), info);
    }
    if let Some(aud) = &jwt.audience {
        claims.insert("aud".into(), json!(aud));
    }
    if let Some(iss) = &jwt.issuer {
        claims.insert("iss".into(), json!(iss));
    }
    let key = jsonwebtoken::EncodingKey::from_secret(secret.expose().as_bytes());
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &Value::Object(claims),
        &key,
    )
    .context("signing the token")
}

/// The claims of `token` as JSON, without verifying anything: what a
/// refused token said it was.
fn claims(token: &str) -> Option<Value> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Verifies `token` as `herald serve` would; prints its claims and the
/// verdict.
async fn check(jwt: &JwtConfig, token: &str) -> anyhow::Result<ExitCode> {
    let verifier = JwtVerifier::new(jwt, Arc::new(herald_auth::NoFetch))
        .map_err(|e| anyhow!("[auth.jwt]: {e}"))?;
    if let Some(claims) = claims(token) {
        writeln!(std::io::stdout().lock(), "{claims:#}")?;
    }
    let mut err = std::io::stderr().lock();
    match verifier.verify(token).await {
        Ok(grant) => {
            writeln!(
                err,
                "valid: sub {}, expires in {} s",
                grant.subject,
                grant.time_left().as_secs()
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let hint = if jwt.jwks_url.is_some() {
                " (keys behind jwks_url are not fetched by herald token check)"
            } else {
                ""
            };
            writeln!(err, "refused: {e}{hint}")?;
            Ok(ExitCode::FAILURE)
        }
    }
}

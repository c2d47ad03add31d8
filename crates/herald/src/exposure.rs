//! Safe by default: a node without authentication serves only loopback.
//!
//! A node whose `--listen` address is loopback (`127.0.0.0/8`, `::1`,
//! `localhost`) starts without authentication, for development. On any
//! other address it starts only when authentication is configured
//! ([`auth_configured`]) or `--insecure-no-auth` is given; then it warns at
//! start and every hour ([`INSECURE_WARNING_PERIOD`]).

use std::net::IpAddr;
use std::time::Duration;

use herald_server::AuthConfig;

use tracing::warn;

/// How often a node started with `--insecure-no-auth` repeats its warning.
pub(crate) const INSECURE_WARNING_PERIOD: Duration = Duration::from_secs(3600);

/// How a node is exposed, as decided at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exposure {
    /// Loopback only, or authentication configured.
    Safe,
    /// Reachable from other hosts without authentication, as
    /// `--insecure-no-auth` asked.
    Insecure,
}

/// Whether the config file's `[auth]` section configures any credential: an
/// API key or a JWT key ([`AuthConfig::enabled`]). The one place that
/// decides it.
pub(crate) fn auth_configured(auth: Option<&AuthConfig>) -> bool {
    auth.is_some_and(AuthConfig::enabled)
}

/// Whether a `--listen` host is loopback only: an address in
/// `127.0.0.0/8` or `::1` (also written IPv4-mapped), or `localhost`.
pub(crate) fn is_loopback(host: &str) -> bool {
    match host.parse::<IpAddr>() {
        Ok(ip) => ip.to_canonical().is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// Decides whether a node listening on `host` (written `listen` in
/// messages) may start.
///
/// # Errors
/// Not loopback, no authentication and no `--insecure-no-auth`: the
/// message names the fixes.
pub(crate) fn check(
    host: &str,
    listen: &str,
    auth: Option<&AuthConfig>,
    insecure_no_auth: bool,
) -> anyhow::Result<Exposure> {
    if is_loopback(host) || auth_configured(auth) {
        return Ok(Exposure::Safe);
    }
    if insecure_no_auth {
        return Ok(Exposure::Insecure);
    }
    anyhow::bail!(
        "refusing to listen on {listen} without authentication: anyone who reaches it could \
         publish to and read every channel. Configure API keys or JWT in the [auth] section of \
         the config file (--config, see docs/configuration.md), listen on loopback only \
         (--listen 127.0.0.1:PORT), or pass --insecure-no-auth to run without authentication \
         anyway"
    )
}

/// Logs the warning of an insecure node now and every
/// [`INSECURE_WARNING_PERIOD`], for as long as the task runs.
pub(crate) async fn warn_insecure(listen: String) {
    let mut every = tokio::time::interval(INSECURE_WARNING_PERIOD);
    loop {
        every.tick().await;
        warn!(
            listen = %listen,
            "running without authentication (--insecure-no-auth): anyone who reaches this node \
             can publish to and read every channel"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for host in [
            "127.0.0.1",
            "127.8.9.10",
            "::1",
            "localhost",
            "LOCALHOST",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "0.0.0.0",
            "::",
            "10.0.0.1",
            "node-a.internal",
            "localhost.example",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn auth_is_configured_by_an_api_key_or_a_jwt_key() {
        let auth = |text: &str| toml::from_str::<AuthConfig>(text).unwrap();
        assert!(!auth_configured(None));
        assert!(!auth_configured(Some(&auth(""))));
        assert!(!auth_configured(Some(&auth("api_keys = []"))));
        assert!(auth_configured(Some(&auth(&format!(
            "[[api_keys]]\nname = \"backend\"\nsha256 = \"{}\"\npermissions = [\"publish\"]",
            "ab".repeat(32)
        )))));
        assert!(auth_configured(Some(&auth("[jwt]\nhs256_secret = \"s\""))));
    }

    #[test]
    fn an_exposed_node_needs_auth_or_the_insecure_flag() {
        assert_eq!(
            check("127.0.0.1", "127.0.0.1:1", None, false).unwrap(),
            Exposure::Safe
        );
        assert_eq!(
            check("0.0.0.0", "0.0.0.0:1", None, true).unwrap(),
            Exposure::Insecure
        );
        let error = check("0.0.0.0", "0.0.0.0:1", None, false)
            .unwrap_err()
            .to_string();
        assert!(error.contains("[auth]"), "{error}");
        assert!(error.contains("--insecure-no-auth"), "{error}");
        let auth: AuthConfig = toml::from_str(&format!(
            "api_keys = [{{ name = \"k\", sha256 = \"{}\", permissions = [\"read\"] }}]",
            "ab".repeat(32)
        ))
        .unwrap();
        assert_eq!(
            check("0.0.0.0", "0.0.0.0:1", Some(&auth), false).unwrap(),
            Exposure::Safe
        );
    }
}

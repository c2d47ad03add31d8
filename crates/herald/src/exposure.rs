//! Safe by default: a node without authentication serves only loopback.
//!
//! A node whose `--listen` address is loopback (`127.0.0.0/8`, `::1`,
//! `localhost`) starts without authentication, for development, provided
//! nothing publishes it to other hosts: no `--trusted-proxy` (a reverse
//! proxy in front of it) and an `--advertise-url` that is loopback too.
//! Such a node answers only requests for loopback host names
//! ([`Exposure::Loopback`], against DNS rebinding). Any other node starts
//! only when authentication is configured ([`auth_configured`]) or
//! `--insecure-no-auth` is given; then it warns at start and every hour
//! ([`INSECURE_WARNING_PERIOD`]).

use std::net::IpAddr;
use std::time::Duration;

use herald_auth::AuthConfig;

use tracing::warn;

/// How often a node started with `--insecure-no-auth` repeats its warning.
pub(crate) const INSECURE_WARNING_PERIOD: Duration = Duration::from_secs(3600);

/// How a node is exposed, as decided at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exposure {
    /// Authentication configured.
    Authenticated,
    /// No authentication, loopback only: requests for other host names
    /// are refused.
    Loopback,
    /// Reachable from other hosts without authentication, as
    /// `--insecure-no-auth` asked.
    Insecure,
}

/// Where a node can be reached from, as its flags say.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reach<'a> {
    /// The host of `--listen`.
    pub(crate) host: &'a str,
    /// `--listen` as written, for messages.
    pub(crate) listen: &'a str,
    /// `--advertise-url`, if given.
    pub(crate) advertise_url: Option<&'a str>,
    /// Whether `--trusted-proxy` names any proxy.
    pub(crate) behind_proxy: bool,
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

/// Whether an `--advertise-url`'s host is loopback (see [`is_loopback`];
/// an IPv6 host in brackets).
fn url_is_loopback(url: &str) -> bool {
    reqwest::Url::parse(url).is_ok_and(|url| {
        url.host_str()
            .is_some_and(|host| is_loopback(host.trim_start_matches('[').trim_end_matches(']')))
    })
}

/// Decides whether a node reachable as `reach` says may start.
///
/// # Errors
/// No authentication, no `--insecure-no-auth`, and a listen address that
/// is not loopback, a trusted proxy, or an advertised URL that is not
/// loopback: the message names the cause and the fixes.
pub(crate) fn check(
    reach: Reach<'_>,
    auth: Option<&AuthConfig>,
    insecure_no_auth: bool,
) -> anyhow::Result<Exposure> {
    if auth_configured(auth) {
        return Ok(Exposure::Authenticated);
    }
    let published = if !is_loopback(reach.host) {
        None
    } else if reach.behind_proxy {
        Some("--trusted-proxy says a reverse proxy publishes it to other hosts".to_owned())
    } else {
        match reach.advertise_url {
            Some(url) if !url_is_loopback(url) => Some(format!(
                "--advertise-url {url} says other hosts reach it there"
            )),
            _ => return Ok(Exposure::Loopback),
        }
    };
    if insecure_no_auth {
        return Ok(Exposure::Insecure);
    }
    let listen = reach.listen;
    match published {
        None => anyhow::bail!(
            "refusing to listen on {listen} without authentication: anyone who reaches it could \
             publish to and read every channel. Configure API keys or JWT in the [auth] section of \
             the config file (--config, see docs/configuration.md), listen on loopback only \
             (--listen 127.0.0.1:PORT), or pass --insecure-no-auth to run without authentication \
             anyway"
        ),
        Some(why) => anyhow::bail!(
            "refusing to start without authentication: the node listens on loopback ({listen}), \
             but {why}, and anyone who reaches it there could publish to and read every channel. \
             Configure API keys or JWT in the [auth] section of the config file (--config, see \
             docs/configuration.md), or pass --insecure-no-auth to run without authentication \
             anyway"
        ),
    }
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

    fn reach<'a>(host: &'a str, advertise_url: Option<&'a str>, behind_proxy: bool) -> Reach<'a> {
        Reach {
            host,
            listen: "the listen address",
            advertise_url,
            behind_proxy,
        }
    }

    #[test]
    fn an_exposed_node_needs_auth_or_the_insecure_flag() {
        assert_eq!(
            check(reach("127.0.0.1", None, false), None, false).unwrap(),
            Exposure::Loopback
        );
        assert_eq!(
            check(reach("0.0.0.0", None, false), None, true).unwrap(),
            Exposure::Insecure
        );
        let error = check(reach("0.0.0.0", None, false), None, false)
            .unwrap_err()
            .to_string();
        assert!(error.contains("[auth]"), "{error}");
        assert!(error.contains("--insecure-no-auth"), "{error}");
        let auth: AuthConfig = toml::from_str(&format!(
            "api_keys = [{{ name = \"k\", sha256 = \"{}\", permissions = [\"read\"] }}]",
            "ab".repeat(32)
        ))
        .unwrap();
        for exposed in [
            reach("0.0.0.0", None, false),
            reach("127.0.0.1", None, true),
            reach("127.0.0.1", Some("https://herald.example"), false),
        ] {
            assert_eq!(
                check(exposed, Some(&auth), false).unwrap(),
                Exposure::Authenticated
            );
        }
    }

    /// A loopback node that a reverse proxy publishes (a trusted proxy, or
    /// an advertised URL that is not loopback) is exposed as much as one
    /// listening on every interface.
    #[test]
    fn a_published_loopback_node_needs_auth_or_the_insecure_flag() {
        for (published, cause) in [
            (reach("127.0.0.1", None, true), "--trusted-proxy"),
            (
                reach("localhost", Some("https://herald.example"), false),
                "--advertise-url https://herald.example",
            ),
            (
                reach("::1", Some("http://10.0.0.5:7700"), false),
                "--advertise-url http://10.0.0.5:7700",
            ),
        ] {
            let error = check(published, None, false).unwrap_err().to_string();
            assert!(error.contains(cause), "{error}");
            assert!(error.contains("--insecure-no-auth"), "{error}");
            assert!(error.contains("[auth]"), "{error}");
            assert_eq!(check(published, None, true).unwrap(), Exposure::Insecure);
        }
        for loopback in [
            "http://127.0.0.1:7700",
            "http://localhost:7700",
            "https://[::1]:7700",
        ] {
            assert_eq!(
                check(reach("127.0.0.1", Some(loopback), false), None, false).unwrap(),
                Exposure::Loopback,
                "{loopback}"
            );
        }
    }
}

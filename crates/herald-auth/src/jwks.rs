//! JSON Web Key Sets (RFC 7517 §5): the keys of a JWKS document, and a
//! JWKS served at a URL (`[auth.jwt] jwks_url`), fetched when first
//! needed, cached, and fetched again when its cache time has passed or a
//! token names a `kid` it does not hold, as Centrifugo's JWKS endpoint
//! option does, so that a key rotation needs no restart.
//!
//! The fetch itself is the caller's [`JwksFetch`] (herald-auth knows no
//! HTTP; the server's is bounded in time and size and follows no
//! redirect). Fetches are rate-limited here: at most one per refetch
//! interval, whatever the tokens ask, so a flood of tokens with made-up
//! `kid`s costs the JWKS server one request per interval. While one fetch
//! runs, the others wait for it and use its keys. A failed fetch keeps the
//! keys in hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey};
use tracing::{info, warn};
use url::Url;

use crate::wall_clock::WallClock;

/// Fetches the JWKS document served at a URL: the body's bytes, or why
/// not (the message names no secret; it is logged with the URL).
#[async_trait::async_trait]
pub trait JwksFetch: Send + Sync + std::fmt::Debug {
    /// The body of a successful answer to a GET of `url`.
    ///
    /// # Errors
    /// Why there is none: the request failed, the answer was not a
    /// success, the body was too large ...
    async fn fetch(&self, url: &Url) -> Result<Vec<u8>, String>;
}

/// A [`JwksFetch`] that fetches nothing: for an [`crate::access::Auth`]
/// built only to check settings, which verifies no token. Every fetch
/// fails.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFetch;

#[async_trait::async_trait]
impl JwksFetch for NoFetch {
    async fn fetch(&self, _url: &Url) -> Result<Vec<u8>, String> {
        Err("this node fetches no JWKS".to_owned())
    }
}

/// One verification key.
pub(crate) struct Key {
    /// The JWKS `kid`, if the key came from a JWKS.
    pub(crate) kid: Option<String>,
    /// The one algorithm it verifies.
    pub(crate) algorithm: Algorithm,
    /// The key itself.
    pub(crate) key: DecodingKey,
}

/// Default time a fetched JWKS is used before it is fetched again, seconds.
pub(crate) const DEFAULT_CACHE_TTL_S: u64 = 3600;
/// Default shortest time between two fetches, seconds.
pub(crate) const DEFAULT_REFETCH_INTERVAL_S: u64 = 10;

/// The keys of the JWKS document `bytes`; `what` names its source in
/// errors.
///
/// # Errors
/// Not a JWKS document, or a key that is not an RS256, ES256 or HS256 key.
pub(crate) fn keys_of(bytes: &[u8], what: &str) -> Result<Vec<Key>, String> {
    let set: JwkSet =
        serde_json::from_slice(bytes).map_err(|e| format!("{what}: not a JWKS document: {e}"))?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        let algorithm = match (&jwk.common.key_algorithm, &jwk.algorithm) {
            (Some(alg), _) => alg.to_string().parse::<Algorithm>().ok(),
            (None, AlgorithmParameters::RSA(_)) => Some(Algorithm::RS256),
            (None, AlgorithmParameters::EllipticCurve(_)) => Some(Algorithm::ES256),
            _ => None,
        };
        let algorithm = algorithm
            .filter(|a| matches!(a, Algorithm::RS256 | Algorithm::ES256 | Algorithm::HS256));
        let (Some(algorithm), Ok(key)) = (algorithm, DecodingKey::from_jwk(jwk)) else {
            return Err(format!(
                "{what}: key {:?} is not an RS256, ES256 or HS256 key",
                jwk.common.key_id
            ));
        };
        keys.push(Key {
            kid: jwk.common.key_id.clone(),
            algorithm,
            key,
        });
    }
    Ok(keys)
}

/// Checks a `jwks_url`: `https`, or `http` to a loopback host only (a key
/// set fetched in clear could be swapped on the way), and no user
/// information (it would be logged with the URL).
///
/// # Errors
/// A message saying what is wrong with it.
pub(crate) fn check_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|e| format!("auth.jwt.jwks_url: not a URL: {e}"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err("auth.jwt.jwks_url: must not hold a user name or password".to_owned());
    }
    let host = url.host_str().unwrap_or_default();
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match url.scheme() {
        "https" => Ok(url),
        "http" if loopback => Ok(url),
        "http" => Err(
            "auth.jwt.jwks_url: use https (http is accepted for a loopback host only)".to_owned(),
        ),
        other => Err(format!(
            "auth.jwt.jwks_url: scheme {other} is not https (or http to a loopback host)"
        )),
    }
}

/// A JWKS served at a URL, with the keys of its last good fetch.
pub(crate) struct RemoteJwks {
    url: Url,
    /// Fetches the set (the caller's HTTP client).
    fetch: Arc<dyn JwksFetch>,
    /// How long a fetched set is used before it is fetched again, ms.
    cache_ttl_ms: u64,
    /// Shortest time between two fetch attempts, ms.
    refetch_interval_ms: u64,
    /// The keys of the last good fetch (none before the first).
    keys: RwLock<Arc<Vec<Key>>>,
    /// When the last good fetch ended, ms since the epoch on the
    /// verifier's clock; 0: never (or marked stale by a reload).
    fetched_at_ms: AtomicU64,
    /// When the last fetch attempt started (`None`: never). Held across a
    /// fetch, so that concurrent callers wait for it instead of fetching.
    last_attempt_ms: tokio::sync::Mutex<Option<u64>>,
}

impl std::fmt::Debug for RemoteJwks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteJwks")
            .field("url", &self.url.as_str())
            .finish_non_exhaustive()
    }
}

impl RemoteJwks {
    /// The JWKS at `url` (checked by [`check_url`]), fetched by `fetch`,
    /// used for `cache_ttl_s` seconds, fetched at most once per
    /// `refetch_interval_s` seconds. Nothing is fetched yet.
    pub(crate) fn new(
        url: Url,
        cache_ttl_s: u64,
        refetch_interval_s: u64,
        fetch: Arc<dyn JwksFetch>,
    ) -> Self {
        Self {
            url,
            fetch,
            cache_ttl_ms: cache_ttl_s.saturating_mul(1000),
            refetch_interval_ms: refetch_interval_s.saturating_mul(1000),
            keys: RwLock::new(Arc::new(Vec::new())),
            fetched_at_ms: AtomicU64::new(0),
            last_attempt_ms: tokio::sync::Mutex::new(None),
        }
    }

    /// The keys of the last good fetch.
    pub(crate) fn keys(&self) -> Arc<Vec<Key>> {
        Arc::clone(&self.keys.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Makes the next [`RemoteJwks::refresh_if_stale`] fetch (within the
    /// rate limit): on reload.
    pub(crate) fn mark_stale(&self) {
        self.fetched_at_ms.store(0, Ordering::Relaxed);
    }

    /// Fetches the set if it was never fetched or its cache time has
    /// passed, within the rate limit.
    pub(crate) async fn refresh_if_stale(&self, clock: &WallClock) {
        if self.is_fresh(clock.unix_ms()) {
            return;
        }
        self.fetch_limited(clock, true).await;
    }

    /// Fetches the set again for a token whose `kid` it does not hold,
    /// within the rate limit; `true` when new keys were fetched.
    pub(crate) async fn refetch(&self, clock: &WallClock) -> bool {
        self.fetch_limited(clock, false).await
    }

    fn is_fresh(&self, now_ms: u64) -> bool {
        let at = self.fetched_at_ms.load(Ordering::Relaxed);
        at != 0 && now_ms.saturating_sub(at) < self.cache_ttl_ms
    }

    /// One fetch, unless one started less than the refetch interval ago
    /// (or, with `only_if_stale`, the set became fresh while this caller
    /// waited for another's fetch).
    async fn fetch_limited(&self, clock: &WallClock, only_if_stale: bool) -> bool {
        let mut last_attempt = self.last_attempt_ms.lock().await;
        let now = clock.unix_ms();
        if only_if_stale && self.is_fresh(now) {
            return false;
        }
        // A clock that went back counts as the interval having passed.
        if last_attempt.is_some_and(|last| now >= last && now - last < self.refetch_interval_ms) {
            return false;
        }
        *last_attempt = Some(now);
        match self.fetch().await {
            Ok(keys) => {
                info!(jwks_url = %self.url, keys = keys.len(), "JWKS fetched");
                *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keys);
                self.fetched_at_ms
                    .store(clock.unix_ms().max(1), Ordering::Relaxed);
                true
            }
            Err(e) => {
                warn!(jwks_url = %self.url, error = %e, "JWKS fetch failed; the keys in hand stay in use");
                false
            }
        }
    }

    /// Fetches the set and reads its keys.
    async fn fetch(&self) -> Result<Vec<Key>, String> {
        let body = self.fetch.fetch(&self.url).await?;
        keys_of(&body, "the JWKS")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jwks_url_is_https_or_loopback_http_without_credentials() {
        for good in [
            "https://auth.example/.well-known/jwks.json",
            "http://127.0.0.1:8080/jwks",
            "http://[::1]/jwks",
            "http://localhost/jwks",
        ] {
            assert!(check_url(good).is_ok(), "{good}");
        }
        for bad in [
            "http://auth.example/jwks",
            "http://10.0.0.1/jwks",
            "ftp://127.0.0.1/jwks",
            "https://user:pw@auth.example/jwks",
            "not a url",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }
}

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
//! `kid`s costs the JWKS server one request per interval. One fetch runs
//! at a time, in the background: a token check never waits for it while
//! keys are in hand (the cached set serves meanwhile, however slow the
//! identity provider); only the first fetch (no keys yet) and a token
//! whose `kid` is unknown wait for the fetch in flight. A failed fetch
//! keeps the keys in hand. A symmetric key (`oct`) from a URL is skipped:
//! the document is public.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio::sync::watch;
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

/// The keys of the JWKS document `bytes` (a file the operator gives);
/// `what` names its source in errors.
///
/// # Errors
/// Not a JWKS document, or a key that is not an RS256, ES256 or HS256 key.
pub(crate) fn keys_of(bytes: &[u8], what: &str) -> Result<Vec<Key>, String> {
    let set: JwkSet =
        serde_json::from_slice(bytes).map_err(|e| format!("{what}: not a JWKS document: {e}"))?;
    keys_of_set(&set.keys, what)
}

/// Whether `jwk` is a symmetric key: of type `oct` (RFC 7518 §6.4), or
/// named for an HMAC algorithm (`HS256`, `HS384`, `HS512`).
fn is_symmetric(jwk: &Jwk) -> bool {
    matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_))
        || jwk.common.key_algorithm.is_some_and(|alg| {
            matches!(
                alg,
                KeyAlgorithm::HS256 | KeyAlgorithm::HS384 | KeyAlgorithm::HS512
            )
        })
}

/// The public keys of the JWKS document `bytes` fetched from `url`. A
/// JWKS URL serves its document to anyone who asks (it is public by
/// nature), so a symmetric key there (`oct`, or an HMAC `alg`) would let
/// anyone sign tokens: such keys are skipped and logged (WARN), never
/// used.
///
/// # Errors
/// As [`keys_of`], for the keys that are not skipped.
pub(crate) fn public_keys_of(bytes: &[u8], what: &str, url: &Url) -> Result<Vec<Key>, String> {
    let set: JwkSet =
        serde_json::from_slice(bytes).map_err(|e| format!("{what}: not a JWKS document: {e}"))?;
    let (symmetric, public): (Vec<Jwk>, Vec<Jwk>) = set.keys.into_iter().partition(is_symmetric);
    for jwk in &symmetric {
        warn!(
            jwks_url = %url,
            kid = ?jwk.common.key_id,
            "a symmetric (oct or HMAC) key in a JWKS served at a URL is skipped: anyone who fetches the set could sign tokens with it"
        );
    }
    keys_of_set(&public, what)
}

/// The keys of `set`; `what` names its source in errors.
fn keys_of_set(set: &[Jwk], what: &str) -> Result<Vec<Key>, String> {
    let mut keys = Vec::new();
    for jwk in set {
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
    /// What the fetch task shares with the verifier.
    shared: Arc<Fetched>,
    /// How long a fetched set is used before it is fetched again, ms.
    cache_ttl_ms: u64,
    /// Shortest time between two fetch attempts, ms.
    refetch_interval_ms: u64,
}

/// The fetched keys and the one fetch in flight, shared with the task
/// that fetches.
struct Fetched {
    url: Url,
    /// Fetches the set (the caller's HTTP client).
    fetch: Arc<dyn JwksFetch>,
    /// The keys of the last good fetch (none before the first).
    keys: RwLock<Arc<Vec<Key>>>,
    /// When the last good fetch ended, ms since the epoch on the
    /// verifier's clock; 0: never (or marked stale by a reload).
    fetched_at_ms: AtomicU64,
    /// When the last attempt started and whether one runs; held for a
    /// moment only, never across a fetch.
    attempts: Mutex<Attempts>,
    /// The number of fetches that ended (well or not), sent as each ends,
    /// so that a caller that needs the outcome awaits the one in flight.
    ended: watch::Sender<u64>,
}

/// The fetch attempts' state.
#[derive(Default)]
struct Attempts {
    /// When the last attempt started, ms on the verifier's clock.
    last_ms: Option<u64>,
    /// A fetch runs now.
    in_flight: bool,
}

impl std::fmt::Debug for RemoteJwks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteJwks")
            .field("url", &self.shared.url.as_str())
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
            shared: Arc::new(Fetched {
                url,
                fetch,
                keys: RwLock::new(Arc::new(Vec::new())),
                fetched_at_ms: AtomicU64::new(0),
                attempts: Mutex::new(Attempts::default()),
                ended: watch::Sender::new(0),
            }),
            cache_ttl_ms: cache_ttl_s.saturating_mul(1000),
            refetch_interval_ms: refetch_interval_s.saturating_mul(1000),
        }
    }

    /// The keys of the last good fetch.
    pub(crate) fn keys(&self) -> Arc<Vec<Key>> {
        self.shared.keys()
    }

    /// Makes the next [`RemoteJwks::refresh_if_stale`] fetch (within the
    /// rate limit): on reload.
    pub(crate) fn mark_stale(&self) {
        self.shared.fetched_at_ms.store(0, Ordering::Relaxed);
    }

    /// Starts a fetch in the background if the set was never fetched or
    /// its cache time has passed, within the rate limit. Returns at once
    /// while keys are in hand (they serve meanwhile); with none yet, once
    /// the fetch in flight ended.
    pub(crate) async fn refresh_if_stale(&self, clock: &WallClock) {
        if self.is_fresh(clock.unix_ms()) {
            return;
        }
        if let Some(ended) = self.start(clock, true) {
            if self.keys().is_empty() {
                wait(ended).await;
            }
        }
    }

    /// For a token whose `kid` the set does not hold: starts a fetch
    /// within the rate limit, or joins the one in flight, and returns
    /// once it ended; `true` then (the keys may have changed), `false`
    /// when no fetch ran.
    pub(crate) async fn refetch(&self, clock: &WallClock) -> bool {
        match self.start(clock, false) {
            Some(ended) => {
                wait(ended).await;
                true
            }
            None => false,
        }
    }

    fn is_fresh(&self, now_ms: u64) -> bool {
        let at = self.shared.fetched_at_ms.load(Ordering::Relaxed);
        at != 0 && now_ms.saturating_sub(at) < self.cache_ttl_ms
    }

    /// The end of the fetch in flight, or of one started now in the
    /// background, unless one started less than the refetch interval ago
    /// (or, with `only_if_stale`, the set is fresh): `None` then. One
    /// fetch at a time.
    fn start(&self, clock: &WallClock, only_if_stale: bool) -> Option<watch::Receiver<u64>> {
        let mut attempts = self.shared.attempts();
        // Subscribed under the lock: the fetch in flight sends its end
        // under it too, so that end is seen.
        let ended = self.shared.ended.subscribe();
        if attempts.in_flight {
            return Some(ended);
        }
        let now = clock.unix_ms();
        if only_if_stale && self.is_fresh(now) {
            return None;
        }
        // A clock that went back counts as the interval having passed.
        if attempts
            .last_ms
            .is_some_and(|last| now >= last && now - last < self.refetch_interval_ms)
        {
            return None;
        }
        attempts.last_ms = Some(now);
        attempts.in_flight = true;
        drop(attempts);
        let shared = Arc::clone(&self.shared);
        let clock = clock.clone();
        tokio::spawn(async move {
            // Ends the attempt even if the fetch panics.
            let _end = AttemptEnd(&shared);
            shared.fetch_now(&clock).await;
        });
        Some(ended)
    }
}

/// Waits for the next fetch's end on `ended`.
async fn wait(mut ended: watch::Receiver<u64>) {
    // The sender lives as long as the verifier that waits.
    let _ = ended.changed().await;
}

/// Ends the attempt in flight when dropped: another may start, and its
/// waiters are woken.
struct AttemptEnd<'a>(&'a Fetched);

impl Drop for AttemptEnd<'_> {
    fn drop(&mut self) {
        let mut attempts = self.0.attempts();
        attempts.in_flight = false;
        self.0.ended.send_modify(|n| *n += 1);
    }
}

impl Fetched {
    fn keys(&self) -> Arc<Vec<Key>> {
        Arc::clone(&self.keys.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn attempts(&self) -> std::sync::MutexGuard<'_, Attempts> {
        self.attempts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One fetch: its keys put in force, or the failure logged (the keys
    /// in hand stay).
    async fn fetch_now(&self, clock: &WallClock) {
        let fetched = match self.fetch.fetch(&self.url).await {
            Ok(body) => public_keys_of(&body, "the JWKS", &self.url),
            Err(e) => Err(e),
        };
        match fetched {
            Ok(keys) => {
                info!(jwks_url = %self.url, keys = keys.len(), "JWKS fetched");
                *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keys);
                self.fetched_at_ms
                    .store(clock.unix_ms().max(1), Ordering::Relaxed);
            }
            Err(e) => {
                warn!(jwks_url = %self.url, error = %e, "JWKS fetch failed; the keys in hand stay in use");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A symmetric key is taken from a JWKS file (the operator's) but
    /// skipped in a set fetched from a URL (public).
    #[test]
    fn symmetric_keys_are_skipped_from_a_url_only() {
        let set = serde_json::json!({"keys": [
            {"kty": "oct", "kid": "s", "alg": "HS256",
             "k": "YS1zZWNyZXQtb2YtYXQtbGVhc3QtMzItYnl0ZXMtaW4tYS1zZXQ"},
        ]})
        .to_string();
        let url = Url::parse("https://auth.example/jwks.json").unwrap();
        assert_eq!(keys_of(set.as_bytes(), "file").unwrap().len(), 1);
        assert!(public_keys_of(set.as_bytes(), "url", &url)
            .unwrap()
            .is_empty());
    }

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

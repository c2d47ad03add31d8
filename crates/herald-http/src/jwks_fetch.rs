//! The HTTP fetch of a JWKS served at a URL (`[auth.jwt] jwks_url`), for
//! herald-auth, which decides when to fetch and reads the keys
//! ([`herald_auth::jwks`]) but knows no HTTP.
//!
//! A fetch is bounded: [`FETCH_TIMEOUT`] for the whole request, a body of
//! at most [`MAX_JWKS_BYTES`], no redirect followed.

use std::time::Duration;

use herald_auth::JwksFetch;

/// Longest a JWKS fetch may take, connection and body included.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest JWKS document accepted from a URL, bytes (a set of a few dozen
/// RSA keys is about 20 KB).
pub const MAX_JWKS_BYTES: usize = 256 * 1024;

/// Fetches a JWKS with one HTTP client, shared by every fetch of a node's
/// access control (and of the ones a reload builds).
#[derive(Debug, Clone)]
pub struct HttpJwksFetch {
    client: reqwest::Client,
}

impl HttpJwksFetch {
    /// A fetcher with its HTTP client: [`FETCH_TIMEOUT`] to connect and in
    /// all, no redirect.
    ///
    /// # Errors
    /// The HTTP client cannot be built (the message names `jwks_url`).
    pub fn new() -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .connect_timeout(FETCH_TIMEOUT)
            // A redirect could lead to any server; a JWKS is fetched from
            // the configured one only.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("auth.jwt.jwks_url: cannot build an HTTP client: {e}"))?;
        Ok(Self { client })
    }
}

#[async_trait::async_trait]
impl JwksFetch for HttpJwksFetch {
    /// GETs the set: the body of a success, at most [`MAX_JWKS_BYTES`].
    async fn fetch(&self, url: &reqwest::Url) -> Result<Vec<u8>, String> {
        let mut response = self
            .client
            .get(url.clone())
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("answered {}", response.status()));
        }
        let too_big = || format!("the JWKS is larger than {MAX_JWKS_BYTES} bytes");
        if response
            .content_length()
            .is_some_and(|n| n > MAX_JWKS_BYTES as u64)
        {
            return Err(too_big());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("reading the body failed: {e}"))?
        {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(too_big());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    //! A JWKS URL end to end: herald-auth's verifier fetching through
    //! [`HttpJwksFetch`] from a JWKS server on loopback.

    use std::sync::Arc;
    use std::time::Duration;

    use herald_auth::jwt::JwtVerifier;
    use herald_auth::testing::{verify, EcKey};
    use herald_auth::wall_clock::WallClock;
    use herald_auth::{AuthError, JwtConfig};
    use serde_json::json;

    use super::*;
    use crate::error::Error;

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    /// The fetcher under test.
    fn http() -> Arc<dyn JwksFetch> {
        Arc::new(HttpJwksFetch::new().unwrap())
    }

    /// The stable code a refusal is answered with.
    trait CodeOf {
        fn code_of(self) -> &'static str;
    }

    impl CodeOf for AuthError {
        fn code_of(self) -> &'static str {
            Error::Auth(self).code()
        }
    }

    /// A JWKS server on loopback that counts its requests (as they
    /// arrive) and holds its answers while the test says so.
    struct JwksServer {
        url: String,
        set: Arc<std::sync::Mutex<serde_json::Value>>,
        fetches: Arc<tokio::sync::watch::Sender<usize>>,
        /// `true`: requests are held, unanswered, until it turns `false`.
        hold: Arc<tokio::sync::watch::Sender<bool>>,
        runtime: tokio::runtime::Runtime,
    }

    impl JwksServer {
        fn start(set: serde_json::Value) -> Self {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let set = Arc::new(std::sync::Mutex::new(set));
            let fetches = Arc::new(tokio::sync::watch::Sender::new(0));
            let hold = Arc::new(tokio::sync::watch::Sender::new(false));
            let listener = runtime
                .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
                .unwrap();
            let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
            let (served, counted, held) =
                (Arc::clone(&set), Arc::clone(&fetches), Arc::clone(&hold));
            let app = axum::Router::new().route(
                "/jwks.json",
                axum::routing::get(move || {
                    let (served, counted, held) =
                        (Arc::clone(&served), Arc::clone(&counted), Arc::clone(&held));
                    async move {
                        let mut released = held.subscribe();
                        counted.send_modify(|n| *n += 1);
                        let _ = released.wait_for(|held| !*held).await;
                        let body = served.lock().unwrap().to_string();
                        ([("content-type", "application/json")], body)
                    }
                }),
            );
            runtime.spawn(async move { axum::serve(listener, app).await });
            Self {
                url,
                set,
                fetches,
                hold,
                runtime,
            }
        }

        fn fetches(&self) -> usize {
            *self.fetches.borrow()
        }

        /// Waits until `n` requests have arrived.
        fn wait_fetches(&self, n: usize) {
            let mut arrived = self.fetches.subscribe();
            self.runtime.block_on(async {
                tokio::time::timeout(Duration::from_secs(20), arrived.wait_for(|&c| c >= n))
                    .await
                    .expect("the JWKS requests to arrive")
                    .unwrap();
            });
        }

        /// Holds the answers (`true`) or lets them go.
        fn hold(&self, on: bool) {
            self.hold.send_replace(on);
        }
    }

    /// The HTTP fetcher, counting the fetches that ended.
    #[derive(Debug)]
    struct Recording {
        inner: HttpJwksFetch,
        ended: tokio::sync::watch::Sender<usize>,
    }

    #[async_trait::async_trait]
    impl JwksFetch for Recording {
        async fn fetch(&self, url: &reqwest::Url) -> Result<Vec<u8>, String> {
            let outcome = self.inner.fetch(url).await;
            self.ended.send_modify(|n| *n += 1);
            outcome
        }
    }

    /// A JWKS URL: fetched at the first token, cached; a token with a
    /// `kid` it does not hold makes one refetch; a flood of unknown `kid`s
    /// makes at most one fetch per refetch interval (counted by the
    /// server), on a hand-set clock.
    #[test]
    fn a_jwks_url_is_refetched_for_an_unknown_kid_within_the_rate_limit() {
        let (a, b, c) = (EcKey::new(), EcKey::new(), EcKey::new());
        let server = JwksServer::start(json!({"keys": [a.jwk("a")]}));
        let clock = WallClock::manual(now() * 1000);
        let v = JwtVerifier::with_clock(
            &JwtConfig {
                jwks_url: Some(server.url.clone()),
                jwks_refetch_interval_s: Some(30),
                ..JwtConfig::default()
            },
            clock.clone(),
            http(),
        )
        .unwrap();
        assert_eq!(
            server.fetches(),
            0,
            "nothing is fetched before a token needs it"
        );
        let exp = now() + 3600;
        assert!(verify(&v, &a.token("a", exp)).is_ok());
        assert!(verify(&v, &a.token("a", exp)).is_ok());
        assert_eq!(server.fetches(), 1, "the set is cached");

        // Rotation: the server adds "b"; a token with "b" makes one
        // refetch once the interval has passed.
        server.set.lock().unwrap()["keys"] = json!([a.jwk("a"), b.jwk("b")]);
        clock.advance(Duration::from_secs(30));
        assert!(verify(&v, &b.token("b", exp)).is_ok());
        assert_eq!(server.fetches(), 2, "one refetch for the unknown kid");
        assert!(verify(&v, &b.token("b", exp)).is_ok());
        assert_eq!(server.fetches(), 2);

        // A flood of unknown kids within the interval: no fetch at all.
        for i in 0..200 {
            let t = c.token(&format!("made-up-{i}"), exp);
            assert_eq!(verify(&v, &t).unwrap_err().code_of(), "unauthorized");
        }
        assert_eq!(server.fetches(), 2, "refetches are rate-limited");
        // Over several intervals: at most one fetch per interval.
        for round in 0..3 {
            clock.advance(Duration::from_secs(30));
            for i in 0..50 {
                let t = c.token(&format!("round-{round}-{i}"), exp);
                assert!(verify(&v, &t).is_err());
            }
        }
        assert_eq!(server.fetches(), 5, "one fetch per interval, not per token");
        // Known keys still verify meanwhile, without fetching.
        assert!(verify(&v, &a.token("a", exp)).is_ok());
        assert_eq!(server.fetches(), 5);
        // After the cache time (default 1 h) the set is fetched again, in
        // the background: the token verifies with the keys in hand.
        clock.advance(Duration::from_secs(3600));
        assert!(verify(&v, &a.token("a", exp + 3600)).is_ok());
        server.wait_fetches(6);
        assert_eq!(server.fetches(), 6);
    }

    /// A JWKS server that holds its answer (the identity provider slow or
    /// down) does not hold up token checks: once the cached set is stale,
    /// tokens with a known `kid` still verify, every one while the server
    /// still holds the one fetch in flight (the test holds it, so the
    /// checks cannot have waited for it), and no other fetch starts.
    #[test]
    fn a_stalled_jwks_fetch_does_not_hold_up_token_checks() {
        let a = EcKey::new();
        let server = JwksServer::start(json!({"keys": [a.jwk("a")]}));
        let fetch = Arc::new(Recording {
            inner: HttpJwksFetch::new().unwrap(),
            ended: tokio::sync::watch::Sender::new(0),
        });
        let clock = WallClock::manual(now() * 1000);
        let v = JwtVerifier::with_clock(
            &JwtConfig {
                jwks_url: Some(server.url.clone()),
                ..JwtConfig::default()
            },
            clock.clone(),
            Arc::clone(&fetch) as Arc<dyn JwksFetch>,
        )
        .unwrap();
        let exp = now() + 3 * 3600;
        assert!(verify(&v, &a.token("a", exp)).is_ok());
        assert_eq!(*fetch.ended.borrow(), 1);

        // The set's cache time passes while the server holds its answers.
        server.hold(true);
        clock.advance(Duration::from_secs(3600));
        assert!(verify(&v, &a.token("a", exp)).is_ok());
        server.wait_fetches(2);
        for _ in 0..100 {
            assert!(verify(&v, &a.token("a", exp)).is_ok());
        }
        assert_eq!(
            *fetch.ended.borrow(),
            1,
            "every check answered while the refetch was held"
        );
        assert_eq!(server.fetches(), 2, "one fetch in flight at a time");

        // Let go, the fetch ends and the set is fresh again.
        server.hold(false);
        let mut ended = fetch.ended.subscribe();
        server.runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(20), ended.wait_for(|&n| n >= 2))
                .await
                .expect("the held fetch to end")
                .unwrap();
        });
        assert!(verify(&v, &a.token("a", exp)).is_ok());
        assert_eq!(server.fetches(), 2);
    }

    /// A JWKS served at a URL is public: a symmetric key in it (`oct`,
    /// HS256) is skipped, so an HS256 token signed with it is refused,
    /// while the set's public keys verify.
    #[test]
    fn a_symmetric_key_from_a_jwks_url_is_refused() {
        use base64::Engine;
        let a = EcKey::new();
        let secret = b"a-secret-of-at-least-32-bytes-in-a-public-set";
        let k = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
        let oct = json!({"kty": "oct", "kid": "s", "alg": "HS256", "k": k});
        let server = JwksServer::start(json!({"keys": [oct, a.jwk("a")]}));
        let v = JwtVerifier::new(
            &JwtConfig {
                jwks_url: Some(server.url.clone()),
                ..JwtConfig::default()
            },
            http(),
        )
        .unwrap();
        let exp = now() + 600;
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some("s".to_owned());
        let forged = jsonwebtoken::encode(
            &header,
            &json!({"sub": "mallory", "exp": exp}),
            &jsonwebtoken::EncodingKey::from_secret(secret),
        )
        .unwrap();
        assert_eq!(verify(&v, &forged).unwrap_err().code_of(), "unauthorized");
        assert!(
            verify(&v, &a.token("a", exp)).is_ok(),
            "the public key serves"
        );
    }

    /// A JWKS server that answers with more than the size cap, or with a
    /// redirect, gives no keys; the failure is retried only after the
    /// interval.
    #[test]
    fn a_jwks_fetch_is_bounded_and_follows_no_redirect() {
        let a = EcKey::new();
        let big = json!({"keys": [a.jwk("a")], "pad": "x".repeat(MAX_JWKS_BYTES)});
        let server = JwksServer::start(big);
        let clock = WallClock::manual(now() * 1000);
        let config = |url: &str| JwtConfig {
            jwks_url: Some(url.to_owned()),
            ..JwtConfig::default()
        };
        let v = JwtVerifier::with_clock(&config(&server.url), clock.clone(), http()).unwrap();
        let t = a.token("a", now() + 600);
        assert_eq!(verify(&v, &t).unwrap_err().code_of(), "unauthorized");
        assert_eq!(verify(&v, &t).unwrap_err().code_of(), "unauthorized");
        assert_eq!(server.fetches(), 1, "a failed fetch is not retried at once");
        // A redirect to a server that holds the key is not followed.
        let good = JwksServer::start(json!({"keys": [a.jwk("a")]}));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let redirect_url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
        let target = good.url.clone();
        let app = axum::Router::new().route(
            "/jwks.json",
            axum::routing::get(move || {
                let target = target.clone();
                async move { axum::response::Redirect::temporary(&target) }
            }),
        );
        runtime.spawn(async move { axum::serve(listener, app).await });
        let v = JwtVerifier::with_clock(&config(&redirect_url), clock, http()).unwrap();
        assert_eq!(verify(&v, &t).unwrap_err().code_of(), "unauthorized");
        assert_eq!(good.fetches(), 0, "the redirect was not followed");
        // http to a host off loopback is refused at the start.
        assert!(JwtVerifier::new(&config("http://auth.example/jwks.json"), http()).is_err());
    }
}

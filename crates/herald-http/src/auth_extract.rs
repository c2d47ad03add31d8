//! Credentials from a request for herald-auth's [`Auth`], and the
//! extractors handlers use:
//! [`Caller`] (headers only) and [`Subscriber`] (headers, or `?token=` for
//! browsers' `EventSource` and WebSocket, which cannot set headers).
//!
//! Accepted:
//! - `Authorization: Bearer <API key or token>` (RFC 6750 §2.1; the
//!   scheme name is case-insensitive, RFC 9110 §11.1);
//! - `X-API-Key: <API key>` (Centrifugo's header);
//! - `?token=<token>` on the SSE and WebSocket routes (RFC 6750 §2.3);
//! - a write forwarded by a standby: `Herald-Forwarded-By` with
//!   `Herald-Cluster-Secret: <cluster secret>`.
//!
//! A `?token=` on any other route is refused with a 401 that says where it
//! is taken ([`Caller`]).
//!
//! Two credentials at once, or a forwarded request without the right
//! cluster secret, is 401.

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts, Query};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName};
use herald_auth::{Auth, AuthError, AuthSlot, Credential, Principal};

use crate::error::Error;
use herald_node::forward::{was_forwarded, CLUSTER_SECRET, FORWARDED_BY};

/// What the extractors need of a wing's state: the node's access control.
/// A wing's state gives it to them through axum's [`FromRef`], so
/// [`Caller`] and [`Subscriber`] work with any state that can.
#[derive(Clone)]
pub struct AuthState(pub Arc<AuthSlot>);

impl AuthState {
    /// The access control in force now; a request reads it once.
    fn load(&self) -> Arc<Auth> {
        self.0.load()
    }
}

/// Centrifugo's API key header.
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The credential in `headers`, if one.
///
/// # Errors
/// [`AuthError::InvalidCredentials`] for an `Authorization` that is not
/// `Bearer <credential>`, a header that is not visible ASCII, or both
/// headers at once.
pub fn from_headers(headers: &HeaderMap) -> Result<Option<Credential<'_>>, AuthError> {
    let bad = |why: &str| AuthError::InvalidCredentials(why.to_owned());
    let bearer = match headers.get(AUTHORIZATION) {
        None => None,
        Some(value) => {
            let text = value
                .to_str()
                .map_err(|_| bad("the Authorization header is not visible ASCII"))?;
            let (scheme, credential) = text
                .split_once(' ')
                .ok_or_else(|| bad("use Authorization: Bearer <API key or token>"))?;
            let credential = credential.trim();
            if !scheme.eq_ignore_ascii_case("bearer") || credential.is_empty() {
                return Err(bad("use Authorization: Bearer <API key or token>"));
            }
            Some(Credential::Bearer(credential))
        }
    };
    let key = match headers.get(X_API_KEY) {
        None => None,
        Some(value) => {
            let text = value
                .to_str()
                .map_err(|_| bad("the X-API-Key header is not visible ASCII"))?
                .trim();
            if text.is_empty() {
                return Err(bad("the X-API-Key header is empty"));
            }
            Some(Credential::ApiKey(text))
        }
    };
    match (bearer, key) {
        (Some(_), Some(_)) => Err(bad("give Authorization or X-API-Key, not both")),
        (bearer, key) => Ok(bearer.or(key)),
    }
}

/// The principal of a request, read from its headers (and `?token=`
/// where a route takes it) by [`Auth`].
// Implemented and awaited only by Herald's own wings, inside handlers
// whose futures are checked `Send` where they are spawned.
#[allow(async_fn_in_trait)]
pub trait RequestPrincipal {
    /// The principal of a request with `headers` and, if allowed here,
    /// `query_token` (`?token=`).
    ///
    /// A forwarded publish (`Herald-Forwarded-By`) is
    /// [`Principal::Cluster`] when it carries the cluster secret; without
    /// it, it is refused once a cluster secret or access control is
    /// configured (and passes as anonymous on an open node, as before).
    ///
    /// # Errors
    /// As [`Auth::resolve`]; [`AuthError::InvalidCredentials`] for a
    /// forwarded request without the right cluster secret, or a header and
    /// a `?token=` at once.
    async fn principal(
        &self,
        headers: &HeaderMap,
        query_token: Option<&str>,
    ) -> Result<Principal, AuthError>;
}

impl RequestPrincipal for Auth {
    async fn principal(
        &self,
        headers: &HeaderMap,
        query_token: Option<&str>,
    ) -> Result<Principal, AuthError> {
        if was_forwarded(headers) {
            let presented = headers.get(CLUSTER_SECRET).map(|v| v.as_bytes());
            let forwarded_by = headers
                .get(FORWARDED_BY)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            return self.forwarded(presented, forwarded_by);
        }
        let header = from_headers(headers)?;
        let credential = match (header, query_token) {
            (Some(_), Some(_)) => {
                return Err(AuthError::InvalidCredentials(
                    "give the credential in a header or in ?token=, not both".to_owned(),
                ))
            }
            (Some(c), None) => Some(c),
            (None, token) => token.map(Credential::Token),
        };
        self.resolve(credential).await
    }
}

/// Where `?token=` is taken, as a refusal elsewhere says.
pub const QUERY_TOKEN_ROUTES: &str = "?token= is taken only by the SSE and WebSocket \
     routes (/v1/channels/{channel}/events, /v1/channels/{channel}/ws), where a browser cannot \
     set a header; send the token to this route as Authorization: Bearer <token>";

/// The checked principal of a request, from its headers. Rejects with the
/// JSON 401 answer.
///
/// With access control on, a `?token=` here is refused (401 naming the
/// routes that take it) rather than ignored: the client meant it as its
/// credential, and would otherwise be refused as anonymous with a message
/// that asks for a token. A token stays out of URLs wherever a header
/// can carry it (`docs/security.md`).
#[derive(Debug)]
pub struct Caller(pub Principal);

impl<S> FromRequestParts<S> for Caller
where
    AuthState: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        let auth = AuthState::from_ref(state).load();
        if auth.enabled() && has_query_token(parts) {
            return Err(AuthError::MissingCredentials(QUERY_TOKEN_ROUTES.to_owned()).into());
        }
        Ok(Self(auth.principal(&parts.headers, None).await?))
    }
}

/// `true` when the request's query has a `token` parameter (one that does
/// not decode has none).
fn has_query_token(parts: &Parts) -> bool {
    Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
        .is_ok_and(|Query(pairs)| pairs.iter().any(|(name, _)| name == "token"))
}

/// The checked principal of a subscription request: from its headers, or
/// `?token=`. Rejects with the JSON 401 answer.
#[derive(Debug)]
pub struct Subscriber(pub Principal);

impl<S> FromRequestParts<S> for Subscriber
where
    AuthState: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        // A query that does not decode is refused by the route's own query
        // extractor; here it only has no token.
        let pairs = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map(|Query(pairs)| pairs)
            .unwrap_or_default();
        let mut tokens = pairs.iter().filter(|(name, _)| name == "token");
        let token = tokens.next().map(|(_, value)| value.as_str());
        if tokens.next().is_some() {
            return Err(
                AuthError::InvalidCredentials("token is given more than once".to_owned()).into(),
            );
        }
        let auth = AuthState::from_ref(state).load();
        Ok(Self(auth.principal(&parts.headers, token).await?))
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        h
    }

    #[test]
    fn credentials_come_from_bearer_or_x_api_key() {
        let h = headers(&[("authorization", "Bearer abc")]);
        assert_eq!(from_headers(&h).unwrap(), Some(Credential::Bearer("abc")));
        let h = headers(&[("authorization", "bearer  abc ")]);
        assert_eq!(from_headers(&h).unwrap(), Some(Credential::Bearer("abc")));
        let h = headers(&[("x-api-key", "k")]);
        assert_eq!(from_headers(&h).unwrap(), Some(Credential::ApiKey("k")));
        assert_eq!(from_headers(&HeaderMap::new()).unwrap(), None);
        for bad in [
            vec![("authorization", "Basic abc")],
            vec![("authorization", "Bearer")],
            vec![("authorization", "Bearer ")],
            vec![("x-api-key", "")],
            vec![("authorization", "Bearer a"), ("x-api-key", "b")],
        ] {
            let err = from_headers(&headers(&bad)).unwrap_err();
            assert_eq!(Error::Auth(err).code(), "unauthorized", "{bad:?}");
        }
    }
}

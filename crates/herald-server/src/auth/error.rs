//! [`AuthError`]: why a request was refused by access control. It becomes
//! [`crate::Error::Auth`] and answers in the crate's JSON error shape.

use axum::http::{HeaderValue, StatusCode};

/// `WWW-Authenticate` for a request without credentials (RFC 6750 §3).
const CHALLENGE: &str = r#"Bearer realm="herald""#;
/// `WWW-Authenticate` for a bad credential (RFC 6750 §3.1, `invalid_token`).
const CHALLENGE_INVALID: &str = r#"Bearer realm="herald", error="invalid_token""#;
/// `WWW-Authenticate` for an expired token (RFC 6750 §3.1).
const CHALLENGE_EXPIRED: &str =
    r#"Bearer realm="herald", error="invalid_token", error_description="the token has expired""#;

/// A refusal by access control. Messages never quote a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credentials, where some are needed. 401 `unauthorized`.
    #[error("{0}")]
    MissingCredentials(String),
    /// A credential that is not an API key this server knows, nor a token
    /// it can verify (bad signature, malformed, wrong audience, not yet
    /// valid ...); or a forwarded request without the cluster secret.
    /// 401 `unauthorized`, `error="invalid_token"`.
    #[error("{0}")]
    InvalidCredentials(String),
    /// A token past its `exp`. 401 `token_expired`.
    #[error("the token has expired; get a fresh one")]
    TokenExpired,
    /// Valid credentials that do not allow this action on this channel.
    /// 403 `forbidden`.
    #[error("{0}")]
    Forbidden(String),
    /// The API key or token subject used up its publish rate.
    /// 429 `rate_limited`, `Retry-After: <retry_after_s>`.
    #[error("{detail}; retry after {retry_after_s} s")]
    RateLimited {
        /// Seconds until the publish would be allowed (at least 1).
        retry_after_s: u64,
        /// Which key or token subject, its rate and the setting that
        /// sets it.
        detail: String,
    },
}

impl AuthError {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingCredentials(_) | Self::InvalidCredentials(_) | Self::TokenExpired => {
                StatusCode::UNAUTHORIZED
            }
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// The stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::MissingCredentials(_) | Self::InvalidCredentials(_) => "unauthorized",
            Self::TokenExpired => "token_expired",
            Self::Forbidden(_) => "forbidden",
            Self::RateLimited { .. } => "rate_limited",
        }
    }

    /// The `WWW-Authenticate` header of a 401 answer (RFC 6750 §3).
    pub(crate) fn challenge(&self) -> Option<HeaderValue> {
        let value = match self {
            Self::MissingCredentials(_) => CHALLENGE,
            Self::InvalidCredentials(_) => CHALLENGE_INVALID,
            Self::TokenExpired => CHALLENGE_EXPIRED,
            Self::Forbidden(_) | Self::RateLimited { .. } => return None,
        };
        Some(HeaderValue::from_static(value))
    }

    /// The `Retry-After` value of a 429 answer, in seconds.
    pub(crate) fn retry_after_s(&self) -> Option<u64> {
        match self {
            Self::RateLimited { retry_after_s, .. } => Some(*retry_after_s),
            _ => None,
        }
    }
}

/// A reload of the JWT key files that failed: the message names the file
/// (never a key). The keys in force stay.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KeyReloadError(pub(crate) String);

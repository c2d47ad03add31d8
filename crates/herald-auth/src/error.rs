//! [`AuthError`]: the crate's one error type.

/// Why access control refused a request, or could not be built from its
/// settings. Messages never quote a credential or a secret. The HTTP
/// server maps each refusal to its answer (status, stable code,
/// `WWW-Authenticate`, `Retry-After`); the statuses named below are that
/// answer.
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
    /// The `[auth]` or `[namespaces]` settings are unusable (a hash that
    /// is not 64 hex digits, an unreadable key file, a bad rate, turning
    /// access control off by a reload ...): the message names the
    /// setting. Never the answer to a request.
    #[error("invalid server configuration: {0}")]
    Config(String),
    /// A reload of the JWT key files failed: the message names the file
    /// (never a key). The keys in force stay. Never the answer to a
    /// request.
    #[error("{0}")]
    KeyReload(String),
}

#[cfg(test)]
impl AuthError {
    /// The stable code the HTTP server answers a refusal with (its
    /// `error.rs` maps it), so that this crate's tests say what a client
    /// sees.
    pub(crate) fn code_for_tests(&self) -> &'static str {
        match self {
            Self::MissingCredentials(_) | Self::InvalidCredentials(_) => "unauthorized",
            Self::TokenExpired => "token_expired",
            Self::Forbidden(_) => "forbidden",
            Self::RateLimited { .. } => "rate_limited",
            Self::Config(_) | Self::KeyReload(_) => "internal",
        }
    }
}

//! Herald's crates, bottom to top: `herald-core` (the domain, no I/O),
//! `herald-storage` (all SQL), `herald-lease` (the lease's timing),
//! `herald-node` (the core, no route), `herald-server` (HTTP: API v1,
//! Centrifugo and Durable Streams) and `herald` (the binary); `herald-auth`
//! (access control, no HTTP) stands beside them on `herald-core`.
//! `ARCHITECTURE.md` is the map.
//!
//! Herald's access control: who may publish, read, subscribe and
//! administer.
//!
//! - `config.rs`: the `[auth]` and `[namespaces]` settings
//!   ([`AuthConfig`], [`NamespacesConfig`]);
//! - `access.rs`: [`Auth`], which holds the checked settings and answers
//!   every question, and [`Principal`], who is asking;
//! - `reload.rs`: [`AuthSlot`], the access control in force on one node,
//!   and [`AuthReload`], which replaces it (SIGHUP);
//! - `api_keys.rs`: server-side API keys (SHA-256 hashes, constant-time
//!   lookup, key generation);
//! - `jwt.rs`: client tokens (JWT) and what they grant;
//! - `jwks.rs`: JWKS documents and their keys, and a JWKS served at a
//!   URL (cached, refetched for an unknown `kid` within a rate limit),
//!   fetched through the caller's [`JwksFetch`];
//! - `wall_clock.rs`: the clock that `jwt.rs` and `jwks.rs` read;
//! - `policy.rs`: channel patterns and namespace rules;
//! - `rate_limit.rs`: publish rate per API key and per token subject;
//!   `metrics.rs` the counter of its refusals;
//! - `log_limit.rs`: at most one WARN a minute per kind of refusal;
//! - `error.rs`: [`AuthError`], the crate's one error type.
//!
//! Invariants:
//! - herald-auth knows no HTTP: no route, no header, no status code, no
//!   HTTP client. Credentials arrive as [`Credential`]s read by the
//!   server, refusals leave as [`AuthError`]s that the server turns into
//!   answers, and a `jwks_url` is fetched by the server's [`JwksFetch`];
//! - among Herald's crates it depends on herald-core only (the test
//!   command checks it);
//! - with neither an API key nor a JWT key configured, access control is
//!   off: every request is allowed, as on a development node on loopback;
//! - no secret (API key, token, JWT secret, cluster secret) is logged or
//!   put in an error message.
//!
//! `docs/security.md` describes the model.

pub mod access;
pub mod api_keys;
pub mod config;
pub mod error;
pub mod jwks;
pub mod jwt;
mod log_limit;
pub mod metrics;
pub mod policy;
mod rate_limit;
pub mod reload;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod wall_clock;

pub use access::{Auth, Credential, Principal};
pub use api_keys::{api_key_sha256, generate_api_key};
pub use config::{
    ApiKeyConfig, AuthConfig, JwtConfig, NamespaceRule, NamespacesConfig, OneOrMany, Permission,
    PublishRule, Secret, SubscribeRule, DEFAULT_HISTORY_RESUME_WINDOW,
};
pub use error::AuthError;
pub use jwks::{JwksFetch, NoFetch};
pub use reload::{AuthReload, AuthSlot};

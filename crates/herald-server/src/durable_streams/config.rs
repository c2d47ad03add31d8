//! The settings of the Durable Streams wing (`[durable_streams]` in the
//! config file, `--ds-*` flags).

use std::time::Duration;

use herald_node::node_error::StartError;

/// The Durable Streams wing's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurableStreamsConfig {
    /// Whether the wing is served (default: on).
    pub enabled: bool,
    /// The path prefix of every stream URL (default `/ds`): a stream's URL
    /// is `<prefix>/<path>`. Starts with `/`, has no trailing `/`.
    pub prefix: String,
    /// How long a long-poll read waits for new data before it answers
    /// `204` (default 30 s), and how often an idle SSE read sends a
    /// keep-alive comment and checks the stream again.
    pub long_poll_timeout: Duration,
    /// Largest accepted body of a `PUT` or `POST`, in bytes (default
    /// 16 MiB): one append is one message of at most this size.
    pub max_append_bytes: usize,
    /// Most messages one fork may copy from its source (default 10 000,
    /// what one creating `PUT` may write): a fork copies inside one
    /// fenced transaction, which holds the writer meanwhile. A larger fork
    /// is refused with 413 `fork_too_large`.
    pub max_fork_messages: u64,
    /// Most bytes of message payloads one fork may copy (default 16 MiB,
    /// what one creating `PUT` may write); 413 `fork_too_large` above.
    pub max_fork_bytes: u64,
    /// Most live forks (not deleted, not expired) one stream may have
    /// (default 100); one more is refused with 409 `stream_conflict`.
    pub max_forks_per_source: u64,
}

impl Default for DurableStreamsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            prefix: "/ds".to_owned(),
            long_poll_timeout: Duration::from_secs(30),
            max_append_bytes: 16 * 1024 * 1024,
            max_fork_messages: 10_000,
            max_fork_bytes: 16 * 1024 * 1024,
            max_forks_per_source: 100,
        }
    }
}

impl DurableStreamsConfig {
    /// Checks the prefix (`/` then path characters, no trailing `/`, not
    /// a route of another wing) and the sizes.
    ///
    /// # Errors
    /// [`StartError::Config`] naming the bad setting.
    pub fn validate(&self) -> Result<(), StartError> {
        let p = &self.prefix;
        let fine = p.len() > 1
            && p.starts_with('/')
            && !p.ends_with('/')
            && !p.contains("//")
            && p[1..]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '.'));
        if !fine {
            return Err(StartError::Config(format!(
                "durable_streams.prefix {p:?} must start with /, hold only letters, digits, \
                 '/', '-', '_', '.', and not end with /, e.g. /ds"
            )));
        }
        let taken = [
            "/v1",
            "/api",
            "/connection",
            "/console",
            "/healthz",
            "/readyz",
            "/metrics",
        ];
        if taken
            .iter()
            .any(|t| p == t || p.starts_with(&format!("{t}/")))
        {
            return Err(StartError::Config(format!(
                "durable_streams.prefix {p:?} is a path of Herald's own routes; choose another, e.g. /ds"
            )));
        }
        if self.max_append_bytes == 0 || self.long_poll_timeout.is_zero() {
            return Err(StartError::Config(
                "durable_streams.max_append_bytes and long_poll_timeout must be above zero"
                    .to_owned(),
            ));
        }
        Ok(())
    }
}

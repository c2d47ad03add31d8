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
    /// 16 MiB), and most its messages weigh together (each its length
    /// plus 32 bytes); each message is at most
    /// `ServerConfig::max_message_bytes` (see `request.rs`).
    pub max_append_bytes: usize,
}

impl Default for DurableStreamsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            prefix: "/ds".to_owned(),
            long_poll_timeout: Duration::from_secs(30),
            max_append_bytes: 16 * 1024 * 1024,
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

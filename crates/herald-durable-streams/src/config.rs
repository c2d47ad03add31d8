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
    /// Most idempotent producers (`Producer-Id`s) one stream keeps state
    /// for (default 1000): an append of one more is refused with 409
    /// `too_many_producers` while the others are not idle.
    pub max_producers_per_stream: u64,
    /// How long a producer's state outlives its last append (default
    /// 7 days): then it is forgotten, and its next append must start
    /// again at `Producer-Seq` 0 (a later number is answered 409
    /// `producer_seq_gap`, expected 0).
    pub producer_idle_timeout: Duration,
    /// How long an append whose producer sequence number is ahead of the
    /// next one expected waits for the appends before it, on the node
    /// that writes (default 300 ms), before it is answered 409
    /// `producer_seq_gap`: a client that pipelines appends may have them
    /// arrive out of order. Woken by each commit of the same producer;
    /// 0 answers a gap at once; at most 4 s.
    pub producer_gap_wait: Duration,
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
            max_producers_per_stream: 1000,
            producer_idle_timeout: Duration::from_secs(7 * 24 * 3600),
            producer_gap_wait: Duration::from_millis(300),
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
        if self.max_producers_per_stream == 0 || self.producer_idle_timeout.is_zero() {
            return Err(StartError::Config(
                "durable_streams.max_producers_per_stream and producer_idle_timeout must be \
                 above zero"
                    .to_owned(),
            ));
        }
        if self.producer_gap_wait > MAX_PRODUCER_GAP_WAIT {
            return Err(StartError::Config(format!(
                "durable_streams.producer_gap_wait must be at most {}s: a request waits that \
                 long at most, and a standby forwarding it waits for the answer",
                MAX_PRODUCER_GAP_WAIT.as_secs()
            )));
        }
        Ok(())
    }

    /// The bounds on a stream's producer state that every append is held
    /// to.
    pub(crate) fn producer_limits(&self) -> herald_core::ProducerLimits {
        herald_core::ProducerLimits {
            max_per_stream: self.max_producers_per_stream,
            idle_ms: u64::try_from(self.producer_idle_timeout.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// Longest `producer_gap_wait`: below the 5 s a standby waits for the
/// holder's answer to a forwarded write (`ServerConfig::forward_timeout`),
/// so that a forwarded append that waits is answered, not timed out.
const MAX_PRODUCER_GAP_WAIT: Duration = Duration::from_secs(4);

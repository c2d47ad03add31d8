//! The server's settings.

use std::net::IpAddr;
use std::time::Duration;

use herald_auth::{AuthConfig, AuthReload, NamespacesConfig};
use herald_http::cors::CorsConfig;
use herald_http::shared::Settings;
use herald_http::tls::TlsCertificates;
use herald_node::node::NodeConfig;
use herald_node::node_error::StartError;
use herald_node::retention::policy::RetentionHandle;
use herald_node::retention::trimmer::TrimPacing;

/// Settings of one node's HTTP server. Every field has a default (see
/// [`ServerConfig::default`]); [`ServerConfig::validate`] checks them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// This node's id, shown in `/v1/status` and in every log record.
    pub node_id: String,
    /// The URL at which clients reach this node's HTTP API. The lease row
    /// carries it so that standbys can point publishers to the holder; the
    /// server itself only logs it.
    pub advertise_url: String,
    /// Largest accepted publish request body, in bytes (default 65 536).
    /// A larger body is answered with 413 `payload_too_large`. Every
    /// stored message is held to it, whatever protocol writes it: a
    /// Durable Streams JSON message over it is refused the same way, a
    /// byte stream's append is stored in pieces of at most it.
    pub max_message_bytes: usize,
    /// Largest accepted batch publish request body (`POST /v1/messages`),
    /// in bytes (default 4 MiB); each entry's `data` is also held to
    /// `max_message_bytes`. A larger body is answered with 413
    /// `payload_too_large`. Also the largest Centrifugo server API body
    /// (`POST /api/<method>`, 413 with code 106).
    pub max_batch_body_bytes: usize,
    /// Capacity of the writer's queue, in publish requests (default 4 096).
    /// A publish that finds it full is answered with 503 `queue_full`.
    pub queue_capacity: usize,
    /// Most messages committed in one storage transaction (group commit),
    /// default 512.
    pub max_batch: usize,
    /// Interval between SSE comment heartbeats and WebSocket pings (default
    /// 15 s); a WebSocket client that sent nothing between two pings is
    /// closed.
    pub heartbeat: Duration,
    /// How often a standby asks the storage which channels moved, to feed its
    /// live subscribers, when the storage does not signal commits (default
    /// 100 ms). With commit signals it asks at each signal and every second.
    pub standby_poll_interval: Duration,
    /// Most message bytes one read of the storage may bring into memory,
    /// in bytes (default 8 MiB): a history page (`GET
    /// /v1/channels/{channel}/messages`, Centrifugo's `history`), a
    /// subscription's catch-up page (SSE, WebSocket, Centrifugo), a
    /// Durable Streams read. Such a read asks the storage for at most
    /// `read_budget_bytes / max_message_bytes` messages (at least one),
    /// so with every stored message held to `max_message_bytes` it holds
    /// at most this much; a page cut by it says where to continue (see
    /// `docs/api.md`, "History").
    pub read_budget_bytes: usize,
    /// Most bytes of pushes queued for one Centrifugo connection and not
    /// yet written to it, in bytes (default 8 MiB). A subscription whose
    /// next push would take the queue past it ends, and the connection is
    /// closed with 3008 "slow" (Centrifugo's code for a slow consumer); the
    /// client reconnects and recovers from its offset. A push is queued
    /// into an empty queue whatever its size, so every subscriber
    /// progresses.
    pub subscriber_queue_bytes: usize,
    /// Notices buffered per channel for live subscribers (default 1 024). A
    /// subscriber that falls further behind reads the missed messages from
    /// the storage instead, so this bounds the memory a slow client costs.
    pub subscriber_buffer: usize,
    /// Longest a client may take to send a complete HTTP/1 request head
    /// (default 10 s): from its first byte for the first request of a
    /// connection (the first bytes must themselves arrive within this time
    /// of the connection opening, so a first head may take up to twice
    /// this), and from the end of the previous response for the next one
    /// on a kept-alive connection. A connection that runs out of time is
    /// closed without an answer. Bodies and responses, SSE streams and
    /// WebSockets included, are not limited by it. On an HTTP/2 connection
    /// the server sends a PING after this long without a frame from the
    /// client and closes the connection when the PING is not answered
    /// within this time either.
    pub header_read_timeout: Duration,
    /// Longest a standby waits for the holder's whole answer to a forwarded
    /// publish, from connect to the last byte (default 5 s); then the
    /// client gets 503 `no_holder`. A forward ends sooner when this node
    /// takes the lease over meanwhile (see `docs/api.md`, "Writes on any
    /// node").
    pub forward_timeout: Duration,
    /// Which web origins may call the API from a browser (default: none).
    pub cors: CorsConfig,
    /// The certificate and key to serve HTTPS with; `None` (the default):
    /// plain HTTP, e.g. behind a proxy that terminates TLS.
    pub tls: Option<TlsCertificates>,
    /// PEM certificates of certificate authorities that the forwarder
    /// trusts besides the system's trust store, for holders whose
    /// advertised URL is `https://` with a certificate from a private CA
    /// (default: none).
    pub trusted_ca_pem: Option<Vec<u8>>,
    /// Access control, the `[auth]` section (default: off, every request
    /// allowed). See `docs/security.md`.
    pub auth: AuthConfig,
    /// Namespace rules, the `[namespaces.<name>]` tables (default: none;
    /// every channel follows `auth.default_namespace`).
    pub namespaces: NamespacesConfig,
    /// Most connections open at once from one client IP address (default
    /// 256). A connection over the limit is accepted and every request on
    /// it is answered `429 too_many_connections` (`Connection: close`).
    /// Connections from a [`ServerConfig::trusted_proxies`] address are not
    /// counted; the requests they carry are, each for as long as its answer
    /// (an SSE stream, a WebSocket session) lasts, by the client address in
    /// `X-Forwarded-For`.
    pub max_connections_per_ip: usize,
    /// Addresses of reverse proxies whose `X-Forwarded-For` header names
    /// the client (default none). From any other peer the header is
    /// ignored: a client could write anything there.
    pub trusted_proxies: Vec<IpAddr>,
    /// Most requests at once on one HTTP/2 connection (default 100):
    /// every SSE subscription is one, so this bounds the subscriptions one
    /// connection carries. Announced to the client as
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` (RFC 9113 §6.5.2); a stream over
    /// it is refused with `REFUSED_STREAM`. An HTTP/1 connection carries one
    /// request at a time, and a WebSocket session one subscription.
    pub max_streams_per_connection: u32,
    /// Largest message (and frame) a WebSocket client may send, in bytes
    /// (default 65 536). A larger one closes the session with 1009 "message
    /// too big" (RFC 6455 §7.4.1).
    pub ws_max_message_bytes: usize,
    /// The retention policies in force (default: none, history grows
    /// forever); replaceable while the node runs (`RetentionHandle::replace`,
    /// read by the trimming task at each sweep). See `docs/retention.md`.
    pub retention: RetentionHandle,
    /// How the holder's trimming task paces itself (sweep interval, rows
    /// per transaction, pause between transactions).
    pub trim_pacing: TrimPacing,
    /// The Centrifugo protocols' settings (`/connection/websocket`): ping
    /// period, pong timeout, connect timeout. See `docs/centrifugo.md`.
    pub centrifugo: crate::centrifugo::config::CentrifugoConfig,
    /// The Durable Streams wing's settings (`docs/durable-streams.md`).
    pub durable_streams: herald_durable_streams::config::DurableStreamsConfig,
    /// The web console's settings (`docs/console.md`).
    pub console: crate::console::config::ConsoleConfig,
    /// Reloads the node's access control (`[auth]`, `[namespaces]`) or
    /// its `[auth.jwt]` key files while it runs (`herald serve` on
    /// SIGHUP); see [`AuthReload`].
    pub auth_reload: AuthReload,
    /// Answer only requests whose `Host` is a loopback name (`localhost`,
    /// `*.localhost`, `127.0.0.0/8`, `[::1]`); any other is
    /// `403 host_not_allowed` (default off). `herald serve` turns it on
    /// for a node without access control that serves loopback only, so
    /// that a web page cannot reach it through a name of its own that
    /// resolves to loopback (DNS rebinding).
    pub loopback_hosts_only: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            node_id: "herald-1".to_owned(),
            advertise_url: "http://127.0.0.1:8080".to_owned(),
            max_message_bytes: 64 * 1024,
            max_batch_body_bytes: 4 * 1024 * 1024,
            queue_capacity: 4096,
            max_batch: 512,
            heartbeat: Duration::from_secs(15),
            standby_poll_interval: Duration::from_millis(100),
            read_budget_bytes: 8 * 1024 * 1024,
            subscriber_queue_bytes: 8 * 1024 * 1024,
            subscriber_buffer: 1024,
            header_read_timeout: Duration::from_secs(10),
            forward_timeout: Duration::from_secs(5),
            cors: CorsConfig::default(),
            tls: None,
            trusted_ca_pem: None,
            auth: AuthConfig::default(),
            namespaces: NamespacesConfig::new(),
            max_connections_per_ip: 256,
            trusted_proxies: Vec::new(),
            max_streams_per_connection: 100,
            ws_max_message_bytes: 64 * 1024,
            retention: RetentionHandle::default(),
            trim_pacing: TrimPacing::default(),
            centrifugo: crate::centrifugo::config::CentrifugoConfig::default(),
            durable_streams: herald_durable_streams::config::DurableStreamsConfig::default(),
            console: crate::console::config::ConsoleConfig::default(),
            auth_reload: AuthReload::default(),
            loopback_hosts_only: false,
        }
    }
}

impl ServerConfig {
    /// The settings of the node's core (herald-node) among these: node id,
    /// advertised URL, writer queue and batch, subscriber buffer, standby
    /// poll interval, retention and trim pacing, and forwarding (timeout,
    /// trusted certificates, cluster secret). Call [`ServerConfig::validate`]
    /// first.
    pub fn node_config(&self) -> NodeConfig {
        NodeConfig {
            node_id: self.node_id.clone(),
            advertise_url: self.advertise_url.clone(),
            queue_capacity: self.queue_capacity,
            max_batch: self.max_batch,
            subscriber_buffer: self.subscriber_buffer,
            standby_poll_interval: self.standby_poll_interval,
            retention: self.retention.clone(),
            trim_pacing: self.trim_pacing,
            forward_timeout: self.forward_timeout,
            trusted_ca_pem: self.trusted_ca_pem.clone(),
            cluster_secret: self.auth.cluster_secret.clone(),
        }
    }

    /// Messages per storage read of a history or catch-up page: as many
    /// messages of `max_message_bytes` as fit in `read_budget_bytes`, at
    /// least one.
    pub fn read_page_messages(&self) -> usize {
        self.settings().read_page_messages()
    }

    /// The settings every wing reads, among these (`shared.rs`).
    pub(crate) fn settings(&self) -> Settings {
        Settings {
            node_id: self.node_id.clone(),
            advertise_url: self.advertise_url.clone(),
            max_message_bytes: self.max_message_bytes,
            max_batch_body_bytes: self.max_batch_body_bytes,
            read_budget_bytes: self.read_budget_bytes,
            subscriber_queue_bytes: self.subscriber_queue_bytes,
            heartbeat: self.heartbeat,
            ws_max_message_bytes: self.ws_max_message_bytes,
            allowed_origins: self.cors.allowed_origins.clone(),
            loopback_hosts_only: self.loopback_hosts_only,
            tls: self.tls.is_some(),
            delete_batch: self.trim_pacing.batch,
        }
    }

    /// Checks that every size and period is usable.
    ///
    /// # Errors
    /// [`StartError::Config`] names the first field that is zero or empty.
    pub fn validate(&self) -> Result<(), StartError> {
        let sizes = [
            ("max_message_bytes", self.max_message_bytes),
            ("max_batch_body_bytes", self.max_batch_body_bytes),
            ("queue_capacity", self.queue_capacity),
            ("max_batch", self.max_batch),
            ("subscriber_buffer", self.subscriber_buffer),
            ("read_budget_bytes", self.read_budget_bytes),
            ("subscriber_queue_bytes", self.subscriber_queue_bytes),
            ("max_connections_per_ip", self.max_connections_per_ip),
            ("ws_max_message_bytes", self.ws_max_message_bytes),
            (
                "max_streams_per_connection",
                usize::try_from(self.max_streams_per_connection).unwrap_or(usize::MAX),
            ),
            ("trim_pacing.batch", self.trim_pacing.batch),
        ];
        for (name, value) in sizes {
            if value == 0 {
                return Err(StartError::Config(format!(
                    "{name} must be greater than zero"
                )));
            }
        }
        let periods = [
            ("heartbeat", self.heartbeat),
            ("standby_poll_interval", self.standby_poll_interval),
            ("header_read_timeout", self.header_read_timeout),
            ("forward_timeout", self.forward_timeout),
            ("trim_pacing.interval", self.trim_pacing.interval),
        ];
        for (name, value) in periods {
            if value.is_zero() {
                return Err(StartError::Config(format!(
                    "{name} must be greater than zero"
                )));
            }
        }
        if self.node_id.is_empty() {
            return Err(StartError::Config("node_id must not be empty".to_owned()));
        }
        self.cors.validate()?;
        self.centrifugo.validate()?;
        self.durable_streams.validate()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_documented() {
        let c = ServerConfig::default();
        assert_eq!(c.max_message_bytes, 65_536);
        assert_eq!(c.queue_capacity, 4096);
        assert_eq!(c.max_batch, 512);
        assert_eq!(c.heartbeat, Duration::from_secs(15));
        assert_eq!(c.standby_poll_interval, Duration::from_millis(100));
        assert_eq!(c.header_read_timeout, Duration::from_secs(10));
        assert_eq!(c.forward_timeout, Duration::from_secs(5));
        assert_eq!(c.max_connections_per_ip, 256);
        assert!(c.trusted_proxies.is_empty());
        assert_eq!(c.ws_max_message_bytes, 65_536);
        assert_eq!(c.read_budget_bytes, 8 << 20);
        assert_eq!(c.subscriber_queue_bytes, 8 << 20);
        assert_eq!(c.read_page_messages(), 128);
        c.validate().unwrap();
    }

    #[test]
    fn rejects_zero_sizes_and_periods() {
        let c = ServerConfig {
            queue_capacity: 0,
            ..ServerConfig::default()
        };
        assert!(matches!(c.validate(), Err(StartError::Config(m)) if m.contains("queue_capacity")));
        let c = ServerConfig {
            heartbeat: Duration::ZERO,
            ..ServerConfig::default()
        };
        assert!(matches!(c.validate(), Err(StartError::Config(m)) if m.contains("heartbeat")));
        let c = ServerConfig {
            header_read_timeout: Duration::ZERO,
            ..ServerConfig::default()
        };
        assert!(
            matches!(c.validate(), Err(StartError::Config(m)) if m.contains("header_read_timeout"))
        );
        let c = ServerConfig {
            forward_timeout: Duration::ZERO,
            ..ServerConfig::default()
        };
        assert!(
            matches!(c.validate(), Err(StartError::Config(m)) if m.contains("forward_timeout"))
        );
    }
}

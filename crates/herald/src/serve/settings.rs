//! `herald serve`'s flags and settings: the flags ([`ServeArgs`], each
//! also read from `HERALD_<FLAG>`, whose defaults a config file's keys
//! replace, see `config_file.rs`) and their parsers, the checks that need
//! neither the network nor a database ([`check`], shared with `herald
//! config check`), and the lease's and the server's settings built from
//! them.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use herald_auth::{Auth, AuthConfig, NamespacesConfig, NoFetch};
use herald_lease::{
    default_renew_statement_timeout, LeaseConfig, RENEW_ATTEMPT_SLACK, SHORTEST_DERIVED_TTL,
};
use herald_server::{
    CentrifugoConfig, ConsoleConfig, CorsConfig, DurableStreamsConfig, RetentionHandle,
    ServerConfig, TlsCertificates,
};
use tracing::warn;

use crate::config_file::ConfigFile;
use crate::duration::parse_duration;
use crate::exposure::{self, Exposure};
use crate::logging::LogFormat;
use crate::retention::RetentionArgs;

/// The `herald serve` subcommand, flattened into the `herald` command
/// line's subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum ServeCommand {
    /// Run the server.
    Serve(Box<ServeArgs>),
}

/// The `herald` command line with `serve` alone: the same command name
/// and attributes as the binary's, so that `serve` is built the same.
#[derive(clap::Parser)]
#[command(name = "herald", version, about)]
struct ServeOnly {
    #[command(subcommand)]
    command: ServeCommand,
}

/// The `herald` command line with the `serve` subcommand alone, which
/// parses `herald serve ...` as the binary does.
pub(crate) fn serve_command_line() -> clap::Command {
    <ServeOnly as clap::CommandFactory>::command()
}

/// The `herald serve` command as clap builds it (its flags, their
/// defaults and environment variables), for the config file's keys.
pub(crate) fn serve_command() -> clap::Command {
    let mut cli = serve_command_line();
    cli.build();
    cli.find_subcommand("serve")
        .expect("herald has a serve subcommand")
        .clone()
}

/// Flags of `herald serve`. Each flag is also read from the environment
/// variable `HERALD_<FLAG>`; durations are written `250ms`, `6s`, `2m`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on, `IP:PORT` or `HOST:PORT` (a host name is
    /// resolved and the first address that can be bound is used; port 0
    /// picks a free port; the `listening` log record says which).
    #[arg(long, env = "HERALD_LISTEN", default_value = "127.0.0.1:7700", value_parser = parse_listen)]
    pub(crate) listen: ListenAddr,
    /// Directory of the embedded database (`herald.db`) and the node id.
    #[arg(long, env = "HERALD_DATA_DIR", default_value = "./herald-data")]
    pub(crate) data_dir: PathBuf,
    /// PostgreSQL connection string: a URL
    /// `postgres://user:password@host:port/dbname` or libpq `key=value`
    /// settings. Without it Herald uses the embedded SQLite database in the
    /// data dir.
    #[arg(long = "database", env = "HERALD_DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: Option<String>,
    /// Connections in the PostgreSQL pool (reads and fenced writes); the
    /// renewal has a connection of its own besides.
    #[arg(long, env = "HERALD_POOL_SIZE", default_value_t = 10)]
    pub(crate) pool_size: usize,
    /// This node's id (default: generated once and kept in the data dir).
    #[arg(long, env = "HERALD_NODE_ID")]
    pub(crate) node_id: Option<String>,
    /// URL at which clients reach this node (default `http://<listen>`).
    #[arg(long, env = "HERALD_ADVERTISE_URL", value_parser = parse_advertise_url)]
    advertise_url: Option<String>,
    /// How long a renewal extends the writer lease.
    #[arg(long, env = "HERALD_LEASE_TTL", default_value = "30s", value_parser = parse_duration)]
    lease_ttl: Duration,
    /// The holder stops writing this long before the lease would expire
    /// (default: ttl / 6, at most 5 s).
    #[arg(long, env = "HERALD_LEASE_SAFETY_MARGIN", value_parser = parse_duration)]
    lease_safety_margin: Option<Duration>,
    /// Period between renewals (default: ttl / 6).
    #[arg(long, env = "HERALD_LEASE_RENEW_INTERVAL", value_parser = parse_duration)]
    lease_renew_interval: Option<Duration>,
    /// Period between a standby's attempts to acquire the lease.
    #[arg(long, env = "HERALD_ACQUIRE_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    acquire_interval: Duration,
    /// Longest a renewal may wait for the database; the client abandons an
    /// attempt 1 s after this (default: ttl / 6, at most 5 s).
    #[arg(long, env = "HERALD_RENEW_STATEMENT_TIMEOUT", value_parser = parse_duration)]
    renew_statement_timeout: Option<Duration>,
    /// Largest message, in bytes, whatever protocol writes it (a publish
    /// body, a Durable Streams JSON element).
    #[arg(long, env = "HERALD_MAX_MESSAGE_BYTES", default_value_t = 65_536)]
    max_message_bytes: usize,
    /// Largest accepted batch publish body (`POST /v1/messages`), in bytes.
    #[arg(long, env = "HERALD_MAX_BATCH_BODY_BYTES", default_value_t = 4_194_304)]
    max_batch_body_bytes: usize,
    /// Most message bytes one storage read (a history page, a catch-up
    /// page, a Durable Streams read) may bring into memory, in bytes.
    #[arg(long, env = "HERALD_READ_BUDGET_BYTES", default_value_t = 8_388_608)]
    read_budget_bytes: usize,
    /// Most bytes of pushes queued for one Centrifugo connection; past it
    /// the connection is closed with 3008 "slow".
    #[arg(
        long,
        env = "HERALD_SUBSCRIBER_QUEUE_BYTES",
        default_value_t = 8_388_608
    )]
    subscriber_queue_bytes: usize,
    /// Capacity of the writer queue, in publish requests; a full queue
    /// answers 503.
    #[arg(long, env = "HERALD_QUEUE_CAPACITY", default_value_t = 4096)]
    queue_capacity: usize,
    /// Longest a client may take to send a complete request head, for its
    /// first request and between requests on a kept-alive connection; the
    /// connection is closed after that.
    #[arg(long, env = "HERALD_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    header_read_timeout: Duration,
    /// Most connections open at once from one client IP address; a
    /// connection over the limit is answered 429 too_many_connections.
    #[arg(long, env = "HERALD_MAX_CONNECTIONS_PER_IP", default_value_t = 256)]
    max_connections_per_ip: usize,
    /// IP address of a reverse proxy whose X-Forwarded-For header names the
    /// client, for --max-connections-per-ip (repeat the flag, or separate
    /// addresses with commas); no other peer's header is believed.
    #[arg(
        long = "trusted-proxy",
        env = "HERALD_TRUSTED_PROXIES",
        value_delimiter = ','
    )]
    trusted_proxies: Vec<IpAddr>,
    /// Most requests at once on one HTTP/2 connection, SSE subscriptions
    /// included (SETTINGS_MAX_CONCURRENT_STREAMS); a stream over it is
    /// refused with REFUSED_STREAM.
    #[arg(long, env = "HERALD_MAX_STREAMS_PER_CONNECTION", default_value_t = 100)]
    max_streams_per_connection: u32,
    /// Largest message (and frame) a WebSocket client may send, in bytes;
    /// a larger one closes the session with 1009.
    #[arg(long, env = "HERALD_WS_MAX_MESSAGE_BYTES", default_value_t = 65_536)]
    ws_max_message_bytes: usize,
    /// Longest a drain (SIGTERM/SIGINT) may take: connections still open
    /// then are closed (exit status 0); if the publishes already accepted
    /// are not committed by then, the node stops renewing and exits with
    /// status 5.
    #[arg(long, env = "HERALD_DRAIN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub(crate) drain_timeout: Duration,
    /// Log format on stderr.
    #[arg(long, env = "HERALD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    pub(crate) log_format: LogFormat,
    /// Config file (TOML, docs/configuration.md): every flag can be set
    /// there; flags and `HERALD_*` variables override it.
    #[arg(long, env = "HERALD_CONFIG", value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Start without authentication on an address other than loopback:
    /// anyone who reaches the node may publish and read every channel.
    /// The variable takes `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`.
    #[arg(long, env = "HERALD_INSECURE_NO_AUTH", value_parser = clap::builder::BoolishValueParser::new())]
    insecure_no_auth: bool,
    /// PEM certificate chain to serve HTTPS with (with `--tls-key`);
    /// reread with the key on SIGHUP.
    #[arg(
        long,
        env = "HERALD_TLS_CERT",
        value_name = "PEM",
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(
        long,
        env = "HERALD_TLS_KEY",
        value_name = "PEM",
        requires = "tls_cert"
    )]
    pub(crate) tls_key: Option<PathBuf>,
    /// PEM file of certificate authorities trusted besides the system's
    /// when forwarding a publish to an `https://` holder.
    #[arg(long, env = "HERALD_TLS_CA", value_name = "PEM")]
    tls_ca: Option<PathBuf>,
    /// Web origins allowed to call the API from a browser (CORS), e.g.
    /// `https://app.example.com`, or `*` for every origin; comma-separated
    /// or repeated. Default: none.
    #[arg(
        long,
        env = "HERALD_CORS_ALLOWED_ORIGINS",
        value_delimiter = ',',
        value_name = "ORIGIN"
    )]
    cors_allowed_origins: Vec<String>,
    /// How long browsers may cache a CORS preflight answer.
    #[arg(long, env = "HERALD_CORS_MAX_AGE", default_value = "10m", value_parser = parse_duration)]
    cors_max_age: Duration,
    /// Retention policies and the trimming task's pacing.
    #[command(flatten)]
    pub(crate) retention: RetentionArgs,
    /// Centrifugo protocol: period of the server's `{}` pings to clients
    /// of `/connection/websocket` (whole seconds, at least 1 s).
    #[arg(long, env = "HERALD_CENTRIFUGO_PING_INTERVAL", default_value = "25s", value_parser = parse_duration)]
    centrifugo_ping_interval: Duration,
    /// Centrifugo protocol: longest wait for a client's pong before the
    /// server closes with 3012; shorter than the ping interval.
    #[arg(long, env = "HERALD_CENTRIFUGO_PONG_TIMEOUT", default_value = "8s", value_parser = parse_duration)]
    centrifugo_pong_timeout: Duration,
    /// Centrifugo protocol: longest wait for `connect` after the upgrade
    /// before the server closes with 3502.
    #[arg(long, env = "HERALD_CENTRIFUGO_CONNECT_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    centrifugo_connect_timeout: Duration,
    /// Centrifugo protocol: longest wait of one write to a client's socket
    /// (a client that stopped reading) before the server closes with 3012.
    #[arg(long, env = "HERALD_CENTRIFUGO_WRITE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    centrifugo_write_timeout: Duration,
    /// Centrifugo protocol: answer `presence` and `presence_stats`
    /// (cluster-wide, kept in the database); off, they answer 108. The
    /// default for namespaces without `presence` of their own.
    #[arg(long, env = "HERALD_CENTRIFUGO_PRESENCE", value_parser = clap::builder::BoolishValueParser::new())]
    centrifugo_presence: bool,
    /// Centrifugo protocol: push joins and leaves to the subscribers that
    /// ask (cluster-wide). The default for namespaces without
    /// `join_leave` of their own.
    #[arg(long, env = "HERALD_CENTRIFUGO_JOIN_LEAVE", value_parser = clap::builder::BoolishValueParser::new())]
    centrifugo_join_leave: bool,
    /// Centrifugo protocol: push joins and leaves to every subscriber,
    /// asked or not. The default for namespaces without
    /// `force_push_join_leave` of their own.
    #[arg(long, env = "HERALD_CENTRIFUGO_FORCE_PUSH_JOIN_LEAVE", value_parser = clap::builder::BoolishValueParser::new())]
    centrifugo_force_push_join_leave: bool,
    /// Centrifugo protocol: how long a node's presence rows outlive its
    /// last heartbeat (renewed every third of it).
    #[arg(long, env = "HERALD_CENTRIFUGO_PRESENCE_TTL", default_value = "30s", value_parser = parse_duration)]
    centrifugo_presence_ttl: Duration,
    /// Centrifugo protocol: the most channels one connection may be
    /// subscribed to (client-side and server-side together; at least 1).
    /// A subscribe beyond it answers 106, a connect whose token's `subs`
    /// name more closes with 3505.
    #[arg(long, env = "HERALD_CENTRIFUGO_CHANNEL_LIMIT", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    centrifugo_channel_limit: u32,
    /// Centrifugo protocol: accept a `connect` without a token as an
    /// anonymous connection, which may subscribe to public namespaces
    /// (Centrifugo's `allow_anonymous_connect_without_token`). Off (the
    /// default), such a connect is closed with 3501 when access control
    /// is on.
    #[arg(long, env = "HERALD_CENTRIFUGO_ANONYMOUS_CONNECT", value_parser = clap::builder::BoolishValueParser::new())]
    centrifugo_anonymous_connect: bool,
    /// Durable Streams protocol: serve it (default: on; `false` turns the
    /// routes off).
    #[arg(long, env = "HERALD_DURABLE_STREAMS_ENABLED", default_value_t = true, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    durable_streams_enabled: bool,
    /// Durable Streams protocol: the path prefix of every stream URL.
    #[arg(long, env = "HERALD_DURABLE_STREAMS_PREFIX", default_value = "/ds")]
    durable_streams_prefix: String,
    /// Durable Streams protocol: how long a long-poll read waits for new
    /// data before it answers 204; also the keep-alive period of SSE reads.
    #[arg(long, env = "HERALD_DURABLE_STREAMS_LONG_POLL_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    durable_streams_long_poll_timeout: Duration,
    /// Durable Streams protocol: largest accepted body of a PUT or POST,
    /// in bytes (one append is one message).
    #[arg(
        long,
        env = "HERALD_DURABLE_STREAMS_MAX_APPEND_BYTES",
        default_value_t = 16_777_216
    )]
    durable_streams_max_append_bytes: usize,
    /// Durable Streams protocol: most idempotent producers (Producer-Id)
    /// one stream keeps state for; an append of one more is refused with
    /// 409 too_many_producers.
    #[arg(
        long,
        env = "HERALD_DURABLE_STREAMS_MAX_PRODUCERS_PER_STREAM",
        default_value_t = 1000
    )]
    durable_streams_max_producers_per_stream: u64,
    /// Durable Streams protocol: how long a producer's state outlives its
    /// last append; then it is forgotten and must start again at
    /// Producer-Seq 0.
    #[arg(long, env = "HERALD_DURABLE_STREAMS_PRODUCER_IDLE_TIMEOUT", default_value = "7d", value_parser = parse_duration)]
    durable_streams_producer_idle_timeout: Duration,
    /// Durable Streams protocol: how long an append ahead of its
    /// producer's turn waits for the appends before it before it is
    /// answered 409 producer_seq_gap (0: at once; at most 4s).
    #[arg(long, env = "HERALD_DURABLE_STREAMS_PRODUCER_GAP_WAIT", default_value = "300ms", value_parser = parse_duration)]
    durable_streams_producer_gap_wait: Duration,
    /// Durable Streams protocol: most messages one fork may copy from its
    /// source (a larger fork is refused with 413).
    #[arg(
        long,
        env = "HERALD_DURABLE_STREAMS_MAX_FORK_MESSAGES",
        default_value_t = 10_000
    )]
    durable_streams_max_fork_messages: u64,
    /// Durable Streams protocol: most bytes of messages one fork may copy
    /// from its source (a larger fork is refused with 413).
    #[arg(
        long,
        env = "HERALD_DURABLE_STREAMS_MAX_FORK_BYTES",
        default_value_t = 16_777_216
    )]
    durable_streams_max_fork_bytes: u64,
    /// Durable Streams protocol: most live forks one stream may have.
    #[arg(
        long,
        env = "HERALD_DURABLE_STREAMS_MAX_FORKS_PER_SOURCE",
        default_value_t = 100
    )]
    durable_streams_max_forks_per_source: u64,
    /// Web console: serve its pages at `/console/` (default: off; the
    /// admin API it uses is served either way). See docs/console.md.
    #[arg(long, env = "HERALD_CONSOLE_ENABLED", default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    console_enabled: bool,
}

impl ServeArgs {
    /// The open file limit these settings want, in descriptors
    /// ([`crate::fd_limit::wanted`]): one client address's
    /// `--max-connections-per-ip`, and with PostgreSQL the pool and the
    /// renewal's connection.
    pub(crate) fn nofile_wanted(&self) -> u64 {
        let database = if self.database_url.is_some() {
            self.pool_size.saturating_add(1)
        } else {
            0
        };
        crate::fd_limit::wanted(self.max_connections_per_ip, database)
    }
}

/// A `--listen` value: a host (an IP address or a name to resolve) and a
/// port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListenAddr {
    /// An IP address (IPv6 without brackets) or a host name.
    pub(crate) host: String,
    /// The TCP port; 0 picks a free one.
    pub(crate) port: u16,
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Parses `--advertise-url`: an `http://` or `https://` URL with a host,
/// without query or fragment (standbys append `/v1/...` to it when they
/// forward a publish). Returned without a trailing `/`.
pub(crate) fn parse_advertise_url(s: &str) -> Result<String, String> {
    const FORM: &str = "write the URL at which the other nodes and clients reach this node, \
         with its scheme, e.g. http://node-a.internal:7700";
    let url = reqwest::Url::parse(s.trim()).map_err(|e| format!("{e}; {FORM}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(format!(
            "{s:?} is not an http:// or https:// URL with a host; {FORM}"
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{s:?} has a query or a fragment; {FORM}"));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// What `--listen` takes, as said in its errors.
const LISTEN_FORMS: &str = "write HOST:PORT, e.g. 127.0.0.1:7700 (this host only), \
     0.0.0.0:7700 (every interface), [::1]:7700 or localhost:7700";

/// Parses a `--listen` value: `IP:PORT`, `[IPv6]:PORT` or `HOST:PORT`.
pub(crate) fn parse_listen(s: &str) -> Result<ListenAddr, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(ListenAddr {
            host: addr.ip().to_string(),
            port: addr.port(),
        });
    }
    if let Some((_, rest)) = s.split_once("://") {
        return Err(format!(
            "{s:?} is a URL; --listen takes an address without a scheme, e.g. {rest}; \
             {LISTEN_FORMS}"
        ));
    }
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} has no host; {LISTEN_FORMS}"));
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!("{s:?} has no port; {LISTEN_FORMS}"));
    };
    let port: u16 = port
        .parse()
        .map_err(|_| format!("the port must be a number from 0 to 65535; {LISTEN_FORMS}"))?;
    if host.is_empty() {
        return Err(format!("{s:?} has no host; {LISTEN_FORMS}"));
    }
    if host.contains(':') {
        return Err(format!(
            "an IPv6 address goes in brackets, e.g. [::1]:{port}; {LISTEN_FORMS}"
        ));
    }
    // A host name (RFC 1123): letters, digits, `-` and `.`.
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return Err(format!(
            "{host:?} is neither an IP address nor a host name; {LISTEN_FORMS}"
        ));
    }
    Ok(ListenAddr {
        host: host.to_owned(),
        port,
    })
}

/// What `herald serve` checks before it touches the network or a database,
/// shared with `herald config check`: the lease timing, the server's
/// settings, the exposure (safe by default), the TLS files.
pub(crate) struct Checked {
    /// The lease's timing.
    pub(crate) lease_config: LeaseConfig,
    /// Whether the node runs without authentication off loopback.
    pub(crate) exposure: Exposure,
    /// The certificate to serve HTTPS with.
    pub(crate) tls: Option<TlsCertificates>,
    /// Extra CA certificates (PEM) the forwarder trusts.
    pub(crate) trusted_ca_pem: Option<Vec<u8>>,
    /// Access control, `[auth]` (default: off).
    pub(crate) auth: AuthConfig,
    /// Namespace rules, `[namespaces]`.
    pub(crate) namespaces: NamespacesConfig,
}

/// Runs every check of `herald serve` that needs neither the network nor a
/// database.
///
/// # Errors
/// The first setting refused, named in the message.
pub(crate) fn check(args: &ServeArgs, file: &ConfigFile) -> anyhow::Result<Checked> {
    let lease_config = lease_config(args)?;
    check_settings(args)?;
    let exposure = exposure::check(
        exposure::Reach {
            host: &args.listen.host,
            listen: &args.listen.to_string(),
            advertise_url: args.advertise_url.as_deref(),
            behind_proxy: !args.trusted_proxies.is_empty(),
        },
        file.auth.as_ref(),
        args.insecure_no_auth,
    )?;
    check_cluster_secret(args, file.auth.as_ref())?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(TlsCertificates::load(cert, key).context("--tls-cert and --tls-key")?)
        }
        (None, None) => None,
        _ => anyhow::bail!("--tls-cert and --tls-key go together: give both or neither"),
    };
    let trusted_ca_pem = match &args.tls_ca {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("cannot read --tls-ca {}: {e}", path.display()))?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                anyhow::bail!(
                    "--tls-ca {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                    path.display()
                );
            }
            Some(pem)
        }
        None => None,
    };
    let auth = file.auth.clone().unwrap_or_default();
    let namespaces = file.namespaces.clone().unwrap_or_default();
    // Key hashes, key files, secret lengths and rates, checked as the
    // server will check them at its start.
    Auth::new(&auth, &namespaces, Arc::new(NoFetch)).map_err(|e| anyhow::anyhow!("[auth]: {e}"))?;
    Ok(Checked {
        lease_config,
        exposure,
        tls,
        trusted_ca_pem,
        auth,
        namespaces,
    })
}

/// Refuses access control without a cluster secret on PostgreSQL: every
/// node of a cluster shares that database, and a standby forwards the
/// publishes (and other holder-only requests) it receives to the holder,
/// which refuses them with 401 unless they carry the cluster secret. One
/// node alone needs it too, since a second node can join it at any time.
///
/// # Errors
/// `[auth]` turns access control on, `--database` is given and `[auth]`
/// has no `cluster_secret`.
fn check_cluster_secret(args: &ServeArgs, auth: Option<&AuthConfig>) -> anyhow::Result<()> {
    let Some(auth) = auth else {
        return Ok(());
    };
    if args.database_url.is_some() && auth.enabled() && auth.cluster_secret.is_none() {
        anyhow::bail!(
            "[auth] turns access control on and --database is PostgreSQL, which several nodes \
             share, but [auth] has no cluster_secret: the holder would refuse with 401 every \
             publish a standby forwards to it. Add cluster_secret = \"<at least 16 random \
             bytes>\" to [auth], the same on every node (a single node needs one too)"
        );
    }
    Ok(())
}

/// The lease's timing from the flags.
///
/// # Errors
/// Timings the supervisor cannot keep; the message names the flags.
/// Timings not given are derived from `--lease-ttl`
/// ([`LeaseConfig::for_ttl`]); those given are kept as they are, and a
/// combination that cannot work is refused.
fn lease_config(args: &ServeArgs) -> anyhow::Result<LeaseConfig> {
    let mut lease_config = LeaseConfig::for_ttl(args.lease_ttl);
    if let Some(margin) = args.lease_safety_margin {
        lease_config.safety_margin = margin;
    }
    if let Some(interval) = args.lease_renew_interval {
        lease_config.renew_interval = interval;
    }
    lease_config.acquire_interval = args.acquire_interval;
    // The storage abandons a silent renewal 1 s after its statement
    // timeout; the supervisor's own limit comes 1 s later, as a backstop.
    lease_config.renew_attempt_timeout = renew_statement_timeout(args) + RENEW_ATTEMPT_SLACK;
    lease_config.validate().with_context(|| {
        let hint = if args.lease_ttl < SHORTEST_DERIVED_TTL {
            format!(
                " (timings are derived from a ttl of {}s or more; a shorter ttl needs them all \
                 given)",
                SHORTEST_DERIVED_TTL.as_secs()
            )
        } else {
            String::new()
        };
        format!(
            "lease timing: change --lease-ttl, --lease-safety-margin, --lease-renew-interval \
             or --renew-statement-timeout{hint}"
        )
    })?;
    Ok(lease_config)
}

/// `--renew-statement-timeout`, else its default for `--lease-ttl`.
pub(crate) fn renew_statement_timeout(args: &ServeArgs) -> Duration {
    args.renew_statement_timeout
        .unwrap_or_else(|| default_renew_statement_timeout(args.lease_ttl))
}

/// Checks the flags that need neither the network nor the database: the
/// server's limits, `--node-id` and the form of `--database`.
///
/// # Errors
/// The first bad flag, named in the message.
fn check_settings(args: &ServeArgs) -> anyhow::Result<()> {
    ServerConfig {
        max_message_bytes: args.max_message_bytes,
        max_batch_body_bytes: args.max_batch_body_bytes,
        read_budget_bytes: args.read_budget_bytes,
        subscriber_queue_bytes: args.subscriber_queue_bytes,
        queue_capacity: args.queue_capacity,
        header_read_timeout: args.header_read_timeout,
        cors: cors_config(args),
        max_connections_per_ip: args.max_connections_per_ip,
        max_streams_per_connection: args.max_streams_per_connection,
        ws_max_message_bytes: args.ws_max_message_bytes,
        trim_pacing: args.retention.pacing(),
        centrifugo: centrifugo_config(args),
        ..ServerConfig::default()
    }
    .validate()
    .context("server settings")?;
    args.retention.load(args.config.as_deref())?;
    if args
        .node_id
        .as_deref()
        .is_some_and(|id| id.trim().is_empty())
    {
        anyhow::bail!("--node-id must not be empty");
    }
    if let Some(url) = &args.database_url {
        check_database_url(url)?;
    }
    Ok(())
}

/// The Centrifugo protocol's settings of the flags.
fn centrifugo_config(args: &ServeArgs) -> CentrifugoConfig {
    CentrifugoConfig {
        ping_interval: args.centrifugo_ping_interval,
        pong_timeout: args.centrifugo_pong_timeout,
        connect_timeout: args.centrifugo_connect_timeout,
        write_timeout: args.centrifugo_write_timeout,
        presence: args.centrifugo_presence,
        presence_ttl: args.centrifugo_presence_ttl,
        join_leave: args.centrifugo_join_leave,
        force_push_join_leave: args.centrifugo_force_push_join_leave,
        channel_limit: usize::try_from(args.centrifugo_channel_limit).unwrap_or(usize::MAX),
        anonymous_connect: args.centrifugo_anonymous_connect,
    }
}

/// The CORS settings of the flags.
fn cors_config(args: &ServeArgs) -> CorsConfig {
    CorsConfig {
        allowed_origins: args.cors_allowed_origins.clone(),
        max_age: args.cors_max_age,
    }
}

/// The server's settings for node `node_id` listening on `addr`. The URL
/// standbys send publishers to is `--advertise-url`, else `http://<addr>`
/// (`https://` with TLS)
/// (with a warning when `addr` means every interface).
///
/// # Errors
/// Settings the server refuses.
pub(crate) fn server_config(
    args: &ServeArgs,
    node_id: String,
    addr: SocketAddr,
    checked: &Checked,
) -> anyhow::Result<ServerConfig> {
    let scheme = if checked.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let advertise_url = match &args.advertise_url {
        Some(url) => url.clone(),
        None => {
            if addr.ip().is_unspecified() {
                warn!(addr = %addr, "listening on all interfaces without --advertise-url: standbys will send publishers to {scheme}://{addr}, which other hosts cannot reach");
            }
            format!("{scheme}://{addr}")
        }
    };
    let server_config = ServerConfig {
        node_id,
        advertise_url,
        max_message_bytes: args.max_message_bytes,
        max_batch_body_bytes: args.max_batch_body_bytes,
        read_budget_bytes: args.read_budget_bytes,
        subscriber_queue_bytes: args.subscriber_queue_bytes,
        queue_capacity: args.queue_capacity,
        header_read_timeout: args.header_read_timeout,
        cors: cors_config(args),
        tls: checked.tls.clone(),
        trusted_ca_pem: checked.trusted_ca_pem.clone(),
        auth: checked.auth.clone(),
        namespaces: checked.namespaces.clone(),
        max_connections_per_ip: args.max_connections_per_ip,
        trusted_proxies: args.trusted_proxies.clone(),
        max_streams_per_connection: args.max_streams_per_connection,
        ws_max_message_bytes: args.ws_max_message_bytes,
        retention: RetentionHandle::new(args.retention.load(args.config.as_deref())?),
        trim_pacing: args.retention.pacing(),
        centrifugo: centrifugo_config(args),
        durable_streams: DurableStreamsConfig {
            enabled: args.durable_streams_enabled,
            prefix: args.durable_streams_prefix.clone(),
            long_poll_timeout: args.durable_streams_long_poll_timeout,
            max_append_bytes: args.durable_streams_max_append_bytes,
            max_producers_per_stream: args.durable_streams_max_producers_per_stream,
            producer_idle_timeout: args.durable_streams_producer_idle_timeout,
            producer_gap_wait: args.durable_streams_producer_gap_wait,
            max_fork_messages: args.durable_streams_max_fork_messages,
            max_fork_bytes: args.durable_streams_max_fork_bytes,
            max_forks_per_source: args.durable_streams_max_forks_per_source,
        },
        console: ConsoleConfig {
            enabled: args.console_enabled,
            lease_safety_margin: lease_config(args)?.safety_margin,
        },
        // Against DNS rebinding: a loopback node without authentication
        // answers loopback host names only.
        loopback_hosts_only: checked.exposure == Exposure::Loopback,
        ..ServerConfig::default()
    };
    server_config.validate().context("server settings")?;
    Ok(server_config)
}

/// Refuses a `--database` value that is not a PostgreSQL connection
/// string, saying which forms are accepted and that leaving the flag out
/// selects the embedded SQLite database. Connects to nothing.
fn check_database_url(url: &str) -> anyhow::Result<()> {
    herald_storage::postgres::check_connection_string(url).map_err(|e| {
        let leave_out = if url.trim_start().to_ascii_lowercase().starts_with("sqlite") {
            "SQLite is not chosen by URL: leave"
        } else {
            "Leave"
        };
        anyhow::anyhow!(
            "--database: {e}. {leave_out} --database out (and HERALD_DATABASE_URL unset) to use \
             the embedded SQLite database in --data-dir"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `herald serve`'s flags alone.
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    /// The `ServerConfig` that `herald serve` builds from `flags` (after
    /// the program name), with no config file.
    fn config_of(flags: &[&str]) -> ServerConfig {
        let cli = <Cli as clap::Parser>::try_parse_from(
            std::iter::once("herald").chain(flags.iter().copied()),
        )
        .unwrap();
        let checked = check(&cli.serve, &ConfigFile::default()).unwrap();
        server_config(
            &cli.serve,
            "n".to_owned(),
            "127.0.0.1:1".parse().unwrap(),
            &checked,
        )
        .unwrap()
    }

    #[test]
    fn centrifugo_flags_reach_the_server_config() {
        let config = config_of(&[
            "--centrifugo-presence",
            "--centrifugo-ping-interval",
            "5s",
            "--centrifugo-pong-timeout",
            "2s",
            "--centrifugo-join-leave",
        ]);
        assert!(config.centrifugo.presence);
        assert!(config.centrifugo.join_leave);
        assert!(!config.centrifugo.force_push_join_leave);
        assert!(
            config_of(&["--centrifugo-force-push-join-leave"])
                .centrifugo
                .force_push_join_leave
        );
        assert_eq!(config.centrifugo.ping_interval, Duration::from_secs(5));
        assert_eq!(config.centrifugo.pong_timeout, Duration::from_secs(2));
        assert_eq!(config.centrifugo.channel_limit, 128);
        assert!(!config.centrifugo.anonymous_connect);
        assert!(
            config_of(&["--centrifugo-anonymous-connect"])
                .centrifugo
                .anonymous_connect
        );
        assert_eq!(
            config_of(&["--centrifugo-channel-limit", "3"])
                .centrifugo
                .channel_limit,
            3
        );
        assert_eq!(
            config.centrifugo.connect_timeout,
            CentrifugoConfig::default().connect_timeout
        );
    }

    #[test]
    fn console_flags_reach_the_server_config() {
        let off = config_of(&[]);
        assert!(!off.console.enabled, "the pages are off by default");
        let on = config_of(&["--console-enabled", "true", "--lease-safety-margin", "2s"]);
        assert!(on.console.enabled);
        assert_eq!(on.console.lease_safety_margin, Duration::from_secs(2));
        assert!(!config_of(&["--console-enabled", "false"]).console.enabled);
        assert_eq!(
            off.console.lease_safety_margin,
            herald_lease::default_safety_margin(Duration::from_secs(30))
        );
    }

    #[test]
    fn limit_flags_reach_the_server_config() {
        let config = config_of(&[
            "--insecure-no-auth",
            "--max-connections-per-ip",
            "3",
            "--trusted-proxy",
            "10.0.0.1,::1",
            "--trusted-proxy",
            "10.0.0.2",
            "--ws-max-message-bytes",
            "1024",
        ]);
        assert_eq!(config.max_connections_per_ip, 3);
        assert_eq!(config.ws_max_message_bytes, 1024);
        // Published by a proxy with --insecure-no-auth: any Host; a plain
        // loopback node without auth: loopback host names only.
        assert!(!config.loopback_hosts_only);
        assert!(config_of(&[]).loopback_hosts_only);
        let proxies: Vec<IpAddr> = ["10.0.0.1", "::1", "10.0.0.2"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(config.trusted_proxies, proxies);
        assert!(<Cli as clap::Parser>::try_parse_from([
            "herald",
            "--trusted-proxy",
            "proxy.local"
        ])
        .is_err());
    }

    #[test]
    fn advertise_urls_need_a_scheme_and_a_host() {
        assert_eq!(
            parse_advertise_url("http://node-a.internal:7700/"),
            Ok("http://node-a.internal:7700".to_owned())
        );
        assert_eq!(
            parse_advertise_url("https://h/herald"),
            Ok("https://h/herald".to_owned())
        );
        for bad in [
            "127.0.0.1:7750",
            "node-a:7700",
            "ftp://h",
            "http://h/?x=1",
            "",
        ] {
            let error = parse_advertise_url(bad).unwrap_err();
            assert!(
                error.contains("with its scheme, e.g. http://node-a.internal:7700"),
                "{bad:?}: {error}"
            );
        }
    }

    #[test]
    fn listen_takes_ip_addresses_and_host_names() {
        let listen = |host: &str, port| ListenAddr {
            host: host.to_owned(),
            port,
        };
        assert_eq!(
            parse_listen("127.0.0.1:7700"),
            Ok(listen("127.0.0.1", 7700))
        );
        assert_eq!(parse_listen("[::1]:0"), Ok(listen("::1", 0)));
        assert_eq!(
            parse_listen("localhost:7702"),
            Ok(listen("localhost", 7702))
        );
        assert_eq!(parse_listen("[::1]:0").unwrap().to_string(), "[::1]:0");
        assert_eq!(
            parse_listen("node-a.internal:80").unwrap().to_string(),
            "node-a.internal:80"
        );
        for (bad, words) in [
            ("7700", "has no host"),
            (":7700", "has no host"),
            ("localhost", "has no port"),
            (
                "localhost:http",
                "the port must be a number from 0 to 65535",
            ),
            (
                "localhost:70000",
                "the port must be a number from 0 to 65535",
            ),
            ("::1:7700", "an IPv6 address goes in brackets"),
            (
                "http://h:7700",
                "is a URL; --listen takes an address without a scheme, e.g. h:7700",
            ),
            ("local host:7700", "neither an IP address nor a host name"),
        ] {
            let e = parse_listen(bad).unwrap_err();
            assert!(e.contains(words), "{bad}: {e}");
            assert!(e.contains("127.0.0.1:7700"), "{bad}: {e}");
        }
    }
}

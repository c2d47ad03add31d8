//! `herald serve`: opens the storage, binds the listener, runs the lease
//! supervisor and the HTTP server, and turns how they ended into the exit
//! status (see [`ExitStatus`]).
//!
//! At start it validates `HERALD_FAULT_SWITCHES` (the test-only fault
//! switches of `herald_core::fault_switches`, compiled in only with the
//! cargo feature `fault-switches`): an unknown name, or any name in a build
//! without the feature, fails the start-up (status 1).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use herald_auth::{Auth, AuthConfig, NamespacesConfig, NoFetch};
use herald_core::{Candidate, LeaseInfo};
use herald_lease::{
    default_renew_statement_timeout, BootClock, LeaseConfig, LeaseHandle, LeaseState, Release,
    StopReason, Supervisor, RENEW_ATTEMPT_SLACK, SHORTEST_DERIVED_TTL,
};
use herald_server::{CentrifugoConfig, CorsConfig, RetentionHandle, ServerConfig, TlsCertificates};
use herald_storage::postgres::{PostgresOptions, PostgresStorage};
use herald_storage::sqlite::{SqliteOptions, SqliteStorage};
use herald_storage::Storage;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinError, JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config_file::ConfigFile;
use crate::exposure::{self, Exposure};
use crate::logging::LogFormat;
use crate::retention::RetentionArgs;

/// Exit statuses of `herald serve`, documented in `README.md` and
/// `docs/storage.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExitStatus {
    /// Drained on SIGTERM/SIGINT and released the lease.
    Drained = 0,
    /// Start-up failed (bad flag, storage, listener, `HERALD_FAULT_SWITCHES`).
    Failed = 1,
    /// The watchdog stopped the node: the safety deadline passed without a
    /// successful renewal.
    Watchdog = 3,
    /// A renewal or a fenced write found the lease held by another token.
    LeaseLost = 4,
    /// The writer did not finish the publishes it had accepted within
    /// `--drain-timeout`; the node stopped renewing and exited anyway.
    DrainTimeout = 5,
    /// Drained, but the node was holder and could not release the lease
    /// (the release failed or did not finish before the drain deadline):
    /// standbys take over only when it expires.
    ReleaseFailed = 6,
}

impl From<ExitStatus> for ExitCode {
    fn from(s: ExitStatus) -> Self {
        ExitCode::from(s as u8)
    }
}

impl From<&StopReason> for ExitStatus {
    /// The exit status for the way the lease supervisor stopped: 0 only
    /// when the node did not hold the lease or released it.
    fn from(reason: &StopReason) -> Self {
        match reason {
            StopReason::Watchdog(_) => ExitStatus::Watchdog,
            StopReason::LeaseLost { .. } => ExitStatus::LeaseLost,
            StopReason::Drained {
                release: Release::NotHeld | Release::Released,
            } => ExitStatus::Drained,
            StopReason::Drained {
                release: Release::Failed,
            } => ExitStatus::ReleaseFailed,
        }
    }
}

/// Flags of `herald serve`. Each flag is also read from the environment
/// variable `HERALD_<FLAG>`; durations are written `250ms`, `6s`, `2m`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on, `IP:PORT` or `HOST:PORT` (a host name is
    /// resolved and the first address that can be bound is used; port 0
    /// picks a free port; the `listening` log record says which).
    #[arg(long, env = "HERALD_LISTEN", default_value = "127.0.0.1:7700", value_parser = parse_listen)]
    listen: ListenAddr,
    /// Directory of the embedded database (`herald.db`) and the node id.
    #[arg(long, env = "HERALD_DATA_DIR", default_value = "./herald-data")]
    data_dir: PathBuf,
    /// PostgreSQL connection string: a URL
    /// `postgres://user:password@host:port/dbname` or libpq `key=value`
    /// settings. Without it Herald uses the embedded SQLite database in the
    /// data dir.
    #[arg(long = "database", env = "HERALD_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Connections in the PostgreSQL pool (reads and fenced writes); the
    /// renewal has a connection of its own besides.
    #[arg(long, env = "HERALD_POOL_SIZE", default_value_t = 10)]
    pool_size: usize,
    /// This node's id (default: generated once and kept in the data dir).
    #[arg(long, env = "HERALD_NODE_ID")]
    node_id: Option<String>,
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
    /// Largest accepted publish body, in bytes.
    #[arg(long, env = "HERALD_MAX_MESSAGE_BYTES", default_value_t = 65_536)]
    max_message_bytes: usize,
    /// Largest accepted batch publish body (`POST /v1/messages`), in bytes.
    #[arg(long, env = "HERALD_MAX_BATCH_BODY_BYTES", default_value_t = 4_194_304)]
    max_batch_body_bytes: usize,
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
    drain_timeout: Duration,
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
    tls_key: Option<PathBuf>,
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
}

/// A `--listen` value: a host (an IP address or a name to resolve) and a
/// port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListenAddr {
    /// An IP address (IPv6 without brackets) or a host name.
    host: String,
    /// The TCP port; 0 picks a free one.
    port: u16,
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

/// How long a drain that timed out (exit status 5) still waits for the
/// lease supervisor to release the lease before the process exits.
const RELEASE_AFTER_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

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

/// Binds the `--listen` address. A host name is resolved, and the addresses
/// are tried in the order the resolver gives them until one can be bound
/// (`localhost` gives `[::1]` and `127.0.0.1` on most systems; the first
/// that works is used, not both).
///
/// # Errors
/// The host cannot be resolved; the port is in use (the message names the
/// port and `--listen`); another bind error.
async fn bind(listen: &ListenAddr) -> anyhow::Result<TcpListener> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((listen.host.as_str(), listen.port))
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot resolve the host of --listen {listen}: {e}; use an IP address instead, \
                 e.g. --listen 127.0.0.1:{}",
                listen.port
            )
        })?
        .collect();
    let mut first_error = None;
    for addr in &addrs {
        match TcpListener::bind(addr).await {
            Ok(listener) => return Ok(listener),
            Err(e) => {
                first_error.get_or_insert((*addr, e));
            }
        }
    }
    let Some((addr, e)) = first_error else {
        anyhow::bail!(
            "the host of --listen {listen} resolves to no address; use an IP address instead, \
             e.g. --listen 127.0.0.1:{}",
            listen.port
        );
    };
    if e.kind() == std::io::ErrorKind::AddrInUse {
        anyhow::bail!(
            "cannot listen on {addr}: port {} is already in use (another herald serve?); stop \
             the other process or choose another port with --listen (port 0 picks a free one)",
            addr.port()
        );
    }
    anyhow::bail!("cannot listen on {addr} (--listen {listen}): {e}")
}

/// Parses `250ms`, `6s`, `2m` (humantime's syntax).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write e.g. 250ms, 6s, 2m)"))
}

/// Runs the server until drain or a lease stop; the exit code tells which.
/// `file` holds the config file's sections that are not flags (empty
/// without `--config`); `file_error` is why the config file was refused,
/// logged as a failed start.
pub(crate) async fn run(
    args: ServeArgs,
    file: anyhow::Result<ConfigFile>,
) -> anyhow::Result<ExitCode> {
    crate::logging::init(args.log_format);
    match start_and_run(args, file).await {
        Ok(status) => Ok(status.into()),
        Err(e) => {
            error!(error = %crate::logging::one_line(&e), "start-up failed");
            Ok(ExitStatus::Failed.into())
        }
    }
}

/// What `herald serve` checks before it touches the network or a database,
/// shared with `herald config check`: the lease timing, the server's
/// settings, the exposure (safe by default), the TLS files.
pub(crate) struct Checked {
    /// The lease's timing.
    lease_config: LeaseConfig,
    /// Whether the node runs without authentication off loopback.
    exposure: Exposure,
    /// The certificate to serve HTTPS with.
    tls: Option<TlsCertificates>,
    /// Extra CA certificates (PEM) the forwarder trusts.
    trusted_ca_pem: Option<Vec<u8>>,
    /// Access control, `[auth]` (default: off).
    auth: AuthConfig,
    /// Namespace rules, `[namespaces]`.
    namespaces: NamespacesConfig,
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

/// Starts the node step by step (each step refuses what it can before the
/// next touches anything), then runs it until it stops.
async fn start_and_run(
    args: ServeArgs,
    file: anyhow::Result<ConfigFile>,
) -> anyhow::Result<ExitStatus> {
    let file = file?;
    check_fault_switches()?;
    // Check the settings before touching the network or the database.
    let checked = check(&args, &file)?;
    let secret_files = [
        ("the config file", args.config.as_deref()),
        ("the TLS key", args.tls_key.as_deref()),
    ];
    crate::file_modes::warn_readable_by_others(
        &secret_files
            .iter()
            .filter_map(|(what, path)| Some((*what, (*path)?)))
            .collect::<Vec<_>>(),
    );
    // Bind first: a node that cannot serve neither creates nor migrates a
    // database, nor takes the lease.
    let listener = bind(&args.listen).await?;
    let addr = listener.local_addr()?;
    herald_server::install_metrics_recorder();
    let (storage, backend) = open_storage(&args, &checked.lease_config).await?;
    let node_id = match &args.node_id {
        Some(id) => id.clone(),
        None => stable_node_id(&args.data_dir)?,
    };
    let tls = checked.tls.clone();
    let server_config = server_config(&args, node_id, addr, &checked)?;

    let advertise_url = server_config.advertise_url.clone();
    let retention = server_config.retention.clone();
    // Watched before the node is announced: from then on a SIGHUP reloads.
    let reloads = tls.map(crate::tls_reload::reload_on_sighup).transpose()?;
    let tls_on = reloads.is_some();
    args.retention
        .clone()
        .reload_on_sighup(args.config.clone(), server_config.retention.clone());
    crate::auth_reload::reload_on_sighup(
        server_config.auth_reload.clone(),
        args.config.clone(),
        crate::auth_reload::Started {
            flags: file.flags.clone(),
            auth: checked.auth.clone(),
            namespaces: checked.namespaces.clone(),
            shared_database: args.database_url.is_some(),
        },
    );
    let node = Node::start(listener, storage, checked.lease_config, server_config);
    info!(
        node_id = %node.node_id,
        addr = %addr,
        advertise_url = %advertise_url,
        backend = %backend.kind,
        database = %backend.location,
        tls = tls_on,
        "listening"
    );
    info!(
        policies = %retention.current(),
        "retention policies in force"
    );
    if checked.exposure == Exposure::Insecure {
        tokio::spawn(exposure::warn_insecure(addr.to_string()));
    }
    if let Some(reloads) = reloads {
        tokio::spawn(reloads);
    }
    tokio::spawn(log_first_role(node.lease.subscribe(), node.node_id.clone()));
    node.run(args.drain_timeout).await
}

/// Reads `HERALD_FAULT_SWITCHES`, the test-only fault switches, and warns
/// when any is on.
///
/// # Errors
/// An unknown switch, or any switch in a build without them.
fn check_fault_switches() -> anyhow::Result<()> {
    let fault_switches = herald_core::fault_switches::init()?;
    if !fault_switches.is_empty() {
        let names: Vec<&str> = fault_switches.iter().map(|s| s.as_str()).collect();
        warn!(
            fault_switches = %names.join(","),
            "fault switches active: this build is for fault-injection tests only"
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
fn renew_statement_timeout(args: &ServeArgs) -> Duration {
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
fn server_config(
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
        // Against DNS rebinding: a loopback node without authentication
        // answers loopback host names only.
        loopback_hosts_only: checked.exposure == Exposure::Loopback,
        ..ServerConfig::default()
    };
    server_config.validate().context("server settings")?;
    Ok(server_config)
}

/// A started node: the lease supervisor and the HTTP server, each with the
/// token that stops it.
struct Node {
    node_id: String,
    lease: LeaseHandle,
    /// The lease supervisor's task; says why it stopped.
    supervisor: JoinHandle<StopReason>,
    /// Stops the supervisor, which then releases the lease if it holds it.
    lease_shutdown: CancellationToken,
    /// The HTTP server's task.
    server: JoinHandle<Result<(), herald_server::StartError>>,
    /// Starts the server's drain.
    server_shutdown: CancellationToken,
    /// Cancelled by the server once its writer has ended during a drain.
    writes_done: CancellationToken,
}

/// What ends a running node.
enum NodeEvent {
    /// SIGTERM or SIGINT.
    DrainSignal,
    /// The supervisor stopped the node on its own (watchdog, lost lease),
    /// for this reason; `None` when it ended without publishing one.
    LeaseStopped(Option<StopReason>),
    /// The server's task ended (at start-up, or failing).
    ServerEnded(Result<Result<(), herald_server::StartError>, JoinError>),
}

impl Node {
    /// Starts the lease supervisor, then the server on `listener`.
    fn start(
        listener: TcpListener,
        storage: Arc<dyn Storage>,
        lease_config: LeaseConfig,
        server_config: ServerConfig,
    ) -> Self {
        let node_id = server_config.node_id.clone();
        let lease_shutdown = CancellationToken::new();
        let (lease, supervisor) = Supervisor::start(
            storage.clone(),
            Candidate {
                lease_name: lease_config.name.clone(),
                node_id: node_id.clone(),
                advertise_url: server_config.advertise_url.clone(),
            },
            lease_config,
            Arc::new(BootClock),
            lease_shutdown.clone(),
        );
        let server_shutdown = CancellationToken::new();
        let writes_done = CancellationToken::new();
        let server = tokio::spawn(herald_server::serve_with_writes_done(
            listener,
            storage,
            lease.clone(),
            server_config,
            server_shutdown.clone(),
            writes_done.clone(),
        ));
        Self {
            node_id,
            lease,
            supervisor,
            lease_shutdown,
            server,
            server_shutdown,
            writes_done,
        }
    }

    /// Runs until a drain signal, a lease stop or the server's end,
    /// whichever comes first, and stops the node accordingly.
    ///
    /// # Errors
    /// The server failed; the supervisor has been stopped first.
    async fn run(mut self, drain_timeout: Duration) -> anyhow::Result<ExitStatus> {
        let stopped = lease_stopped(self.lease.subscribe());
        let event = tokio::select! {
            () = shutdown_signal() => NodeEvent::DrainSignal,
            reason = stopped => NodeEvent::LeaseStopped(reason),
            served = &mut self.server => NodeEvent::ServerEnded(served),
        };
        match event {
            NodeEvent::DrainSignal => Ok(self.drain(drain_timeout).await),
            NodeEvent::LeaseStopped(reason) => Ok(self.close_after_lease_stop(reason).await),
            NodeEvent::ServerEnded(served) => self.stop_after_server_end(served).await,
        }
    }

    /// The drain (docs/storage.md): stop accepting, let the writer finish,
    /// release the lease, then let open connections end until the deadline.
    async fn drain(mut self, drain_timeout: Duration) -> ExitStatus {
        info!(node_id = %self.node_id, "drain requested");
        let deadline = tokio::time::Instant::now() + drain_timeout;
        let drain_timeout_ms = drain_timeout.as_millis() as u64;
        self.server_shutdown.cancel();
        // 1. The writer commits or fails what it accepted.
        if tokio::time::timeout_at(deadline, self.writes_done.cancelled())
            .await
            .is_err()
        {
            return self.stop_renewing(drain_timeout_ms).await;
        }
        // 2. Nothing more will be written: release the lease now, so a
        // standby takes over without waiting for slow clients.
        let status = self.release_lease(deadline).await;
        // 3. Let open requests and streams end, until the deadline.
        match tokio::time::timeout_at(deadline, &mut self.server).await {
            Ok(Ok(Err(e))) => {
                warn!(node_id = %self.node_id, error = %e, "server ended with an error during drain")
            }
            Ok(_) => {}
            Err(_) => {
                warn!(node_id = %self.node_id, drain_timeout_ms, "connections still open at the drain deadline are closed")
            }
        }
        info!(node_id = %self.node_id, exit_status = status as u8, "drained");
        status
    }

    /// Drain step 1 failed: the writer did not finish before the deadline.
    /// Stops renewing and tries briefly to release the lease.
    async fn stop_renewing(self, drain_timeout_ms: u64) -> ExitStatus {
        self.lease_shutdown.cancel();
        error!(node_id = %self.node_id, drain_timeout_ms, "queued writes did not finish before the drain deadline; exiting without renewing");
        // Still try to release, briefly: a standby then takes over at once
        // instead of after expiry. Safe with a write still in flight: it
        // either commits before the new holder's acquire (which waits for
        // it) or fails its fencing check.
        match tokio::time::timeout(RELEASE_AFTER_DRAIN_TIMEOUT, self.supervisor).await {
            Ok(Ok(reason)) => supervisor_stopped(&self.node_id, &reason),
            Ok(Err(e)) => {
                error!(node_id = %self.node_id, error = %e, "lease supervisor task failed")
            }
            Err(_) => {
                warn!(node_id = %self.node_id, "releasing the lease did not finish in time; it will expire instead")
            }
        }
        ExitStatus::DrainTimeout
    }

    /// Drain step 2: stops the supervisor, which releases the lease, and
    /// waits for it until `deadline`. The lease may have been lost during
    /// the drain: the status says so, as outside a drain.
    async fn release_lease(&mut self, deadline: tokio::time::Instant) -> ExitStatus {
        self.lease_shutdown.cancel();
        match tokio::time::timeout_at(deadline, &mut self.supervisor).await {
            Ok(Ok(reason)) => {
                supervisor_stopped(&self.node_id, &reason);
                ExitStatus::from(&reason)
            }
            Ok(Err(e)) => {
                error!(node_id = %self.node_id, error = %e, "lease supervisor task failed");
                ExitStatus::ReleaseFailed
            }
            Err(_) => {
                warn!(node_id = %self.node_id, "releasing the lease did not finish before the drain deadline");
                ExitStatus::ReleaseFailed
            }
        }
    }

    /// The supervisor stopped the node: the lease is gone and writes
    /// already fail. Closes the server quickly so clients move to the new
    /// holder.
    async fn close_after_lease_stop(mut self, reason: Option<StopReason>) -> ExitStatus {
        self.server_shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(2), &mut self.server).await;
        reason.map_or(ExitStatus::LeaseLost, |reason| ExitStatus::from(&reason))
    }

    /// The server ended by itself: stops the supervisor (which releases
    /// the lease) and exits as the supervisor says, or fails with the
    /// server's error.
    async fn stop_after_server_end(
        self,
        served: Result<Result<(), herald_server::StartError>, JoinError>,
    ) -> anyhow::Result<ExitStatus> {
        self.lease_shutdown.cancel();
        let exit = self.supervisor.await;
        info!(node_id = %self.node_id, exit = ?exit.as_ref().ok(), "lease supervisor stopped");
        match served {
            Ok(Ok(())) => Ok(exit.map_or(ExitStatus::ReleaseFailed, |reason| {
                ExitStatus::from(&reason)
            })),
            Ok(Err(e)) => Err(anyhow::Error::new(e).context("server failed")),
            Err(e) => Err(anyhow::Error::new(e).context("server task failed")),
        }
    }
}

/// Resolves when the supervisor stops the node on its own (the watchdog,
/// a lost lease) with that reason, or with `None` if the supervisor is
/// gone without either.
async fn lease_stopped(mut states: watch::Receiver<LeaseState>) -> Option<StopReason> {
    let state = states
        .wait_for(|s| {
            matches!(
                s,
                LeaseState::Stopped {
                    reason: StopReason::Watchdog(_) | StopReason::LeaseLost { .. }
                }
            )
        })
        .await
        .ok()?;
    match &*state {
        LeaseState::Stopped { reason } => Some(reason.clone()),
        _ => None,
    }
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

/// Logs how this node started, once the lease supervisor's first attempt
/// is done: a standby says who holds the writer lease (the holder's start
/// is logged by the storage as `writer lease acquired`).
async fn log_first_role(mut states: watch::Receiver<LeaseState>, node_id: String) {
    let first = match states
        .wait_for(|s| !matches!(s, LeaseState::Starting))
        .await
    {
        Ok(state) => state.clone(),
        Err(_) => return,
    };
    let LeaseState::Standby { holder } = first else {
        return;
    };
    match holder {
        Some(LeaseInfo {
            name,
            holder: Some(holder),
            holder_url,
            token,
            ..
        }) => info!(
            node_id = %node_id,
            lease = %name,
            holder = %holder,
            holder_url = %holder_url.as_deref().unwrap_or("unknown"),
            token = token.0,
            "started as a standby: another node holds the writer lease"
        ),
        _ => info!(
            node_id = %node_id,
            "started as a standby: the writer lease could not be taken yet; retrying"
        ),
    }
}

/// Which storage a node uses, as logged in the `listening` record.
struct Backend {
    /// `sqlite` or `postgres`.
    kind: &'static str,
    /// The SQLite file (absolute path), or the PostgreSQL database as
    /// `user@host:port/dbname` (never a password).
    location: String,
}

/// Opens the storage the flags select: PostgreSQL with `--database`, else
/// SQLite in the data dir. Returns it with a description for the log (never
/// a password).
async fn open_storage(
    args: &ServeArgs,
    lease: &LeaseConfig,
) -> anyhow::Result<(Arc<dyn Storage>, Backend)> {
    match &args.database_url {
        Some(url) => {
            // Server-side timeouts of pool connections stay well under the
            // ttl, so that a frozen writer's transaction cannot block a
            // takeover for long.
            let server_timeout = (lease.ttl / 3).min(Duration::from_secs(5));
            let storage = PostgresStorage::connect(
                url,
                PostgresOptions {
                    pool_size: args.pool_size,
                    statement_timeout: server_timeout,
                    idle_in_transaction_timeout: server_timeout,
                    renew_statement_timeout: renew_statement_timeout(args),
                    acquire_lock_timeout: lease.acquire_interval.min(Duration::from_secs(1)),
                    ..PostgresOptions::default()
                },
            )
            .await
            .context("connecting to PostgreSQL (--database)")?;
            let backend = Backend {
                kind: "postgres",
                location: storage.target().to_owned(),
            };
            Ok((Arc::new(storage), backend))
        }
        None => {
            let storage = SqliteStorage::open(
                &args.data_dir,
                SqliteOptions {
                    renew_statement_timeout: renew_statement_timeout(args),
                    ..SqliteOptions::default()
                },
            )
            .await
            .context("opening the embedded SQLite database (--data-dir)")?;
            let backend = Backend {
                kind: "sqlite",
                location: storage.db_path().display().to_string(),
            };
            Ok((Arc::new(storage), backend))
        }
    }
}

/// The node id kept in `<data_dir>/node-id`, created on first use. Errors
/// name the absolute path and the operation, once.
fn stable_node_id(data_dir: &Path) -> anyhow::Result<String> {
    let data_dir = &std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    herald_storage::sqlite::create_private_dir(data_dir).map_err(|e| {
        anyhow::anyhow!(
            "cannot create the data directory {} (--data-dir), where the node id is kept: {e}",
            data_dir.display()
        )
    })?;
    let path = data_dir.join("node-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("cannot read the node id from {}: {e}", path.display()),
    }
    let id = format!("node-{:016x}", rand::random::<u64>());
    let tmp = data_dir.join("node-id.tmp");
    std::fs::write(&tmp, format!("{id}\n"))
        .map_err(|e| anyhow::anyhow!("cannot write the node id to {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &path)
        .map_err(|e| anyhow::anyhow!("cannot write the node id to {}: {e}", path.display()))?;
    Ok(id)
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "cannot watch SIGTERM; only SIGINT drains");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Logs INFO `lease supervisor stopped` with `reason` in words (its
/// `Display`, e.g. `drained, lease released`), not its Rust debug form.
fn supervisor_stopped(node_id: &str, reason: &StopReason) {
    info!(node_id = %node_id, reason = %reason, "lease supervisor stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lease supervisor stopped` says why in words: `reason` is the
    /// reason's text, never its debug form (`Drained { release: ... }`).
    #[test]
    fn the_supervisor_stop_reason_is_logged_in_words() {
        #[derive(Clone, Default)]
        struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .json()
            .flatten_event(true)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            supervisor_stopped(
                "node-a",
                &StopReason::Drained {
                    release: Release::Released,
                },
            );
            supervisor_stopped(
                "node-a",
                &StopReason::LeaseLost {
                    token: herald_core::FencingToken(7),
                },
            );
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let reasons: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["reason"].clone())
            .collect();
        assert_eq!(
            reasons,
            [
                serde_json::json!("drained, lease released"),
                serde_json::json!("lease lost, token 7")
            ]
        );
    }

    #[test]
    fn a_drain_exits_0_only_when_no_lease_is_left_behind() {
        let drained = |release| ExitStatus::from(&StopReason::Drained { release });
        assert_eq!(drained(Release::Released), ExitStatus::Drained);
        assert_eq!(drained(Release::NotHeld), ExitStatus::Drained);
        assert_eq!(drained(Release::Failed), ExitStatus::ReleaseFailed);
        assert_eq!(
            ExitStatus::from(&StopReason::LeaseLost {
                token: herald_core::FencingToken(7)
            }),
            ExitStatus::LeaseLost
        );
    }

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
    fn durations_take_the_documented_forms() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("6s"), Ok(Duration::from_secs(6)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("six").is_err());
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

    #[test]
    fn node_id_is_stable_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let first = stable_node_id(dir.path()).unwrap();
        let second = stable_node_id(dir.path()).unwrap();
        assert_eq!(first, second);
        assert!(first.starts_with("node-"));
    }
}

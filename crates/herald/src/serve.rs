//! `herald serve`: opens the storage, binds the listener, runs the lease
//! supervisor and the HTTP server, and turns how they ended into the exit
//! status (see [`ExitStatus`]). Its flags and the settings built from them
//! are [`settings`].
//!
//! At start it raises its soft limit on open files to the hard limit and
//! logs the limit in force (`crate::fd_limit`).
//!
//! It also validates `HERALD_FAULT_SWITCHES` (the test-only fault
//! switches of `herald_core::fault_switches`, compiled in only with the
//! cargo feature `fault-switches`): an unknown name, or any name in a build
//! without the feature, fails the start-up (status 1).

pub(crate) mod settings;

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use herald_core::{Candidate, LeaseInfo};
use herald_lease::{
    BootClock, LeaseConfig, LeaseHandle, LeaseState, Release, StopReason, Supervisor,
};
use herald_server::ServerConfig;
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
use settings::{check, renew_statement_timeout, server_config, ListenAddr, ServeArgs};

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

/// How long a drain that timed out (exit status 5) still waits for the
/// lease supervisor to release the lease before the process exits.
const RELEASE_AFTER_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

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

/// Starts the node step by step (each step refuses what it can before the
/// next touches anything), then runs it until it stops.
async fn start_and_run(
    args: ServeArgs,
    file: anyhow::Result<ConfigFile>,
) -> anyhow::Result<ExitStatus> {
    // Known before anything else is logged: from then on every JSON record
    // carries it. A new id is written to the data dir only once the
    // storage is open (a node that cannot start creates nothing).
    let proposed_id = args
        .node_id
        .clone()
        .or_else(|| kept_node_id(&args.data_dir))
        .unwrap_or_else(new_node_id);
    crate::logging::set_node_id(&proposed_id);
    let file = file?;
    check_fault_switches()?;
    // Check the settings before touching the network or the database.
    let checked = check(&args, &file)?;
    // Before the listener: every client connection holds a descriptor.
    crate::fd_limit::log(&crate::fd_limit::raise(), args.nofile_wanted());
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
    herald_server::record_build_info(env!("CARGO_PKG_VERSION"), env!("HERALD_COMMIT"));
    let (storage, backend) = open_storage(&args, &checked.lease_config).await?;
    let node_id = match &args.node_id {
        Some(id) => id.clone(),
        None => stable_node_id(&args.data_dir, &proposed_id)?,
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

/// The node id already kept in `<data_dir>/node-id`, if there is one;
/// creates nothing (a node that cannot bind its port must not create its
/// data directory).
fn kept_node_id(data_dir: &Path) -> Option<String> {
    let id = std::fs::read_to_string(data_dir.join("node-id")).ok()?;
    let id = id.trim();
    (!id.is_empty()).then(|| id.to_owned())
}

/// A fresh node id: `node-` and 16 random hex digits.
fn new_node_id() -> String {
    format!("node-{:016x}", rand::random::<u64>())
}

/// The node id kept in `<data_dir>/node-id`, created on first use with
/// `proposed` as its value. Errors name the absolute path and the
/// operation, once.
fn stable_node_id(data_dir: &Path, proposed: &str) -> anyhow::Result<String> {
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
    let id = proposed.to_owned();
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
        let records = herald_core::log_capture::json_records(|| {
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
        let reasons: Vec<serde_json::Value> = records.iter().map(|r| r["reason"].clone()).collect();
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

    #[test]
    fn node_id_is_stable_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let first = stable_node_id(dir.path(), "node-a").unwrap();
        let second = stable_node_id(dir.path(), "node-b").unwrap();
        assert_eq!(first, second);
        assert!(first.starts_with("node-"));
    }
}

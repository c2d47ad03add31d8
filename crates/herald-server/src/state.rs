//! The node's shared state: the core ([`Node`], which runs the writer, the
//! standby feed and retention's trimming task) and the server's own parts
//! and tasks (access control, connection limits, Centrifugo's registry,
//! cluster events, the node's report for Centrifugo's `info`, metrics
//! upkeep).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use herald_auth::{Auth, AuthSlot};
use herald_lease::LeaseHandle;
use herald_node::node::Node;
use herald_node::node_error::StartError;
use herald_node::publish::Publisher;
use herald_node::role::LeaseView;
use herald_storage::Storage;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::centrifugo::node_info;
use crate::centrifugo::registry::Registry;
use crate::config::ServerConfig;
use crate::conn_limit::ConnectionLimits;
use crate::jwks_fetch::HttpJwksFetch;
use crate::metrics::install_metrics_recorder;

/// Interval of the metrics recorder's upkeep (draining histogram samples
/// when nobody scrapes).
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// Everything the handlers share: storage, lease view, writer queue, hub,
/// settings and the drain signal. Cheap to clone.
///
/// Built by [`AppState::start`], which also starts the node's background
/// tasks; they run until the `shutdown` token passed there is cancelled.
#[derive(Clone)]
pub struct AppState {
    pub(crate) shared: Arc<Shared>,
}

/// The state behind [`AppState`].
pub(crate) struct Shared {
    /// The node's core: storage, lease view, writer queue, hub, forwarder
    /// and their tasks.
    pub(crate) node: Arc<Node>,
    /// Settings.
    pub(crate) config: ServerConfig,
    /// Access control, replaced whole on a reload: read it with
    /// [`Shared::auth`].
    auth_slot: Arc<AuthSlot>,
    /// Cancelled when the node drains.
    pub(crate) shutdown: CancellationToken,
    /// Renders `/metrics`.
    pub(crate) metrics: PrometheusHandle,
    /// WebSocket sessions, which outlive their HTTP request; drain waits for
    /// them to send their Close frame.
    pub(crate) ws_sessions: TaskTracker,
    /// Connections open per client address (`max_connections_per_ip`).
    pub(crate) conn_limits: Arc<ConnectionLimits>,
    /// This node's Centrifugo connections (`centrifugo/registry.rs`).
    pub(crate) centrifugo: Arc<Registry>,
    /// The server's own tasks (cluster events, the node's report, metrics
    /// upkeep), awaited by [`AppState::stopped`] after the core's.
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    /// What the publish routine needs of this node (`publish.rs`).
    pub(crate) fn publisher(&self) -> Publisher<'_> {
        self.node.publisher()
    }

    /// The access control in force now; a request reads it once.
    pub(crate) fn auth(&self) -> Arc<Auth> {
        self.auth_slot.load()
    }
}

impl AppState {
    /// Validates `config`, reads the storage's change and deletion cursors
    /// and starts the writer, the standby feed, the trimming task, the
    /// task that applies other nodes' cluster events, the node's report
    /// (Centrifugo's `info`) and the metrics upkeep. They stop when
    /// `shutdown` is cancelled; [`AppState::stopped`] waits for that.
    ///
    /// # Errors
    /// [`StartError::Config`] for an unusable config,
    /// [`StartError::Storage`] when the storage does not answer.
    pub async fn start(
        storage: Arc<dyn Storage>,
        lease: LeaseHandle,
        config: ServerConfig,
        shutdown: CancellationToken,
    ) -> Result<Self, StartError> {
        Self::start_with(storage, Arc::new(lease), config, shutdown).await
    }

    /// [`AppState::start`] with any lease view (tests drive it by hand).
    pub(crate) async fn start_with(
        storage: Arc<dyn Storage>,
        lease: Arc<dyn LeaseView>,
        config: ServerConfig,
        shutdown: CancellationToken,
    ) -> Result<Self, StartError> {
        config.validate()?;
        let jwks_fetch = Arc::new(HttpJwksFetch::new().map_err(StartError::Config)?);
        let auth = Arc::new(AuthSlot::new(Auth::new(
            &config.auth,
            &config.namespaces,
            jwks_fetch,
        )?));
        config.auth_reload.attach(&auth);
        let metrics = install_metrics_recorder();
        let node = Arc::new(
            Node::start(
                Arc::clone(&storage),
                lease,
                config.node_config(),
                shutdown.clone(),
            )
            .await?,
        );
        // Every log record of these tasks carries the node's id.
        let span = tracing::info_span!("herald", node_id = %config.node_id);
        let centrifugo = Arc::new(Registry::new(
            Arc::clone(&storage),
            shutdown.clone(),
            span.clone(),
        ));
        // Subscribed now: every event sent after the start is applied.
        let cluster_events = crate::cluster::run(
            storage.watch_cluster_events(),
            Arc::clone(&centrifugo),
            shutdown.clone(),
        );
        let tasks = vec![
            tokio::spawn(cluster_events.instrument(span.clone())),
            tokio::spawn(
                node_info::report_task(
                    Arc::clone(&storage),
                    Arc::clone(&centrifugo),
                    config.node_id.clone(),
                    shutdown.clone(),
                )
                .instrument(span),
            ),
            tokio::spawn(upkeep(metrics.clone(), shutdown.clone())),
        ];
        tracing::info!(
            node_id = %config.node_id,
            advertise_url = %config.advertise_url,
            backend = storage.backend(),
            access_control = auth.load().enabled(),
            "server state started"
        );
        let conn_limits = ConnectionLimits::new(
            config.max_connections_per_ip,
            config.trusted_proxies.clone(),
            &config.node_id,
        );
        Ok(Self {
            shared: Arc::new(Shared {
                node,
                config,
                auth_slot: auth,
                shutdown,
                metrics,
                ws_sessions: TaskTracker::new(),
                conn_limits,
                centrifugo,
                tasks: Mutex::new(tasks),
            }),
        })
    }

    /// The settings this state was started with.
    pub fn config(&self) -> &ServerConfig {
        &self.shared.config
    }

    /// `true` once the node drains (its `shutdown` token is cancelled).
    pub fn draining(&self) -> bool {
        self.shared.shutdown.is_cancelled()
    }

    /// Resolves once the writer has ended after the drain began: every
    /// publish it accepted is committed or failed, and it will write
    /// nothing more.
    pub async fn writes_done(&self) {
        self.shared.node.writes_done().await;
    }

    /// Waits until the background tasks have ended and every WebSocket
    /// session has closed. Call it after cancelling the `shutdown` token
    /// given to [`AppState::start`]; before that it waits for the drain.
    /// Queued publishes are committed (or failed) before it returns, and
    /// the leaves of the closed Centrifugo connections are sent to the
    /// other nodes.
    pub async fn stopped(&self) {
        self.shared.shutdown.cancelled().await;
        self.shared.node.stopped().await;
        let tasks = std::mem::take(
            &mut *self
                .shared
                .tasks
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for task in tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "background task panicked");
            }
        }
        self.shared.ws_sessions.close();
        self.shared.ws_sessions.wait().await;
        self.shared.centrifugo.join_leave.finish().await;
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("node_id", &self.shared.config.node_id)
            .field("draining", &self.draining())
            .finish_non_exhaustive()
    }
}

/// Drains histogram samples every [`METRICS_UPKEEP`] until drain.
async fn upkeep(handle: PrometheusHandle, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(METRICS_UPKEEP) => handle.run_upkeep(),
        }
    }
}

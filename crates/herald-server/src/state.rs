//! The node's state: the core ([`Node`], which runs the writer, the standby
//! feed and retention's trimming task), the server's metrics upkeep and
//! Centrifugo's context (which starts its own tasks,
//! `centrifugo/context.rs`), and the sub-state each wing takes from it
//! (`FromRef`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::FromRef;
use herald_auth::{Auth, AuthSlot};
use herald_lease::LeaseHandle;
use herald_node::node::Node;
use herald_node::node_error::StartError;
use herald_node::role::LeaseView;
use herald_storage::Storage;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::state::ApiState;
use crate::centrifugo::context::{Centrifugo, CentrifugoState};
use crate::centrifugo::node_info::ReportedNode;
use crate::config::ServerConfig;
use crate::console::cluster::ViewCache;
use crate::console::config::ConsoleConfig;
use crate::console::rates::Rates;
use crate::console::ConsoleState;
use herald_durable_streams::StreamsState;
use herald_http::conn_limit::ConnectionLimits;
use herald_http::jwks_fetch::HttpJwksFetch;
use herald_http::metrics::install_metrics_recorder;
use herald_http::shared::Shared;

/// Interval of the metrics recorder's upkeep (draining histogram samples
/// when nobody scrapes).
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// The whole node's state: what every wing shares (`shared.rs`), each
/// wing's own (API v1's `ApiState`, Centrifugo's context), the connection
/// limits and the background tasks. Cheap to clone. The router hands each
/// wing only its own state ([`FromRef`]).
///
/// Built by [`AppState::start`], which also starts the node's background
/// tasks; they run until the `shutdown` token passed there is cancelled.
#[derive(Clone)]
pub struct AppState {
    /// What every wing shares.
    pub(crate) shared: Arc<Shared>,
    /// The rest, which only this file and the router reach.
    running: Arc<Running>,
}

/// The part of [`AppState`] that is not shared with the wings whole.
struct Running {
    /// The node's whole settings, as given to [`AppState::start`].
    config: ServerConfig,
    /// API v1's state.
    api: ApiState,
    /// The Durable Streams wing's state.
    streams: StreamsState,
    /// The console's own settings.
    console: Arc<ConsoleConfig>,
    /// Centrifugo's context.
    centrifugo: Arc<Centrifugo>,
    /// The node's rates of the last minutes (the console's charts).
    rates: Arc<Rates>,
    /// The cluster view the console's event streams share.
    views: Arc<ViewCache>,
    /// When this state started (the node's uptime on the console).
    started: std::time::Instant,
    /// Connections open per client address (`max_connections_per_ip`).
    conn_limits: Arc<ConnectionLimits>,
    /// The server's own tasks (metrics upkeep), awaited by
    /// [`AppState::stopped`] after the core's.
    tasks: Mutex<Vec<JoinHandle<()>>>,
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
        // Subscribed to other nodes' cluster events now: every event sent
        // after the start is applied.
        let reported = ReportedNode {
            node_id: config.node_id.clone(),
            url: config.advertise_url.clone(),
            hub: Arc::clone(node.hub()),
        };
        let centrifugo = Arc::new(Centrifugo::start(
            config.centrifugo.clone(),
            &storage,
            &reported,
            &shutdown,
            &span,
        ));
        let rates = Arc::new(Rates::default());
        let tasks = vec![
            tokio::spawn(upkeep(metrics.clone(), shutdown.clone())),
            tokio::spawn(Arc::clone(&rates).run(
                metrics.clone(),
                Arc::clone(node.hub()),
                shutdown.clone(),
            )),
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
        let shared = Arc::new(Shared {
            node,
            settings: config.settings(),
            auth_slot: auth,
            shutdown,
        });
        Ok(Self {
            running: Arc::new(Running {
                api: ApiState::new(Arc::clone(&shared), metrics),
                streams: StreamsState::new(Arc::clone(&shared), config.durable_streams.clone()),
                console: Arc::new(config.console.clone()),
                config,
                centrifugo,
                rates,
                views: Arc::default(),
                started: std::time::Instant::now(),
                conn_limits,
                tasks: Mutex::new(tasks),
            }),
            shared,
        })
    }

    /// The settings this state was started with.
    pub fn config(&self) -> &ServerConfig {
        &self.running.config
    }

    /// `true` once the node drains (its `shutdown` token is cancelled).
    pub fn draining(&self) -> bool {
        self.shared.draining()
    }

    /// Connections open per client address, which the router's layer and
    /// the listener count.
    pub(crate) fn conn_limits(&self) -> &Arc<ConnectionLimits> {
        &self.running.conn_limits
    }

    /// Resolves once the writer has ended after the drain began: every
    /// publish it accepted is committed or failed, and it will write
    /// nothing more.
    pub async fn writes_done(&self) {
        self.shared.node.writes_done().await;
    }

    /// Waits until the background tasks have ended and every WebSocket
    /// session (API v1's, then Centrifugo's) has closed. Call it after
    /// cancelling the `shutdown` token given to [`AppState::start`];
    /// before that it waits for the drain.
    /// Queued publishes are committed (or failed) before it returns, and
    /// the leaves of the closed Centrifugo connections are sent to the
    /// other nodes.
    pub async fn stopped(&self) {
        self.shared.shutdown.cancelled().await;
        self.shared.node.stopped().await;
        let tasks = std::mem::take(
            &mut *self
                .running
                .tasks
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for task in tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "background task panicked");
            }
        }
        self.running.api.stopped().await;
        self.running.centrifugo.stopped().await;
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("node_id", &self.shared.settings.node_id)
            .field("draining", &self.draining())
            .finish_non_exhaustive()
    }
}

impl FromRef<AppState> for ConsoleState {
    fn from_ref(state: &AppState) -> Self {
        ConsoleState {
            shared: Arc::clone(&state.shared),
            rates: Arc::clone(&state.running.rates),
            started: state.running.started,
            views: Arc::clone(&state.running.views),
            config: Arc::clone(&state.running.console),
        }
    }
}

impl FromRef<AppState> for ApiState {
    fn from_ref(state: &AppState) -> Self {
        state.running.api.clone()
    }
}

impl FromRef<AppState> for StreamsState {
    fn from_ref(state: &AppState) -> Self {
        state.running.streams.clone()
    }
}

impl FromRef<AppState> for CentrifugoState {
    fn from_ref(state: &AppState) -> Self {
        CentrifugoState {
            shared: Arc::clone(&state.shared),
            centrifugo: Arc::clone(&state.running.centrifugo),
        }
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

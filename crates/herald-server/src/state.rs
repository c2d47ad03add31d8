//! The node's shared state and its background tasks (writer, standby feed,
//! retention's trimming task, cluster events, the node's report for
//! Centrifugo's `info`, metrics upkeep).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use herald_auth::{Auth, AuthSlot};
use herald_lease::LeaseHandle;
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
use herald_node::forward::Forwarder;
use herald_node::hub::Hub;
use herald_node::node_error::StartError;
use herald_node::publish::Publisher;
use herald_node::retention::trimmer::Trimmer;
use herald_node::role::LeaseView;
use herald_node::standby_feed::StandbyFeed;
use herald_node::writer::{Writer, WriterHandle};

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
    /// Where messages and the lease live.
    pub(crate) storage: Arc<dyn Storage>,
    /// The node's role (holder or standby).
    pub(crate) lease: Arc<dyn LeaseView>,
    /// Settings.
    pub(crate) config: ServerConfig,
    /// The writer's queue.
    pub(crate) writer: WriterHandle,
    /// Live fan-out to subscribers.
    pub(crate) hub: Arc<Hub>,
    /// Access control, replaced whole on a reload: read it with
    /// [`Shared::auth`].
    auth_slot: Arc<AuthSlot>,
    /// Hands publishes that reach this node while standby to the holder.
    pub(crate) forwarder: Forwarder,
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
    /// Writer, standby feed and upkeep tasks, awaited by
    /// [`AppState::stopped`].
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Cancelled when the writer has ended: from then on this node writes
    /// nothing more, so the lease can be released even while slow clients
    /// still hold connections open.
    writes_done: CancellationToken,
}

impl Shared {
    /// What the publish routine needs of this node (`publish.rs`).
    pub(crate) fn publisher(&self) -> Publisher<'_> {
        Publisher {
            writer: &self.writer,
            lease: self.lease.as_ref(),
            forwarder: &self.forwarder,
            shutdown: &self.shutdown,
        }
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
        let forwarder = Forwarder::new(
            &config.node_id,
            &config.advertise_url,
            config.forward_timeout,
            config.trusted_ca_pem.as_deref(),
            config.auth.cluster_secret.as_ref(),
        )?;
        let metrics = install_metrics_recorder();
        let cursors = (
            storage.change_cursor().await?,
            storage.deletion_cursor().await?,
        );
        let hub = Hub::new(config.subscriber_buffer);
        let (writer, writer_handle) = Writer::new(
            Arc::clone(&storage),
            Arc::clone(&lease),
            Arc::clone(&hub),
            config.queue_capacity,
            config.max_batch,
        );
        let feed = StandbyFeed::new(
            Arc::clone(&storage),
            Arc::clone(&lease),
            Arc::clone(&hub),
            cursors,
            config.standby_poll_interval,
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
        let writes_done = CancellationToken::new();
        let writer_task = {
            let shutdown = shutdown.clone();
            let done = writes_done.clone();
            async move {
                writer.run(shutdown).await;
                done.cancel();
            }
        };
        let trimmer = Trimmer {
            storage: Arc::clone(&storage),
            lease: Arc::clone(&lease),
            retention: config.retention.clone(),
            pacing: config.trim_pacing,
        };
        let tasks = vec![
            tokio::spawn(writer_task.instrument(span.clone())),
            tokio::spawn(feed.run(shutdown.clone()).instrument(span.clone())),
            tokio::spawn(trimmer.run(shutdown.clone()).instrument(span.clone())),
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
                storage,
                lease,
                config,
                writer: writer_handle,
                hub,
                auth_slot: auth,
                forwarder,
                shutdown,
                metrics,
                ws_sessions: TaskTracker::new(),
                conn_limits,
                centrifugo,
                tasks: Mutex::new(tasks),
                writes_done,
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
        self.shared.writes_done.cancelled().await;
    }

    /// Waits until the background tasks have ended and every WebSocket
    /// session has closed. Call it after cancelling the `shutdown` token
    /// given to [`AppState::start`]; before that it waits for the drain.
    /// Queued publishes are committed (or failed) before it returns, and
    /// the leaves of the closed Centrifugo connections are sent to the
    /// other nodes.
    pub async fn stopped(&self) {
        self.shared.shutdown.cancelled().await;
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

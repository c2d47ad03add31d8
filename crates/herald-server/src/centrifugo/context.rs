//! Centrifugo's own context on a node: its connections' registry, the
//! WebSocket sessions of its client protocol, and its background tasks
//! (the cluster events of other nodes, `cluster.rs`; this node's report
//! for a cluster-wide `info`, `node_info.rs`). [`Centrifugo::start`]
//! starts them and [`Centrifugo::stopped`] waits for them and finishes the
//! join and leave relay. [`CentrifugoState`] is what Centrifugo's handlers
//! take: the state every wing shares and this context.

use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::FromRef;
use herald_storage::Storage;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::config::CentrifugoConfig;
use super::registry::Registry;
use super::{cluster, node_info};
use herald_http::auth_extract::AuthState;
use herald_http::shared::{Settings, Shared};

/// Centrifugo's context on this node. Built and started by
/// [`Centrifugo::start`]; its tasks run until the `shutdown` token passed
/// there is cancelled.
pub(crate) struct Centrifugo {
    /// Centrifugo's own settings (`[centrifugo]`).
    pub(crate) config: CentrifugoConfig,
    /// This node's Centrifugo connections (`registry.rs`).
    pub(crate) registry: Arc<Registry>,
    /// The client protocol's WebSocket sessions, which outlive their HTTP
    /// request; [`Centrifugo::stopped`] waits for them to close.
    pub(crate) sessions: TaskTracker,
    /// The sessions of the emulation transports, by session id
    /// (`emulation_sessions.rs`).
    pub(crate) emulation: Arc<super::emulation_sessions::EmulationSessions>,
    /// The Fossil deltas of this node's delta subscriptions
    /// (`delta_cache.rs`).
    pub(crate) deltas: Arc<super::delta_cache::DeltaCache>,
    /// Cancelled when the node drains.
    shutdown: CancellationToken,
    /// The cluster events' and the node report's tasks, awaited by
    /// [`Centrifugo::stopped`].
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Centrifugo {
    /// Makes the registry (which starts the join and leave relay on
    /// `storage`) and starts the task that applies other nodes' cluster
    /// events (subscribed here: every event sent from now on is applied)
    /// and the task that reports this node (`node`: its connections for
    /// Centrifugo's `info`, its URL and subscriptions for the console).
    /// Every task runs in `span` and stops when `shutdown` is cancelled.
    /// `config` is Centrifugo's own settings.
    pub(crate) fn start(
        config: CentrifugoConfig,
        storage: &Arc<dyn Storage>,
        node: &node_info::ReportedNode,
        shutdown: &CancellationToken,
        span: &tracing::Span,
    ) -> Self {
        let registry = Arc::new(Registry::new(
            Arc::clone(storage),
            shutdown.clone(),
            span.clone(),
        ));
        let cluster_events = cluster::run(
            storage.watch_cluster_events(),
            Arc::clone(&registry),
            shutdown.clone(),
        );
        let report = node_info::report_task(
            Arc::clone(storage),
            Arc::clone(&registry),
            node.clone(),
            shutdown.clone(),
        );
        let tasks = vec![
            tokio::spawn(cluster_events.instrument(span.clone())),
            tokio::spawn(report.instrument(span.clone())),
        ];
        Self {
            config,
            registry,
            sessions: TaskTracker::new(),
            emulation: Arc::default(),
            deltas: Arc::default(),
            shutdown: shutdown.clone(),
            tasks: Mutex::new(tasks),
        }
    }

    /// Waits until the drain began (the `shutdown` token given to
    /// [`Centrifugo::start`] is cancelled), the background tasks ended and
    /// every client session closed, then sends the leaves of the closed
    /// connections to the other nodes (the join and leave relay's end).
    pub(crate) async fn stopped(&self) {
        self.shutdown.cancelled().await;
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        for task in tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "background task panicked");
            }
        }
        self.sessions.close();
        self.sessions.wait().await;
        self.registry.join_leave.finish().await;
    }
}

/// What Centrifugo's handlers take (`session.rs`, `server_api.rs`): the
/// state every wing shares and Centrifugo's context. Cheap to clone.
#[derive(Clone)]
pub(crate) struct CentrifugoState {
    /// What every wing shares (`shared.rs`).
    pub(crate) shared: Arc<Shared>,
    /// Centrifugo's own context.
    pub(crate) centrifugo: Arc<Centrifugo>,
}

impl CentrifugoState {
    /// Centrifugo's own settings.
    pub(crate) fn config(&self) -> &CentrifugoConfig {
        &self.centrifugo.config
    }

    /// The settings every wing reads.
    pub(crate) fn settings(&self) -> &Settings {
        &self.shared.settings
    }

    /// `true` once the node drains.
    pub(crate) fn draining(&self) -> bool {
        self.shared.draining()
    }
}

impl FromRef<CentrifugoState> for AuthState {
    fn from_ref(state: &CentrifugoState) -> Self {
        AuthState(Arc::clone(&state.shared.auth_slot))
    }
}

//! [`Node`], the node's core as one value: its settings ([`NodeConfig`]),
//! its parts (storage, lease view, writer, hub, forwarder) and the tasks it
//! starts (writer, standby feed, trimming task, stream TTL renewals).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use herald_auth::Secret;
use herald_storage::Storage;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::forward::Forwarder;
use crate::hub::Hub;
use crate::node_error::StartError;
use crate::publish::Publisher;
use crate::retention::policy::RetentionHandle;
use crate::retention::trimmer::{TrimPacing, Trimmer};
use crate::role::LeaseView;
use crate::standby_feed::StandbyFeed;
use crate::stream_renewals::StreamRenewals;
use crate::writer::{Writer, WriterHandle};

/// The settings the node's core needs. herald-server builds it from its
/// `ServerConfig` (`ServerConfig::node_config`), which checked them.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node's id, in logs, the lease row and forwarded requests.
    pub node_id: String,
    /// The URL other nodes reach this node at (in the lease row while it
    /// holds the lease); a lease row naming it is never forwarded to.
    pub advertise_url: String,
    /// Publish requests the writer's queue holds before refusing
    /// (`queue_full`).
    pub queue_capacity: usize,
    /// Messages in one group commit at most.
    pub max_batch: usize,
    /// Notices buffered per channel for live subscribers before a slow one
    /// falls behind and reads storage.
    pub subscriber_buffer: usize,
    /// How often a standby reads the change cursor without a commit
    /// signal.
    pub standby_poll_interval: Duration,
    /// The retention policies in force (replaced whole on a reload).
    pub retention: RetentionHandle,
    /// How much one trim transaction removes and how often sweeps run.
    pub trim_pacing: TrimPacing,
    /// How long a standby waits for the holder's answer to a forward.
    pub forward_timeout: Duration,
    /// PEM certificates trusted, besides the system's, when forwarding to
    /// the holder over HTTPS.
    pub trusted_ca_pem: Option<Vec<u8>>,
    /// Sent with every forward so that the holder trusts it, when set.
    pub cluster_secret: Option<Secret>,
}

/// The node's core, started: storage, lease view, writer queue, hub and
/// forwarder, with the writer, standby feed and trimming task running until
/// the `shutdown` token given to [`Node::start`] is cancelled. Every
/// protocol wing publishes and subscribes through it.
pub struct Node {
    /// Where messages and the lease live.
    storage: Arc<dyn Storage>,
    /// The node's role (holder or standby).
    lease: Arc<dyn LeaseView>,
    /// The settings it was started with.
    config: NodeConfig,
    /// The writer's queue.
    writer: WriterHandle,
    /// Live fan-out to subscribers.
    hub: Arc<Hub>,
    /// Hands publishes that reach this node while standby to the holder.
    forwarder: Forwarder,
    /// The streams read here, whose TTL the next renewal batch restarts.
    stream_renewals: Arc<StreamRenewals>,
    /// Cancelled when the node drains.
    shutdown: CancellationToken,
    /// Writer, standby feed and trimming task, awaited by
    /// [`Node::stopped`].
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Cancelled when the writer has ended.
    writes_done: CancellationToken,
}

impl Node {
    /// Builds the forwarder, reads the storage's change and deletion
    /// cursors and starts the writer, the standby feed and the trimming
    /// task. They stop when `shutdown` is cancelled; [`Node::stopped`]
    /// waits for that. Every log record of these tasks carries the node's
    /// id.
    ///
    /// # Errors
    /// [`StartError::Config`] for an unusable setting (the node id in a
    /// header, the trusted certificates), [`StartError::Storage`] when the
    /// storage does not answer.
    pub async fn start(
        storage: Arc<dyn Storage>,
        lease: Arc<dyn LeaseView>,
        config: NodeConfig,
        shutdown: CancellationToken,
    ) -> Result<Self, StartError> {
        let forwarder = Forwarder::new(
            &config.node_id,
            &config.advertise_url,
            config.forward_timeout,
            config.trusted_ca_pem.as_deref(),
            config.cluster_secret.as_ref(),
        )?;
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
        let span = tracing::info_span!("herald", node_id = %config.node_id);
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
            hub: Arc::clone(&hub),
        };
        let stream_renewals = Arc::new(StreamRenewals::new(
            Arc::clone(&storage),
            Arc::clone(&lease),
            forwarder.clone(),
            &config.advertise_url,
        ));
        let tasks = vec![
            tokio::spawn(writer_task.instrument(span.clone())),
            tokio::spawn(feed.run(shutdown.clone()).instrument(span.clone())),
            tokio::spawn(trimmer.run(shutdown.clone()).instrument(span.clone())),
            tokio::spawn(
                Arc::clone(&stream_renewals)
                    .run(shutdown.clone())
                    .instrument(span),
            ),
        ];
        Ok(Self {
            storage,
            lease,
            config,
            writer: writer_handle,
            hub,
            forwarder,
            stream_renewals,
            shutdown,
            tasks: Mutex::new(tasks),
            writes_done,
        })
    }

    /// Where messages and the lease live.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The node's role (holder or standby).
    pub fn lease(&self) -> &Arc<dyn LeaseView> {
        &self.lease
    }

    /// The settings the node was started with.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// The writer's queue.
    pub fn writer(&self) -> &WriterHandle {
        &self.writer
    }

    /// Live fan-out to subscribers.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// Hands publishes that reach this node while standby to the holder.
    pub fn forwarder(&self) -> &Forwarder {
        &self.forwarder
    }

    /// The streams read here, whose TTL the next renewal batch restarts
    /// (`stream_renewals.rs`).
    pub fn stream_renewals(&self) -> &StreamRenewals {
        &self.stream_renewals
    }

    /// What the publish routine needs of this node (`publish.rs`).
    pub fn publisher(&self) -> Publisher<'_> {
        Publisher {
            writer: &self.writer,
            lease: self.lease.as_ref(),
            forwarder: &self.forwarder,
            shutdown: &self.shutdown,
        }
    }

    /// Resolves once the writer has ended after the drain began: every
    /// publish it accepted is committed or failed, and it will write
    /// nothing more.
    pub async fn writes_done(&self) {
        self.writes_done.cancelled().await;
    }

    /// Waits until the writer, the standby feed and the trimming task have
    /// ended. Call it after cancelling the `shutdown` token given to
    /// [`Node::start`]; before that it waits for the drain. Queued
    /// publishes are committed (or failed) before it returns.
    pub async fn stopped(&self) {
        self.shutdown.cancelled().await;
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        for task in tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "background task panicked");
            }
        }
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("node_id", &self.config.node_id)
            .field("draining", &self.shutdown.is_cancelled())
            .finish_non_exhaustive()
    }
}

//! Join and leave pushes (Centrifugo's `join_leave`, see
//! `channel_options.rs`), cluster-wide: when a client subscribes to a
//! channel with `join_leave` (or unsubscribes, or disconnects), every
//! subscriber of that channel that wants them, on any node, gets a
//! `{"push":{"channel":..,"join":{"info":{..}}}}` (`leave`) push.
//!
//! A node delivers its own clients' events at once to its listeners
//! (the subscriptions here that want the pushes), and queues them for the
//! other nodes: one relay task hands them to
//! `Storage::send_presence_events`, one call at a time, so they leave in
//! the order they happened (a client's join before its leave). The
//! events of other nodes arrive from `Storage::watch_presence_events`
//! and go to the same listeners. On a storage without a way between
//! processes (SQLite) there are no other nodes to tell.
//!
//! Delivery is at most once, as Centrifugo's: a push is dropped when the
//! subscriber's queue is full, and an event when the relay's queue is
//! full, the storage fails, or another node's listener misses it (see the
//! storage). A node that drains sends the leaves of its clients before
//! it stops ([`JoinLeave::finish`]); a node that dies sends none.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use herald_core::ChannelName;
use herald_storage::{PresenceEvent, Storage};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::codec::Encoded;
use super::codec::Encoding;
use super::mailbox::{Out, Push};
use super::replies::join_leave_push;

/// Events the relay may have queued before new ones are dropped.
const OUTBOX_CAPACITY: usize = 4096;
/// Most events the relay hands the storage in one call.
const RELAY_BATCH: usize = 256;

/// A subscription of this node that wants the pushes of its channel.
struct Listener {
    /// Its connection's client id.
    client: String,
    /// Its subscription's generation (`session.rs`): a push of an ended
    /// subscription is dropped by the session.
    generation: u64,
    /// Its session's push queue.
    out: mpsc::Sender<Out>,
    /// Its connection's encoding.
    encoding: Encoding,
}

/// This node's listeners, by channel.
#[derive(Default)]
struct Listeners(Mutex<HashMap<ChannelName, Vec<Listener>>>);

impl Listeners {
    fn lock(&self) -> MutexGuard<'_, HashMap<ChannelName, Vec<Listener>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `event`'s push to every listener of its channel; a full
    /// queue misses it.
    fn deliver(&self, event: &PresenceEvent) {
        let listeners = self.lock();
        let Some(list) = listeners.get(&event.channel) else {
            return;
        };
        let reply = join_leave_push(event);
        // Encoded once per encoding its listeners speak.
        let mut json = None;
        let mut protobuf = None;
        for listener in list {
            let encoded = match listener.encoding {
                Encoding::Json => &mut json,
                Encoding::Protobuf => &mut protobuf,
            }
            .get_or_insert_with(|| Encoded::of(listener.encoding, &reply));
            let push = Out::Push(Box::new(Push {
                channel: event.channel.clone(),
                generation: listener.generation,
                encoded: encoded.clone(),
                queued_bytes: 0,
            }));
            if listener.out.try_send(push).is_err() {
                tracing::debug!(
                    channel = %event.channel,
                    client = %listener.client,
                    "join or leave push dropped: the connection's queue is full"
                );
            }
        }
    }
}

/// The node's join and leave fan-out (see the module's documentation).
pub(crate) struct JoinLeave {
    listeners: Arc<Listeners>,
    /// The relay's queue; `None` when the storage has no other nodes to
    /// tell.
    outbox: Option<mpsc::Sender<PresenceEvent>>,
    /// Cancelled by [`JoinLeave::finish`]: the relay sends what is
    /// queued and ends.
    flush: CancellationToken,
    /// The relay task, awaited by [`JoinLeave::finish`].
    relay: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for JoinLeave {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinLeave")
            .field("channels", &self.listeners.lock().len())
            .field("relays", &self.outbox.is_some())
            .finish_non_exhaustive()
    }
}

impl JoinLeave {
    /// Starts the relay and the task that takes other nodes' events from
    /// `storage`, if it has them; that one ends when `shutdown` is
    /// cancelled, the relay at [`JoinLeave::finish`]. Their records are
    /// in `span`.
    pub(crate) fn start(
        storage: Arc<dyn Storage>,
        shutdown: CancellationToken,
        span: tracing::Span,
    ) -> Self {
        let listeners = Arc::new(Listeners::default());
        let flush = CancellationToken::new();
        let Some(heard) = storage.watch_presence_events() else {
            return Self {
                listeners,
                outbox: None,
                flush,
                relay: Mutex::new(None),
            };
        };
        tokio::spawn(inbound(heard, Arc::clone(&listeners), shutdown).instrument(span.clone()));
        let (outbox, queued) = mpsc::channel(OUTBOX_CAPACITY);
        let relay = tokio::spawn(relay(storage, queued, flush.clone()).instrument(span));
        Self {
            listeners,
            outbox: Some(outbox),
            flush,
            relay: Mutex::new(Some(relay)),
        }
    }

    /// Subscription `generation` of `client` to `channel` gets the
    /// channel's pushes in `out`, encoded in `encoding` (replacing an
    /// earlier one of the same client).
    pub(crate) fn listen(
        &self,
        channel: &ChannelName,
        client: &str,
        generation: u64,
        out: mpsc::Sender<Out>,
        encoding: Encoding,
    ) {
        let mut listeners = self.listeners.lock();
        let list = listeners.entry(channel.clone()).or_default();
        list.retain(|l| l.client != client);
        list.push(Listener {
            client: client.to_owned(),
            generation,
            out,
            encoding,
        });
    }

    /// `client` no longer gets `channel`'s pushes.
    pub(crate) fn unlisten(&self, channel: &ChannelName, client: &str) {
        let mut listeners = self.listeners.lock();
        if let Some(list) = listeners.get_mut(channel) {
            list.retain(|l| l.client != client);
            if list.is_empty() {
                listeners.remove(channel);
            }
        }
    }

    /// A client of this node joined or left: its push goes to this
    /// node's listeners now, and the event to the other nodes.
    pub(crate) fn emit(&self, event: PresenceEvent) {
        self.listeners.deliver(&event);
        if let Some(outbox) = &self.outbox {
            if let Err(e) = outbox.try_send(event) {
                tracing::warn!(
                    channel = %e.into_inner().channel,
                    "join or leave event not sent to the other nodes: the queue is full"
                );
            }
        }
    }

    /// Sends the events still queued to the other nodes and waits for
    /// that (call it once the connections have ended, so that their
    /// leaves go too).
    pub(crate) async fn finish(&self) {
        self.flush.cancel();
        let relay = self
            .relay
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(relay) = relay {
            if let Err(e) = relay.await {
                tracing::error!(error = %e, "join and leave relay panicked");
            }
        }
    }
}

/// Hands queued events to the storage, in order, a batch per call, until
/// `flush`: then what is queued, and it ends.
async fn relay(
    storage: Arc<dyn Storage>,
    mut queued: mpsc::Receiver<PresenceEvent>,
    flush: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            biased;
            event = queued.recv() => match event {
                Some(event) => event,
                None => return,
            },
            () = flush.cancelled() => {
                let mut rest = Vec::new();
                while let Ok(event) = queued.try_recv() {
                    rest.push(event);
                }
                for batch in rest.chunks(RELAY_BATCH) {
                    send(storage.as_ref(), batch).await;
                }
                return;
            }
        };
        let mut batch = vec![first];
        while batch.len() < RELAY_BATCH {
            match queued.try_recv() {
                Ok(event) => batch.push(event),
                Err(_) => break,
            }
        }
        send(storage.as_ref(), &batch).await;
    }
}

/// One call of the storage; a failure is logged (the events are lost).
async fn send(storage: &dyn Storage, batch: &[PresenceEvent]) {
    if let Err(e) = storage.send_presence_events(batch).await {
        herald_node::node_error::StorageFailure::new("send_presence_events", None, e).log();
    }
}

/// Delivers other nodes' events to this node's listeners until
/// `shutdown`.
async fn inbound(
    mut heard: broadcast::Receiver<PresenceEvent>,
    listeners: Arc<Listeners>,
    shutdown: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            () = shutdown.cancelled() => return,
            next = heard.recv() => next,
        };
        match next {
            Ok(event) => listeners.deliver(&event),
            Err(broadcast::error::RecvError::Lagged(missed)) => tracing::warn!(
                missed,
                "join and leave events of other nodes lost: this node fell behind"
            ),
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

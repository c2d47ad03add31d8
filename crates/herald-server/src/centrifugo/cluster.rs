//! Cluster events on this node (`herald_storage::ClusterEvent`): the
//! server API's cluster-wide requests go to every other node through the
//! storage (`Storage::send_cluster_event`; on PostgreSQL one `NOTIFY`),
//! and the ones other nodes send are applied to this node's clients.
//! Best effort, as the storage's events are: a node that is not listening
//! when one is sent never applies it.

use std::sync::Arc;

use herald_storage::ClusterEvent;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;

use herald_storage::Storage;

use crate::centrifugo::registry::Registry;

/// Sends `event` to every other node through `storage`, then applies it
/// to this node's clients (`registry`): a request the storage refuses (too large, or the database
/// unreachable) is applied nowhere.
///
/// # Errors
/// The storage's: [`herald_storage::Error::ClusterEventTooLarge`] or
/// [`herald_storage::Error::Unavailable`].
pub(crate) async fn tell(
    storage: &dyn Storage,
    registry: &Registry,
    event: ClusterEvent,
) -> herald_storage::Result<()> {
    storage.send_cluster_event(&event).await?;
    apply(registry, &event);
    Ok(())
}

/// Applies `event` to the clients it concerns on this node.
fn apply(registry: &Registry, event: &ClusterEvent) {
    let told = registry.apply(event);
    tracing::debug!(?event, connections = told, "cluster event applied");
}

/// Applies the events other nodes send (`events`, from
/// `Storage::watch_cluster_events`; nothing to do without them) until
/// `shutdown` is cancelled or the storage stops sending.
pub(crate) async fn run(
    events: Option<broadcast::Receiver<ClusterEvent>>,
    registry: Arc<Registry>,
    shutdown: CancellationToken,
) {
    let Some(mut events) = events else {
        return;
    };
    loop {
        let next = tokio::select! {
            () = shutdown.cancelled() => return,
            next = events.recv() => next,
        };
        match next {
            Ok(event) => apply(&registry, &event),
            Err(RecvError::Lagged(missed)) => {
                tracing::warn!(
                    missed,
                    "cluster events arrived faster than applied; some were lost"
                );
            }
            Err(RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::centrifugo::mailbox::{Control, Mailbox};
    use herald_core::ChannelName;
    use herald_node::testing::MemoryStorage;

    async fn next(mailbox: &Mailbox) -> Control {
        tokio::time::timeout(Duration::from_secs(5), mailbox.next())
            .await
            .expect("no control in time")
    }

    #[tokio::test]
    async fn events_from_other_nodes_reach_the_users_connections_here() {
        let storage = MemoryStorage::new();
        let shutdown = CancellationToken::new();
        let registry = Arc::new(Registry::new(
            storage.clone(),
            shutdown.clone(),
            tracing::Span::none(),
        ));
        let news = ChannelName::new("news").unwrap();
        let ann = Arc::new(Mailbox::default());
        let bob = Arc::new(Mailbox::default());
        registry.insert("c1", "ann", Arc::clone(&ann));
        registry.insert("c2", "bob", Arc::clone(&bob));
        registry.set_subscribed("c1", &news, true);
        let task = tokio::spawn(run(
            herald_storage::ClusterView::watch_cluster_events(&*storage),
            Arc::clone(&registry),
            shutdown.clone(),
        ));

        storage.hear_event(ClusterEvent::Unsubscribe {
            user: "ann".to_owned(),
            channel: news.clone(),
        });
        assert!(matches!(next(&ann).await, Control::Unsubscribe(c) if c == news));
        storage.hear_event(ClusterEvent::Disconnect {
            user: "bob".to_owned(),
            code: 3011,
        });
        assert!(matches!(next(&bob).await, Control::Disconnect(d) if d.code == 3011));
        storage.hear_event(ClusterEvent::Disconnect {
            user: "ann".to_owned(),
            code: 3503,
        });
        assert!(matches!(next(&ann).await, Control::Disconnect(d) if d.code == 3503));
        // Each event reached only its user.
        assert!(bob.take().is_none());
        shutdown.cancel();
        task.await.unwrap();
    }
}

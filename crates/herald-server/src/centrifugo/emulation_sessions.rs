//! The emulation transports' sessions on this node, by session id: the
//! queue through which `/emulation` hands each its frames of commands
//! (`emulation.rs`), and the registration a session holds while it runs
//! (`transport.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::codec::ClientFrame;

/// Frames posted to one session and not yet run before `/emulation`
/// waits (at most the write timeout, then 503).
const COMMAND_QUEUE: usize = 16;

/// The emulation sessions of this node, by session id.
#[derive(Debug, Default)]
pub(crate) struct EmulationSessions {
    map: Mutex<HashMap<String, mpsc::Sender<ClientFrame>>>,
    /// The other nodes' advertised URLs by node id, from the node reports,
    /// and when they were read: a request for another node reads the
    /// reports at most once per [`NODE_URLS_FRESH`], so that requests
    /// anyone may send cannot make the node query its database at will.
    node_urls: Mutex<Option<(Instant, NodeUrls)>>,
}

/// Node id → advertised URL.
pub(crate) type NodeUrls = Arc<HashMap<String, String>>;

/// How long the node URLs read from the reports are used.
const NODE_URLS_FRESH: Duration = Duration::from_secs(1);

impl EmulationSessions {
    /// Registers session `id` (a random secret), whose first frame is
    /// `first`.
    pub(crate) fn register(self: &Arc<Self>, id: String, first: ClientFrame) -> Registration {
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        // The queue is new and empty: the first frame fits.
        let _ = tx.try_send(first);
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.clone(), tx);
        Registration {
            id,
            rx,
            sessions: Arc::clone(self),
        }
    }

    /// The queue of session `id`, if it runs on this node.
    pub(crate) fn get(&self, id: &str) -> Option<mpsc::Sender<ClientFrame>> {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    /// The node URLs read less than [`NODE_URLS_FRESH`] ago, if any.
    pub(crate) fn node_urls(&self) -> Option<NodeUrls> {
        let urls = self
            .node_urls
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        urls.as_ref()
            .filter(|(at, _)| at.elapsed() < NODE_URLS_FRESH)
            .map(|(_, urls)| Arc::clone(urls))
    }

    /// Keeps `urls`, read now; returns them.
    pub(crate) fn keep_node_urls(
        &self,
        urls: HashMap<String, String>,
    ) -> Arc<HashMap<String, String>> {
        let urls = Arc::new(urls);
        *self
            .node_urls
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), Arc::clone(&urls)));
        urls
    }

    /// Sessions registered now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A session's place in [`EmulationSessions`]: the frames posted for it;
/// dropping it removes the session.
pub(crate) struct Registration {
    /// The session id.
    pub(crate) id: String,
    rx: mpsc::Receiver<ClientFrame>,
    sessions: Arc<EmulationSessions>,
}

impl Registration {
    /// The next frame posted for the session.
    pub(crate) async fn next(&mut self) -> Option<ClientFrame> {
        self.rx.recv().await
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.sessions
            .map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_session_is_registered_until_its_registration_drops() {
        let sessions = Arc::new(EmulationSessions::default());
        let frame = |text: &str| ClientFrame::Json(text.to_owned());
        let text = |frame: Option<ClientFrame>| match frame {
            Some(ClientFrame::Json(text)) => Some(text),
            _ => None,
        };
        let mut registration = sessions.register("s-1".to_owned(), frame("first"));
        let id = registration.id.clone();
        assert_eq!(text(registration.next().await).as_deref(), Some("first"));
        let queue = sessions.get(&id).expect("registered");
        queue.send(frame("second")).await.unwrap();
        assert_eq!(text(registration.next().await).as_deref(), Some("second"));
        assert!(sessions.get("another").is_none());
        drop(registration);
        assert!(sessions.get(&id).is_none());
        assert_eq!(sessions.len(), 0);
        assert!(queue.send(frame("late")).await.is_err());
    }
}

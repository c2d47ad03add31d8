//! Connection threads: each SQLite connection lives on its own OS thread and
//! runs jobs sent to it over a channel; answers go back over a oneshot.
//!
//! The queue is bounded ([`QUEUE_CAPACITY`] jobs): a caller that finds it
//! full gets [`Error::Unavailable`] at once (a `503` for HTTP clients)
//! instead of adding to a queue that a stalled thread never empties. A job
//! whose caller stopped waiting (its future was dropped, e.g. by a timeout)
//! is skipped when its turn comes instead of being run for nobody.

use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::error::{Error, Result};

/// Work for a connection thread.
pub(super) type Job = Box<dyn FnOnce(&mut Connection) + Send + 'static>;

/// Jobs a worker's queue holds at most, besides the ones its threads run.
pub(super) const QUEUE_CAPACITY: usize = 4096;

/// One or more threads, each owning one connection, taking jobs from one
/// shared queue. Dropping a `Worker` closes the queue and waits until every
/// thread has finished its current job and stopped.
pub(super) struct Worker {
    role: &'static str,
    tx: Option<SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl Worker {
    /// Starts one thread per connection, named after `role`, with a queue
    /// of [`QUEUE_CAPACITY`] jobs.
    pub(super) fn spawn(role: &'static str, connections: Vec<Connection>) -> std::io::Result<Self> {
        Self::spawn_with_capacity(role, connections, QUEUE_CAPACITY)
    }

    /// [`Worker::spawn`] with a queue of `capacity` jobs.
    fn spawn_with_capacity(
        role: &'static str,
        connections: Vec<Connection>,
        capacity: usize,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel::<Job>(capacity);
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(connections.len());
        for (i, conn) in connections.into_iter().enumerate() {
            let rx = Arc::clone(&rx);
            let handle = thread::Builder::new()
                .name(format!("herald-sqlite-{role}-{i}"))
                .spawn(move || serve(role, conn, &rx))?;
            threads.push(handle);
        }
        Ok(Self {
            role,
            tx: Some(tx),
            threads,
        })
    }

    /// A handle on the queue, to submit jobs without holding `self`.
    pub(super) fn sender(&self) -> Submitter {
        Submitter {
            role: self.role,
            tx: self.tx.clone(),
        }
    }

    /// Runs `f` on one of this worker's connections.
    ///
    /// # Errors
    /// Whatever `f` returns; [`Error::Unavailable`] when the thread is gone
    /// or `f` panicked.
    pub(super) async fn call<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        self.sender().call(f).await
    }

    /// Lets the threads go without waiting for them: they stop after their
    /// current job. For a connection that is abandoned because it hangs.
    pub(super) fn detach(mut self) {
        self.tx = None;
        self.threads.clear();
    }
}

/// How long dropping a [`Worker`] waits for its threads to finish their
/// current jobs.
const JOIN_WAIT: Duration = Duration::from_secs(1);

impl Drop for Worker {
    /// Closes the queue and waits for the threads to stop, at most
    /// [`JOIN_WAIT`]: a thread stuck in a job (a write blocked on I/O, a
    /// lock held by a frozen process) must not keep a draining process, or
    /// the async runtime this may run on, from going on. Such a thread is
    /// left to finish (or to end with the process); SQLite's journal keeps
    /// its transaction atomic either way, and nothing it writes has been
    /// acknowledged.
    fn drop(&mut self) {
        self.tx = None;
        let me = thread::current().id();
        let handles: Vec<JoinHandle<()>> = self
            .threads
            .drain(..)
            .filter(|h| h.thread().id() != me)
            .collect();
        if handles.is_empty() {
            return;
        }
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let joiner = thread::Builder::new()
            .name(format!("herald-sqlite-{}-join", self.role))
            .spawn(move || {
                for handle in handles {
                    let _ = handle.join();
                }
                let _ = done_tx.send(());
            });
        if joiner.is_err() || done_rx.recv_timeout(JOIN_WAIT).is_err() {
            tracing::warn!(
                role = self.role,
                wait_ms = u64::try_from(JOIN_WAIT.as_millis()).unwrap_or(u64::MAX),
                "a sqlite connection thread is still busy at shutdown; not waiting for it"
            );
        }
    }
}

/// A cloneable handle on a [`Worker`]'s queue.
#[derive(Clone)]
pub(super) struct Submitter {
    role: &'static str,
    tx: Option<SyncSender<Job>>,
}

impl Submitter {
    /// Runs `f` on one of the worker's connections; see [`Worker::call`].
    pub(super) async fn call<T, F>(self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let gone = || Error::unavailable(format!("the sqlite {} thread is gone", self.role));
        let (answer_tx, answer_rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            // Nobody waits for the answer any more: skip the work.
            if !answer_tx.is_closed() {
                let _ = answer_tx.send(f(conn));
            }
        });
        match self.tx.as_ref().ok_or_else(gone)?.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(Error::unavailable(format!(
                    "the sqlite {} queue is full ({QUEUE_CAPACITY} jobs waiting)",
                    self.role
                )))
            }
            Err(TrySendError::Disconnected(_)) => return Err(gone()),
        }
        answer_rx.await.map_err(|_| gone())?
    }
}

/// A connection thread's loop: runs jobs until the queue closes.
fn serve(role: &'static str, mut conn: Connection, rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(PoisonError::into_inner);
            rx.recv()
        };
        let Ok(job) = job else { break };
        if panic::catch_unwind(AssertUnwindSafe(|| job(&mut conn))).is_err() {
            tracing::error!(role, "a job panicked on a sqlite connection thread");
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::FutureExt;

    use super::*;

    /// A full queue refuses at once; jobs whose callers gave up are skipped.
    #[tokio::test]
    async fn a_full_queue_refuses_and_abandoned_jobs_are_skipped() {
        let conn = Connection::open_in_memory().unwrap();
        let worker = Worker::spawn_with_capacity("test", vec![conn], 2).unwrap();
        // Occupy the thread until told to go on.
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (busy_tx, busy_rx) = oneshot::channel::<()>();
        let blocker = tokio::spawn(worker.sender().call(move |_| {
            let _ = busy_tx.send(());
            let _ = go_rx.recv();
            Ok(())
        }));
        busy_rx.await.unwrap();
        // Two callers queue a job each and give up at once (one poll).
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..2 {
            let ran = Arc::clone(&ran);
            let call = worker.sender().call(move |_| {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok(())
            });
            assert!(call.now_or_never().is_none(), "queued, not answered");
        }
        // The queue is full: refused at once.
        let refused = worker.sender().call(|_| Ok(())).now_or_never();
        match refused {
            Some(Err(Error::Unavailable { message, .. })) => {
                assert!(message.contains("queue is full"), "{message}");
            }
            other => panic!("expected a full queue, got {other:?}"),
        }
        go_tx.send(()).unwrap();
        blocker.await.unwrap().unwrap();
        // Jobs run in order: once this one ran, the abandoned ones had their
        // turn, and did nothing. The thread may not have taken them off the
        // queue yet when the blocker's answer arrives: until it has, the
        // queue is still full and refuses at once, so ask again.
        loop {
            match worker.call(|_| Ok(())).await {
                Err(Error::Unavailable { message, .. }) if message.contains("queue is full") => {
                    tokio::task::yield_now().await;
                }
                other => break other.unwrap(),
            }
        }
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }

    /// Dropping a worker whose thread is stuck in a job returns anyway,
    /// after [`JOIN_WAIT`], instead of waiting for the job.
    #[tokio::test]
    async fn dropping_a_worker_does_not_wait_for_a_stuck_thread() {
        let conn = Connection::open_in_memory().unwrap();
        let worker = Worker::spawn("test", vec![conn]).unwrap();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (busy_tx, busy_rx) = oneshot::channel::<()>();
        let stuck = tokio::spawn(worker.sender().call(move |_| {
            let _ = busy_tx.send(());
            // Stuck until the test lets it go, after the drop returned.
            let _ = go_rx.recv();
            Ok(())
        }));
        busy_rx.await.unwrap();
        let (dropped_tx, dropped_rx) = std::sync::mpsc::channel::<()>();
        thread::spawn(move || {
            drop(worker);
            let _ = dropped_tx.send(());
        });
        let dropped = tokio::task::spawn_blocking(move || {
            dropped_rx.recv_timeout(Duration::from_secs(30)).is_ok()
        })
        .await
        .unwrap();
        assert!(dropped, "dropping the worker waited for its stuck thread");
        go_tx.send(()).unwrap();
        stuck.await.unwrap().unwrap();
    }
}

//! Connection threads: each SQLite connection lives on its own OS thread and
//! runs jobs sent to it over a channel; answers go back over a oneshot.

use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::{Error, Result};

/// Work for a connection thread.
pub(super) type Job = Box<dyn FnOnce(&mut Connection) + Send + 'static>;

/// One or more threads, each owning one connection, taking jobs from one
/// shared queue. Dropping a `Worker` closes the queue and waits until every
/// thread has finished its current job and stopped.
pub(super) struct Worker {
    role: &'static str,
    tx: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl Worker {
    /// Starts one thread per connection, named after `role`.
    pub(super) fn spawn(role: &'static str, connections: Vec<Connection>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
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

impl Drop for Worker {
    fn drop(&mut self) {
        self.tx = None;
        let me = thread::current().id();
        for handle in self.threads.drain(..) {
            if handle.thread().id() != me {
                let _ = handle.join();
            }
        }
    }
}

/// A cloneable handle on a [`Worker`]'s queue.
#[derive(Clone)]
pub(super) struct Submitter {
    role: &'static str,
    tx: Option<Sender<Job>>,
}

impl Submitter {
    /// Runs `f` on one of the worker's connections; see [`Worker::call`].
    pub(super) async fn call<T, F>(self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let gone = || Error::Unavailable(format!("the sqlite {} thread is gone", self.role));
        let (answer_tx, answer_rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let _ = answer_tx.send(f(conn));
        });
        self.tx
            .as_ref()
            .ok_or_else(gone)?
            .send(job)
            .map_err(|_| gone())?;
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

//! Injecting and healing the faults of a schedule.
//!
//! # What each fault models
//!
//! - `kill_holder` / `kill_standby`: a crash (`kill -9`, the OOM killer, a
//!   host losing power while its TCP connections get reset). The node is
//!   restarted after a pause, as a supervisor would.
//! - `stop_holder`: a hang (a paused VM, a stalled disk, a long GC-like
//!   stop) of the holder for longer than the lease's ttl. A standby takes
//!   over once the lease expired; when the old holder resumes, its safety
//!   deadline has passed and it exits (status 3 or 4) without writing; it
//!   is restarted as a standby. From SIGCONT until it exits, a client with
//!   a stale route publishes to it alone (`stale-<ms>-<n>` messages), so
//!   what a resumed holder does with its old lease is always put to the
//!   test. A node still running 15 s (`EXIT_WAIT`) after
//!   SIGCONT (a broken build that keeps going as a zombie) is killed with
//!   SIGKILL and restarted; the run goes on.
//! - `term_holder`: a deploy or a planned stop: SIGTERM drains the holder,
//!   which releases the lease; it is restarted. One that has not exited 15 s
//!   after SIGTERM is killed and restarted too.
//! - `restart_db`: a database restart or failover (`pg_ctl restart -m
//!   fast`): every session of every node ends at once.
//! - `cut_db`: one node's database connections reset (a network path that
//!   fails loudly), for a few seconds.
//! - `blackhole_db`: a partition between one node and the database in which
//!   packets vanish, for a few seconds, ended by resetting the connections
//!   (the kernel's eventual verdict); see the proxy's documentation.
//! - `delay_db`: a slow link (200 ms each way) between one node and the
//!   database, for a few seconds.
//! - `lock_lease_brief`: another session (a backup tool, an operator's
//!   query) holds the lease row `FOR UPDATE` for 1 s: renewals and fenced
//!   writes wait, the holder must ride it out.
//! - `lock_lease_long`: the same for 5 s, past the holder's safety deadline
//!   (3 s after a renewal is sent): the holder must stop writing in time.
//! - `lock_channel`: another session holds one channel's row lock for 2 s
//!   while publishes to it run: writes to that channel stall, nothing may
//!   be lost, duplicated or reordered.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use herald_chaos::history::Event;
use herald_chaos::proxy::Mode;
use rustix::process::Signal;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::clients::{stale_route_publisher, status, Recorder};
use super::database::{connect, Cluster};
use super::node::{Node, Urls};
use super::schedule::{FaultKind, Planned, Target};

/// How long a fault waits for some node to be holder before it gives up.
const HOLDER_WAIT: Duration = Duration::from_secs(15);

/// How often the nodes are checked for one that exited on its own.
const RESTART_CHECK: Duration = Duration::from_millis(250);

/// The pause before such a node is restarted (systemd's `RestartSec=1` in
/// docs/operations.md).
const RESTART_PAUSE: Duration = Duration::from_secs(1);

/// The kind recorded for a node that exited on its own and was restarted
/// by the runner: not a fault the schedule injects, but its consequence.
pub(crate) const NODE_EXITED: &str = "node_exited";

/// How long a drained or resumed node may take to exit.
const EXIT_WAIT: Duration = Duration::from_secs(15);

/// The cluster as the fault injector sees it.
pub(crate) struct World<'a> {
    /// The nodes.
    pub(crate) nodes: &'a mut [Node],
    /// The database.
    pub(crate) cluster: &'a Arc<Cluster>,
    /// The channels clients use.
    pub(crate) channels: &'a [String],
    /// Where to record faults.
    pub(crate) recorder: &'a Recorder,
    /// The nodes' URLs.
    pub(crate) urls: &'a Urls,
}

impl World<'_> {
    /// Injects one fault, heals it, and records it. A fault that cannot
    /// find its target (no holder, no standby) is skipped and not recorded.
    pub(crate) async fn inject(&mut self, plan: &Planned) -> anyhow::Result<()> {
        let start = self.recorder.now_ms();
        let target = match plan.kind {
            FaultKind::KillHolder | FaultKind::StopHolder | FaultKind::TermHolder => {
                let Some(holder) = self.holder().await else {
                    eprintln!("herald-chaos: no holder for {}; skipped", plan.kind.name());
                    return Ok(());
                };
                let start = self.recorder.now_ms();
                self.hit_holder(plan, holder).await?;
                return self.record(plan, &self.nodes[holder].id.clone(), start);
            }
            FaultKind::KillStandby => {
                let holder = self.holder().await;
                let standbys: Vec<usize> = (0..self.nodes.len())
                    .filter(|i| Some(*i) != holder)
                    .collect();
                let Target::Standby(pick) = plan.target else {
                    unreachable!("a standby fault targets a standby")
                };
                if standbys.is_empty() {
                    return Ok(());
                }
                let index = standbys[pick as usize % standbys.len()];
                let start = self.recorder.now_ms();
                let node = &mut self.nodes[index];
                node.kill().await;
                tokio::time::sleep(plan.hold).await;
                node.start().await?;
                let id = node.id.clone();
                return self.record(plan, &id, start);
            }
            FaultKind::RestartDatabase => {
                let cluster = Arc::clone(self.cluster);
                tokio::task::spawn_blocking(move || cluster.restart_fast())
                    .await
                    .context("the restart task")??;
                "database".to_owned()
            }
            FaultKind::CutDb | FaultKind::BlackholeDb | FaultKind::DelayDb => {
                let Target::Node(index) = plan.target else {
                    unreachable!("a proxy fault targets a node")
                };
                let node = &self.nodes[index % self.nodes.len()];
                match plan.kind {
                    FaultKind::CutDb => node.proxy.set_mode(Mode::Cut),
                    FaultKind::BlackholeDb => node.proxy.set_mode(Mode::Blackhole),
                    _ => node.proxy.set_mode(Mode::Delay(Duration::from_millis(200))),
                }
                tokio::time::sleep(plan.hold).await;
                if plan.kind == FaultKind::BlackholeDb {
                    node.proxy.set_mode(Mode::Cut);
                }
                node.proxy.set_mode(Mode::Pass);
                node.id.clone()
            }
            FaultKind::LockLeaseBrief | FaultKind::LockLeaseLong => {
                self.hold_lock(
                    "SELECT 1 FROM storage_leases WHERE name = 'writer' FOR UPDATE",
                    &[],
                    plan.hold,
                )
                .await?;
                "storage_leases".to_owned()
            }
            FaultKind::LockChannel => {
                let Target::Channel(index) = plan.target else {
                    unreachable!("a channel fault targets a channel")
                };
                let channel = &self.channels[index % self.channels.len()];
                self.hold_lock(
                    "SELECT 1 FROM channels WHERE name = $1 FOR UPDATE",
                    &[channel],
                    plan.hold,
                )
                .await?;
                channel.clone()
            }
        };
        self.record(plan, &target, start)
    }

    fn record(&self, plan: &Planned, target: &str, start_ms: u64) -> anyhow::Result<()> {
        self.recorder.push(Event::Fault {
            kind: plan.kind.name().to_owned(),
            target: target.to_owned(),
            start_ms,
            end_ms: self.recorder.now_ms(),
        });
        Ok(())
    }

    /// Hits the holder, then starts it again. A signal that cannot be sent
    /// (the process ended on its own meanwhile) is noted and the fault goes
    /// on; [`Node::wait_exit`] kills a process that outlives [`EXIT_WAIT`],
    /// so that the restart always finds the node stopped.
    async fn hit_holder(&mut self, plan: &Planned, index: usize) -> anyhow::Result<()> {
        let node = &mut self.nodes[index];
        let signal = |node: &Node, signal: Signal| {
            if let Err(e) = node.signal(signal) {
                eprintln!("herald-chaos: {}: {e:#}", plan.kind.name());
            }
        };
        match plan.kind {
            FaultKind::KillHolder => {
                node.kill().await;
                tokio::time::sleep(plan.hold).await;
            }
            FaultKind::StopHolder => {
                signal(node, Signal::STOP);
                tokio::time::sleep(plan.hold).await;
                signal(node, Signal::CONT);
                // Some client always reaches the resumed node, whatever
                // became of the requests it had when it froze.
                let stop = CancellationToken::new();
                let stale = stale_route_publisher(
                    format!("stale-{}", self.recorder.now_ms()),
                    index,
                    self.channels.to_vec(),
                    self.urls.clone(),
                    self.recorder.clone(),
                    stop.clone(),
                );
                node.wait_exit(EXIT_WAIT).await;
                stop.cancel();
                stale.await.context("the stale-route publisher")?;
            }
            _ => {
                signal(node, Signal::TERM);
                node.wait_exit(EXIT_WAIT).await;
                tokio::time::sleep(plan.hold).await;
            }
        }
        node.start().await
    }

    /// Holds a row lock taken by `query` for `hold` in a session of its
    /// own, straight to the database; its transaction is rolled back.
    async fn hold_lock(
        &self,
        query: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        hold: Duration,
    ) -> anyhow::Result<()> {
        let mut client = connect(&self.cluster.url()).await?;
        let tx = client.transaction().await?;
        tx.execute(query, params).await?;
        tokio::time::sleep(hold).await;
        tx.rollback().await?;
        Ok(())
    }

    /// The node that holds the lease now, waiting for one if none does
    /// (and restarting nodes that exited on their own meanwhile).
    async fn holder(&mut self) -> Option<usize> {
        let http = self
            .urls
            .client()
            .timeout(Duration::from_secs(1))
            .build()
            .ok()?;
        let deadline = Instant::now() + HOLDER_WAIT;
        while Instant::now() < deadline {
            let looks = futures::future::join_all(
                (0..self.urls.len()).map(|i| status(&http, self.urls.get(i))),
            )
            .await;
            let best = looks
                .iter()
                .enumerate()
                .filter_map(|(i, look)| look.as_ref().filter(|s| s.holder).map(|s| (s.token, i)))
                .max();
            if let Some((_, index)) = best {
                return Some(index);
            }
            // A holder may just have stopped itself: restart it meanwhile.
            self.restart_exited().await.ok()?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }

    /// Waits until `at` while restarting, every [`RESTART_CHECK`], each
    /// node that exited on its own (its watchdog stopped it, it lost the
    /// lease), as a process supervisor does (docs/operations.md: systemd
    /// `Restart=always`, `RestartSec=1`). Without this, faults that make
    /// nodes stop themselves would leave the cluster without nodes until a
    /// later fault happened to restart them.
    pub(crate) async fn wait_until(&mut self, at: Instant) -> anyhow::Result<()> {
        loop {
            self.restart_exited().await?;
            let now = Instant::now();
            if now >= at {
                return Ok(());
            }
            tokio::time::sleep_until(at.min(now + RESTART_CHECK)).await;
        }
    }

    /// Restarts, [`RESTART_PAUSE`] after it was noticed, each node that
    /// exited on its own, and records each restart as a fault of kind
    /// [`NODE_EXITED`] (from the exit noticed to the restart done): the
    /// checker's liveness rule must not judge that time as fault-free.
    async fn restart_exited(&mut self) -> anyhow::Result<()> {
        for node in self.nodes.iter_mut() {
            if let Some(status) = node.exited() {
                let start_ms = self.recorder.now_ms();
                tokio::time::sleep(RESTART_PAUSE).await;
                eprintln!(
                    "herald-chaos: {} exited on its own ({status}); restarted",
                    node.id
                );
                node.start().await?;
                self.recorder.push(Event::Fault {
                    kind: NODE_EXITED.to_owned(),
                    target: node.id.clone(),
                    start_ms,
                    end_ms: self.recorder.now_ms(),
                });
            }
        }
        Ok(())
    }

    /// Heals whatever may be left: every proxy back to `Pass`, every node
    /// that is not running started again.
    pub(crate) async fn heal(&mut self) -> anyhow::Result<()> {
        self.restart_exited().await?;
        for node in self.nodes.iter_mut() {
            node.proxy.set_mode(Mode::Pass);
            if !node.is_running() {
                node.start().await?;
            }
        }
        Ok(())
    }
}

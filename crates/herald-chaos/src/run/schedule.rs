//! The fault schedule: which faults a run injects, in which order, and when.
//!
//! A schedule is drawn only from the run's seed, its duration and its number
//! of nodes, so the same three values always give the same schedule. What a
//! fault hits at run time (which node is holder then) is resolved when it
//! is injected; the schedule only says "the holder" or "a standby", and for
//! a standby a number that picks one of those present.
//!
//! Kinds are drawn from a shuffled bag holding every allowed kind once,
//! refilled when empty, so the first faults of a run are all of different
//! kinds. The allowed kinds (`--faults`) are put in the bag in the fixed
//! order of [`FaultKind::ALL`] whatever order they were named in, so with
//! every kind allowed (the default) a seed gives the same schedule as it
//! always did, and a restricted set gives the same schedule however it is
//! spelled. With no kind allowed the schedule is empty.

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Time before the first fault, for the cluster and the clients to settle.
const WARM_UP: Duration = Duration::from_secs(2);

/// Time after the last fault's expected end in which no fault starts.
const COOL_DOWN: Duration = Duration::from_secs(2);

/// The lease's ttl as the nodes are configured (`--lease-ttl`).
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(5);

/// A kind of fault; see the crate's binary documentation for what each
/// models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultKind {
    /// `kill -9` of the holder, restarted after a pause.
    KillHolder,
    /// `kill -9` of a standby, restarted after a pause.
    KillStandby,
    /// SIGSTOP of the holder for longer than the ttl, then SIGCONT; the
    /// node exits on its own and is restarted.
    StopHolder,
    /// SIGTERM (drain) of the holder, then a restart.
    TermHolder,
    /// `pg_ctl restart -m fast`.
    RestartDatabase,
    /// One node's database connections are reset for a while.
    CutDb,
    /// One node's database traffic vanishes for a while, then its
    /// connections are reset.
    BlackholeDb,
    /// One node's database traffic is delayed by 200 ms each way.
    DelayDb,
    /// Another session holds the lease row `FOR UPDATE` for 1 s.
    LockLeaseBrief,
    /// Another session holds the lease row `FOR UPDATE` for 5 s, past the
    /// holder's safety deadline.
    LockLeaseLong,
    /// Another session holds a channel's row lock for 2 s.
    LockChannel,
}

impl FaultKind {
    /// Every kind, in a fixed order.
    pub(crate) const ALL: [FaultKind; 11] = [
        FaultKind::KillHolder,
        FaultKind::KillStandby,
        FaultKind::StopHolder,
        FaultKind::TermHolder,
        FaultKind::RestartDatabase,
        FaultKind::CutDb,
        FaultKind::BlackholeDb,
        FaultKind::DelayDb,
        FaultKind::LockLeaseBrief,
        FaultKind::LockLeaseLong,
        FaultKind::LockChannel,
    ];

    /// The name recorded in the history's `Fault` events.
    pub(crate) fn name(self) -> &'static str {
        match self {
            FaultKind::KillHolder => "kill_holder",
            FaultKind::KillStandby => "kill_standby",
            FaultKind::StopHolder => "stop_holder",
            FaultKind::TermHolder => "term_holder",
            FaultKind::RestartDatabase => "restart_db",
            FaultKind::CutDb => "cut_db",
            FaultKind::BlackholeDb => "blackhole_db",
            FaultKind::DelayDb => "delay_db",
            FaultKind::LockLeaseBrief => "lock_lease_brief",
            FaultKind::LockLeaseLong => "lock_lease_long",
            FaultKind::LockChannel => "lock_channel",
        }
    }

    /// The kind with this name (as in [`FaultKind::name`]).
    pub(crate) fn from_name(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the kind needs at least two nodes (it hits a standby).
    fn needs_standby(self) -> bool {
        self == FaultKind::KillStandby
    }
}

/// What a scheduled fault hits, as far as the schedule can know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// Whichever node holds the lease when the fault starts.
    Holder,
    /// One of the standbys present when the fault starts: the one at this
    /// number modulo their count.
    Standby(u32),
    /// The node with this index.
    Node(usize),
    /// The database.
    Database,
    /// The channel with this index in the run's channel list.
    Channel(usize),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Holder => write!(f, "holder"),
            Target::Standby(pick) => write!(f, "standby#{pick}"),
            Target::Node(i) => write!(f, "node-{i}"),
            Target::Database => write!(f, "database"),
            Target::Channel(i) => write!(f, "channel#{i}"),
        }
    }
}

/// One planned fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Planned {
    /// Earliest start, from the run's start. A fault starts later when the
    /// one before it (with its recovery gap) is not over yet.
    pub(crate) at: Duration,
    /// What kind.
    pub(crate) kind: FaultKind,
    /// What it hits.
    pub(crate) target: Target,
    /// How long the fault lasts before it is healed (for a kill, the
    /// pause before the restart).
    pub(crate) hold: Duration,
    /// The quiet time after it is healed before the next fault may start.
    pub(crate) gap: Duration,
}

impl fmt::Display for Planned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>8} ms  {:<17} {:<12} hold {:>5} ms  gap {:>5} ms",
            self.at.as_millis(),
            self.kind.name(),
            self.target.to_string(),
            self.hold.as_millis(),
            self.gap.as_millis()
        )
    }
}

/// Parses a `--faults` list: comma-separated kind names, or `none` for no
/// fault at all. Names may be repeated and surrounded by spaces; the kinds
/// come back in the order of [`FaultKind::ALL`].
pub(crate) fn parse_kinds(list: &str) -> Result<Vec<FaultKind>, String> {
    let known = || {
        FaultKind::ALL
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if list.trim() == "none" {
        return Ok(Vec::new());
    }
    let mut named = Vec::new();
    for name in list.split(',').map(str::trim) {
        if name.is_empty() {
            return Err(format!(
                "an empty fault kind in {list:?}; name kinds ({}) or `none`",
                known()
            ));
        }
        let kind = FaultKind::from_name(name)
            .ok_or_else(|| format!("unknown fault kind {name:?}; known: {}, or `none`", known()))?;
        named.push(kind);
    }
    Ok(FaultKind::ALL
        .into_iter()
        .filter(|k| named.contains(k))
        .collect())
}

/// Kinds as a comma-separated list of their names, `none` for no kind.
pub(crate) fn kind_names(kinds: &[FaultKind]) -> String {
    if kinds.is_empty() {
        return "none".to_owned();
    }
    kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(",")
}

/// Draws the schedule of a run of `duration` on `nodes` nodes and
/// `channels` channels from `seed`, with faults of the `allowed` kinds
/// only (in any order; [`FaultKind::ALL`] for every kind).
pub(crate) fn draw(
    seed: u64,
    duration: Duration,
    nodes: usize,
    channels: usize,
    allowed: &[FaultKind],
) -> Vec<Planned> {
    // In the order of ALL, whatever the order of `allowed`: with every kind
    // allowed, the bag and so the draws are those of the full set.
    let pool: Vec<FaultKind> = FaultKind::ALL
        .into_iter()
        .filter(|k| allowed.contains(k))
        .filter(|k| nodes > 1 || !k.needs_standby())
        .collect();
    if pool.is_empty() {
        return Vec::new();
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut bag: Vec<FaultKind> = Vec::new();
    let mut plan = Vec::new();
    let mut at = WARM_UP + ms(rng.random_range(0..1000));
    loop {
        if bag.is_empty() {
            bag.clone_from(&pool);
            bag.shuffle(&mut rng);
        }
        let kind = bag.pop().expect("the bag was just filled");
        let (target, hold) = match kind {
            FaultKind::KillHolder => (Target::Holder, ms(rng.random_range(500..2500))),
            FaultKind::KillStandby => (
                Target::Standby(rng.random_range(0..16)),
                ms(rng.random_range(500..2500)),
            ),
            FaultKind::StopHolder => (Target::Holder, LEASE_TTL + ms(rng.random_range(1000..2500))),
            FaultKind::TermHolder => (Target::Holder, ms(rng.random_range(200..1500))),
            FaultKind::RestartDatabase => (Target::Database, Duration::ZERO),
            FaultKind::CutDb | FaultKind::BlackholeDb | FaultKind::DelayDb => (
                Target::Node(rng.random_range(0..nodes)),
                ms(rng.random_range(1500..4000)),
            ),
            FaultKind::LockLeaseBrief => (Target::Database, Duration::from_secs(1)),
            FaultKind::LockLeaseLong => (Target::Database, Duration::from_secs(5)),
            FaultKind::LockChannel => (
                Target::Channel(rng.random_range(0..channels.max(1))),
                Duration::from_secs(2),
            ),
        };
        let gap = ms(rng.random_range(1000..3000));
        let end = at + hold + gap;
        if end + COOL_DOWN > duration {
            break;
        }
        plan.push(Planned {
            at,
            kind,
            target,
            hold,
            gap,
        });
        at = end;
    }
    plan
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        let duration = Duration::from_secs(120);
        let a = draw(7, duration, 3, 2, &FaultKind::ALL);
        let b = draw(7, duration, 3, 2, &FaultKind::ALL);
        assert!(!a.is_empty());
        assert_eq!(a, b);
        let c = draw(8, duration, 3, 2, &FaultKind::ALL);
        assert_ne!(a, c);
    }

    #[test]
    fn faults_stay_inside_the_run_and_do_not_overlap() {
        let duration = Duration::from_secs(60);
        let plan = draw(3, duration, 3, 2, &FaultKind::ALL);
        for pair in plan.windows(2) {
            assert!(pair[0].at + pair[0].hold + pair[0].gap <= pair[1].at);
        }
        let last = plan.last().expect("some faults");
        assert!(last.at + last.hold < duration);
    }

    #[test]
    fn a_single_node_gets_no_standby_fault() {
        let plan = draw(1, Duration::from_secs(600), 1, 2, &FaultKind::ALL);
        assert!(plan.iter().all(|p| p.kind != FaultKind::KillStandby));
    }

    #[test]
    fn restricted_kinds_only_produce_those_kinds() {
        let allowed = [FaultKind::StopHolder, FaultKind::LockLeaseLong];
        let duration = Duration::from_secs(300);
        let plan = draw(5, duration, 3, 2, &allowed);
        assert!(plan.len() > 4, "{plan:?}");
        assert!(plan.iter().all(|p| allowed.contains(&p.kind)), "{plan:?}");
        for kind in allowed {
            assert!(plan.iter().any(|p| p.kind == kind), "{kind:?} never drawn");
        }
        // The same seed gives the same schedule, whatever order the kinds
        // were named in; another seed another.
        assert_eq!(plan, draw(5, duration, 3, 2, &allowed));
        let reversed = [FaultKind::LockLeaseLong, FaultKind::StopHolder];
        assert_eq!(plan, draw(5, duration, 3, 2, &reversed));
        assert_ne!(plan, draw(6, duration, 3, 2, &allowed));
        // One kind alone fills the run with that kind.
        let one = draw(5, duration, 3, 2, &[FaultKind::DelayDb]);
        assert!(!one.is_empty());
        assert!(one.iter().all(|p| p.kind == FaultKind::DelayDb));
    }

    #[test]
    fn no_kind_gives_an_empty_schedule() {
        assert_eq!(draw(1, Duration::from_secs(600), 3, 2, &[]), vec![]);
        assert_eq!(parse_kinds("none"), Ok(vec![]));
        // Only a standby fault on a single node: nothing can be drawn.
        assert_eq!(
            draw(1, Duration::from_secs(600), 1, 2, &[FaultKind::KillStandby]),
            vec![]
        );
    }

    #[test]
    fn fault_lists_parse_by_name() {
        assert_eq!(
            parse_kinds("lock_channel, kill_holder,kill_holder"),
            Ok(vec![FaultKind::KillHolder, FaultKind::LockChannel])
        );
        let every: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(parse_kinds(&every.join(",")), Ok(FaultKind::ALL.to_vec()));
        for bad in ["kill_everything", "kill_holder,", "", "none,kill_holder"] {
            assert!(parse_kinds(bad).is_err(), "{bad:?} accepted");
        }
        let error = parse_kinds("kill_holder,partition").unwrap_err();
        assert!(error.contains("\"partition\""), "{error}");
        assert!(error.contains("lock_channel"), "{error}");
    }
}

//! The checker's verdict: the violations found, the run's counts, the
//! publishers' availability and the recovery times after faults, and the
//! text the harness prints.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::violation::Violation;

/// How many of each thing the run had.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Publish attempts.
    pub publishes: usize,
    /// Attempts acknowledged.
    pub acked: usize,
    /// Attempts refused definitely.
    pub failed: usize,
    /// Attempts with an unknown outcome.
    pub indeterminate: usize,
    /// Distinct messages (channel and id) attempted.
    pub messages: usize,
    /// Subscriber connections.
    pub subscribes: usize,
    /// Messages delivered to subscribers.
    pub deliveries: usize,
    /// Faults injected.
    pub faults: usize,
    /// Takeovers observed.
    pub takeovers: usize,
    /// Channels in the final state.
    pub channels: usize,
    /// Messages in the final state.
    pub stored: usize,
    /// Lease acquisitions in the final state, when known.
    pub lease_acquisitions: Option<usize>,
    /// Lease observations (changes of the lease row seen by the harness).
    #[serde(default)]
    pub lease_observations: usize,
    /// `truncated` announcements received by subscribers (retention).
    #[serde(default)]
    pub truncations: usize,
    /// Distinct fencing tokens among the lease observations.
    #[serde(default)]
    pub lease_tokens: usize,
    /// The run's length: the latest time in the history.
    pub run_ms: u64,
    /// What the Centrifugo clients saw.
    #[serde(default)]
    pub centrifugo: CentrifugoCounts,
}

/// What the Centrifugo clients (the client protocol at
/// `/connection/websocket`) saw.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CentrifugoCounts {
    /// Connections that were connected and then ended.
    pub connections: usize,
    /// Subscribe replies.
    pub subscribes: usize,
    /// Replies to a first subscribe (no resume point yet).
    pub first_subscribes: usize,
    /// Recoveries answered `recovered: true`.
    pub recovered: usize,
    /// Recoveries answered `recovered: false`.
    pub not_recovered: usize,
    /// Publications recovered by the replies.
    pub recovered_publications: usize,
    /// History reads after `recovered: false`.
    pub history_reloads: usize,
    /// Messages the Centrifugo subscribers received.
    pub deliveries: usize,
    /// Pongs sent in answer to the nodes' pings.
    pub pongs: u64,
    /// How connections ended: a close code (`"3010"`), or `"none"` when
    /// one broke or was ended without a code.
    pub closes: BTreeMap<String, usize>,
}

/// Share of time in which publishes succeeded.
///
/// The run is cut into buckets of [`BUCKET_MS`](super::BUCKET_MS). A
/// bucket is *attempted* when some publish was in flight during it (from its invoke to its
/// completion), and *available* when some publish was acknowledged in it
/// (its completion falls in the bucket).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Availability {
    /// The bucket width.
    pub bucket_ms: u64,
    /// Buckets with a publish in flight.
    pub buckets_attempted: u64,
    /// Attempted buckets with an acknowledgement.
    pub buckets_available: u64,
    /// `buckets_available / buckets_attempted`; `None` when nothing was
    /// attempted.
    pub ratio: Option<f64>,
    /// The longest run of consecutive attempted buckets without an
    /// acknowledgement, in ms.
    pub longest_outage_ms: u64,
}

/// Recovery after the faults of one kind: for each fault, the time from
/// its start to the completion of the first acknowledged publish sent at
/// or after its start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryStats {
    /// Faults of this kind.
    pub faults: usize,
    /// Faults followed by an acknowledged publish.
    pub recovered: usize,
    /// The shortest recovery, in ms.
    pub min_ms: Option<u64>,
    /// The median recovery (the mean of the two middle ones, rounded down,
    /// for an even count), in ms.
    pub median_ms: Option<u64>,
    /// The longest recovery, in ms.
    pub max_ms: Option<u64>,
}

/// How a run was configured, as the runner records it in its report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSettings {
    /// The schedule's seed.
    pub seed: u64,
    /// How long clients ran and faults were injected.
    pub duration_ms: u64,
    /// How many nodes.
    pub nodes: usize,
    /// The fault kinds the schedule could draw from (empty: none).
    pub faults: Vec<String>,
    /// What every node got as `HERALD_FAULT_SWITCHES` (empty: nothing).
    pub fault_switches: String,
}

/// The checker's verdict on a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// True when no guarantee was broken.
    pub valid: bool,
    /// The run's settings, filled in by the runner
    /// ([`check`](super::check) does not know them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<RunSettings>,
    /// What the run contained.
    pub counts: Counts,
    /// Publish availability.
    pub availability: Availability,
    /// Recovery times per fault kind.
    pub recovery: BTreeMap<String, RecoveryStats>,
    /// Number of violations per kind.
    pub violations_by_kind: BTreeMap<String, usize>,
    /// Every violation found.
    pub violations: Vec<Violation>,
}

impl Report {
    /// The violations of one kind (as named by [`Violation::kind`]).
    pub fn violations_of(&self, kind: &str) -> Vec<&Violation> {
        self.violations
            .iter()
            .filter(|v| v.kind() == kind)
            .collect()
    }
}

/// How many violations [`Report`]'s `Display` lists one by one.
const SHOWN_VIOLATIONS: usize = 20;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counts;
        if self.valid {
            writeln!(f, "verdict       VALID")?;
        } else {
            writeln!(
                f,
                "verdict       INVALID ({} violations)",
                self.violations.len()
            )?;
        }
        if let Some(settings) = &self.settings {
            writeln!(
                f,
                "settings      seed {}, {} nodes, {} ms",
                settings.seed, settings.nodes, settings.duration_ms
            )?;
            let kinds = if settings.faults.is_empty() {
                "none".to_owned()
            } else {
                settings.faults.join(",")
            };
            writeln!(f, "fault kinds   {kinds}")?;
            if !settings.fault_switches.is_empty() {
                writeln!(f, "switches      {}", settings.fault_switches)?;
            }
        }
        writeln!(f, "run           {} ms", c.run_ms)?;
        writeln!(
            f,
            "publishes     {} ({} messages): acked {}, failed {}, indeterminate {}",
            c.publishes, c.messages, c.acked, c.failed, c.indeterminate
        )?;
        writeln!(
            f,
            "stored        {} messages in {} channels",
            c.stored, c.channels
        )?;
        writeln!(
            f,
            "subscribers   {} connections, {} deliveries",
            c.subscribes, c.deliveries
        )?;
        let acquisitions = c
            .lease_acquisitions
            .map_or_else(|| "unknown".to_owned(), |n| n.to_string());
        writeln!(
            f,
            "faults        {}, takeovers seen {}, lease acquisitions {}",
            c.faults, c.takeovers, acquisitions
        )?;
        if c.truncations > 0 {
            writeln!(
                f,
                "truncations   {} announced to subscribers",
                c.truncations
            )?;
        }
        let z = &c.centrifugo;
        if z.connections > 0 || z.subscribes > 0 {
            writeln!(
                f,
                "centrifugo    {} connections, {} subscribes ({} first, {} recovered with {} \
                 publications, {} not recovered), {} history reloads, {} deliveries, {} pongs",
                z.connections,
                z.subscribes,
                z.first_subscribes,
                z.recovered,
                z.recovered_publications,
                z.not_recovered,
                z.history_reloads,
                z.deliveries,
                z.pongs
            )?;
            let closes: Vec<String> = z
                .closes
                .iter()
                .map(|(code, n)| format!("{code}: {n}"))
                .collect();
            writeln!(f, "  closed by   {}", closes.join(", "))?;
        }
        if c.lease_observations > 0 {
            writeln!(
                f,
                "lease         {} changes seen, {} tokens",
                c.lease_observations, c.lease_tokens
            )?;
        }
        let a = &self.availability;
        match a.ratio {
            Some(ratio) => writeln!(
                f,
                "availability  {:.1}% ({} of {} buckets of {} ms; longest outage {} ms)",
                ratio * 100.0,
                a.buckets_available,
                a.buckets_attempted,
                a.bucket_ms,
                a.longest_outage_ms
            )?,
            None => writeln!(f, "availability  n/a (no publishes)")?,
        }
        if !self.recovery.is_empty() {
            writeln!(
                f,
                "{:<20} {:>6} {:>9} {:>8} {:>8} {:>8}",
                "recovery (ms)", "faults", "recovered", "min", "median", "max"
            )?;
            let ms = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
            for (kind, s) in &self.recovery {
                writeln!(
                    f,
                    "  {:<18} {:>6} {:>9} {:>8} {:>8} {:>8}",
                    kind,
                    s.faults,
                    s.recovered,
                    ms(s.min_ms),
                    ms(s.median_ms),
                    ms(s.max_ms)
                )?;
            }
        }
        if !self.violations.is_empty() {
            writeln!(f, "violations")?;
            for (kind, n) in &self.violations_by_kind {
                writeln!(f, "  {kind:<28} {n:>6}")?;
            }
            for v in self.violations.iter().take(SHOWN_VIOLATIONS) {
                writeln!(f, "  - {v}")?;
            }
            if self.violations.len() > SHOWN_VIOLATIONS {
                writeln!(
                    f,
                    "  ... and {} more",
                    self.violations.len() - SHOWN_VIOLATIONS
                )?;
            }
        }
        Ok(())
    }
}

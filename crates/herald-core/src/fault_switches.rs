//! Fault switches: **test-only** switches that each break one of Herald's
//! protections on purpose, so that a fault-injection checker can be shown
//! to catch a real bug.
//!
//! They exist only in a build with the cargo feature `fault-switches`
//! (`cargo build -p herald --features fault-switches`). Such a build reads
//! the environment variable [`ENV_VAR`] (`HERALD_FAULT_SWITCHES`) once, a
//! comma-separated list of switch names such as
//! `skip_fencing_check,drop_notify`, and [`enabled`] says whether a switch
//! is on. In a build without the feature, [`enabled`] always returns
//! `false` (it is inlined, so the broken code paths behind it are dead
//! code), and [`init`] refuses a non-empty `HERALD_FAULT_SWITCHES`, so that
//! a test run never believes a fault is injected when it is not.
//!
//! Never ship a build with this feature: every switch turned on loses or
//! misreports acknowledged messages, or lets two nodes write at once.
//!
//! Reading an environment variable is the one exception to this crate's "no
//! I/O" rule: [`init`] reads it once at start-up in every build (to refuse
//! it where the switches are not compiled in), and with the feature on
//! [`enabled`] reads it once per process.

use std::fmt;
use std::str::FromStr;

/// The environment variable that lists the active fault switches,
/// comma-separated (whitespace around names and empty items are ignored).
pub const ENV_VAR: &str = "HERALD_FAULT_SWITCHES";

/// One protection that a fault-injection test can break. **Test-only**:
/// a switch has an effect only in a build with the cargo feature
/// `fault-switches` and only when named in [`ENV_VAR`].
///
/// This is the one place that explains what each switch does and what it
/// breaks; the code that acts on a switch, the crate docs,
/// `ARCHITECTURE.md` and `docs/testing.md` name it and point here. Each
/// variant says where it acts.
///
/// Names (as written in [`ENV_VAR`], in logs and by [`FaultSwitch::as_str`])
/// are the variants' names in snake_case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultSwitch {
    /// `skip_fencing_check`: every PostgreSQL fenced write (an append, a
    /// trim, the record of a deletion) no longer locks the lease row `FOR
    /// KEY SHARE` and no longer checks holder, token and expiry, neither
    /// before it writes nor as its decision to commit. It still takes
    /// every other lock it takes (the lease's advisory lock for appends
    /// and deletions, the channel's row for a trim), and an append reads
    /// its commit time from the database clock. Removes the fencing that
    /// keeps a node which lost the lease from writing. Acts on PostgreSQL
    /// only: SQLite's fenced writes are unchanged.
    ///
    /// Acts in `herald-storage`, `postgres/ops.rs` (`fenced`, the prelude
    /// every fenced write runs).
    SkipFencingCheck,
    /// `renew_expired`: a PostgreSQL renewal keeps its holder and token
    /// guard but drops its "not yet expired" guard, so it extends a lease
    /// that has expired (and was not taken over yet). Removes the rule that
    /// an expired lease is lost, not extended. Acts on PostgreSQL only.
    ///
    /// Acts in `herald-storage`, `postgres/renewal.rs`
    /// (`EXTEND_EXPIRED_SQL`).
    RenewExpired,
    /// `drop_notify`: a PostgreSQL fenced write sends no change notice, and
    /// a standby that receives commit signals no longer polls for changes
    /// besides them (its safety poll): it polls only at start, when it
    /// stops being holder, and at each signal, not at updates of the lease
    /// state that leave it a standby (they come about once per acquire
    /// attempt). Removes the standby's way of learning of new commits:
    /// subscribers on standbys stall.
    ///
    /// Acts in `herald-storage`, `postgres/ops.rs` (`append` and
    /// `record_deletion`: the notices), and in `herald-server`,
    /// `standby_feed.rs` (the polls).
    DropNotify,
    /// `ack_before_commit`: the server's writer answers every publish of a
    /// batch with a predicted offset *before* it appends the batch (the
    /// channel's head + 1, + 2, ... as the writer last knew it, with the
    /// node's clock as publication time), and the answers stay sent when
    /// the append then fails, or finds a message to be a duplicate.
    /// Removes the rule that a publish is acknowledged only after its
    /// commit: acknowledged messages are lost, or acknowledged with a wrong
    /// offset.
    ///
    /// Acts in `herald-server`, `writer/fault.rs`.
    AckBeforeCommit,
    /// `zombie_holder`: the lease supervisor never gives up the holder role
    /// by itself: no safety deadline (`LeaseHandle::writable_lease` no
    /// longer checks it), no watchdog stop, and failed renewals and "lease
    /// lost" answers (from a renewal or a fenced write) are logged and
    /// ignored; it keeps renewing every renew interval. Models a holder
    /// whose clock and scheduler failed; the database's fencing check alone
    /// must then refuse its writes. A drain still releases the lease and
    /// exits.
    ///
    /// Acts in `herald-lease`, `supervisor.rs` and `state.rs`.
    ZombieHolder,
}

impl FaultSwitch {
    /// Every switch, in declaration order.
    pub const ALL: [FaultSwitch; 5] = [
        Self::SkipFencingCheck,
        Self::RenewExpired,
        Self::DropNotify,
        Self::AckBeforeCommit,
        Self::ZombieHolder,
    ];

    /// The switch's name as written in [`ENV_VAR`] and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SkipFencingCheck => "skip_fencing_check",
            Self::RenewExpired => "renew_expired",
            Self::DropNotify => "drop_notify",
            Self::AckBeforeCommit => "ack_before_commit",
            Self::ZombieHolder => "zombie_holder",
        }
    }
}

impl fmt::Display for FaultSwitch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FaultSwitch {
    type Err = FaultSwitchError;

    /// Parses one switch name (exact, snake_case).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|switch| switch.as_str() == s)
            .ok_or_else(|| FaultSwitchError::Unknown(s.to_owned()))
    }
}

/// Why [`ENV_VAR`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultSwitchError {
    /// A name in the list is not a [`FaultSwitch`].
    #[error("{ENV_VAR}: unknown fault switch {0:?}; known are {known}", known = known_names())]
    Unknown(String),
    /// The variable is not valid UTF-8.
    #[error("{ENV_VAR} is not valid UTF-8")]
    NotUnicode,
    /// The variable names switches but this build has none (it was built
    /// without the cargo feature `fault-switches`).
    #[error(
        "{ENV_VAR} is set, but this build has no fault switches; build with the cargo feature \
         fault-switches"
    )]
    NotCompiledIn,
}

/// The names of every switch, comma-separated.
fn known_names() -> String {
    FaultSwitch::ALL.map(FaultSwitch::as_str).join(", ")
}

/// Parses a comma-separated list of switch names. Whitespace around names
/// and empty items are ignored; a switch named twice counts once. The
/// result is in the order of first mention.
///
/// # Errors
/// [`FaultSwitchError::Unknown`] naming the first unknown name.
pub fn parse(list: &str) -> Result<Vec<FaultSwitch>, FaultSwitchError> {
    let mut switches = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let switch = name.parse()?;
        if !switches.contains(&switch) {
            switches.push(switch);
        }
    }
    Ok(switches)
}

#[cfg(feature = "fault-switches")]
mod active {
    use std::sync::OnceLock;

    use super::{parse, FaultSwitch, FaultSwitchError, ENV_VAR};

    static SWITCHES: OnceLock<Result<Vec<FaultSwitch>, FaultSwitchError>> = OnceLock::new();

    /// The switches named in the environment, read on first use.
    pub(super) fn switches() -> &'static Result<Vec<FaultSwitch>, FaultSwitchError> {
        SWITCHES.get_or_init(|| match std::env::var(ENV_VAR) {
            Ok(list) => parse(&list),
            Err(std::env::VarError::NotPresent) => Ok(Vec::new()),
            Err(std::env::VarError::NotUnicode(_)) => Err(FaultSwitchError::NotUnicode),
        })
    }
}

/// `true` when `switch` is active. **Test-only** (see the module docs).
///
/// With the cargo feature `fault-switches`, reads [`ENV_VAR`] once (on the
/// first call of this or [`init`]); an invalid list enables nothing (call
/// [`init`] at start-up to refuse it).
#[cfg(feature = "fault-switches")]
pub fn enabled(switch: FaultSwitch) -> bool {
    active::switches()
        .as_ref()
        .is_ok_and(|list| list.contains(&switch))
}

/// `true` when `switch` is active. Always `false`: this build has no fault
/// switches (it was built without the cargo feature `fault-switches`).
#[cfg(not(feature = "fault-switches"))]
#[inline]
pub fn enabled(switch: FaultSwitch) -> bool {
    let _ = switch;
    false
}

/// Validates [`ENV_VAR`] at start-up and returns the active switches (empty
/// when it is unset or empty). **Test-only** (see the module docs).
///
/// # Errors
/// With the cargo feature `fault-switches`: [`FaultSwitchError::Unknown`]
/// naming an unknown switch, [`FaultSwitchError::NotUnicode`]. Without it:
/// [`FaultSwitchError::NotCompiledIn`] when the variable is set and not
/// empty, so that a test never runs a build that ignores its switches.
#[cfg(feature = "fault-switches")]
pub fn init() -> Result<Vec<FaultSwitch>, FaultSwitchError> {
    active::switches().clone()
}

/// Validates [`ENV_VAR`] at start-up and returns the active switches (empty
/// when it is unset or empty). **Test-only** (see the module docs).
///
/// # Errors
/// With the cargo feature `fault-switches`: [`FaultSwitchError::Unknown`]
/// naming an unknown switch, [`FaultSwitchError::NotUnicode`]. Without it:
/// [`FaultSwitchError::NotCompiledIn`] when the variable is set and not
/// empty, so that a test never runs a build that ignores its switches.
#[cfg(not(feature = "fault-switches"))]
pub fn init() -> Result<Vec<FaultSwitch>, FaultSwitchError> {
    match std::env::var_os(ENV_VAR) {
        Some(list) if !list.to_string_lossy().trim().is_empty() => {
            Err(FaultSwitchError::NotCompiledIn)
        }
        _ => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for switch in FaultSwitch::ALL {
            assert_eq!(switch.as_str().parse::<FaultSwitch>(), Ok(switch));
            assert_eq!(switch.to_string(), switch.as_str());
        }
    }

    #[test]
    fn lists_are_parsed_leniently_but_names_strictly() {
        assert_eq!(parse(""), Ok(vec![]));
        assert_eq!(parse(" , "), Ok(vec![]));
        assert_eq!(
            parse("drop_notify, zombie_holder,drop_notify,"),
            Ok(vec![FaultSwitch::DropNotify, FaultSwitch::ZombieHolder])
        );
        assert_eq!(
            parse("drop_notify,Drop_Notify"),
            Err(FaultSwitchError::Unknown("Drop_Notify".to_owned()))
        );
        let e = parse("skip_fencing").unwrap_err();
        assert!(e.to_string().contains("\"skip_fencing\""), "{e}");
    }
}

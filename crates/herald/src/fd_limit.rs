//! The limit on open file descriptors (`RLIMIT_NOFILE`) of `herald serve`.
//!
//! Every client connection (SSE, WebSocket, long poll, HTTP streaming) holds
//! one descriptor for as long as it is open, besides the listener, the
//! database files or connections and the log. The soft limit many systems
//! start a service with is 1024 (systemd's default `LimitNOFILE=1024:524288`,
//! systemd.exec(5)), which caps a node at about a thousand clients; over it,
//! `accept` fails with `EMFILE` ("Too many open files"). The hard limit is
//! what an unprivileged process may raise its soft limit to (setrlimit(2)),
//! so at start the soft limit is raised to the hard one, as Go's runtime
//! (since Go 1.19) and nginx (`worker_rlimit_nofile`) do.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use tracing::{info, warn};

/// Descriptors a node uses besides client connections: the listener, the
/// SQLite files or the PostgreSQL renewal connection, the log, TLS files
/// read on reload, the runtime's own (epoll, eventfd), with room to spare.
pub(crate) const RESERVED: u64 = 64;

/// Below this limit the node logs a warning even when the configured
/// connection limits fit: a few thousand concurrent clients is an ordinary
/// load for one node (docs/performance.md).
pub(crate) const RECOMMENDED: u64 = 4096;

/// Linux's default ceiling of any process's limit (`fs.nr_open`,
/// proc_sys_fs(5)), used when the hard limit is unlimited and
/// `/proc/sys/fs/nr_open` cannot be read: a soft limit of "unlimited" is
/// refused with `EPERM`.
const NR_OPEN_DEFAULT: u64 = 1_048_576;

/// The open file limit before and after [`raise`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FdLimit {
    /// The soft limit the process was started with, in descriptors
    /// (`None`: unlimited).
    pub(crate) at_start: Option<u64>,
    /// The soft limit in force now, in descriptors (`None`: unlimited).
    pub(crate) soft: Option<u64>,
    /// The hard limit, in descriptors (`None`: unlimited).
    pub(crate) hard: Option<u64>,
    /// Why raising the soft limit failed, when it did.
    pub(crate) raise_error: Option<String>,
}

impl FdLimit {
    /// The soft limit as a number (unlimited counts as `u64::MAX`).
    fn soft_count(&self) -> u64 {
        self.soft.unwrap_or(u64::MAX)
    }
}

/// Raises the soft `RLIMIT_NOFILE` of this process to its hard limit (or,
/// when the hard limit is unlimited, to `fs.nr_open`) and returns the
/// limits before and after. Never fails: a refused raise is reported in
/// [`FdLimit::raise_error`] and the limit stays as it was.
pub(crate) fn raise() -> FdLimit {
    let start = getrlimit(Resource::Nofile);
    let target = start.maximum.unwrap_or_else(nr_open);
    let mut limit = FdLimit {
        at_start: start.current,
        soft: start.current,
        hard: start.maximum,
        raise_error: None,
    };
    if start.current.is_some_and(|soft| soft < target) {
        match setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(target),
                maximum: start.maximum,
            },
        ) {
            Ok(()) => limit.soft = getrlimit(Resource::Nofile).current,
            Err(e) => limit.raise_error = Some(std::io::Error::from(e).to_string()),
        }
    }
    limit
}

/// Linux's ceiling on a process's open file limit (`/proc/sys/fs/nr_open`),
/// or its default where that cannot be read.
fn nr_open() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(NR_OPEN_DEFAULT)
}

/// The limit a node with these settings should have, in descriptors: one
/// client address may hold `max_connections_per_ip` connections, the
/// PostgreSQL pool `pool_size` more (0 with SQLite), plus [`RESERVED`]; and
/// at least [`RECOMMENDED`].
pub(crate) fn wanted(max_connections_per_ip: usize, pool_size: usize) -> u64 {
    let configured = u64::try_from(max_connections_per_ip.saturating_add(pool_size))
        .unwrap_or(u64::MAX)
        .saturating_add(RESERVED);
    configured.max(RECOMMENDED)
}

/// Logs the limit in force (INFO `open file limit`, with `nofile_soft`,
/// `nofile_hard` and `nofile_at_start`, each a number of descriptors or
/// `unlimited`), and a WARN when the raise was refused or the limit is
/// below `wanted` (see [`wanted`]).
pub(crate) fn log(limit: &FdLimit, wanted: u64) {
    let shown =
        |value: Option<u64>| value.map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
    info!(
        nofile_soft = %shown(limit.soft),
        nofile_hard = %shown(limit.hard),
        nofile_at_start = %shown(limit.at_start),
        "open file limit"
    );
    if let Some(error) = &limit.raise_error {
        warn!(
            nofile_soft = %shown(limit.soft),
            nofile_hard = %shown(limit.hard),
            error = %error,
            "raising the open file limit to its hard limit failed"
        );
    }
    if limit.soft_count() < wanted {
        warn!(
            nofile_soft = %shown(limit.soft),
            nofile_hard = %shown(limit.hard),
            nofile_wanted = wanted,
            clients_at_most = limit.soft_count().saturating_sub(RESERVED),
            "the open file limit is low: each client connection holds a descriptor, and \
             connections over the limit fail with `Too many open files`; raise the hard limit \
             (systemd LimitNOFILE=, docker run --ulimit nofile=, ulimit -Hn)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wanted_limit_covers_one_address_and_the_pool_and_is_at_least_the_recommendation() {
        assert_eq!(wanted(256, 10), RECOMMENDED);
        assert_eq!(wanted(10_000, 10), 10_000 + 10 + RESERVED);
        assert_eq!(wanted(usize::MAX, 10), u64::MAX);
    }

    #[test]
    fn raising_leaves_the_soft_limit_at_the_hard_one() {
        let limit = raise();
        assert_eq!(limit.raise_error, None, "{limit:?}");
        let now = getrlimit(Resource::Nofile);
        assert_eq!(limit.soft, now.current);
        match now.maximum {
            Some(hard) => assert_eq!(now.current, Some(hard)),
            None => assert_eq!(now.current, Some(nr_open())),
        }
    }
}

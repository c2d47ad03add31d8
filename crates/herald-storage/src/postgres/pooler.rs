//! The start-up check for connection poolers that Herald cannot work
//! through.
//!
//! Herald needs every connection it opens to be one server session for
//! the connection's whole life: its session settings (`statement_timeout`,
//! `idle_in_transaction_session_timeout`, `client_connection_check_interval`,
//! the liveness connection's TCP settings) are sent once, in the start-up
//! parameter `options`; the liveness connection's session-level advisory
//! lock must end exactly when the node's session ends; the migration lock
//! is a session lock too; and the driver prepares statements once per
//! connection. A pooler in transaction mode (PgBouncer's
//! `pool_mode = transaction`, and `statement` likewise) hands a client
//! connection a server connection per transaction, so none of that holds:
//! session locks of different nodes land on one pooled server session and
//! outlive both, a live holder looks gone, prepared statements collide
//! (PgBouncer documentation, "Features", the table of pool modes:
//! <https://www.pgbouncer.org/features.html>). PgBouncer also refuses the
//! parameter `options` (`unsupported startup parameter: options`) or, with
//! `ignore_startup_parameters = options`, drops it silently, in every pool
//! mode (<https://www.pgbouncer.org/config.html>).
//!
//! [`check`] runs on the first connection of a node, before anything else
//! and with the simple query protocol only (no prepared statement, which a
//! transaction pooler would lose between transactions). Each statement runs
//! in a transaction of its own:
//! 1. on that connection, A: its backend pid (`pg_backend_pid()`), the
//!    `lock_timeout` it sent in `options`, and a session setting made with
//!    `set_config(..., false)` (a random marker);
//! 2. on A again: the same three;
//! 3. on a second connection, B: `BEGIN` and its backend pid, which keeps
//!    B's server session inside a transaction; a pooler that reuses the
//!    server connection released last (PgBouncer's default,
//!    `server_round_robin = 0`) hands B the one A just used;
//! 4. on A again while B's transaction is open, then B commits (B's
//!    `COMMIT` is sent together with A's statement, so a pooler with a
//!    single server connection cannot make the check wait forever).
//!
//! Then [`judge`] decides: a changed backend pid on A, B's pid equal to
//! one of A's, a lost marker or a `lock_timeout` other than the one sent
//! means that the node cannot run through this connection path, and
//! [`super::PostgresStorage::connect`] refuses to start with
//! [`Error::UnsupportedPooler`]. On a direct connection (or through a pooler
//! in session mode that passes `options` on) each connection is its own
//! session and the check passes.

use std::time::Duration;

use tokio_postgres::{Client, Config, SimpleQueryMessage};

use super::session::open_connection;
use crate::error::{Error, PoolerEvidence, Result};

/// The custom session setting (a placeholder, PostgreSQL documentation,
/// "Customized Options") that step 1 sets and later steps read back.
const MARKER_SETTING: &str = "herald.pooler_check";

/// What one statement on connection A saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seen {
    /// `pg_backend_pid()`.
    pub(super) pid: i32,
    /// `pg_settings.setting` of `lock_timeout` (in ms, e.g. `"60000"`).
    pub(super) lock_timeout: String,
    /// The value of [`MARKER_SETTING`]; `None` when the session has none.
    pub(super) marker: Option<String>,
}

/// Runs the check on `a`, a connection made with `config` (whose
/// `options` set `lock_timeout` to `sent_lock_timeout_ms`), opening one more
/// connection with `config` for step 3. The whole check is bounded by
/// `limit`.
///
/// # Errors
/// [`Error::UnsupportedPooler`] when the check finds a pooler Herald cannot
/// work through (also when the second connection is refused for its
/// `options`); [`Error::Unavailable`] when it cannot finish within `limit`
/// or the second connection cannot be opened.
pub(super) async fn check(
    a: &Client,
    config: &Config,
    sent_lock_timeout_ms: u128,
    limit: Duration,
) -> Result<()> {
    let marker = format!("{:016x}", rand::random::<u64>());
    let observed = tokio::time::timeout(limit, observe(a, config, &marker, limit))
        .await
        .map_err(|_| {
            Error::unavailable(format!(
                "the start-up session check did not finish within {} ms",
                limit.as_millis()
            ))
        })??;
    let (seen, b_pid) = observed;
    judge(&sent_lock_timeout_ms.to_string(), &marker, &seen, b_pid)
        .map_err(Error::UnsupportedPooler)
}

/// Steps 1 to 4: what A saw, three times, and B's backend pid.
async fn observe(
    a: &Client,
    config: &Config,
    marker: &str,
    limit: Duration,
) -> Result<(Vec<Seen>, i32)> {
    let set = format!(
        "SELECT pg_backend_pid(), \
         (SELECT setting FROM pg_settings WHERE name = 'lock_timeout'), \
         set_config('{MARKER_SETTING}', '{marker}', false)"
    );
    let read = format!(
        "SELECT pg_backend_pid(), \
         (SELECT setting FROM pg_settings WHERE name = 'lock_timeout'), \
         current_setting('{MARKER_SETTING}', true)"
    );
    let mut seen = vec![seen_row(a.simple_query(&set).await?)?];
    seen.push(seen_row(a.simple_query(&read).await?)?);

    let (b, task) = open_connection(config, limit).await?;
    let b_pid = first_row(b.simple_query("BEGIN; SELECT pg_backend_pid()").await?)
        .and_then(|row| pid(row.into_iter().next().flatten()))?;
    let (a_again, committed) = tokio::join!(a.simple_query(&read), b.batch_execute("COMMIT"));
    seen.push(seen_row(a_again?)?);
    committed?;
    drop(b);
    // The task ends once the client is gone.
    let _ = task.await;
    Ok((seen, b_pid))
}

/// The columns of the first row among `messages`, as text.
fn first_row(messages: Vec<SimpleQueryMessage>) -> Result<Vec<Option<String>>> {
    messages
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).map(str::to_owned))
                    .collect(),
            ),
            _ => None,
        })
        .ok_or_else(|| unexpected("no row"))
}

/// A [`Seen`] from the answer to a statement of A.
fn seen_row(messages: Vec<SimpleQueryMessage>) -> Result<Seen> {
    let mut columns = first_row(messages)?.into_iter();
    let pid = pid(columns.next().flatten())?;
    let lock_timeout = columns
        .next()
        .flatten()
        .ok_or_else(|| unexpected("no lock_timeout"))?;
    let marker = columns.next().flatten();
    Ok(Seen {
        pid,
        lock_timeout,
        marker,
    })
}

/// A backend pid from its text.
fn pid(text: Option<String>) -> Result<i32> {
    text.as_deref()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| unexpected("no backend pid"))
}

fn unexpected(what: &str) -> Error {
    Error::unavailable(format!(
        "unexpected answer to the start-up session check: {what}"
    ))
}

/// The verdict on what the check saw: `a` is what connection A's
/// statements saw, in order (the first one set `marker`), `b_pid` the
/// backend pid of connection B; `sent_lock_timeout` is the `lock_timeout`
/// both sent in `options`, as `pg_settings.setting` shows it (ms).
///
/// # Errors
/// The first evidence found, in this order: A's backend pid changed
/// ([`PoolerEvidence::BackendChanged`]), B ran in one of A's sessions
/// ([`PoolerEvidence::SharedBackend`]), the marker was gone
/// ([`PoolerEvidence::SessionStateLost`]), `lock_timeout` differs from the
/// one sent ([`PoolerEvidence::SettingsDropped`]).
pub(super) fn judge(
    sent_lock_timeout: &str,
    marker: &str,
    a: &[Seen],
    b_pid: i32,
) -> Result<(), PoolerEvidence> {
    if let Some(first) = a.first() {
        if let Some(other) = a.iter().find(|s| s.pid != first.pid) {
            return Err(PoolerEvidence::BackendChanged {
                first: first.pid,
                then: other.pid,
            });
        }
    }
    if a.iter().any(|s| s.pid == b_pid) {
        return Err(PoolerEvidence::SharedBackend { pid: b_pid });
    }
    if a.iter().any(|s| s.marker.as_deref() != Some(marker)) {
        return Err(PoolerEvidence::SessionStateLost);
    }
    if let Some(other) = a.iter().find(|s| s.lock_timeout != sent_lock_timeout) {
        return Err(PoolerEvidence::SettingsDropped {
            setting: "lock_timeout".to_owned(),
            sent: sent_lock_timeout.to_owned(),
            found: other.lock_timeout.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SENT: &str = "60000";
    const MARKER: &str = "00c0ffee00c0ffee";

    fn seen(pid: i32, lock_timeout: &str, marker: Option<&str>) -> Seen {
        Seen {
            pid,
            lock_timeout: lock_timeout.to_owned(),
            marker: marker.map(str::to_owned),
        }
    }

    #[test]
    fn a_direct_connection_passes() {
        let a = [
            seen(100, SENT, Some(MARKER)),
            seen(100, SENT, Some(MARKER)),
            seen(100, SENT, Some(MARKER)),
        ];
        assert_eq!(judge(SENT, MARKER, &a, 101), Ok(()));
    }

    /// A pooler that hands out its server connections in turn: A's second
    /// transaction runs in another session.
    #[test]
    fn a_changed_backend_is_a_transaction_pooler() {
        let a = [
            seen(100, SENT, Some(MARKER)),
            seen(200, SENT, None),
            seen(100, SENT, Some(MARKER)),
        ];
        assert_eq!(
            judge(SENT, MARKER, &a, 300),
            Err(PoolerEvidence::BackendChanged {
                first: 100,
                then: 200
            })
        );
    }

    /// A pooler that reuses the server connection released last: A keeps
    /// its session while alone, and B is handed it.
    #[test]
    fn a_session_shared_by_two_connections_is_a_transaction_pooler() {
        let a = [
            seen(100, SENT, Some(MARKER)),
            seen(100, SENT, Some(MARKER)),
            seen(100, SENT, Some(MARKER)),
        ];
        assert_eq!(
            judge(SENT, MARKER, &a, 100),
            Err(PoolerEvidence::SharedBackend { pid: 100 })
        );
    }

    /// The pid stayed (a pooler that resets the session between
    /// transactions, or that recycles pids) but the session setting did not.
    #[test]
    fn a_lost_session_setting_is_a_transaction_pooler() {
        for lost in [None, Some("")] {
            let a = [
                seen(100, SENT, Some(MARKER)),
                seen(100, SENT, lost),
                seen(100, SENT, Some(MARKER)),
            ];
            assert_eq!(
                judge(SENT, MARKER, &a, 101),
                Err(PoolerEvidence::SessionStateLost),
                "{lost:?}"
            );
        }
    }

    /// PgBouncer in session mode with `ignore_startup_parameters = options`:
    /// one session per connection, but without the settings sent.
    #[test]
    fn dropped_start_up_settings_are_refused() {
        let a = [
            seen(100, "0", Some(MARKER)),
            seen(100, "0", Some(MARKER)),
            seen(100, "0", Some(MARKER)),
        ];
        assert_eq!(
            judge(SENT, MARKER, &a, 101),
            Err(PoolerEvidence::SettingsDropped {
                setting: "lock_timeout".to_owned(),
                sent: SENT.to_owned(),
                found: "0".to_owned(),
            })
        );
    }

    #[test]
    fn the_message_says_what_was_seen_and_what_to_do() {
        let text = Error::UnsupportedPooler(PoolerEvidence::BackendChanged {
            first: 100,
            then: 200,
        })
        .to_string();
        assert!(
            text.starts_with("a transaction-pooling proxy was detected"),
            "{text}"
        );
        assert!(text.contains("backend pid 100, then 200"), "{text}");
        assert!(text.contains("connect directly to PostgreSQL"), "{text}");
        assert!(text.contains("pooler in session mode"), "{text}");
    }
}

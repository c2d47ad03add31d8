//! The audit log of admin actions: every deletion of a channel, removal
//! of a channel's history, disconnection and unsubscription of a user,
//! and a Durable Streams `PUT` that makes a channel with messages a stream,
//! is logged once, at `info` on the target `herald::audit`, with who asked
//! (`actor`: the API key's name or the token's subject, never a secret;
//! see `Principal::actor`), the action, and its channel or user, on the
//! node that received the request, after the caller's permission was
//! checked and before the action runs. A request another node forwarded
//! (`actor` `cluster`) was logged there and is not logged again.

use herald_auth::Principal;

/// The log target of the audit log, for filters such as
/// `RUST_LOG=herald::audit=info`.
pub const TARGET: &str = "herald::audit";

/// Logs the admin action `action` by `who` on `channel` or `user`.
pub fn admin_action(
    who: &Principal,
    action: &'static str,
    channel: Option<&str>,
    user: Option<&str>,
) {
    if matches!(who, Principal::Cluster) {
        return;
    }
    tracing::info!(
        target: TARGET,
        actor = %who.actor(),
        action,
        channel,
        user,
        "admin action"
    );
}

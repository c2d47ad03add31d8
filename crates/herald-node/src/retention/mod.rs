//! Retention: the policies (`policy.rs`), the holder's trimming task
//! (`trimmer.rs`), the removal of a channel's history and the deletion of a
//! channel (here). The storage does
//! the fenced, bounded removal (`herald_storage::Storage::trim`); this
//! module decides what and when. `docs/retention.md` is the operator's
//! view.

pub mod policy;
pub mod trimmer;

use herald_core::{ChannelName, Offset};
use herald_storage::{Storage, TrimLimits};

pub use policy::{duration_text, RetentionConfig, RetentionHandle, RetentionPolicy};
pub use trimmer::TrimPacing;

use crate::hub::{Hub, Notice};
use crate::node_error::HolderWrite;
use crate::node_error::{NodeError, NodeResult};
use crate::node_error::{StorageContext, StorageFailure};
use crate::role::LeaseView;

/// Removes every message of `channel` up to the head read at the start
/// (messages published while it runs survive) on this node, which must
/// be holder, in fenced transactions of [`TrimPacing::batch`] messages
/// (`Storage::trim` with `up_to`: the same removal as retention's).
/// Returns that head, which the channel keeps: its earliest offset is then
/// `head + 1`, its next message gets `head + 1`, and its epoch is
/// unchanged. Live subscriptions are not told: one that had not got every
/// removed message yet sees the gap at its next storage read and hands
/// out [`crate::subscription::Item::Truncated`], as after a retention
/// trim; one that had them all goes on. (Centrifugo's `history_remove`.)
///
/// # Errors
/// [`NodeError::NotHolder`] when this node does not hold the lease;
/// [`NodeError::LeaseLost`] when it lost it meanwhile (what was removed stays
/// removed; the head is kept); [`NodeError::Storage`] when the storage fails.
pub async fn remove_history(
    storage: &dyn Storage,
    role: &dyn LeaseView,
    trim_batch: usize,
    channel: &ChannelName,
) -> NodeResult<Offset> {
    let Some(lease) = role.writable_lease() else {
        return Err(NodeError::NotHolder {
            request: Some(HolderWrite::RemoveHistory(channel.clone())),
            holder_url: role.state().holder_url().map(str::to_owned),
        });
    };
    let page = storage
        .read(channel, Offset::MAX, 0)
        .await
        .during("read", Some(channel))?;
    let limits = TrimLimits {
        up_to: Some(page.head),
        ..TrimLimits::default()
    };
    let failed = |e: herald_storage::Error, what: &'static str| match e {
        herald_storage::Error::LeaseLost { .. } => NodeError::LeaseLost,
        e => NodeError::Storage(StorageFailure::new(what, Some(channel), e)),
    };
    loop {
        let step = trimmer::trim_step(storage, role, &lease, channel, &limits, trim_batch).await;
        match step {
            Ok(t) if t.done => break,
            Ok(_) => {}
            Err(e) => return Err(failed(e, "trim")),
        }
    }
    Ok(page.head)
}

/// Deletes `channel` on this node, which must be holder: removes its
/// history as [`remove_history`] does, then records the deletion
/// (`Storage::record_deletion`, a fenced write whose record every node
/// reads, and whose change notice, on PostgreSQL, reaches the standbys at
/// its commit) and ends this node's live subscriptions to it with a final
/// `deleted` event; each standby's feed ends its own (`standby_feed.rs`).
/// Returns the head, which the channel keeps (the next message gets
/// `head + 1`).
///
/// # Errors
/// As [`remove_history`]; the same when recording the deletion fails
/// (the messages are removed then, the deletion not recorded: a retry
/// records it).
pub async fn delete_channel(
    storage: &dyn Storage,
    role: &dyn LeaseView,
    hub: &Hub,
    trim_batch: usize,
    channel: &ChannelName,
) -> NodeResult<Offset> {
    let not_holder = |e: NodeError| match e {
        NodeError::NotHolder { holder_url, .. } => NodeError::NotHolder {
            request: Some(HolderWrite::DeleteChannel(channel.clone())),
            holder_url,
        },
        e => e,
    };
    let head = remove_history(storage, role, trim_batch, channel)
        .await
        .map_err(not_holder)?;
    let Some(lease) = role.writable_lease() else {
        return Err(NodeError::NotHolder {
            request: Some(HolderWrite::DeleteChannel(channel.clone())),
            holder_url: role.state().holder_url().map(str::to_owned),
        });
    };
    let recorded = storage.record_deletion(&lease, channel, head).await;
    if let Err(herald_storage::Error::LeaseLost { token, .. }) = &recorded {
        // As the writer and the trimming task report it.
        role.report_lease_lost(*token);
    }
    let number = recorded.map_err(|e| match e {
        herald_storage::Error::LeaseLost { .. } => NodeError::LeaseLost,
        e => NodeError::Storage(StorageFailure::new("record_deletion", Some(channel), e)),
    })?;
    hub.publish(Notice {
        channel: channel.clone(),
        head,
        messages: Vec::new(),
        deleted: Some(number),
        closed: false,
    });
    tracing::info!(channel = %channel, head, deletion = number, "channel deleted");
    Ok(head)
}

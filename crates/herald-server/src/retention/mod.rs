//! Retention: the policies (`policy.rs`), the holder's trimming task
//! (`trimmer.rs`), the removal of a channel's history and the deletion of a
//! channel (here). The storage does
//! the fenced, bounded removal (`herald_storage::Storage::trim`); this
//! module decides what and when. `docs/retention.md` is the operator's
//! view.

mod policy;
mod trimmer;

use herald_core::{ChannelName, Offset};
use herald_storage::TrimLimits;

pub use policy::{RetentionConfig, RetentionHandle, RetentionPolicy};
pub use trimmer::TrimPacing;
pub(crate) use trimmer::Trimmer;

use crate::error::{StorageContext, StorageFailure};
use crate::hub::Notice;
use crate::{AppState, Error, Result};

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
/// [`Error::NotHolder`] when this node does not hold the lease;
/// [`Error::LeaseLost`] when it lost it meanwhile (what was removed stays
/// removed; the head is kept); [`Error::Storage`] when the storage fails.
pub(crate) async fn remove_history(state: &AppState, channel: &ChannelName) -> Result<Offset> {
    let shared = &state.shared;
    let Some(lease) = shared.lease.writable_lease() else {
        return Err(Error::NotHolder {
            holder_url: shared.lease.state().holder_url().map(str::to_owned),
        });
    };
    let page = shared
        .storage
        .read(channel, Offset::MAX, 0)
        .await
        .during("read", Some(channel))?;
    let limits = TrimLimits {
        up_to: Some(page.head),
        ..TrimLimits::default()
    };
    loop {
        let step = trimmer::trim_step(
            &*shared.storage,
            &*shared.lease,
            &lease,
            channel,
            &limits,
            shared.config.trim_pacing.batch,
        )
        .await;
        match step {
            Ok(t) if t.done => break,
            Ok(_) => {}
            Err(herald_storage::Error::LeaseLost { .. }) => return Err(Error::LeaseLost),
            Err(e) => {
                return Err(Error::Storage(StorageFailure::new(
                    "trim",
                    Some(channel),
                    e,
                )))
            }
        }
    }
    Ok(page.head)
}

/// Deletes `channel` on this node, which must be holder: removes its
/// history as [`remove_history`] does, then ends this node's live
/// subscriptions to it with a final `deleted` event. Returns the head,
/// which the channel keeps (the next message gets `head + 1`).
///
/// # Errors
/// As [`remove_history`].
pub(crate) async fn delete_channel(state: &AppState, channel: &ChannelName) -> Result<Offset> {
    let head = remove_history(state, channel).await?;
    state.shared.hub.publish(Notice {
        channel: channel.clone(),
        head,
        messages: Vec::new(),
        deleted: true,
    });
    tracing::info!(channel = %channel, head, "channel deleted");
    Ok(head)
}

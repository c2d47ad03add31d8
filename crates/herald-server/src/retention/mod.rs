//! Retention: the policies (`policy.rs`), the holder's trimming task
//! (`trimmer.rs`) and the deletion of a channel (here). The storage does
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

/// Deletes `channel` on this node, which must be holder: removes every
/// message up to the head read at the start (messages published while it
/// runs survive), in transactions of [`TrimPacing::batch`] messages, then
/// records the deletion (`Storage::record_deletion`, a fenced write whose
/// record every node reads, and whose change notice, on PostgreSQL,
/// reaches the standbys at its commit) and ends this node's live
/// subscriptions to it with a final `deleted` event; each standby's feed
/// ends its own (`standby_feed.rs`). Returns the head, which the channel
/// keeps (the next message gets `head + 1`).
///
/// # Errors
/// [`Error::NotHolder`] when this node does not hold the lease;
/// [`Error::LeaseLost`] when it lost it meanwhile (what was removed stays
/// removed; the head is kept); [`Error::Storage`] when the storage fails.
pub(crate) async fn delete_channel(state: &AppState, channel: &ChannelName) -> Result<Offset> {
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
    let failed = |e: herald_storage::Error, what: &'static str| match e {
        herald_storage::Error::LeaseLost { .. } => Error::LeaseLost,
        e => Error::Storage(StorageFailure::new(what, Some(channel), e)),
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
            Err(e) => return Err(failed(e, "trim")),
        }
    }
    let recorded = shared
        .storage
        .record_deletion(&lease, channel, page.head)
        .await;
    if let Err(herald_storage::Error::LeaseLost { token, .. }) = &recorded {
        // As the writer and the trimming task report it.
        shared.lease.report_lease_lost(*token);
    }
    let number = recorded.map_err(|e| failed(e, "record_deletion"))?;
    shared.hub.publish(Notice {
        channel: channel.clone(),
        head: page.head,
        messages: Vec::new(),
        deleted: Some(number),
    });
    tracing::info!(channel = %channel, head = page.head, deletion = number, "channel deleted");
    Ok(page.head)
}

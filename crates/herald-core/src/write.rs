//! A write of the holder's writer: one entry of a group commit. A group
//! mixes a publish's messages and appends to streams (channels with
//! properties, see [`crate::stream::StreamAppend`]); the storage commits the whole
//! group in one fenced transaction and answers each entry.

use crate::message::{Appended, NewMessage};
use crate::stream::{StreamAppend, StreamAppended};

/// One entry of a group commit (`Storage::write`).
#[derive(Debug, Clone)]
pub enum WriteRequest {
    /// A message to append to its channel (a publish, or one message of a
    /// batch publish).
    Message(NewMessage),
    /// An append to a stream under the stream's guards (closure, content
    /// type, writer session sequence, `Stream-Seq`, expiry): all its
    /// messages or none, at contiguous offsets, and its closure.
    Stream(StreamAppend),
}

/// The outcome of one [`WriteRequest`], in the same position of the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The outcome of a [`WriteRequest::Message`].
    Message(Appended),
    /// The outcome of a [`WriteRequest::Stream`]: `Appended` and
    /// `Duplicate` are successes; every other answer is the append's
    /// refusal, which changed nothing while the rest of the group
    /// committed.
    Stream(StreamAppended),
}

//! What the checks read, indexed: the publish attempts borrowed from the
//! history, and the database's final state by offset and by id.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{FinalState, PublishResult, StoredMessage};

/// One publish attempt, borrowed from the history.
pub(super) struct Attempt<'a> {
    pub(super) client: &'a str,
    pub(super) channel: &'a str,
    pub(super) id: &'a str,
    pub(super) invoke_ms: u64,
    pub(super) complete_ms: u64,
    pub(super) result: &'a PublishResult,
}

/// The final state, indexed.
pub(super) struct Store<'a> {
    /// Per channel, per offset, the messages stored there (normally one).
    pub(super) by_offset: BTreeMap<&'a str, BTreeMap<u64, Vec<&'a StoredMessage>>>,
    /// Per (channel, id), the distinct offsets it is stored at, ascending.
    pub(super) by_id: BTreeMap<(&'a str, &'a str), BTreeSet<u64>>,
    /// Per channel, its final earliest offset (absent: 1).
    pub(super) earliest: &'a BTreeMap<String, u64>,
}

impl<'a> Store<'a> {
    pub(super) fn new(state: &'a FinalState) -> Self {
        let mut by_offset: BTreeMap<&str, BTreeMap<u64, Vec<&StoredMessage>>> = BTreeMap::new();
        let mut by_id: BTreeMap<(&str, &str), BTreeSet<u64>> = BTreeMap::new();
        for (channel, messages) in &state.channels {
            let offsets = by_offset.entry(channel.as_str()).or_default();
            for m in messages {
                offsets.entry(m.offset).or_default().push(m);
                by_id
                    .entry((channel.as_str(), m.id.as_str()))
                    .or_default()
                    .insert(m.offset);
            }
        }
        Store {
            by_offset,
            by_id,
            earliest: &state.earliest,
        }
    }

    /// The channel's final earliest offset: every offset below it was
    /// removed by retention.
    pub(super) fn earliest(&self, channel: &str) -> u64 {
        self.earliest.get(channel).copied().unwrap_or(1).max(1)
    }

    /// The messages stored at an offset.
    pub(super) fn at(&self, channel: &str, offset: u64) -> &[&'a StoredMessage] {
        self.by_offset
            .get(channel)
            .and_then(|offsets| offsets.get(&offset))
            .map_or(&[], Vec::as_slice)
    }

    /// The (first) id stored at an offset.
    pub(super) fn id_at(&self, channel: &str, offset: u64) -> Option<String> {
        self.at(channel, offset).first().map(|m| m.id.clone())
    }

    pub(super) fn offsets_of(&self, channel: &str, id: &str) -> Vec<u64> {
        self.by_id
            .get(&(channel, id))
            .map(|set| set.iter().copied().collect())
            .unwrap_or_default()
    }
}

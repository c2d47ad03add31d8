//! Channel epochs derived from a database's seed (schema version 9): the
//! epoch of a channel without a `channel_epochs` row, computed the same
//! way by both backends, so that reading an epoch writes nothing.

use herald_core::ChannelName;
use sha2::{Digest, Sha256};

/// The epoch of `channel` in the database whose `epoch_seed` is `seed`:
/// the first 8 bytes, as 16 lowercase hex digits, of the SHA-256 of
/// `herald-epoch`, a zero byte, the seed, a zero byte and the channel
/// name (no channel name and no seed contains a zero byte). The same on
/// every node of the database; in another database (another seed) a
/// different one but with a chance of 2^-64.
pub(crate) fn derived(seed: &str, channel: &ChannelName) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"herald-epoch\0");
    hasher.update(seed.as_bytes());
    hasher.update([0u8]);
    hasher.update(channel.as_str().as_bytes());
    let digest = hasher.finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_hex_digits_from_the_seed_and_the_name() {
        let news = ChannelName::new("news").unwrap();
        let epoch = derived("00ff", &news);
        assert_eq!(epoch.len(), 16);
        assert!(epoch
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(derived("00ff", &news), epoch);
        assert_ne!(derived("00fe", &news), epoch);
        assert_ne!(derived("00ff", &ChannelName::new("sport").unwrap()), epoch);
    }
}

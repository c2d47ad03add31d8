//! A stream's URL path and its channel: the part of the path after the
//! wing's prefix, its `/`-separated segments joined with `:`. A segment
//! holds letters, digits, `_`, `-` and `.` (the channel alphabet without
//! `:`, so that the mapping is reversible), and the first starts with a
//! letter or digit; anything else (another character, an empty segment,
//! a name over 128 bytes) is refused with 400, never mapped loosely.
//! `/ds/v1/stream/orders` is channel `v1:stream:orders`, in namespace `v1`.

use herald_core::ChannelName;

/// The channel of the stream at `path` (after the prefix, without its
/// leading `/`), or why it has none.
pub(crate) fn channel_of(path: &str) -> Result<ChannelName, String> {
    if path.is_empty() {
        return Err("the stream path is empty".to_owned());
    }
    let mut name = String::with_capacity(path.len());
    for (i, segment) in path.split('/').enumerate() {
        if segment.is_empty() {
            return Err("a stream path has no empty segment (no // and no trailing /)".to_owned());
        }
        if let Some(c) = segment
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
        {
            return Err(format!(
                "a stream path holds letters, digits, '_', '-', '.' and '/' only, not {c:?}"
            ));
        }
        if i > 0 {
            name.push(':');
        }
        name.push_str(segment);
    }
    ChannelName::new(name).map_err(|e| format!("the stream path maps to no channel: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_channels_map_both_ways() {
        let channel = channel_of("v1/stream/orders-2.x_y").unwrap();
        assert_eq!(channel.as_str(), "v1:stream:orders-2.x_y");
        // Reversible: `:` never comes from a path, so it stands for `/`.
        assert_eq!(channel.as_str().replace(':', "/"), "v1/stream/orders-2.x_y");
    }

    #[test]
    fn what_cannot_map_back_is_refused() {
        for bad in [
            "",
            "a//b",
            "a/",
            "a:b",
            "a/b c",
            "a/%2F",
            "_a",
            "a/é",
            &"x".repeat(129),
        ] {
            assert!(channel_of(bad).is_err(), "{bad:?} must be refused");
        }
    }
}

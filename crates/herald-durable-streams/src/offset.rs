//! Durable Streams offsets and cursors as Herald writes them.
//!
//! An offset is `<16 digits>_<16 digits>`: sixteen zeros, `_`, and the
//! Herald offset of the last message before it, zero-padded, so that
//! offsets sort as strings the way they sort as numbers
//! (`0000000000000000_0000000000000000` is the start of every stream).
//! `-1` means the start, `now` the tail. An offset whose first part is
//! not zero is beyond every stream's tail.

use herald_core::Offset;

/// Where a read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadFrom {
    /// `-1` or no offset: the stream's first stored message.
    Start,
    /// `now`: the tail (no stored message).
    Now,
    /// After this Herald offset.
    After(Offset),
}

/// The offset string of the position after Herald offset `offset`.
pub(crate) fn format(offset: Offset) -> String {
    format!("{:016}_{:016}", 0, offset)
}

/// Parses an `offset` query value.
///
/// # Errors
/// A message for the client: the value is neither `-1`, `now` nor
/// `<digits>_<digits>`.
pub(crate) fn parse(value: &str) -> Result<ReadFrom, String> {
    match value {
        "-1" => return Ok(ReadFrom::Start),
        "now" => return Ok(ReadFrom::Now),
        _ => {}
    }
    let bad = || format!("offset {value:?} is not -1, now, or an offset this server gave out");
    let (high, low) = value.split_once('_').ok_or_else(bad)?;
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(high) || !digits(low) {
        return Err(bad());
    }
    let high: u128 = high.parse().map_err(|_| bad())?;
    let low: u128 = low.parse().map_err(|_| bad())?;
    if high > 0 || low > u128::from(Offset::MAX) {
        return Ok(ReadFrom::After(Offset::MAX));
    }
    Ok(ReadFrom::After(low as Offset))
}

/// Milliseconds since the Unix epoch of 2024-10-09T00:00:00Z, where the
/// cursor's 20-second intervals are counted from (PROTOCOL.md, "Caching
/// and collapsing").
const CURSOR_EPOCH_MS: i64 = 1_728_432_000_000;

/// The `Stream-Cursor` of a live read at `now_ms`: the number of the
/// current 20-second interval, or, when the client's `sent` cursor is not
/// below it, a number above the client's (so that a cache keyed on the
/// cursor never answers the same request twice), moved by 1 to 180.
pub(crate) fn cursor(now_ms: i64, sent: Option<&str>) -> String {
    let interval = (now_ms - CURSOR_EPOCH_MS).max(0) / 20_000;
    match sent.and_then(|s| s.parse::<i64>().ok()) {
        Some(sent) if sent >= interval => {
            let step = 1 + (now_ms.rem_euclid(180));
            sent.saturating_add(step).to_string()
        }
        _ => interval.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_sort_as_strings_as_they_sort_as_numbers() {
        assert_eq!(format(0), "0000000000000000_0000000000000000");
        assert!(format(9) < format(10));
        assert_eq!(parse(&format(42)), Ok(ReadFrom::After(42)));
        assert_eq!(parse("-1"), Ok(ReadFrom::Start));
        assert_eq!(parse("now"), Ok(ReadFrom::Now));
        assert_eq!(
            parse("9999999999999999_9999999999999999"),
            Ok(ReadFrom::After(Offset::MAX))
        );
    }

    #[test]
    fn malformed_offsets_are_refused() {
        for bad in [
            "", "0,1", "0 1", "_1", "1_", "a_1", "-2", "../1", "1_1_1", "0_\n1",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn a_cursor_sent_back_gets_a_larger_one() {
        let now = CURSOR_EPOCH_MS + 20_000 * 7 + 5;
        assert_eq!(cursor(now, None), "7");
        assert_eq!(cursor(now, Some("3")), "7");
        let next: i64 = cursor(now, Some("7")).parse().unwrap();
        assert!(next > 7 && next <= 7 + 180);
        assert_eq!(cursor(now, Some("junk")), "7");
    }
}

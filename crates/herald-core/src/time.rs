use std::time::{Duration, UNIX_EPOCH};

/// Formats milliseconds since the Unix epoch as an RFC 3339 UTC timestamp
/// with millisecond precision, e.g. `2026-11-29T18:50:34.123Z`.
///
/// Negative inputs (before 1970) are clamped to the epoch: Herald never
/// stores such times.
pub fn format_rfc3339_ms(unix_ms: i64) -> String {
    let ms = u64::try_from(unix_ms).unwrap_or(0);
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_with_millis() {
        assert_eq!(format_rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_rfc3339_ms(1_795_287_034_123),
            "2026-11-21T18:50:34.123Z"
        );
    }
}

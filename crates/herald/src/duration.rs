//! The durations `herald serve`'s flags take (`--lease-ttl`,
//! `--drain-timeout`, the retention flags and others).

use std::time::Duration;

/// Parses `250ms`, `6s`, `2m` (humantime's syntax).
///
/// # Errors
/// The text is not a duration; the message shows the forms to write.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write e.g. 250ms, 6s, 2m)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_documented_forms() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("6s"), Ok(Duration::from_secs(6)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("six").is_err());
    }
}

//! The one way a config file's TOML syntax error is reported, by
//! `herald serve`, `herald config check` and the retention policy's
//! reload: its place and reason, never the offending line.

/// A TOML syntax error in `text` as its place and reason only:
/// `line 3, column 14: invalid string`. The `toml` crate's own text quotes
/// the offending line, which may hold a secret (an unquoted database URL
/// with its password, an unquoted key); this never does, so it is safe in
/// the log and in `herald config check`'s output.
pub(crate) fn syntax_error(text: &str, error: &toml::de::Error) -> String {
    // The reason's first line: the crate's messages name what was expected,
    // never the input itself.
    let reason = error.message().lines().next().unwrap_or_default().trim();
    let reason = if reason.is_empty() {
        "not valid TOML"
    } else {
        reason
    };
    match error.span() {
        Some(span) => {
            let before = text.get(..span.start).unwrap_or(text);
            let line = before.matches('\n').count() + 1;
            let column = before
                .rsplit('\n')
                .next()
                .map_or(0, |start| start.chars().count())
                + 1;
            format!("not valid TOML at line {line}, column {column}: {reason}")
        }
        None => format!("not valid TOML: {reason}"),
    }
}

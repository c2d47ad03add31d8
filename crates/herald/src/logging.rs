//! Log set-up: `tracing` records on stderr, human-readable or JSON.

use tracing_subscriber::EnvFilter;

/// How `herald serve` writes its logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// One readable line per record.
    Human,
    /// One JSON object per record, for log shippers.
    Json,
}

/// Installs the global subscriber. The level comes from `RUST_LOG`
/// (default `info`).
pub(crate) fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,refinery_core=warn"));
    // Colours only for a person at a terminal, not in files or journals.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}

/// `error` and its causes on one line, `outer: cause: ...` as anyhow's
/// `{:#}` writes them, but each cause once: the chain stops at an error
/// that already quotes its causes in its own message and also returns them
/// as its source (`herald_storage::Error`, `herald_server::StartError`).
pub(crate) fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&cause.to_string());
        if cause.is::<herald_storage::Error>() || cause.is::<herald_server::StartError>() {
            break;
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use anyhow::Context;

    use super::*;

    /// A storage error quotes its cause and also returns it as its source:
    /// the line names the cause once, as before the source was kept.
    #[test]
    fn a_storage_cause_is_printed_once() {
        let json = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let storage = herald_storage::Error::Migration {
            message: json.to_string(),
            source: Some(Box::new(json)),
        };
        let started: Result<(), _> = Err(herald_server::StartError::Storage(storage));
        let e = started.context("server failed").unwrap_err();
        assert_eq!(
            one_line(&e),
            "server failed: storage: migration failed: EOF while parsing an object at line 1 column 1"
        );
        // Any other chain is printed whole, as `{:#}` does.
        let io = std::io::Error::other("disk on fire");
        let e = anyhow::Error::new(io).context("cannot write the node id");
        assert_eq!(one_line(&e), format!("{e:#}"));
    }
}

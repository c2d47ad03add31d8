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

//! `herald serve`: runs the server (wired up separately).

use std::process::ExitCode;

/// Flags of `herald serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {}

/// Runs the server until drain or a lease stop; the exit code tells which.
pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let _ = args;
    Ok(ExitCode::SUCCESS)
}

//! `herald backup` and `herald restore`: the embedded database copied
//! while nodes serve, and put back while none runs
//! (`herald_storage::sqlite::backup`; docs/operations.md, "Backups").

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

/// Flags of `herald backup`.
#[derive(Debug, clap::Args)]
pub(crate) struct BackupArgs {
    /// The node's data directory (as `herald serve --data-dir`).
    #[arg(long, env = "HERALD_DATA_DIR", default_value = "./herald-data")]
    data_dir: PathBuf,
    /// Where to write the copy; it must not exist.
    file: PathBuf,
}

/// Flags of `herald restore`.
#[derive(Debug, clap::Args)]
pub(crate) struct RestoreArgs {
    /// The data directory to restore into; no node may run on it.
    #[arg(long, env = "HERALD_DATA_DIR", default_value = "./herald-data")]
    data_dir: PathBuf,
    /// A file written by `herald backup`.
    file: PathBuf,
}

/// Writes a consistent copy of the data directory's database to the file
/// and says what it holds (stdout).
///
/// # Errors
/// The database is missing, the file exists, or the copy failed its check.
pub(crate) fn run_backup(args: BackupArgs) -> anyhow::Result<ExitCode> {
    let summary = herald_storage::sqlite::backup::backup(&args.data_dir, &args.file)
        .with_context(|| format!("backing up {}", args.data_dir.display()))?;
    println!(
        "backed up {} to {}: schema version {}, {} channels, {} messages, {} bytes",
        args.data_dir.display(),
        args.file.display(),
        summary.schema_version,
        summary.channels,
        summary.messages,
        summary.bytes
    );
    Ok(ExitCode::SUCCESS)
}

/// Puts a backup in place while no node runs, and says what it did
/// (stdout).
///
/// # Errors
/// A node runs on the data directory, or the file is not a sound Herald
/// database.
pub(crate) fn run_restore(args: RestoreArgs) -> anyhow::Result<ExitCode> {
    herald_storage::sqlite::create_private_dir(&args.data_dir).with_context(|| {
        format!(
            "cannot create the data directory {}",
            args.data_dir.display()
        )
    })?;
    let (summary, replaced) = herald_storage::sqlite::backup::restore(&args.file, &args.data_dir)
        .with_context(|| format!("restoring {}", args.file.display()))?;
    println!(
        "restored {} into {}: schema version {}, {} channels, {} messages; new channel epochs, \
         the writer lease released",
        args.file.display(),
        args.data_dir.display(),
        summary.schema_version,
        summary.channels,
        summary.messages
    );
    if let Some(replaced) = replaced {
        println!("the database it replaced is kept as {}", replaced.display());
    }
    Ok(ExitCode::SUCCESS)
}

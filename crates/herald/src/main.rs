//! Herald's crates, bottom to top: `herald-core` (the domain, no I/O),
//! `herald-storage` (all SQL), `herald-lease` (the lease's timing),
//! `herald-node` (the core, no route), `herald-server` (HTTP: API v1,
//! Centrifugo and Durable Streams) and `herald` (the binary); `herald-auth`
//! (access control, no HTTP) stands beside them on `herald-core`.
//! `ARCHITECTURE.md` is the map.
//!
//! The `herald` binary: the server and its command-line clients.

mod auth_reload;
mod backup;
mod bench;
mod client;
mod config_check;
mod config_file;
mod duration;
mod exposure;
mod fanout;
mod fd_limit;
mod file_modes;
mod history;
mod keys;
mod logging;
mod publish;
mod retention;
mod serve;
mod status;
mod tail;
mod tls_reload;
mod token;
mod toml_syntax;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use serve::settings::{serve_command, ServeCommand};

/// Herald: durable real-time channels over HTTP, SSE and WebSocket.
#[derive(Debug, Parser)]
#[command(name = "herald", version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("HERALD_COMMIT"), ")"), about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Serve(serve::settings::ServeCommand),
    /// Publish one message; prints the server's answer JSON.
    Publish(publish::PublishArgs),
    /// Print a channel's stored messages, one JSON per line.
    History(history::HistoryArgs),
    /// Follow a channel live, one JSON per line; reconnects by itself.
    Tail(tail::TailArgs),
    /// List the channels, one JSON per line: head, earliest offset, message
    /// count and bytes stored.
    Channels(status::InfoArgs),
    /// Print the node's status.
    Status(status::InfoArgs),
    /// Ask a node whether it is ready (`GET /readyz`); exit status 0 when
    /// it answers 200, 1 otherwise: a container's health check.
    Ready(status::ReadyArgs),
    /// Load generators.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Config file tools.
    #[command(subcommand)]
    Config(config_check::ConfigCommand),
    /// API keys: `herald keys generate` prints a new one.
    #[command(subcommand)]
    Keys(keys::KeysCommand),
    /// Write a consistent copy of the embedded database (SQLite) while
    /// nodes serve.
    Backup(backup::BackupArgs),
    /// Put a `herald backup` file in place of the embedded database while
    /// no node runs on the data directory.
    Restore(backup::RestoreArgs),
    /// Client tokens: `herald token create` makes one with the config's
    /// HS256 secret, `herald token check` says whether one is accepted.
    #[command(subcommand)]
    Token(token::TokenCommand),
}

#[tokio::main]
async fn main() -> ExitCode {
    let (cli, file) = parse_command_line();
    let result = match cli.command {
        Command::Serve(ServeCommand::Serve(args)) => serve::run(*args, file).await,
        Command::Config(command) => config_check::run(command),
        Command::Publish(args) => publish::run(args).await,
        Command::History(args) => history::run(args).await,
        Command::Tail(args) => tail::run(args).await,
        Command::Channels(args) => status::run_channels(args).await,
        Command::Status(args) => status::run_status(args).await,
        Command::Ready(args) => status::run_ready(args).await,
        Command::Bench(command) => bench::run(command).await,
        Command::Keys(command) => keys::run(command),
        Command::Token(command) => token::run(command).await,
        Command::Backup(args) => backup::run_backup(args),
        Command::Restore(args) => backup::run_restore(args),
    };
    match result {
        Ok(code) => code,
        // A reader that went away (`herald history c --all | head`) is no failure.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("herald: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Parses the command line (exiting with status 2 when it is wrong, as
/// clap does). For `herald serve --config FILE`, the file's values become
/// the defaults of the flags and the command line is parsed again, so that
/// flags and `HERALD_*` variables override the file; the file's other
/// sections come back with it, or why the file was refused (`herald serve`
/// logs that as a failed start).
fn parse_command_line() -> (Cli, anyhow::Result<config_file::ConfigFile>) {
    let cli = Cli::parse();
    let Command::Serve(ServeCommand::Serve(args)) = &cli.command else {
        return (cli, Ok(config_file::ConfigFile::default()));
    };
    let Some(path) = args.config.clone() else {
        return (cli, Ok(config_file::ConfigFile::default()));
    };
    let file = match config_file::load(&path, &serve_command()) {
        Ok(file) => file,
        Err(e) => return (cli, Err(e)),
    };
    let command = Cli::command().mut_subcommand("serve", |serve| {
        config_file::with_file_defaults(serve, &file)
    });
    let matches = command.get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    (cli, Ok(file))
}

/// `true` when `e` comes from writing to a closed pipe.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_client_commands() {
        let cli = Cli::try_parse_from([
            "herald",
            "publish",
            "--server",
            "http://127.0.0.1:9",
            "orders",
            "{\"a\":1}",
            "--idempotency-key",
            "k-1",
        ])
        .unwrap();
        assert!(matches!(cli.command, Command::Publish(_)));
        assert!(Cli::try_parse_from(["herald", "publish", "bad name", "1"]).is_err());
        assert!(
            Cli::try_parse_from(["herald", "publish", "c", "1", "--idempotency-key", "a b"])
                .is_err()
        );
        assert!(Cli::try_parse_from(["herald", "history", "c", "--limit", "1001"]).is_err());
        assert!(Cli::try_parse_from(["herald", "history", "c", "--all", "--after", "5"]).is_ok());
        // A negative offset reaches Herald's own parser, which names the range.
        for command in ["history", "tail"] {
            let error = Cli::try_parse_from(["herald", command, "c", "--after", "-1"])
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("an offset is an integer from 0"),
                "{command}: {error}"
            );
        }
        assert!(Cli::try_parse_from(["herald", "tail", "c", "--server", "https://h"]).is_ok());
        assert!(Cli::try_parse_from(["herald", "tail", "c", "--server", "h:7700"]).is_err());
        assert!(Cli::try_parse_from(["herald", "bench", "publish", "--channels", "0"]).is_err());
        assert!(
            Cli::try_parse_from(["herald", "bench", "publish", "--json", "--size", "10"]).is_ok()
        );
    }
}

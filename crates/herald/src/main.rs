//! The `herald` binary: the server and its command-line clients.

mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Herald: durable real-time channels over HTTP, SSE and WebSocket.
#[derive(Debug, Parser)]
#[command(name = "herald", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server.
    Serve(serve::ServeArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(args).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("herald: {e:#}");
            ExitCode::FAILURE
        }
    }
}

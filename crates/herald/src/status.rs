//! `herald status` and `herald channels`: what a node says about itself.

use std::io::Write;
use std::process::ExitCode;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::client::{self, Api, ServerArg};

/// Flags of `herald status` and `herald channels`.
#[derive(Debug, clap::Args)]
pub(crate) struct InfoArgs {
    #[command(flatten)]
    server: ServerArg,
}

/// Runs `herald status`: prints the node's status JSON, pretty.
pub(crate) async fn run_status(args: InfoArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(
        &args.server.server,
        client::request_client(&args.server, client::REQUEST_TIMEOUT)?,
    )
    .with_credential(args.server.api_key.as_deref())?;
    let status: serde_json::Value = api.get_json("/v1/status").await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string_pretty(&status)?)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The answer of `GET /v1/channels`.
#[derive(Deserialize)]
struct ChannelList {
    /// Each `{"name","head","earliest","messages","bytes"}`, as the
    /// server wrote it.
    channels: Vec<Box<RawValue>>,
}

/// Runs `herald channels`: prints each channel's
/// `{"name","head","earliest","messages","bytes"}` as one JSON line.
pub(crate) async fn run_channels(args: InfoArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(
        &args.server.server,
        client::request_client(&args.server, client::REQUEST_TIMEOUT)?,
    )
    .with_credential(args.server.api_key.as_deref())?;
    let list: ChannelList = api.get_json("/v1/channels").await?;
    let mut out = std::io::stdout().lock();
    for channel in &list.channels {
        writeln!(out, "{}", crate::history::one_line(channel.get()))?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

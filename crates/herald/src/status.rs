//! `herald status`, `herald channels` and `herald ready`: what a node says
//! about itself.

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

/// Flags of `herald ready`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReadyArgs {
    #[command(flatten)]
    server: ServerArg,
    /// Ask whether this node holds the writer lease (`/readyz?role=holder`)
    /// instead of whether it serves.
    #[arg(long)]
    holder: bool,
}

/// How long `herald ready` waits for the answer, connecting included.
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs `herald ready`: `GET /readyz` (with `--holder`,
/// `/readyz?role=holder`; docs/operations.md) and prints the answer's body.
/// It is the health check of a container image that has no HTTP client of
/// its own.
///
/// Exit status 0 when the node answered 200, 1 on any other answer.
///
/// # Errors
/// No answer within 5 s (connection refused, timeout, TLS failure): exit
/// status 1 with the reason on stderr.
pub(crate) async fn run_ready(args: ReadyArgs) -> anyhow::Result<ExitCode> {
    let http = client::request_client(&args.server, READY_TIMEOUT)?;
    let path = if args.holder {
        "readyz?role=holder"
    } else {
        "readyz"
    };
    let url = format!(
        "{}/{path}",
        args.server.server.as_str().trim_end_matches('/')
    );
    let resp = http
        .get(&url)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("GET {url}: {e}"))?;
    let ready = resp.status() == reqwest::StatusCode::OK;
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    let mut out = std::io::stdout().lock();
    if body.is_empty() {
        writeln!(out, "{status}")?;
    } else {
        writeln!(out, "{}", body.trim_end())?;
    }
    out.flush()?;
    Ok(if ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
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

//! `herald publish`: appends one message to a channel.

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;

use anyhow::Context;
use herald_core::{ChannelName, IdempotencyKey};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::client::{self, Api, ServerArg};

/// Flags of `herald publish`.
#[derive(Debug, clap::Args)]
pub(crate) struct PublishArgs {
    #[command(flatten)]
    server: ServerArg,
    /// Channel to publish to.
    #[arg(value_parser = client::parse_channel)]
    channel: ChannelName,
    /// The message's data as one JSON value; read from stdin when absent or `-`.
    #[arg(value_name = "JSON")]
    json: Option<String>,
    /// Makes the publish idempotent: a repeated key on the same channel
    /// returns the first message's offset and adds nothing.
    #[arg(long, value_name = "KEY", value_parser = client::parse_idempotency_key)]
    idempotency_key: Option<IdempotencyKey>,
}

/// The request body of a publish.
#[derive(Serialize)]
struct PublishBody<'a> {
    data: &'a RawValue,
}

/// Why the given text is not a message's data.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DataError {
    /// Nothing but whitespace was given.
    #[error("no message given: pass one JSON value as an argument or on stdin")]
    Empty,
    /// The text is not exactly one JSON value.
    #[error("the message is not valid JSON: {reason}{hint}")]
    NotJson {
        /// serde_json's description, with line and column.
        reason: String,
        /// A suggestion when the text looks like a bare word.
        hint: &'static str,
    },
}

/// Checks that `text` is exactly one JSON value and keeps its text as is.
pub(crate) fn parse_data(text: &str) -> Result<Box<RawValue>, DataError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(DataError::Empty);
    }
    serde_json::from_str::<Box<RawValue>>(text).map_err(|e| DataError::NotJson {
        reason: e.to_string(),
        hint: if text.starts_with(['{', '[', '"']) {
            ""
        } else {
            " (to send text, quote it as a JSON string, e.g. '\"hello\"')"
        },
    })
}

/// Runs `herald publish`.
pub(crate) async fn run(args: PublishArgs) -> anyhow::Result<ExitCode> {
    let text = match args.json.as_deref() {
        Some(text) if text != "-" => text.to_owned(),
        _ => read_stdin()?,
    };
    let data = parse_data(&text)?;
    let api = Api::new(
        &args.server.server,
        client::request_client(client::REQUEST_TIMEOUT)?,
    );
    let answer: Box<RawValue> = api
        .post_json(
            &client::messages_path(&args.channel),
            &PublishBody { data: &data },
            args.idempotency_key.as_ref(),
        )
        .await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", answer.get())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Reads all of stdin, telling a person at a terminal what is expected.
fn read_stdin() -> anyhow::Result<String> {
    let mut stdin = std::io::stdin().lock();
    if stdin.is_terminal() {
        eprintln!("herald: reading the message's JSON from stdin; end it with Ctrl-D");
    }
    let mut text = String::new();
    stdin
        .read_to_string(&mut text)
        .context("cannot read the message from stdin")?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_valid_json_verbatim() {
        for ok in [
            r#"{"b":1,"a":[true,null]}"#,
            "42",
            r#""hello""#,
            "[ 1, 2 ]",
            "null",
        ] {
            assert_eq!(parse_data(ok).unwrap().get(), ok);
        }
        assert_eq!(parse_data("  {\"a\":1}\n").unwrap().get(), "{\"a\":1}");
    }

    #[test]
    fn rejects_what_is_not_one_json_value() {
        assert_eq!(parse_data(" \n").unwrap_err(), DataError::Empty);
        let err = parse_data("hello").unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("the message is not valid JSON: "),
            "{text}"
        );
        assert!(text.contains("quote it"), "{text}");
        let text = parse_data(r#"{"a":1"#).unwrap_err().to_string();
        assert!(text.contains("line 1"), "{text}");
        assert!(!text.contains("quote it"), "{text}");
        assert!(parse_data("1 2").is_err());
        assert!(parse_data("{} {}").is_err());
    }

    #[test]
    fn body_embeds_the_data_as_is() {
        let data = parse_data(r#"{"z":1,"a":2}"#).unwrap();
        let body = serde_json::to_string(&PublishBody { data: &data }).unwrap();
        assert_eq!(body, r#"{"data":{"z":1,"a":2}}"#);
    }
}

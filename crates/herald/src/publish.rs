//! `herald publish`: appends one message to a channel.

use std::collections::BTreeMap;
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
    /// The message's data as one JSON value (not the request body: the
    /// command wraps it in `{"data": ...}`); read from stdin when absent or
    /// `-`.
    #[arg(value_name = "JSON")]
    json: Option<String>,
    /// Stores the JSON as the data even when it is an object whose only
    /// key is `data` (which is otherwise refused as a likely request body).
    #[arg(long)]
    raw: bool,
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
    /// The value is exactly `{"data": <value>}`: most likely a whole
    /// request body given where the data goes.
    #[error(
        "the JSON given is {{\"data\": ...}}, a request body: herald publish takes the \
         message's data itself and wraps it in {{\"data\": ...}}; pass the inner value \
         (herald publish <channel> '{inner}'), or add --raw to store this object as the data"
    )]
    Wrapped {
        /// The inner value's text, cut for the message.
        inner: String,
    },
}

/// Longest part of the inner value quoted in [`DataError::Wrapped`], in
/// characters.
const MAX_QUOTED_INNER_CHARS: usize = 60;

/// Refuses `data` that is exactly an object with the single key `data`,
/// unless `raw`: `herald publish c '{"data":{"x":1}}'` would otherwise
/// store the wrapper itself as the message's data.
pub(crate) fn refuse_wrapped(data: &RawValue, raw: bool) -> Result<(), DataError> {
    if raw || !data.get().starts_with('{') {
        return Ok(());
    }
    let Ok(object) = serde_json::from_str::<BTreeMap<String, &RawValue>>(data.get()) else {
        return Ok(());
    };
    match (object.len(), object.get("data")) {
        (1, Some(inner)) => {
            let text = inner.get();
            let inner = match text.char_indices().nth(MAX_QUOTED_INNER_CHARS) {
                Some((end, _)) => format!("{}…", &text[..end]),
                None => text.to_owned(),
            };
            Err(DataError::Wrapped { inner })
        }
        _ => Ok(()),
    }
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
    refuse_wrapped(&data, args.raw)?;
    let api = Api::new(
        &args.server.server,
        client::request_client(&args.server, client::REQUEST_TIMEOUT)?,
    )
    .with_credential(args.server.api_key.as_deref())?;
    let (status, answer): (u16, Box<RawValue>) = api
        .post_json_status(
            &client::messages_path(&args.channel),
            &PublishBody { data: &data },
            args.idempotency_key.as_ref(),
        )
        .await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", answer.get())?;
    out.flush()?;
    if let Some(note) = duplicate_note(status, &answer) {
        eprintln!("herald: {note}");
    }
    Ok(ExitCode::SUCCESS)
}

/// What to say on stderr when the server answered 200 (the idempotency key
/// was already used on the channel, so nothing was stored).
fn duplicate_note(status: u16, answer: &RawValue) -> Option<String> {
    if status != 200 {
        return None;
    }
    let offset = serde_json::from_str::<serde_json::Value>(answer.get())
        .ok()
        .and_then(|v| v["offset"].as_u64());
    Some(match offset {
        Some(offset) => format!(
            "duplicate: already published at offset {offset}; this idempotency key was used \
             before on this channel, so nothing new was stored"
        ),
        None => "duplicate: this idempotency key was used before on this channel, so nothing \
                 new was stored"
            .to_owned(),
    })
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
    fn a_request_body_given_as_data_is_refused_unless_raw() {
        let wrapped = parse_data(r#"{"data":{"x":1}}"#).unwrap();
        let e = refuse_wrapped(&wrapped, false).unwrap_err();
        assert_eq!(
            e,
            DataError::Wrapped {
                inner: r#"{"x":1}"#.to_owned()
            }
        );
        let text = e.to_string();
        assert!(text.contains("takes the message's data itself"), "{text}");
        assert!(
            text.contains(r#"herald publish <channel> '{"x":1}'"#),
            "{text}"
        );
        assert!(text.contains("add --raw"), "{text}");
        assert!(refuse_wrapped(&wrapped, true).is_ok());
        for fine in [
            r#"{"data":1,"other":2}"#,
            r#"{"x":{"data":1}}"#,
            r#"{}"#,
            r#"[{"data":1}]"#,
            r#""data""#,
        ] {
            assert!(
                refuse_wrapped(&parse_data(fine).unwrap(), false).is_ok(),
                "{fine}"
            );
        }
        let long = format!(r#"{{"data":"{}"}}"#, "y".repeat(500));
        let DataError::Wrapped { inner } =
            refuse_wrapped(&parse_data(&long).unwrap(), false).unwrap_err()
        else {
            panic!("not Wrapped");
        };
        assert_eq!(inner.chars().count(), MAX_QUOTED_INNER_CHARS + 1);
    }

    #[test]
    fn a_200_answer_is_reported_as_a_duplicate() {
        let answer = RawValue::from_string(
            r#"{"channel":"c","offset":7,"published_at":"2026-01-01T00:00:00.000Z"}"#.to_owned(),
        )
        .unwrap();
        assert_eq!(duplicate_note(201, &answer), None);
        let note = duplicate_note(200, &answer).unwrap();
        assert!(
            note.starts_with("duplicate: already published at offset 7"),
            "{note}"
        );
    }

    #[test]
    fn body_embeds_the_data_as_is() {
        let data = parse_data(r#"{"z":1,"a":2}"#).unwrap();
        let body = serde_json::to_string(&PublishBody { data: &data }).unwrap();
        assert_eq!(body, r#"{"data":{"z":1,"a":2}}"#);
    }
}

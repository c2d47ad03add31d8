//! `herald history`: prints a channel's stored messages as JSON Lines.

use std::borrow::Cow;
use std::future::Future;
use std::io::Write;
use std::process::ExitCode;

use herald_core::ChannelName;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::client::{self, Api, ClientError, ServerArg};

/// Most messages one history request may ask for.
pub(crate) const MAX_LIMIT: u32 = 1000;

/// Flags of `herald history`.
#[derive(Debug, clap::Args)]
pub(crate) struct HistoryArgs {
    #[command(flatten)]
    server: ServerArg,
    /// Channel to read.
    #[arg(value_parser = client::parse_channel)]
    channel: ChannelName,
    /// Print the messages after this offset (0: from the first message).
    #[arg(long, value_name = "N", default_value_t = 0, allow_negative_numbers = true,
          value_parser = client::parse_offset)]
    after: u64,
    /// Messages per request, 1 to 1000; without it the server's default
    /// applies (1000 with `--all`).
    #[arg(long, value_name = "M", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LIMIT)))]
    limit: Option<u32>,
    /// Keep requesting pages until the channel's head as of the first answer.
    #[arg(long)]
    all: bool,
}

/// One page of a channel's history, each message kept as the server's text.
#[derive(Debug, Deserialize)]
pub(crate) struct Page {
    /// Offset of the channel's newest message.
    pub(crate) head: u64,
    /// Messages `{"offset","data","published_at"}` in offset order.
    pub(crate) messages: Vec<Box<RawValue>>,
    /// The channel's earliest stored offset (docs/api.md); absent from
    /// servers older than retention.
    #[serde(default)]
    pub(crate) earliest: Option<u64>,
    /// `after` was below `earliest - 1`: retention or a deletion removed
    /// messages that were asked for, and the page starts at `earliest`.
    #[serde(default)]
    pub(crate) truncated: bool,
}

/// The one field of a message this client needs to read.
#[derive(Deserialize)]
struct OffsetOnly {
    offset: u64,
}

/// The `offset` field of a message's JSON text.
pub(crate) fn message_offset(json: &str) -> Result<u64, serde_json::Error> {
    serde_json::from_str::<OffsetOnly>(json).map(|m| m.offset)
}

/// `json` on one line: raw line breaks can only be whitespace between JSON
/// tokens, so they become spaces.
pub(crate) fn one_line(json: &str) -> Cow<'_, str> {
    if json.contains(['\n', '\r']) {
        Cow::Owned(json.replace(['\n', '\r'], " "))
    } else {
        Cow::Borrowed(json)
    }
}

/// Path and query of one history request.
pub(crate) fn history_path(channel: &ChannelName, after: u64, limit: Option<u32>) -> String {
    let mut path = format!("{}?after={after}", client::messages_path(channel));
    if let Some(limit) = limit {
        path.push_str(&format!("&limit={limit}"));
    }
    path
}

/// Prints the messages after `after` as JSON Lines to `out`, fetching pages
/// with `fetch(after)`. With `all`, pages on until the head seen in the
/// first answer; stops early on an empty page. Offsets that do not move
/// forward are skipped. A page the server marks `truncated` gets one line
/// on `notes` (standard error) naming the offsets it no longer has: the
/// gap is said, never silent. Returns how many messages were printed.
pub(crate) async fn page_through<F, Fut, W, N>(
    mut fetch: F,
    after: u64,
    all: bool,
    out: &mut W,
    notes: &mut N,
) -> anyhow::Result<u64>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<Page, ClientError>>,
    W: Write,
    N: Write,
{
    let mut cursor = after;
    let mut target = None;
    let mut printed = 0;
    loop {
        let page = fetch(cursor).await?;
        let target = *target.get_or_insert(page.head);
        let page_start = cursor;
        if let (true, Some(earliest)) = (page.truncated, page.earliest) {
            if earliest > cursor + 1 {
                writeln!(
                    notes,
                    "herald history: the server no longer has offsets {} to {} (retention or a \
                     deletion removed them); continuing from {earliest}",
                    cursor + 1,
                    earliest - 1
                )?;
            }
        }
        for message in &page.messages {
            let offset = message_offset(message.get())?;
            if offset <= cursor {
                continue;
            }
            writeln!(out, "{}", one_line(message.get()))?;
            cursor = offset;
            printed += 1;
        }
        out.flush()?;
        if !all || cursor == page_start || cursor >= target {
            return Ok(printed);
        }
    }
}

/// Runs `herald history`.
pub(crate) async fn run(args: HistoryArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(
        &args.server.server,
        client::request_client(&args.server, client::REQUEST_TIMEOUT)?,
    )
    .with_credential(args.server.api_key.as_deref())?;
    let limit = match (args.limit, args.all) {
        (None, true) => Some(MAX_LIMIT),
        (limit, _) => limit,
    };
    let channel = &args.channel;
    let api = &api;
    let mut out = std::io::stdout().lock();
    page_through(
        |after| async move { api.get_json(&history_path(channel, after, limit)).await },
        args.after,
        args.all,
        &mut out,
        &mut std::io::stderr(),
    )
    .await?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page of the fake channel holding messages `1..=head`.
    fn fake_page(head: u64, after: u64, limit: u64) -> Page {
        let messages = (after + 1..=head.min(after + limit))
            .map(|o| {
                RawValue::from_string(format!(r#"{{"offset":{o},"data":{{"n":{o}}}}}"#)).unwrap()
            })
            .collect();
        Page {
            head,
            messages,
            earliest: None,
            truncated: false,
        }
    }

    async fn collect(
        fetch: impl FnMut(u64) -> std::future::Ready<Result<Page, ClientError>>,
        after: u64,
        all: bool,
    ) -> Vec<u64> {
        let mut out = Vec::new();
        let mut notes = Vec::new();
        let n = page_through(fetch, after, all, &mut out, &mut notes)
            .await
            .unwrap();
        assert!(notes.is_empty(), "{}", String::from_utf8_lossy(&notes));
        let offsets: Vec<u64> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| message_offset(l).unwrap())
            .collect();
        assert_eq!(n, offsets.len() as u64);
        offsets
    }

    #[tokio::test]
    async fn one_page_without_all() {
        let got = collect(|a| std::future::ready(Ok(fake_page(25, a, 10))), 0, false).await;
        assert_eq!(got, (1..=10).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn all_pages_until_the_head() {
        let got = collect(|a| std::future::ready(Ok(fake_page(25, a, 10))), 0, true).await;
        assert_eq!(got, (1..=25).collect::<Vec<_>>());
        let got = collect(|a| std::future::ready(Ok(fake_page(25, a, 10))), 20, true).await;
        assert_eq!(got, (21..=25).collect::<Vec<_>>());
        let got = collect(|a| std::future::ready(Ok(fake_page(25, a, 10))), 30, true).await;
        assert!(got.is_empty());
    }

    #[tokio::test]
    async fn stops_at_the_first_head_while_the_channel_grows() {
        let mut head = 15;
        let got = collect(
            |a| {
                let page = fake_page(head, a, 10);
                head += 10;
                std::future::ready(Ok(page))
            },
            0,
            true,
        )
        .await;
        assert_eq!(got, (1..=20).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn skips_repeats_and_stops_on_a_stuck_server() {
        // The server keeps answering the first page, whatever `after` is.
        let got = collect(|_| std::future::ready(Ok(fake_page(25, 0, 10))), 0, true).await;
        assert_eq!(got, (1..=10).collect::<Vec<_>>());
        // The head claims more than the server hands out.
        let got = collect(|a| std::future::ready(Ok(fake_page(5, a, 10))), 0, true).await;
        assert_eq!(got, (1..=5).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_truncated_page_is_said_on_the_notes() {
        // Offsets 1 to 4 were trimmed: the server answers from 5.
        let fetch = |a: u64| {
            let mut page = fake_page(8, a.max(4), 10);
            page.earliest = Some(5);
            page.truncated = a < 4;
            std::future::ready(Ok::<_, ClientError>(page))
        };
        let (mut out, mut notes) = (Vec::new(), Vec::new());
        let n = page_through(fetch, 1, true, &mut out, &mut notes)
            .await
            .unwrap();
        assert_eq!(n, 4);
        assert_eq!(
            String::from_utf8(notes).unwrap(),
            "herald history: the server no longer has offsets 2 to 4 (retention or a deletion \
             removed them); continuing from 5\n"
        );
    }

    #[test]
    fn builds_queries_and_lines() {
        let ch = ChannelName::new("c").unwrap();
        assert_eq!(
            history_path(&ch, 7, None),
            "/v1/channels/c/messages?after=7"
        );
        assert_eq!(
            history_path(&ch, 0, Some(1000)),
            "/v1/channels/c/messages?after=0&limit=1000"
        );
        assert_eq!(one_line("{\n  \"a\": \"x\"\r\n}"), "{   \"a\": \"x\"  }");
        assert!(matches!(one_line("{}"), Cow::Borrowed(_)));
    }
}

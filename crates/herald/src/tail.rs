//! `herald tail`: follows a channel live over SSE and prints each message as
//! one JSON line. Reconnects by itself with backoff, resuming after the last
//! offset printed, so the output has no gap and no repeat. Messages the
//! server no longer has (removed by retention, docs/retention.md) are
//! announced once on stderr, from the server's `truncated` event.

use std::error::Error as StdError;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use eventsource_stream::{Event, Eventsource};
use futures::{Stream, StreamExt};
use herald_core::ChannelName;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT};
use reqwest::Url;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::{self, Api, ClientError, ServerArg};
use crate::history::{self, message_offset, one_line, Page};

/// The data of the SSE event `truncated` (docs/api.md,
/// `{"requested_after": N, "earliest": M}`): the channel's oldest stored
/// message is `earliest`, so the messages before it that the subscription
/// asked for are gone.
#[derive(Debug, serde::Deserialize)]
struct Truncated {
    earliest: u64,
}

/// How many times in a row a skipped offset triggers a reconnect before the
/// gap is accepted (the server no longer has those messages).
const MAX_GAP_RESYNCS: u32 = 2;

/// A connection that lasted this long counts as healthy: the backoff starts
/// over after it ends.
const HEALTHY_CONNECTION: Duration = Duration::from_secs(5);

/// Flags of `herald tail`.
#[derive(Debug, clap::Args)]
pub(crate) struct TailArgs {
    #[command(flatten)]
    server: ServerArg,
    /// Channel to follow.
    #[arg(value_parser = client::parse_channel)]
    channel: ChannelName,
    /// Print the messages after this offset, then follow (0: from the first
    /// message). Without it, only messages published from now on.
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = client::parse_offset)]
    after: Option<u64>,
}

/// Reconnect delays: `first`, doubling up to `max`.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Delays starting at `first` and doubling up to `max`.
    pub(crate) fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first,
        }
    }

    /// The delay to wait now; the following one is twice as long, up to the cap.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }

    /// Starts the sequence over at `first`.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}

impl Default for Backoff {
    /// 100 ms doubling up to 5 s.
    fn default() -> Self {
        Self::new(Duration::from_millis(100), Duration::from_secs(5))
    }
}

/// What to do with a message at some offset, given what was printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The next offset: print it.
    Print,
    /// At or before the last printed offset: skip it.
    Repeat,
    /// Past the next offset: messages from `expected` on are missing.
    Gap {
        /// The offset that should have come.
        expected: u64,
    },
}

/// Resume bookkeeping: the last offset printed, or announced as gone (or
/// the start position).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resume {
    last: u64,
}

impl Resume {
    /// Starts after offset `after` (0: before the first message).
    pub(crate) fn new(after: u64) -> Self {
        Self { last: after }
    }

    /// The last offset printed: what `Last-Event-ID` carries on reconnect.
    pub(crate) fn last(&self) -> u64 {
        self.last
    }

    /// Classifies a message at `offset`.
    pub(crate) fn check(&self, offset: u64) -> Verdict {
        if offset <= self.last {
            Verdict::Repeat
        } else if offset == self.last + 1 {
            Verdict::Print
        } else {
            Verdict::Gap {
                expected: self.last + 1,
            }
        }
    }

    /// Records that `offset` was printed, or that every offset up to it is
    /// gone from the server.
    pub(crate) fn advance(&mut self, offset: u64) {
        self.last = self.last.max(offset);
    }
}

/// Tunables of [`follow`].
#[derive(Debug, Clone)]
pub(crate) struct FollowConfig {
    /// Reconnect delays.
    pub(crate) backoff: Backoff,
    /// A connection silent this long (no event, no heartbeat) is dropped.
    pub(crate) idle_timeout: Duration,
    /// Upper bound on a server's `Retry-After`.
    pub(crate) max_retry_after: Duration,
    /// PEM file of extra trusted certificate authorities (`--ca-file`).
    pub(crate) ca_file: Option<PathBuf>,
    /// API key or token sent as `Authorization: Bearer`, if any.
    pub(crate) credential: Option<String>,
}

impl Default for FollowConfig {
    fn default() -> Self {
        Self {
            backoff: Backoff::default(),
            idle_timeout: Duration::from_secs(60),
            max_retry_after: Duration::from_secs(30),
            ca_file: None,
            credential: None,
        }
    }
}

/// How one SSE connection ended without an error.
#[derive(Debug, PartialEq, Eq)]
enum SessionEnd {
    /// The server ended the stream (it does so when draining).
    Closed,
    /// The server ended the stream because the credential's token expired
    /// (`event: token_expired`): reconnecting with it cannot work.
    TokenExpired,
    /// A message skipped ahead of the next offset; a reconnect asks for the
    /// missing ones.
    Gap {
        /// The offset that should have come.
        expected: u64,
        /// The offset that came.
        got: u64,
    },
}

/// How one SSE connection failed.
#[derive(Debug)]
enum SessionError {
    /// Connecting failed or the server answered with an error status.
    Client(ClientError),
    /// The stream broke or held something that is not a message event.
    Stream(String),
    /// Writing the output failed: fatal.
    Output(std::io::Error),
}

/// Counters of one SSE connection.
#[derive(Debug, Default)]
struct SessionStats {
    /// Message events received, printed or not.
    received: u64,
}

/// Follows `channel` on the server at `server`, writing each message as one
/// JSON line to `out` and notices (reconnects, messages the server no
/// longer has) as `herald: tail: ...` lines to `notices`, until `stop` is cancelled (then `Ok`) or a fatal
/// error: an error answer that retrying cannot fix, or a failed write.
///
/// A subscription whose token expired (`event: token_expired`) ends
/// `follow` with an error naming `token_expired`: a reconnect with the
/// same token would be refused.
///
/// Starts after `after`, or after the channel's head at start when `None`.
/// Dropped connections, server errors and a drained server lead to a
/// reconnect with backoff, resuming with `Last-Event-ID` = the last offset
/// printed; offsets at or below it are skipped.
pub(crate) async fn follow<W: Write, N: Write>(
    server: &Url,
    channel: &ChannelName,
    after: Option<u64>,
    out: &mut W,
    notices: &mut N,
    config: FollowConfig,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let api = Api::new(
        server,
        client::stream_client(config.ca_file.as_deref(), config.idle_timeout)?,
    )
    .with_credential(config.credential.as_deref())?;
    let mut backoff = config.backoff.clone();
    let start = match after {
        Some(after) => after,
        None => {
            let head = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                head = current_head(&api, channel, &mut backoff, &config, notices) => head?,
            };
            backoff.reset();
            head
        }
    };
    let mut resume = Resume::new(start);
    let mut first = true;
    let mut gap_resyncs = 0;
    loop {
        let mut stats = SessionStats::default();
        let started = Instant::now();
        let result = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            r = stream_once(&api, channel, first, &mut resume, &mut gap_resyncs, &mut stats, out, notices) => r,
        };
        first = false;
        if stats.received > 0 || started.elapsed() >= HEALTHY_CONNECTION {
            backoff.reset();
        }
        let (reason, delay) = match result {
            Ok(SessionEnd::Closed) => (
                "the server ended the stream".to_owned(),
                backoff.next_delay(),
            ),
            Ok(SessionEnd::TokenExpired) => anyhow::bail!(
                "token_expired: the token expired, and the server ended the subscription \
                 after offset {last}; run herald tail again with a fresh token and \
                 --after {last} to go on from there",
                last = resume.last()
            ),
            Ok(SessionEnd::Gap { expected, got }) => {
                gap_resyncs += 1;
                (
                    format!("offset {got} came where {expected} was due"),
                    Duration::ZERO,
                )
            }
            Err(SessionError::Output(e)) => return Err(e.into()),
            Err(SessionError::Client(ClientError::Api(e))) if !e.is_retryable() => {
                return Err(ClientError::Api(e).into())
            }
            Err(SessionError::Client(e)) => {
                let mut delay = backoff.next_delay();
                if let ClientError::Api(api_error) = &e {
                    if let Some(after) = api_error.retry_after {
                        delay = delay.max(after.min(config.max_retry_after));
                    }
                }
                (error_chain(&e), delay)
            }
            Err(SessionError::Stream(reason)) => (reason, backoff.next_delay()),
        };
        notice(
            notices,
            format_args!(
                "{reason}; reconnecting in {} ms after offset {}",
                delay.as_millis(),
                resume.last()
            ),
        );
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// The channel's head now, retrying transient errors with `backoff`. An
/// unknown channel (404) has head 0.
async fn current_head<N: Write>(
    api: &Api,
    channel: &ChannelName,
    backoff: &mut Backoff,
    config: &FollowConfig,
    notices: &mut N,
) -> anyhow::Result<u64> {
    loop {
        match api
            .get_json::<Page>(&history::history_path(channel, 0, Some(1)))
            .await
        {
            Ok(page) => return Ok(page.head),
            Err(ClientError::Api(e)) if e.status == 404 => return Ok(0),
            Err(e) if e.is_retryable() => {
                let mut delay = backoff.next_delay();
                if let ClientError::Api(api_error) = &e {
                    if let Some(after) = api_error.retry_after {
                        delay = delay.max(after.min(config.max_retry_after));
                    }
                }
                notice(
                    notices,
                    format_args!("{}; retrying in {} ms", error_chain(&e), delay.as_millis()),
                );
                tokio::time::sleep(delay).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Opens one SSE connection and prints its messages. The first connection
/// asks with `?after=`, later ones with `Last-Event-ID`.
#[allow(clippy::too_many_arguments)]
async fn stream_once<W: Write, N: Write>(
    api: &Api,
    channel: &ChannelName,
    first: bool,
    resume: &mut Resume,
    gap_resyncs: &mut u32,
    stats: &mut SessionStats,
    out: &mut W,
    notices: &mut N,
) -> Result<SessionEnd, SessionError> {
    let mut headers = HeaderMap::new();
    headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
    let path = if first {
        format!("{}?after={}", client::events_path(channel), resume.last())
    } else {
        headers.insert("Last-Event-ID", HeaderValue::from(resume.last()));
        client::events_path(channel)
    };
    let response = api
        .open_stream(&path, headers)
        .await
        .map_err(SessionError::Client)?;
    pump(
        response.bytes_stream().eventsource(),
        resume,
        gap_resyncs,
        stats,
        out,
        notices,
    )
    .await
}

/// Prints the message events of `events` that come after `resume`, until
/// the stream ends, breaks, or skips ahead (see [`MAX_GAP_RESYNCS`]). A
/// `truncated` event announces that the server no longer has the messages
/// up to its `earliest − 1`: they are named once in `notices` and `resume`
/// moves past them, so the message at `earliest` that follows is no gap.
async fn pump<S, E, W, N>(
    events: S,
    resume: &mut Resume,
    gap_resyncs: &mut u32,
    stats: &mut SessionStats,
    out: &mut W,
    notices: &mut N,
) -> Result<SessionEnd, SessionError>
where
    S: Stream<Item = Result<Event, eventsource_stream::EventStreamError<E>>>,
    E: StdError + 'static,
    W: Write,
    N: Write,
{
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| {
            SessionError::Stream(match &e {
                eventsource_stream::EventStreamError::Transport(inner) => {
                    format!("the stream broke: {}", error_chain(inner))
                }
                other => format!("the stream is not valid SSE: {other}"),
            })
        })?;
        if event.event == "truncated" {
            let truncated: Truncated = serde_json::from_str(&event.data).map_err(|e| {
                SessionError::Stream(format!("a truncated event that does not parse: {e}"))
            })?;
            // Offsets up to `earliest - 1` are gone; those at or below the
            // last one printed were printed before they went.
            let gone_through = truncated.earliest.saturating_sub(1);
            if gone_through > resume.last() {
                notice(
                    notices,
                    format_args!(
                        "the server no longer has offsets {} to {gone_through} \
                         (removed by retention or a deletion); continuing at {}",
                        resume.last() + 1,
                        truncated.earliest
                    ),
                );
                resume.advance(gone_through);
            }
            continue;
        }
        if event.event == "token_expired" {
            return Ok(SessionEnd::TokenExpired);
        }
        if event.event != "message" {
            continue;
        }
        let offset = message_offset(&event.data)
            .map_err(|e| SessionError::Stream(format!("a message event without an offset: {e}")))?;
        stats.received += 1;
        match resume.check(offset) {
            Verdict::Repeat => continue,
            Verdict::Gap { expected } if *gap_resyncs < MAX_GAP_RESYNCS => {
                return Ok(SessionEnd::Gap {
                    expected,
                    got: offset,
                });
            }
            Verdict::Gap { expected } => notice(
                notices,
                format_args!(
                    "the server no longer has offsets {expected} to {}; continuing",
                    offset - 1
                ),
            ),
            Verdict::Print => {}
        }
        *gap_resyncs = 0;
        writeln!(out, "{}", one_line(&event.data))
            .and_then(|()| out.flush())
            .map_err(SessionError::Output)?;
        resume.advance(offset);
    }
    Ok(SessionEnd::Closed)
}

/// Writes one `herald: tail: ...` line to `notices`. A notice that cannot
/// be written (stderr closed) is dropped: the messages on stdout matter.
fn notice<N: Write>(notices: &mut N, text: std::fmt::Arguments<'_>) {
    let _ = writeln!(notices, "herald: tail: {text}").and_then(|()| notices.flush());
}

/// An error and its sources, joined with `: `.
fn error_chain(e: &(dyn StdError + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Runs `herald tail` until Ctrl-C.
pub(crate) async fn run(args: TailArgs) -> anyhow::Result<ExitCode> {
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_signal.cancel();
        }
    });
    let mut out = std::io::stdout().lock();
    follow(
        &args.server.server,
        &args.channel,
        args.after,
        &mut out,
        &mut std::io::stderr(),
        FollowConfig {
            ca_file: args.server.ca_file.clone(),
            credential: args.server.api_key.clone(),
            ..FollowConfig::default()
        },
        stop,
    )
    .await?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::default();
        let got: Vec<u128> = (0..9).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn resume_prints_next_skips_repeats_flags_gaps() {
        let mut r = Resume::new(0);
        assert_eq!(r.check(1), Verdict::Print);
        r.advance(1);
        assert_eq!(r.check(1), Verdict::Repeat);
        assert_eq!(r.check(0), Verdict::Repeat);
        assert_eq!(r.check(2), Verdict::Print);
        assert_eq!(r.check(4), Verdict::Gap { expected: 2 });
        r.advance(4);
        r.advance(3);
        assert_eq!(r.last(), 4);
    }

    fn sse(
        chunks: &[&str],
    ) -> impl Stream<Item = Result<Event, eventsource_stream::EventStreamError<std::io::Error>>>
    {
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            chunks.iter().map(|c| Ok(c.as_bytes().to_vec())).collect();
        futures::stream::iter(chunks).eventsource()
    }

    fn msg(offset: u64) -> String {
        format!(
            "id: {offset}\nevent: message\ndata: {{\"offset\":{offset},\"data\":{{\"n\":{offset}}},\"published_at\":\"2026-01-01T00:00:00.000Z\"}}\n\n"
        )
    }

    fn offsets(out: &[u8]) -> Vec<u64> {
        String::from_utf8(out.to_vec())
            .unwrap()
            .lines()
            .map(|l| message_offset(l).unwrap())
            .collect()
    }

    /// A tail's state across `pump` calls: where it resumes, its gap
    /// resyncs, its stats, what it printed and the notices it wrote.
    struct Tail {
        resume: Resume,
        gaps: u32,
        stats: SessionStats,
        out: Vec<u8>,
        notices: Vec<u8>,
    }

    impl Tail {
        /// A tail that printed every offset up to `after`.
        fn after(after: u64) -> Self {
            Self {
                resume: Resume::new(after),
                gaps: 0,
                stats: SessionStats::default(),
                out: Vec::new(),
                notices: Vec::new(),
            }
        }

        /// `pump` over an event stream of `chunks`.
        async fn pump(&mut self, chunks: &[&str]) -> Result<SessionEnd, SessionError> {
            pump(
                sse(chunks),
                &mut self.resume,
                &mut self.gaps,
                &mut self.stats,
                &mut self.out,
                &mut self.notices,
            )
            .await
        }
    }

    #[tokio::test]
    async fn pump_prints_in_order_and_skips_repeats() {
        let (m1, m2, m3) = (msg(1), msg(2), msg(3));
        // Chunks split mid-event, a heartbeat comment, another event type,
        // and a replayed offset.
        let text = format!(": hi\n\n{m1}{m2}event: other\ndata: x\n\n{m2}{m3}");
        let (a, b) = text.split_at(30);
        let mut tail = Tail::after(0);
        let end = tail.pump(&[a, b]).await.unwrap();
        assert_eq!(end, SessionEnd::Closed);
        assert_eq!(offsets(&tail.out), [1, 2, 3]);
        assert_eq!(tail.stats.received, 4);
        assert_eq!(tail.resume.last(), 3);
        let first = String::from_utf8(tail.out).unwrap();
        assert!(
            first.starts_with(r#"{"offset":1,"data":{"n":1},"published_at""#),
            "{first}"
        );
    }

    #[tokio::test]
    async fn pump_stops_on_a_gap_then_accepts_it_after_resyncs() {
        let text = format!("{}{}", msg(5), msg(6));
        let mut tail = Tail::after(3);
        let end = tail.pump(&[&text]).await.unwrap();
        assert_eq!(
            end,
            SessionEnd::Gap {
                expected: 4,
                got: 5
            }
        );
        assert!(tail.out.is_empty());
        tail.gaps = MAX_GAP_RESYNCS;
        let end = tail.pump(&[&text]).await.unwrap();
        assert_eq!(end, SessionEnd::Closed);
        assert_eq!(offsets(&tail.out), [5, 6]);
        assert_eq!(tail.gaps, 0);
    }

    #[tokio::test]
    async fn pump_announces_a_truncation_once_and_takes_the_next_offset_as_no_gap() {
        let text = format!(
            "id: 5\nevent: truncated\ndata: {{\"requested_after\":0,\"earliest\":6}}\n\n{}{}",
            msg(6),
            msg(7)
        );
        let mut tail = Tail::after(0);
        let end = tail.pump(&[&text]).await.unwrap();
        assert_eq!(end, SessionEnd::Closed);
        assert_eq!(offsets(&tail.out), [6, 7]);
        assert_eq!(
            String::from_utf8(tail.notices).unwrap(),
            "herald: tail: the server no longer has offsets 1 to 5 \
             (removed by retention or a deletion); continuing at 6\n"
        );
        assert_eq!(tail.gaps, 0);
    }

    #[tokio::test]
    async fn pump_ignores_a_truncation_of_offsets_already_printed() {
        let text = format!(
            "event: truncated\ndata: {{\"requested_after\":0,\"earliest\":3}}\n\n{}",
            msg(5)
        );
        let mut tail = Tail::after(4);
        tail.pump(&[&text]).await.unwrap();
        assert_eq!(offsets(&tail.out), [5]);
        assert!(
            tail.notices.is_empty(),
            "{}",
            String::from_utf8_lossy(&tail.notices)
        );
    }

    #[tokio::test]
    async fn pump_rejects_message_events_without_offsets() {
        let mut tail = Tail::after(0);
        let err = tail.pump(&["data: {\"x\":1}\n\n"]).await.unwrap_err();
        assert!(matches!(err, SessionError::Stream(_)), "{err:?}");
    }

    /// A `Write` the test can read while `follow` runs.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Reads one request's head from `sock`.
    async fn read_request(sock: &mut tokio::net::TcpStream) -> String {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            assert_eq!(sock.read(&mut byte).await.unwrap(), 1, "request cut short");
            buf.push(byte[0]);
        }
        String::from_utf8(buf).unwrap().to_ascii_lowercase()
    }

    /// Answers one request with an SSE body, then closes the connection.
    async fn answer_sse(sock: &mut tokio::net::TcpStream, body: &str) {
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
        sock.write_all(head.as_bytes()).await.unwrap();
        sock.write_all(body.as_bytes()).await.unwrap();
        sock.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn follow_resumes_after_drops_and_errors_without_gaps_or_repeats() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let server = tokio::spawn(async move {
            let mut requests = Vec::new();
            // 1: the first connection asks with ?after=, gets 1 and 2, then the stream ends.
            let (mut s, _) = listener.accept().await.unwrap();
            requests.push(read_request(&mut s).await);
            answer_sse(&mut s, &format!("{}{}", msg(1), msg(2))).await;
            // 2: an overloaded server.
            let (mut s, _) = listener.accept().await.unwrap();
            requests.push(read_request(&mut s).await);
            let body = r#"{"error":{"code":"unavailable","message":"busy"}}"#;
            let answer = format!(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            s.write_all(answer.as_bytes()).await.unwrap();
            s.shutdown().await.unwrap();
            // 3: a replay of 2, then a skip to 5.
            let (mut s, _) = listener.accept().await.unwrap();
            requests.push(read_request(&mut s).await);
            answer_sse(&mut s, &format!("{}{}{}", msg(2), msg(3), msg(5))).await;
            // 4: the resync delivers 4 and 5.
            let (mut s, _) = listener.accept().await.unwrap();
            requests.push(read_request(&mut s).await);
            answer_sse(&mut s, &format!("{}{}", msg(4), msg(5))).await;
            requests
        });

        let out = Shared::default();
        let stop = CancellationToken::new();
        let config = FollowConfig {
            backoff: Backoff::new(Duration::from_millis(1), Duration::from_millis(10)),
            ..FollowConfig::default()
        };
        let channel = ChannelName::new("orders").unwrap();
        let follower = {
            let (url, stop, mut out) = (url.clone(), stop.clone(), out.clone());
            tokio::spawn(async move {
                follow(
                    &url,
                    &channel,
                    Some(0),
                    &mut out,
                    &mut Vec::new(),
                    config,
                    stop,
                )
                .await
            })
        };
        let requests = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .unwrap()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while offsets(&out.0.lock().unwrap()).len() < 5 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.cancel();
        follower.await.unwrap().unwrap();

        assert_eq!(offsets(&out.0.lock().unwrap()), [1, 2, 3, 4, 5]);
        assert!(
            requests[0].starts_with("get /v1/channels/orders/events?after=0 "),
            "{}",
            requests[0]
        );
        assert!(!requests[0].contains("last-event-id"));
        assert!(
            requests[1].contains("last-event-id: 2\r\n"),
            "{}",
            requests[1]
        );
        assert!(
            requests[2].contains("last-event-id: 2\r\n"),
            "{}",
            requests[2]
        );
        assert!(
            requests[3].contains("last-event-id: 3\r\n"),
            "{}",
            requests[3]
        );
        assert!(requests
            .iter()
            .all(|r| r.contains("accept: text/event-stream")));
    }

    /// A `Write` whose bytes the test can await while `follow` runs.
    #[derive(Clone)]
    struct Watched(Arc<tokio::sync::watch::Sender<Vec<u8>>>);

    impl Watched {
        fn new() -> Self {
            Self(Arc::new(tokio::sync::watch::channel(Vec::new()).0))
        }
    }

    impl Write for Watched {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.send_modify(|bytes| bytes.extend_from_slice(buf));
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Against a real node: the channel's offsets 1 to 3 were trimmed, so
    /// `--after 0` gets the server's `truncated` event first. One notice
    /// names the trimmed range, and no reconnect happens.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn follow_announces_trimmed_offsets_once_without_reconnecting() {
        use herald_storage::TrimLimits;
        use herald_testkit::node::{publish_n, Node};

        let dir = tempfile::tempdir().unwrap();
        let node = Node::holder(dir.path()).await;
        publish_n(&node, "orders", 1, 5).await;
        let lease = node.lease.writable_lease().expect("the holder's lease");
        let limits = TrimLimits {
            max_messages: Some(2),
            ..TrimLimits::default()
        };
        let channel = ChannelName::new("orders").unwrap();
        node.storage
            .trim(&lease, &channel, &limits, 1000)
            .await
            .unwrap();
        assert_eq!(node.stored("orders").await.len(), 2);

        let (out, notices) = (Watched::new(), Watched::new());
        let mut printed = out.0.subscribe();
        let stop = CancellationToken::new();
        let follower = {
            let url = Url::parse(&node.base).unwrap();
            let (stop, mut out, mut notices) = (stop.clone(), out.clone(), notices.clone());
            tokio::spawn(async move {
                follow(
                    &url,
                    &channel,
                    Some(0),
                    &mut out,
                    &mut notices,
                    FollowConfig::default(),
                    stop,
                )
                .await
            })
        };
        tokio::time::timeout(
            Duration::from_secs(10),
            printed.wait_for(|bytes| offsets(bytes).len() >= 2),
        )
        .await
        .expect("offsets 4 and 5 printed")
        .unwrap();
        stop.cancel();
        follower.await.unwrap().unwrap();
        node.stop().await;

        assert_eq!(offsets(&out.0.borrow()), [4, 5]);
        // The notice comes before offset 4 is printed, and so would any
        // reconnect caused by taking offset 4 for a gap.
        assert_eq!(
            String::from_utf8(notices.0.borrow().clone()).unwrap(),
            "herald: tail: the server no longer has offsets 1 to 3 \
             (removed by retention or a deletion); continuing at 4\n"
        );
    }

    /// The server ends a token's subscription at its `exp` with
    /// `event: token_expired`: follow stops there, naming it, instead of
    /// reconnecting with the expired token.
    #[tokio::test]
    async fn follow_stops_at_token_expired_without_reconnecting() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            read_request(&mut s).await;
            let expired = "event: token_expired\ndata: {\"code\":\"token_expired\"}\n\n";
            answer_sse(&mut s, &format!("{}{}{expired}", msg(1), msg(2))).await;
            // The listener closes: a reconnect would be refused, and
            // retried for ever.
        });
        let channel = ChannelName::new("c").unwrap();
        let (mut out, mut notices) = (Vec::new(), Vec::new());
        // A guard against the retry loop, not a timing bound.
        let err = tokio::time::timeout(
            Duration::from_secs(60),
            follow(
                &url,
                &channel,
                Some(0),
                &mut out,
                &mut notices,
                FollowConfig::default(),
                CancellationToken::new(),
            ),
        )
        .await
        .expect("follow stopped")
        .unwrap_err();
        server.await.unwrap();
        let err = err.to_string();
        assert!(err.starts_with("token_expired: "), "{err}");
        assert!(err.contains("--after 2"), "{err}");
        assert_eq!(offsets(&out), [1, 2]);
        let notices = String::from_utf8(notices).unwrap();
        assert!(!notices.contains("reconnecting"), "{notices}");
    }

    #[tokio::test]
    async fn follow_gives_up_on_client_errors_and_stops_on_cancel() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            read_request(&mut s).await;
            let body = r#"{"error":{"code":"invalid_offset","message":"after is not a number"}}"#;
            let answer = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            s.write_all(answer.as_bytes()).await.unwrap();
        });
        let channel = ChannelName::new("c").unwrap();
        let err = follow(
            &url,
            &channel,
            Some(0),
            &mut Vec::new(),
            &mut Vec::new(),
            FollowConfig::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().starts_with("invalid_offset: "), "{err}");

        // Nothing listens: follow keeps retrying until cancelled.
        let closed = Url::parse("http://127.0.0.1:1").unwrap();
        let stop = CancellationToken::new();
        stop.cancel();
        follow(
            &closed,
            &channel,
            None,
            &mut Vec::new(),
            &mut Vec::new(),
            FollowConfig::default(),
            stop,
        )
        .await
        .unwrap();
    }
}

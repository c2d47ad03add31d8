//! `herald bench fanout`: how fast and how completely messages reach many
//! subscribers, measured by real clients.
//!
//! S subscribers (SSE or WebSocket) are spread round-robin over K channels
//! `bench:<run id>-fanout-<k>` of the subscribe server; once every one of
//! them is connected, one publisher sends R messages per second for D
//! seconds, round-robin over the channels, to the publish server. Each
//! message's data is `{"sent_us": <µs since the Unix epoch>, "seq": <n>}`:
//! a subscriber computes publish→delivery latency from its own clock, which
//! is the publisher's when both run on one machine (the usual case; across
//! machines the clocks' offset adds to every figure). After the last
//! publish, subscribers get up to 10 s to receive what they are owed.
//!
//! Reported: deliveries per second over the publishing window, latency
//! p50/p99/p99.9/max, messages missed and duplicated (each subscriber must
//! receive every acknowledged message of its channel exactly once), and the
//! subscribe server's resident memory per connected subscriber: the
//! difference of `process_resident_memory_bytes` on `/metrics` before the
//! subscribers connect and once they all are, divided by S.
//!
//! Any server: with `--subscribe-url` (and `--publish-url`), the URLs are
//! templates in which `{channel}` stands for each channel's name, and each
//! message is the body `--publish-body` with `{sent_us}` and `{seq}` filled
//! in, sent as `--content-type`. A subscriber then finds every
//! `"sent_us":<n>` and the `"seq":<n>` after it in each event's data (or
//! WebSocket text frame), whatever JSON wraps them, so one client measures
//! Herald and its peers alike (scripts/bench does). Its memory figure is
//! left to the caller (`null`), who can see all of a server's processes.
//! `--hold` connects the subscribers, prints `{"connected": S}` and keeps
//! them open, publishing nothing, until the process is terminated: for a
//! caller that measures idle connections itself.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use hdrhistogram::Histogram;
use herald_core::ChannelName;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde::Serialize;
use tokio::sync::{watch, Barrier};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::Connector;

use crate::client::ServerArg;

/// Highest latency tracked, in µs (one minute).
const MAX_LATENCY_US: u64 = 60_000_000;
/// How long subscribers may take to receive what they are owed after the
/// last publish.
const DRAIN: Duration = Duration::from_secs(10);
/// How long all subscribers may take to connect.
const CONNECT_LIMIT: Duration = Duration::from_secs(120);

/// How subscribers connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Transport {
    /// Server-Sent Events (`GET /v1/channels/{channel}/events`).
    Sse,
    /// WebSocket (`GET /v1/channels/{channel}/ws`).
    Ws,
}

/// The message body of `--publish-body` by default: Herald's publish body.
const HERALD_BODY: &str = r#"{"data":{"sent_us":{sent_us},"seq":{seq}}}"#;

/// Flags of `herald bench fanout`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BenchFanoutArgs {
    /// The server publishes go to.
    #[command(flatten)]
    server: ServerArg,
    /// The server subscribers connect to (default: the publish server), e.g.
    /// a standby.
    #[arg(long, value_name = "URL")]
    subscribe_server: Option<String>,
    /// Subscribers.
    #[arg(long, value_name = "S", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    subscribers: u32,
    /// Channels the subscribers are spread over.
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    channels: u32,
    /// Messages published per second (over all channels).
    #[arg(long, value_name = "R", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    rate: u32,
    /// How long to publish, e.g. `10s`.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// How subscribers connect.
    #[arg(long, value_enum, default_value_t = Transport::Sse)]
    transport: Transport,
    /// Subscribe URL of any server (SSE, or WebSocket with `--transport
    /// ws`), `{channel}` standing for the channel's name, e.g.
    /// `http://127.0.0.1:8080/sub/{channel}`; replaces Herald's URLs on
    /// `--server`/`--subscribe-server`.
    #[arg(long, value_name = "URL")]
    subscribe_url: Option<String>,
    /// Publish URL (POST) of any server, `{channel}` standing for the
    /// channel's name; needed with `--subscribe-url` unless `--hold`.
    #[arg(long, value_name = "URL", requires = "subscribe_url")]
    publish_url: Option<String>,
    /// The body of each publish, `{sent_us}` and `{seq}` standing for the
    /// send time (µs since the Unix epoch) and the message's number.
    #[arg(long, value_name = "TEMPLATE", default_value = HERALD_BODY)]
    publish_body: String,
    /// `Content-Type` of each publish.
    #[arg(long, value_name = "TYPE", default_value = "application/json")]
    content_type: String,
    /// Channel names: this followed by 0, 1, ... (default
    /// `bench:<run id>-fanout-`).
    #[arg(long, value_name = "PREFIX")]
    channel_prefix: Option<String>,
    /// Connect the subscribers, print `{"connected": S}`, and keep them
    /// open without publishing until the process is terminated.
    #[arg(long)]
    hold: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Each `"sent_us":<n>` in `text` with the first `"seq":<m>` after it:
/// the stamps of the messages an event or frame carries, in order.
fn stamps(text: &str) -> Vec<(u64, u64)> {
    /// The decimal digits at the start of `s`, as a number.
    fn number(s: &str) -> Option<u64> {
        let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        s[..end].parse().ok()
    }
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("\"sent_us\":") {
        rest = &rest[at + "\"sent_us\":".len()..];
        let Some(sent) = number(rest) else { continue };
        let Some(seq_at) = rest.find("\"seq\":") else {
            break;
        };
        let after = &rest[seq_at + "\"seq\":".len()..];
        if let Some(seq) = number(after) {
            found.push((sent, seq));
        }
        rest = after;
    }
    found
}

/// `template` with every `{channel}` replaced by `channel`.
fn fill_channel(template: &str, channel: &str) -> String {
    template.replace("{channel}", channel)
}

/// What one subscriber saw.
struct Seen {
    /// Sequence numbers received, in order (duplicates kept).
    seqs: Vec<u64>,
    latency_us: Histogram<u64>,
}

/// The report.
#[derive(Debug, Serialize)]
struct Report {
    run: String,
    transport: Transport,
    subscribers: u32,
    channels: u32,
    rate: u32,
    duration_s: f64,
    published: u64,
    publish_errors: u64,
    /// Deliveries expected: every acknowledged message times its
    /// channel's subscribers.
    expected_deliveries: u64,
    deliveries: u64,
    deliveries_per_s: f64,
    missed: u64,
    duplicated: u64,
    latency_ms_p50: f64,
    latency_ms_p99: f64,
    latency_ms_p999: f64,
    latency_ms_max: f64,
    /// `None` when the server's `/metrics` has no resident memory gauge.
    resident_bytes_per_subscriber: Option<f64>,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Reads `process_resident_memory_bytes` from `base`'s `/metrics`.
async fn resident_bytes(http: &reqwest::Client, base: &str) -> Option<f64> {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .and_then(|v| v.trim().parse().ok())
}

/// The TLS settings of WebSocket subscribers for `wss://` with a private
/// CA: the system's trust store (rustls-native-certs) and the certificates
/// of `ca_file`. `None` without `ca_file`: tokio-tungstenite then uses the
/// system's trust store by itself.
///
/// # Errors
/// The CA file cannot be read or holds no PEM certificate.
fn ws_connector(ca_file: Option<&Path>) -> anyhow::Result<Option<Connector>> {
    let Some(path) = ca_file else {
        return Ok(None);
    };
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    let extra = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow::anyhow!("--ca-file {}: {e}", path.display()))?;
    if extra.is_empty() {
        anyhow::bail!("--ca-file {} holds no PEM certificate", path.display());
    }
    roots.add_parsable_certificates(extra);
    let config = ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Some(Connector::Rustls(Arc::new(config))))
}

/// How subscribers reach the server: the HTTP client (for SSE), and for
/// WebSocket the credential headers and the TLS connector.
#[derive(Clone)]
struct Reach {
    /// The HTTP client, with the credential among its default headers.
    http: reqwest::Client,
    /// `--api-key` as headers, for the WebSocket handshake.
    credential: reqwest::header::HeaderMap,
    /// The TLS connector of `wss://` URLs (`--ca-file`), if any.
    ws_tls: Option<Connector>,
}

/// One subscriber of `url` (the SSE or WebSocket URL): connects, reports
/// `connected` once, then records every message until `stop`.
async fn subscriber(
    url: String,
    transport: Transport,
    connected: Arc<Barrier>,
    mut stop: watch::Receiver<bool>,
    reach: Reach,
    delivered: Arc<AtomicU64>,
) -> anyhow::Result<Seen> {
    let Reach {
        http,
        credential,
        ws_tls,
    } = reach;
    let mut seen = Seen {
        seqs: Vec::new(),
        latency_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)?,
    };
    // Data without stamps (a server's own control events) is not counted.
    let mut record = |text: &str| -> anyhow::Result<()> {
        let received = now_us();
        for (sent, seq) in stamps(text) {
            seen.latency_us
                .saturating_record(received.saturating_sub(sent).max(1));
            seen.seqs.push(seq);
            delivered.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    };
    match transport {
        Transport::Sse => {
            let response = http
                .get(url)
                .header(reqwest::header::ACCEPT, "text/event-stream")
                .send()
                .await?
                .error_for_status()?;
            let mut events = response.bytes_stream().eventsource();
            connected.wait().await;
            loop {
                let next = tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    next = events.next() => next,
                };
                match next {
                    Some(Ok(event)) => record(&event.data)?,
                    Some(Err(e)) => anyhow::bail!("SSE stream failed: {e}"),
                    None => anyhow::bail!("the SSE stream ended"),
                }
            }
        }
        Transport::Ws => {
            let mut request = url.into_client_request()?;
            request.headers_mut().extend(credential);
            let (mut socket, _) =
                tokio_tungstenite::connect_async_tls_with_config(request, None, false, ws_tls)
                    .await?;
            connected.wait().await;
            loop {
                let next = tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    next = socket.next() => next,
                };
                match next {
                    Some(Ok(WsMessage::Text(text))) => record(text.as_str())?,
                    Some(Ok(WsMessage::Close(_))) | None => anyhow::bail!("the WebSocket closed"),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => anyhow::bail!("WebSocket failed: {e}"),
                }
            }
        }
    }
    Ok(seen)
}

/// Runs `herald bench fanout`.
pub(crate) async fn run_fanout(args: BenchFanoutArgs) -> anyhow::Result<ExitCode> {
    let publish_base = args.server.server.as_str().trim_end_matches('/').to_owned();
    let subscribe_base = args
        .subscribe_server
        .clone()
        .unwrap_or_else(|| publish_base.clone())
        .trim_end_matches('/')
        .to_owned();
    let run = format!("{:08x}", rand::random::<u32>());
    let prefix = args
        .channel_prefix
        .clone()
        .unwrap_or_else(|| format!("bench:{run}-fanout-"));
    let generic = args.subscribe_url.is_some();
    if generic && args.publish_url.is_none() && !args.hold {
        anyhow::bail!("--subscribe-url needs --publish-url (or --hold)");
    }
    // Each channel's subscribe and publish URLs.
    let (subscribe_urls, publish_urls): (Vec<String>, Vec<String>) = (0..args.channels)
        .map(|k| {
            let name = format!("{prefix}{k}");
            if let Some(template) = &args.subscribe_url {
                let publish = args.publish_url.as_deref().unwrap_or_default();
                return Ok((fill_channel(template, &name), fill_channel(publish, &name)));
            }
            let path = format!("/v1/channels/{}", ChannelName::new(name)?);
            let subscribe = match args.transport {
                Transport::Sse => format!("{subscribe_base}{path}/events"),
                Transport::Ws => format!("{}{path}/ws", subscribe_base.replacen("http", "ws", 1)),
            };
            Ok((subscribe, format!("{publish_base}{path}/messages")))
        })
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    // `--api-key`, on every request and WebSocket.
    let credential = crate::client::credential_headers(args.server.api_key.as_deref())?;
    let http = args
        .server
        .http_builder()?
        .pool_max_idle_per_host(usize::try_from(args.subscribers)?)
        .default_headers(credential.clone())
        .build()?;

    // A server of any kind is measured by the caller.
    let before = if generic {
        None
    } else {
        resident_bytes(&http, &subscribe_base).await
    };
    let subscribers = usize::try_from(args.subscribers)?;
    let connected = Arc::new(Barrier::new(subscribers + 1));
    let (stop_tx, stop) = watch::channel(false);
    let delivered = Arc::new(AtomicU64::new(0));
    let ws_tls = ws_connector(args.server.ca_file.as_deref())?;
    let mut set = JoinSet::new();
    for s in 0..subscribers {
        let k = s % subscribe_urls.len();
        let subscribed = subscriber(
            subscribe_urls[k].clone(),
            args.transport,
            connected.clone(),
            stop.clone(),
            Reach {
                http: http.clone(),
                credential: credential.clone(),
                ws_tls: ws_tls.clone(),
            },
            delivered.clone(),
        );
        set.spawn(async move { subscribed.await.map(|seen| (k, seen)) });
    }
    tokio::time::timeout(CONNECT_LIMIT, connected.wait())
        .await
        .map_err(|_| {
            anyhow::anyhow!("the subscribers did not all connect within {CONNECT_LIMIT:?}")
        })?;
    if args.hold {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "{}",
            serde_json::json!({ "connected": args.subscribers })
        )?;
        out.flush()?;
        drop(out);
        // Until terminated; a subscriber that fails ends the hold.
        return match set.join_next().await {
            Some(done) => {
                done??;
                anyhow::bail!("a subscriber stopped while holding")
            }
            None => Ok(ExitCode::SUCCESS),
        };
    }
    let after = if generic {
        None
    } else {
        resident_bytes(&http, &subscribe_base).await
    };

    // The publisher: R messages per second, round-robin over the channels.
    // Acknowledged sequence numbers, per channel: what each of its
    // subscribers is owed.
    let mut owed: Vec<BTreeSet<u64>> = vec![BTreeSet::new(); publish_urls.len()];
    let mut publish_errors = 0u64;
    let period = Duration::from_secs_f64(1.0 / f64::from(args.rate));
    let total = (args.duration.as_secs_f64() * f64::from(args.rate)).round() as u64;
    let started = Instant::now();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for seq in 0..total {
        tick.tick().await;
        let k = usize::try_from(seq % publish_urls.len() as u64)?;
        let body = args
            .publish_body
            .replace("{sent_us}", &now_us().to_string())
            .replace("{seq}", &seq.to_string());
        let sent = http
            .post(&publish_urls[k])
            .header(reqwest::header::CONTENT_TYPE, &args.content_type)
            .body(body)
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => {
                owed[k].insert(seq);
            }
            _ => publish_errors += 1,
        }
    }
    let window = started.elapsed();

    // Wait until every subscriber has what it is owed, or the drain ends.
    let expected: u64 = (0..subscribers)
        .map(|s| owed[s % publish_urls.len()].len() as u64)
        .sum();
    let drain_end = Instant::now() + DRAIN;
    while delivered.load(Ordering::Relaxed) < expected && Instant::now() < drain_end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(true);
    let mut latency_us = Histogram::<u64>::new_with_bounds(1, MAX_LATENCY_US, 3)?;
    let (mut deliveries, mut missed, mut duplicated) = (0u64, 0u64, 0u64);
    let mut failures = Vec::new();
    while let Some(done) = set.join_next().await {
        match done? {
            Ok((k, seen)) => {
                latency_us.add(&seen.latency_us)?;
                deliveries += seen.seqs.len() as u64;
                let got: BTreeSet<u64> = seen.seqs.iter().copied().collect();
                duplicated += (seen.seqs.len() - got.len()) as u64;
                missed += owed[k].difference(&got).count() as u64;
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    if let Some(first) = failures.first() {
        anyhow::bail!("{} subscribers failed; the first: {first}", failures.len());
    }
    let ms = |q: f64| latency_us.value_at_quantile(q) as f64 / 1000.0;
    let report = Report {
        run,
        transport: args.transport,
        subscribers: args.subscribers,
        channels: args.channels,
        rate: args.rate,
        duration_s: window.as_secs_f64(),
        published: owed.iter().map(|o| o.len() as u64).sum(),
        publish_errors,
        expected_deliveries: expected,
        deliveries,
        deliveries_per_s: deliveries as f64 / window.as_secs_f64(),
        missed,
        duplicated,
        latency_ms_p50: ms(0.5),
        latency_ms_p99: ms(0.99),
        latency_ms_p999: ms(0.999),
        latency_ms_max: latency_us.max() as f64 / 1000.0,
        resident_bytes_per_subscriber: before
            .zip(after)
            .map(|(b, a)| (a - b) / f64::from(args.subscribers)),
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        writeln!(
            out,
            "run           {} ({} {} subscribers over {} channels)",
            report.run,
            report.subscribers,
            match report.transport {
                Transport::Sse => "SSE",
                Transport::Ws => "WebSocket",
            },
            report.channels
        )?;
        writeln!(
            out,
            "published     {} ({} errors) at {}/s for {:.1} s",
            report.published, report.publish_errors, report.rate, report.duration_s
        )?;
        writeln!(
            out,
            "deliveries    {} of {} expected, {:.0}/s; missed {}, duplicated {}",
            report.deliveries,
            report.expected_deliveries,
            report.deliveries_per_s,
            report.missed,
            report.duplicated
        )?;
        writeln!(
            out,
            "latency (ms)  p50 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
            report.latency_ms_p50,
            report.latency_ms_p99,
            report.latency_ms_p999,
            report.latency_ms_max
        )?;
        match report.resident_bytes_per_subscriber {
            Some(b) => writeln!(
                out,
                "memory        {:.1} KB resident per subscriber",
                b / 1024.0
            )?,
            None => writeln!(
                out,
                "memory        unknown (no process_resident_memory_bytes on /metrics)"
            )?,
        }
    }
    out.flush()?;
    Ok(
        if report.missed == 0 && report.duplicated == 0 && report.publish_errors == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}

#[cfg(test)]
mod tests {
    use super::{fill_channel, stamps, HERALD_BODY};

    #[test]
    fn stamps_are_found_whatever_json_wraps_them() {
        // Herald's SSE data: the message around the published data.
        assert_eq!(
            stamps(r#"{"offset":3,"data":{"sent_us":17,"seq":4},"published_at":"x"}"#),
            vec![(17, 4)]
        );
        // Several messages in one event, across lines (a JSON array).
        assert_eq!(
            stamps(
                "[\n{\"data\":{\"sent_us\":1,\"seq\":2}},\n{\"data\":{\"sent_us\":3,\"seq\":4}}\n]"
            ),
            vec![(1, 2), (3, 4)]
        );
        // A server's own events carry none.
        assert!(stamps(r#"{"streamNextOffset":"0_31","upToDate":true}"#).is_empty());
        assert!(stamps(r#"{"sent_us":"x","seq":1}"#).is_empty());
        assert!(stamps(r#"{"sent_us":5}"#).is_empty());
    }

    #[test]
    fn templates_are_filled() {
        assert_eq!(
            fill_channel("http://h/sub/{channel}?x={channel}", "c-1"),
            "http://h/sub/c-1?x=c-1"
        );
        let body = HERALD_BODY.replace("{sent_us}", "12").replace("{seq}", "3");
        assert_eq!(body, r#"{"data":{"sent_us":12,"seq":3}}"#);
        assert_eq!(stamps(&body), vec![(12, 3)]);
    }
}

//! The nginx front of docs/operations.md ("nginx in front"), as written
//! there: the test takes the server block between the comments
//! `nginx-server-block:begin` and `nginx-server-block:end` of that page,
//! changes only the upstream nodes' addresses and the listening address,
//! and runs Debian's nginx with it in front of two `herald serve` nodes (a
//! holder and a standby) on one PostgreSQL database, with access control
//! on and nginx's address as `--trusted-proxy`. Through it, every route of
//! Herald: publishes (single, batch, Centrifugo's server API, each reaching
//! the standby too, which forwards it), history, an SSE subscription, a
//! WebSocket of `/v1/channels/{channel}/ws` and of Centrifugo's
//! `/connection/websocket`, both with a browser's `Origin`, and
//! centrifuge-js (`tests/clients/centrifuge.mjs`), over WebSocket and over
//! HTTP streaming (whose `/emulation` requests nginx spreads over both
//! nodes). Then more event streams
//! than `--max-connections-per-ip` allows one address, from as many client
//! addresses: none is refused, since each counts against its own address
//! (`X-Forwarded-For`); and from one client address: the limit holds, and
//! each node logs one WARN for that address.
//!
//! The nginx binary is `HERALD_TEST_NGINX` (the test command installs
//! Debian's `nginx` package and sets it), else `nginx` on the `PATH` or in
//! `/usr/sbin`; without one the test fails, it is never skipped. nginx runs
//! as one process (`master_process off`, so that killing it leaves no
//! worker behind), with its pid, logs and temporary files in a temp dir.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use futures::SinkExt;
use herald_testkit::api::Api;
use herald_testkit::auth::{hs256_token, write_auth_config, AuthFile};
use herald_testkit::process::{Server, FAST_LEASE};
use herald_testkit::sdk::{Sdk, SdkClient};
use herald_testkit::sse::SseClient;
use herald_testkit::ws::ws_next;
use herald_testkit::{within, TestDatabase, NODE_WAIT, POLL, WAIT};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message as Frame;

/// The channel every route is driven on (the default namespace rule:
/// subscribing needs a token that lists it).
const CHANNEL: &str = "news:nginx";

/// Each node's `--max-connections-per-ip`: small, so that a few streams
/// exceed it.
const PER_IP: usize = 8;

/// Event streams opened from distinct client addresses, and from one: far
/// more than [`PER_IP`] reach each node whichever way nginx spreads them.
const STREAMS: usize = 4 * PER_IP;

/// The nginx binary to run.
fn nginx_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("HERALD_TEST_NGINX") {
        return PathBuf::from(bin);
    }
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|bin| bin.is_file())
        .unwrap_or_else(|| {
            panic!(
                "nginx not found: install it (Debian: apt-get install nginx), set \
                 HERALD_TEST_NGINX to its binary, or run ./scripts/test, which does both"
            )
        })
}

/// The nginx server block of docs/operations.md: the lines of the code
/// fence between the two marking comments.
fn documented_server_block() -> String {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md");
    let text = std::fs::read_to_string(&page).expect("read docs/operations.md");
    let begin = "<!-- nginx-server-block:begin -->";
    let end = "<!-- nginx-server-block:end -->";
    let start = text
        .find(begin)
        .expect("the begin marker in docs/operations.md")
        + begin.len();
    let stop = start + text[start..].find(end).expect("the end marker");
    let marked = text[start..stop].trim();
    let body = marked
        .strip_prefix("```nginx")
        .and_then(|rest| rest.strip_suffix("```"))
        .expect("the marked part of docs/operations.md is one ```nginx fence");
    body.to_owned()
}

/// `block` with each upstream `server` line's address replaced by one of
/// `nodes` in turn and the `listen` directive by `listen`: nothing else is
/// changed.
fn with_addresses(block: &str, nodes: &[&str], listen: &str) -> String {
    let mut servers = 0;
    let mut listens = 0;
    let mut in_upstream = false;
    let mut out = String::new();
    for line in block.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if trimmed.starts_with("upstream ") {
            in_upstream = true;
        } else if in_upstream && trimmed.starts_with('}') {
            in_upstream = false;
        }
        let mut words = trimmed.splitn(3, ' ');
        let line = match (words.next(), words.next(), words.next()) {
            (Some("server"), Some(_), rest) if in_upstream => {
                let node = nodes[servers % nodes.len()];
                servers += 1;
                match rest {
                    Some(rest) => format!("{indent}server {node} {rest}"),
                    None => format!("{indent}server {node};"),
                }
            }
            (Some("listen"), Some(_), _) => {
                listens += 1;
                format!("{indent}listen {listen};")
            }
            _ => line.to_owned(),
        };
        out.push_str(&line);
        out.push('\n');
    }
    assert!(
        servers >= 2,
        "the documented upstream lists {servers} nodes"
    );
    assert_eq!(listens, 1, "the documented server block has one listen");
    out
}

/// An nginx process serving a config of its own, killed when dropped.
struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
    /// `127.0.0.1:<port>`, where it listens.
    addr: String,
}

impl Nginx {
    /// Runs nginx with `server_block` inside a test-only main config (one
    /// process, everything it writes in a temp dir) and returns once it
    /// accepts connections on `addr`.
    async fn start(server_block: &str, addr: &str) -> Nginx {
        let dir = tempfile::tempdir().expect("a temp dir");
        let d = dir.path().display();
        let config = format!(
            "daemon off;\n\
             master_process off;\n\
             pid {d}/nginx.pid;\n\
             error_log {d}/error.log info;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n\
             access_log off;\n\
             client_body_temp_path {d}/client_body;\n\
             proxy_temp_path {d}/proxy;\n\
             fastcgi_temp_path {d}/fastcgi;\n\
             uwsgi_temp_path {d}/uwsgi;\n\
             scgi_temp_path {d}/scgi;\n\
             {server_block}\n\
             }}\n"
        );
        let conf = dir.path().join("nginx.conf");
        std::fs::write(&conf, config).expect("write nginx.conf");
        let mut child = Command::new(nginx_bin())
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start nginx");
        let log = dir.path().join("error.log");
        within("nginx to listen", WAIT, async {
            loop {
                if let Some(status) = child.try_wait().expect("nginx's status") {
                    panic!(
                        "nginx exited with {status}:\n{}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    );
                }
                if tokio::net::TcpStream::connect(addr).await.is_ok() {
                    return;
                }
                // Pacing between attempts: nginx reports nothing when it
                // listens.
                tokio::time::sleep(POLL).await;
            }
        })
        .await;
        Nginx {
            child,
            dir,
            addr: addr.to_owned(),
        }
    }

    /// nginx's error log so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if std::thread::panicking() {
            eprintln!("--- nginx error log ---\n{}", self.log());
        }
    }
}

fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").to_string()
}

/// An HTTP client whose connections leave from `local` (an address of
/// 127.0.0.0/8), as a client on another host would reach nginx.
fn client_from(local: IpAddr) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(local)
        .connect_timeout(WAIT)
        .build()
        .expect("build the HTTP client")
}

/// Opens `count` event streams of [`CHANNEL`] through nginx at `base`,
/// the `i`-th from the client address `address(i)`; returns each answer's
/// status with its stream.
async fn open_streams(
    base: &str,
    token: &str,
    count: usize,
    address: impl Fn(usize) -> IpAddr,
) -> Vec<(u16, SseClient)> {
    let url = format!("{base}/v1/channels/{CHANNEL}/events?token={token}");
    let mut streams = Vec::new();
    for i in 0..count {
        let client = client_from(address(i));
        let sse = within("an SSE answer through nginx", WAIT, async {
            SseClient::open(&client, &url, &[]).await
        })
        .await
        .expect("an SSE request through nginx");
        streams.push((sse.status, sse));
    }
    streams
}

/// The WARN records of `node` about refusals of `client_ip`.
fn refusal_warnings(node: &Server, client_ip: &str) -> Vec<Value> {
    node.log_records()
        .into_iter()
        .filter(|r| {
            r["level"] == "WARN"
                && r["setting"] == "max_connections_per_ip"
                && r["client_ip"] == client_ip
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_nginx_front_serves_every_route_of_a_two_node_cluster() {
    Sdk::Js.check();
    let block = documented_server_block();
    let nginx_bin = nginx_bin();
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let config = dir.path().join("herald.toml");
    let AuthFile { key, secret } = write_auth_config(&config, &["publish", "read", "admin"]);
    let token = hs256_token(&secret, "nginx", &["news:*"]);
    let per_ip = PER_IP.to_string();
    let url = db.url().to_owned();
    let flags = |node: &'static str| {
        let mut flags = vec![
            "--database",
            url.as_str(),
            "--node-id",
            node,
            "--config",
            config.to_str().expect("a UTF-8 path"),
            "--trusted-proxy",
            "127.0.0.1",
            "--max-connections-per-ip",
            per_ip.as_str(),
        ];
        flags.extend_from_slice(FAST_LEASE);
        flags
    };
    let holder = Server::start_with(&dir.path().join("a"), &flags("node-a")).await;
    holder.api.wait_role("holder", WAIT).await;
    let standby = Server::start_with(&dir.path().join("b"), &flags("node-b")).await;
    standby.api.wait_role("standby", WAIT).await;

    let listen = free_addr();
    let upstreams = [
        holder.url.trim_start_matches("http://"),
        standby.url.trim_start_matches("http://"),
    ];
    let nginx = Nginx::start(&with_addresses(&block, &upstreams, &listen), &listen).await;
    let base = format!("http://{}", nginx.addr);
    let through = Api::with_api_key(&base, &key);
    eprintln!("{} in front of {upstreams:?}", nginx_bin.display());

    // Both nodes answer through nginx.
    let mut node_ids = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let status = through.status().await;
        node_ids.insert(status["node_id"].as_str().expect("a node id").to_owned());
    }
    assert_eq!(node_ids.len(), 2, "nginx reached {node_ids:?}");

    // Subscribers first, so that each must get the publications live.
    let mut sse = SseClient::open(
        &reqwest::Client::new(),
        &format!("{base}/v1/channels/{CHANNEL}/events?token={token}"),
        &[],
    )
    .await
    .expect("an SSE request through nginx");
    assert_eq!(sse.status, 200, "SSE through nginx");
    // A browser's WebSocket: its Origin is the page's, nginx's own.
    let origin = format!("http://{}", nginx.addr);
    let mut request = format!("ws://{}/v1/channels/{CHANNEL}/ws?token={token}", nginx.addr)
        .into_client_request()
        .expect("a WebSocket request");
    request
        .headers_mut()
        .insert("origin", origin.parse().expect("an origin"));
    let (mut ws, answer) = within(
        "a WebSocket through nginx",
        NODE_WAIT,
        tokio_tungstenite::connect_async(request),
    )
    .await
    .expect("the WebSocket of /v1/channels/{channel}/ws through nginx");
    assert_eq!(answer.status().as_u16(), 101);
    let centrifugo_url = format!("ws://{}/connection/websocket", nginx.addr);
    let mut request = centrifugo_url
        .as_str()
        .into_client_request()
        .expect("a WebSocket request");
    request
        .headers_mut()
        .insert("origin", origin.parse().expect("an origin"));
    let (mut raw, answer) = within(
        "Centrifugo's WebSocket through nginx",
        NODE_WAIT,
        tokio_tungstenite::connect_async(request),
    )
    .await
    .expect("the WebSocket of /connection/websocket through nginx");
    assert_eq!(answer.status().as_u16(), 101);
    raw.send(Frame::Text(
        json!({"id": 1, "connect": {"token": token}})
            .to_string()
            .into(),
    ))
    .await
    .expect("send connect");
    raw.send(Frame::Text(
        json!({"id": 2, "subscribe": {"channel": CHANNEL}})
            .to_string()
            .into(),
    ))
    .await
    .expect("send subscribe");
    let mut closed = None;
    let mut replies = Vec::new();
    while replies.len() < 2 {
        let reply = within(
            "Centrifugo's replies",
            NODE_WAIT,
            ws_next(&mut raw, &mut closed),
        )
        .await
        .unwrap_or_else(|| panic!("the Centrifugo connection closed ({closed:?})"));
        // Replies have an id; a ping (`{}`) has none.
        if !reply["id"].is_null() {
            replies.push(reply);
        }
    }
    assert!(replies[0]["connect"]["client"].is_string(), "{replies:?}");
    assert_eq!(replies[1]["id"], 2, "{replies:?}");
    assert!(replies[1]["error"].is_null(), "{replies:?}");
    let mut sdk = SdkClient::start(Sdk::Js, "through nginx", &centrifugo_url, &token, CHANNEL);
    let subscribed = sdk.follow().await;
    assert_eq!(subscribed["channel"], CHANNEL, "{subscribed}");
    // Over HTTP streaming: its commands reach either node through nginx
    // (`/emulation`), forwarded to the one that runs the session.
    let http_stream_url = format!("http://{}/connection/http_stream", nginx.addr);
    let mut streamed = SdkClient::start(
        Sdk::Js,
        "over HTTP streaming through nginx",
        &http_stream_url,
        &token,
        CHANNEL,
    );
    let subscribed = streamed.follow().await;
    assert_eq!(subscribed["channel"], CHANNEL, "{subscribed}");

    // Every publishing route, each request to whichever node nginx picks
    // (a standby forwards it to the holder).
    let mut offset = 0;
    for n in 0..4 {
        let answer = through
            .try_publish(CHANNEL, &json!({ "n": n }), Some(&format!("single-{n}")))
            .await
            .expect("a publish through nginx");
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
        offset += 1;
        assert_eq!(answer.body["offset"], offset, "{answer:?}");
    }
    let http = reqwest::Client::new();
    for n in 4..6 {
        let batch = http
            .post(format!("{base}/v1/messages"))
            .bearer_auth(&key)
            .json(&json!({ "messages": [{ "channel": CHANNEL, "data": { "n": n } }] }))
            .send()
            .await
            .expect("a batch publish through nginx");
        assert_eq!(batch.status(), StatusCode::CREATED);
        offset += 1;
        let body: Value = batch.json().await.expect("a JSON answer");
        assert_eq!(body["results"][0]["offset"], offset, "{body}");
    }
    for n in 6..8 {
        let publish = http
            .post(format!("{base}/api/publish"))
            .header("X-API-Key", &key)
            .json(&json!({ "channel": CHANNEL, "data": { "n": n } }))
            .send()
            .await
            .expect("a server API publish through nginx");
        assert_eq!(publish.status(), StatusCode::OK);
        let body: Value = publish.json().await.expect("a JSON answer");
        assert!(body["error"].is_null(), "{body}");
        offset += 1;
        assert_eq!(body["result"]["offset"], offset, "{body}");
    }
    let (head, history) = through.history_all(CHANNEL, 3).await;
    assert_eq!(head, offset);
    let ns: Vec<Value> = history.iter().map(|m| m["data"]["n"].clone()).collect();
    assert_eq!(ns, (0..8).map(|n| json!(n)).collect::<Vec<_>>());

    // Every subscriber got every publication, live, in order.
    for want in 1..=offset {
        let (got, message) = sse.expect_message().await;
        assert_eq!(got, want, "SSE through nginx: {message}");
        let frame = within("a WebSocket frame", WAIT, ws_next(&mut ws, &mut closed))
            .await
            .unwrap_or_else(|| panic!("the WebSocket closed ({closed:?})"));
        assert_eq!(frame["offset"], want, "WebSocket through nginx: {frame}");
    }
    let mut pushed = Vec::new();
    while pushed.len() < usize::try_from(offset).expect("a small offset") {
        let push = within("a Centrifugo push", WAIT, ws_next(&mut raw, &mut closed))
            .await
            .unwrap_or_else(|| panic!("the Centrifugo connection closed ({closed:?})"));
        if let Some(offset) = push["push"]["pub"]["offset"].as_u64() {
            pushed.push(offset);
        }
    }
    assert_eq!(pushed, (1..=offset).collect::<Vec<_>>());
    sdk.received_up_to(offset).await;
    let offsets: Vec<u64> = sdk.received.iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, (1..=offset).collect::<Vec<_>>());
    sdk.stop().await;
    streamed.received_up_to(offset).await;
    let offsets: Vec<u64> = streamed.received.iter().map(|(o, _)| *o).collect();
    assert_eq!(
        offsets,
        (1..=offset).collect::<Vec<_>>(),
        "over HTTP streaming"
    );
    streamed.stop().await;

    // More event streams than one address may open, from as many client
    // addresses: each counts against its own, none is refused.
    let streams = open_streams(&base, &token, STREAMS, |i| {
        IpAddr::from([127, 0, 1, u8::try_from(i + 1).expect("a small index")])
    })
    .await;
    let refused = streams.iter().filter(|(status, _)| *status != 200).count();
    assert_eq!(
        refused,
        0,
        "{refused} of {STREAMS} event streams from distinct addresses were refused: {:?}",
        streams.iter().map(|(s, _)| *s).collect::<Vec<_>>()
    );
    // From one address, the limit holds per node; each node that refused
    // logs it once, naming the address and the setting.
    let crowded = "127.0.2.1";
    let more = open_streams(&base, &token, STREAMS, |_| {
        crowded.parse().expect("an address")
    })
    .await;
    let statuses: Vec<u16> = more.iter().map(|(status, _)| *status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        2 * PER_IP,
        "each node lets {PER_IP} streams of one address in: {statuses:?}"
    );
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    drop(more);
    drop(streams);
    for node in [&holder, &standby] {
        node.wait_log_record("the refusal's WARN", WAIT, |r| {
            r["setting"] == "max_connections_per_ip" && r["client_ip"] == crowded
        })
        .await;
    }
    // Stop both nodes and read their whole logs: one WARN each.
    for node in [&holder, &standby] {
        node.sigterm();
        node.wait_log_record("the end of the drain", NODE_WAIT, |r| {
            r["message"] == "drained"
        })
        .await;
        let warnings = refusal_warnings(node, crowded);
        assert_eq!(warnings.len(), 1, "{}: {warnings:?}", node.url);
        assert_eq!(warnings[0]["limit"], PER_IP, "{}", warnings[0]);
        assert!(warnings[0]["node_id"].is_string(), "{}", warnings[0]);
        assert!(
            refusal_warnings(node, "127.0.0.1").is_empty(),
            "nginx's own address was refused"
        );
    }
    drop(ws);
    drop(raw);
    drop(nginx);
}

//! The browser check: centrifuge-js, Centrifugo's JavaScript SDK (npm
//! `centrifuge`, its browser bundle), running in a page in headless
//! Chromium, connects to `herald serve`'s `/connection/websocket` with an
//! HS256 token, subscribes, and receives a message published through
//! Herald's HTTP API with an API key: the data byte for byte and the
//! acknowledged offset, right after the subscribe position.
//!
//! The page is served and driven by `tests/clients/browser.mjs` (Node.js
//! with `playwright-core`), which prints what the page sees as JSON lines.
//! Its origin (a free loopback port of its own) is another than the
//! node's, so the node allows it in `[cors] allowed_origins`: a WebSocket
//! from an origin not allowed is refused.
//! The test command installs the packages (`npm ci` in `tests/clients`)
//! and Debian's `chromium`, and names them in `HERALD_TEST_NODE_CLIENTS`
//! and `HERALD_TEST_CHROMIUM` (and `node` in `HERALD_TEST_NODE`, else
//! `node` on `PATH`).

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use herald_testkit::clients::{chromium_bin as chromium, node_bin, node_clients, ClientProcess};
use herald_testkit::process::Server;
use herald_testkit::{within, WAIT};
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::{json, Value};
use tokio::process::Command;

/// The channel the page subscribes to (the default namespace rule:
/// subscribing needs a token that lists it).
const CHANNEL: &str = "news:browser";

/// Bound of each wait on the browser: starting Chromium and loading a page
/// on a busy machine takes seconds.
const BROWSER_WAIT: Duration = Duration::from_secs(60);

/// One `node browser.mjs` process (which owns the browser): reports out.
/// Dropping it kills `node`; Chromium, started by Playwright with
/// `--remote-debugging-pipe`, exits by itself when that pipe closes.
struct Browser {
    /// Its stdin takes the WebSocket URL, then is kept open: the script
    /// closes the browser and exits when it ends.
    process: ClientProcess,
}

impl Browser {
    /// Starts the page's server (its first report is the page's origin);
    /// once [`Browser::open`] names the WebSocket URL, the page's client
    /// connects there with `token` and subscribes to `channel`. Temporary
    /// files (the browser's profile) go to `tmp`.
    fn start(tmp: &Path, token: &str, channel: &str) -> Self {
        let clients = node_clients(
            &["centrifuge", "playwright-core"],
            &["browser.mjs", "chromium.mjs"],
        );
        let mut command = Command::new(node_bin());
        command
            .arg(clients.join("browser.mjs"))
            .arg(chromium())
            .arg(token)
            .arg(channel)
            .current_dir(&clients)
            .env("TMPDIR", tmp);
        Self {
            process: ClientProcess::spawn(command),
        }
    }

    /// Opens the page, whose client connects to `ws_url`.
    async fn open(&mut self, ws_url: &str) {
        self.process.send_line(ws_url).await;
    }

    fn stderr_text(&self) -> String {
        self.process.stderr_text()
    }

    /// The next report, which must be of `kind`; a `failed` report, or
    /// the script ending first, fails the test with what it said.
    async fn expect(&mut self, kind: &str) -> Value {
        let line = within(
            &format!("the page's {kind} report"),
            BROWSER_WAIT,
            self.process.reports.next_line(),
        )
        .await
        .expect("read the script's stdout");
        let Some(line) = line else {
            let status = within("browser.mjs to exit", WAIT, self.process.child.wait()).await;
            panic!(
                "browser.mjs ended ({status:?}) before a {kind} report; stderr:\n{}",
                self.stderr_text()
            );
        };
        let report: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("a report that is not JSON ({e}): {line}"));
        assert_eq!(
            report["type"],
            kind,
            "{report}; stderr:\n{}",
            self.stderr_text()
        );
        report
    }
}

/// An HS256 token for the user `browser`, valid for 5 minutes, that may
/// subscribe to `news:*`.
fn token(secret: &str) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = json!({ "sub": "browser", "iat": now, "exp": now + 300, "channels": ["news:*"] });
    encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn centrifuge_js_in_headless_chromium_receives_a_publication() {
    // Fail at once, before a server starts, when the set-up is missing.
    node_clients(
        &["centrifuge", "playwright-core"],
        &["browser.mjs", "chromium.mjs"],
    );
    chromium();

    let dir = tempfile::tempdir().unwrap();
    let api_key = herald_auth::generate_api_key();
    let jwt_secret = herald_auth::generate_api_key();
    let config = dir.path().join("herald.toml");
    std::fs::write(
        &config,
        format!(
            "[auth]\n\
             api_keys = [{{ name = \"backend\", sha256 = \"{}\", permissions = [\"publish\"] }}]\n\
             \n\
             [auth.jwt]\n\
             hs256_secret = \"{jwt_secret}\"\n",
            herald_auth::api_key_sha256(&api_key)
        ),
    )
    .unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();

    let mut browser = Browser::start(&tmp, &token(&jwt_secret), CHANNEL);
    let origin = browser.expect("origin").await;
    let origin = origin["origin"].as_str().expect("an origin").to_owned();
    let server = Server::start_with(
        &dir.path().join("data"),
        &[
            "--config",
            config.to_str().unwrap(),
            "--cors-allowed-origins",
            &origin,
        ],
    )
    .await;
    let ws_url = format!(
        "{}/connection/websocket",
        server.url.replacen("http://", "ws://", 1)
    );
    browser.open(&ws_url).await;
    let subscribed = browser.expect("subscribed").await;
    println!("{subscribed}");
    assert_eq!(subscribed["channel"], CHANNEL, "{subscribed}");
    assert_eq!(subscribed["offset"], 0, "a new channel: {subscribed}");
    let user_agent = subscribed["userAgent"].as_str().unwrap_or_default();
    assert!(
        user_agent.contains("HeadlessChrome"),
        "not headless Chromium: {subscribed}"
    );

    // Published through Herald's own HTTP API, with the API key.
    let data = json!({ "text": "hello, browser", "n": 1 });
    let http = reqwest::Client::builder().timeout(WAIT).build().unwrap();
    let answer = http
        .post(format!("{}/v1/channels/{CHANNEL}/messages", server.url))
        .header("authorization", format!("Bearer {api_key}"))
        .json(&json!({ "data": data }))
        .send()
        .await
        .expect("publish request");
    assert_eq!(answer.status(), reqwest::StatusCode::CREATED);
    let answer: Value = answer.json().await.unwrap();
    let offset = answer["offset"].as_u64().expect("an offset");
    assert_eq!(offset, 1, "{answer}");

    let publication = browser.expect("publication").await;
    println!("{publication}");
    assert_eq!(publication["channel"], CHANNEL, "{publication}");
    assert_eq!(publication["offset"], offset, "{publication}");
    assert_eq!(publication["data"], data, "{publication}");

    // The script closes the browser and its HTTP server, then exits 0.
    let status = within(
        "browser.mjs to exit",
        BROWSER_WAIT,
        browser.process.child.wait(),
    )
    .await
    .unwrap();
    assert!(
        status.success(),
        "browser.mjs exited with {status}; stderr:\n{}",
        browser.stderr_text()
    );
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "the browser left files behind: {left:?}");
}

//! Centrifugo's client SDKs as child processes, one driver for both:
//! centrifuge-js under Node.js (`tests/clients/centrifuge.mjs`) and
//! centrifuge-python (`tests/clients/python/centrifuge_follow.py`) read the
//! same commands on stdin and print the same reports on stdout (JSON
//! lines, in the shapes `centrifuge.mjs` documents), so that one test
//! scenario runs with either SDK ([`SdkClient`]).

use std::process::Stdio;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::clients::{node_bin, node_clients, python_bin, python_script};
use crate::{within, NODE_WAIT};

/// A Centrifugo client SDK the tests drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sdk {
    /// centrifuge-js (npm `centrifuge`), under Node.js with `ws`, through
    /// `tests/clients/centrifuge.mjs`.
    Js,
    /// centrifuge-python (PyPI `centrifuge-python`), through
    /// `tests/clients/python/centrifuge_follow.py`.
    Python,
}

impl Sdk {
    /// Checks that the SDK is installed, so that a test fails at once,
    /// before it starts servers, when it is not.
    ///
    /// # Panics
    /// Saying what to install, when it is missing (see
    /// [`crate::clients`]).
    pub fn check(self) {
        self.command();
    }

    /// The command that runs the SDK's script, without its arguments.
    fn command(self) -> Command {
        match self {
            Self::Js => {
                let clients = node_clients(&["centrifuge", "ws"], &["centrifuge.mjs"]);
                let mut command = Command::new(node_bin());
                command
                    .arg(clients.join("centrifuge.mjs"))
                    .current_dir(&clients);
                command
            }
            Self::Python => {
                let mut command = Command::new(python_bin());
                command.arg(python_script("centrifuge_follow.py"));
                command
            }
        }
    }
}

/// One SDK client process: commands in ([`SdkClient::send`]), reports out
/// ([`SdkClient::expect`]). It connects as it starts. On the way to the
/// report a test waits for, it records what concerns the channel it
/// follows: publications, `subscribed` reports and reconnects.
pub struct SdkClient {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    reports: Lines<BufReader<ChildStdout>>,
    channel: String,
    /// `(offset, data)` of every publication of the followed channel, of a
    /// client-side (`publication`) or a server-side subscription
    /// (`server_publication`), in arrival order.
    pub received: Vec<(u64, Value)>,
    /// The tags of each of [`Self::received`] (`null` for none).
    pub received_tags: Vec<Value>,
    /// Every `subscribed` and `server_subscribed` report of the followed
    /// channel, in arrival order.
    pub subscribed: Vec<Value>,
    /// `connecting` reports for a lost connection (code 0 is the SDK's own
    /// `connect()` call, not counted).
    pub reconnects: usize,
}

impl SdkClient {
    /// Starts `sdk`'s client of the WebSocket `url` with the connection
    /// `token`, following `channel`; `what` names it in failures.
    ///
    /// # Panics
    /// When the SDK is not installed or its process cannot start.
    pub fn start(sdk: Sdk, what: &str, url: &str, token: &str, channel: &str) -> Self {
        Self::spawn(sdk, what, url, token, channel, &[])
    }

    /// As [`SdkClient::start`], with a `getToken` on the client and on its
    /// subscriptions that answers the tokens queued by the command
    /// `{"op": "tokens", "tokens": [...]}` (a subscription's with
    /// `"channel"`), then the last of them again, and reports each call
    /// (`{"type": "get_token", "channel": ...}`). centrifuge-js only.
    ///
    /// # Panics
    /// As [`SdkClient::start`], or for another SDK.
    pub fn start_with_get_token(
        sdk: Sdk,
        what: &str,
        url: &str,
        token: &str,
        channel: &str,
    ) -> Self {
        assert_eq!(sdk, Sdk::Js, "getToken is driven for centrifuge-js only");
        Self::spawn(sdk, what, url, token, channel, &["--get-token"])
    }

    /// As [`SdkClient::start`], with the SDK speaking Centrifugo's binary
    /// protocol (centrifuge-js's protobuf build, over WebSocket or HTTP
    /// streaming by `url`; centrifuge-python's `use_protobuf`, over
    /// WebSocket).
    ///
    /// # Panics
    /// As [`SdkClient::start`].
    pub fn start_protobuf(sdk: Sdk, what: &str, url: &str, token: &str, channel: &str) -> Self {
        Self::spawn(sdk, what, url, token, channel, &["--protobuf"])
    }

    fn spawn(sdk: Sdk, what: &str, url: &str, token: &str, channel: &str, extra: &[&str]) -> Self {
        let mut child = sdk
            .command()
            .arg(url)
            .arg(token)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the {sdk:?} client: {e}"));
        let stdin = child.stdin.take();
        let reports = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        Self {
            what: format!("{sdk:?} client {what}"),
            child,
            stdin,
            reports,
            channel: channel.to_owned(),
            received: Vec::new(),
            received_tags: Vec::new(),
            subscribed: Vec::new(),
            reconnects: 0,
        }
    }

    /// What the client is, as failures name it (`"<Sdk> client <what>"`).
    pub fn what(&self) -> &str {
        &self.what
    }

    /// Sends one command (a JSON object, e.g. `{"op": "subscribe",
    /// "channel": "news:a"}`).
    pub async fn send(&mut self, command: Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write a command");
        stdin.flush().await.expect("flush a command");
    }

    /// Reads reports until one satisfies `wanted` and returns it, recording
    /// publications, `subscribed` reports and reconnects on the way.
    ///
    /// # Panics
    /// On a `failed` report that `wanted` does not accept, when the client
    /// ends first, or after [`NODE_WAIT`].
    pub async fn expect(&mut self, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
        let client = self.what.clone();
        within(&format!("{client}: {what}"), NODE_WAIT, async {
            loop {
                let line = self
                    .reports
                    .next_line()
                    .await
                    .expect("read the client's stdout")
                    .unwrap_or_else(|| panic!("{client} ended before {what}"));
                let report: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("{client}: not JSON ({e}): {line}"));
                self.record(&report);
                if wanted(&report) {
                    return report;
                }
                assert_ne!(report["type"], "failed", "{client}: {report}");
            }
        })
        .await
    }

    fn record(&mut self, report: &Value) {
        if report["type"] == "connecting" && report["code"] != 0 {
            self.reconnects += 1;
        }
        if report["channel"] != self.channel.as_str() {
            return;
        }
        if is_publication(report) {
            let offset = report["offset"].as_u64().expect("an offset");
            self.received.push((offset, report["data"].clone()));
            self.received_tags.push(report["tags"].clone());
        }
        if report["type"] == "subscribed" || report["type"] == "server_subscribed" {
            self.subscribed.push(report.clone());
        }
    }

    /// Waits for `connected`, subscribes to the followed channel and
    /// returns its `subscribed` report.
    pub async fn follow(&mut self) -> Value {
        self.expect("connected", is("connected", "")).await;
        let channel = self.channel.clone();
        self.send(serde_json::json!({"op": "subscribe", "channel": channel}))
            .await;
        self.expect("subscribed", |r| {
            r["type"] == "subscribed" && r["channel"] == channel.as_str()
        })
        .await
    }

    /// Waits until the followed channel's publications reach `offset`.
    pub async fn received_up_to(&mut self, offset: u64) {
        if self.received.last().is_some_and(|(o, _)| *o >= offset) {
            return;
        }
        let channel = self.channel.clone();
        self.expect(&format!("publication {offset}"), |r| {
            is_publication(r)
                && r["channel"] == channel.as_str()
                && r["offset"].as_u64() >= Some(offset)
        })
        .await;
    }

    /// Closes its stdin (the script disconnects and exits) and expects
    /// exit status 0.
    ///
    /// # Panics
    /// When it does not exit within [`NODE_WAIT`] or exits otherwise.
    pub async fn stop(mut self) {
        drop(self.stdin.take());
        let status = within(
            &format!("{} to exit", self.what),
            NODE_WAIT,
            self.child.wait(),
        )
        .await
        .expect("wait for the client");
        assert!(status.success(), "{}: {status}", self.what);
    }
}

/// A publication report, of a client-side (`publication`) or a
/// server-side subscription (`server_publication`).
pub fn is_publication(report: &Value) -> bool {
    report["type"] == "publication" || report["type"] == "server_publication"
}

/// A predicate for [`SdkClient::expect`]: a report of type `kind` about
/// `channel` (any channel when empty).
pub fn is(kind: &'static str, channel: &'static str) -> impl Fn(&Value) -> bool {
    move |r| r["type"] == kind && (channel.is_empty() || r["channel"] == channel)
}

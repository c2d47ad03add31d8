//! A client of one node's HTTP API, for the process tests: one-shot
//! requests with a 10 s timeout ([`WAIT`]), streams without one.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::sse::SseClient;
use crate::{within, POLL, WAIT};

/// A client of one server's HTTP API.
#[derive(Clone)]
pub struct Api {
    /// Base URL without a trailing `/`.
    pub base: String,
    /// For one-shot requests (10 s timeout each).
    http: reqwest::Client,
    /// For streams: no total timeout.
    stream_http: reqwest::Client,
}

/// The answer to one request: status and JSON body (`null` when the body
/// is not JSON).
#[derive(Debug)]
pub struct Answer {
    /// The status code.
    pub status: StatusCode,
    /// The body as JSON, or `null`.
    pub body: Value,
}

impl Answer {
    /// Asserts the `{"error":{"code","message"}}` shape with `code`.
    pub fn assert_error(&self, status: StatusCode, code: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.body["error"]["code"], code, "{self:?}");
        let message = self.body["error"]["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty(), "an error without a message: {self:?}");
    }
}

impl Api {
    /// A client of the server at `base`.
    pub fn new(base: &str) -> Self {
        Self::with_builder(base, reqwest::Client::builder)
    }

    /// A client of the server at `base` whose HTTP clients start from
    /// `builder()` (e.g. one that trusts a test CA).
    pub fn with_builder(base: &str, builder: impl Fn() -> reqwest::ClientBuilder) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            http: builder()
                .timeout(WAIT)
                .build()
                .expect("build the HTTP client"),
            stream_http: builder()
                .connect_timeout(WAIT)
                .build()
                .expect("build the HTTP client"),
        }
    }

    /// A client of the server at `base` whose every request carries the
    /// API key `key` (`Authorization: Bearer <key>`, marked sensitive so
    /// that it is never printed).
    pub fn with_api_key(base: &str, key: &str) -> Self {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
            .expect("an API key is a header value");
        value.set_sensitive(true);
        let headers =
            reqwest::header::HeaderMap::from_iter([(reqwest::header::AUTHORIZATION, value)]);
        Self::with_builder(base, move || {
            reqwest::Client::builder().default_headers(headers.clone())
        })
    }

    fn messages_url(&self, channel: &str) -> String {
        format!("{}/v1/channels/{channel}/messages", self.base)
    }

    async fn answer(resp: reqwest::Response) -> Result<Answer, reqwest::Error> {
        let status = resp.status();
        let bytes = resp.bytes().await?;
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok(Answer { status, body })
    }

    /// `POST` a raw body to a channel's messages.
    pub async fn post_raw(
        &self,
        channel: &str,
        body: Vec<u8>,
        idempotency_key: Option<&str>,
    ) -> Result<Answer, reqwest::Error> {
        let mut req = self
            .http
            .post(self.messages_url(channel))
            .header("content-type", "application/json")
            .body(body);
        if let Some(key) = idempotency_key {
            req = req.header("Idempotency-Key", key);
        }
        Self::answer(req.send().await?).await
    }

    /// Publishes `{"data": data}`.
    pub async fn try_publish(
        &self,
        channel: &str,
        data: &Value,
        idempotency_key: Option<&str>,
    ) -> Result<Answer, reqwest::Error> {
        let body = serde_json::to_vec(&json!({ "data": data })).expect("serialize");
        self.post_raw(channel, body, idempotency_key).await
    }

    /// Publishes `{"n": n}` to `channel` with the idempotency key `n-<n>`,
    /// retried with the same key every [`POLL`] until acknowledged (201,
    /// or 200 for a retry whose first attempt committed) within `limit`:
    /// a failover or a restart makes answers fail for a moment. The
    /// offset must be `n`, so that no retry stored it twice. Returns how
    /// many attempts failed.
    ///
    /// # Panics
    /// When no attempt is acknowledged within `limit`, or the offset is
    /// not `n`.
    pub async fn publish_numbered(&self, channel: &str, n: u64, limit: Duration) -> usize {
        let key = format!("n-{n}");
        let deadline = Instant::now() + limit;
        let mut failed = 0;
        loop {
            if let Ok(answer) = self
                .try_publish(channel, &json!({ "n": n }), Some(&key))
                .await
            {
                if answer.status == StatusCode::CREATED || answer.status == StatusCode::OK {
                    assert_eq!(answer.body["offset"], n, "{answer:?}");
                    return failed;
                }
            }
            failed += 1;
            assert!(
                Instant::now() < deadline,
                "publication {n} not acknowledged within {limit:?}"
            );
            // Pacing between attempts, not a wait for an event.
            tokio::time::sleep(POLL).await;
        }
    }

    /// Publishes `data`, expecting 201; returns the acknowledged offset.
    pub async fn publish(&self, channel: &str, data: &Value) -> u64 {
        let answer = self
            .try_publish(channel, data, None)
            .await
            .expect("publish request");
        assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
        assert_eq!(answer.body["channel"], channel, "{answer:?}");
        assert!(answer.body["published_at"].is_string(), "{answer:?}");
        answer.body["offset"].as_u64().expect("an offset")
    }

    /// `GET` a path (with its query), expecting a JSON answer.
    pub async fn get(&self, path_and_query: &str) -> Answer {
        let resp = self
            .http
            .get(format!("{}{path_and_query}", self.base))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path_and_query}: {e}"));
        Self::answer(resp)
            .await
            .unwrap_or_else(|e| panic!("GET {path_and_query}: {e}"))
    }

    /// One history page.
    pub async fn history_page(&self, channel: &str, after: u64, limit: u32) -> Value {
        let answer = self
            .get(&format!(
                "/v1/channels/{channel}/messages?after={after}&limit={limit}"
            ))
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        answer.body
    }

    /// The channel's head (0 for a channel never written).
    pub async fn head(&self, channel: &str) -> u64 {
        self.history_page(channel, 0, 1).await["head"]
            .as_u64()
            .expect("a head")
    }

    /// Every stored message of `channel`, paging `limit` at a time, and the
    /// head of the first page. Checks each page's shape on the way.
    pub async fn history_all(&self, channel: &str, limit: u32) -> (u64, Vec<Value>) {
        let mut after = 0;
        let mut head = None;
        let mut all = Vec::new();
        loop {
            let page = self.history_page(channel, after, limit).await;
            assert_eq!(page["channel"], channel, "{page}");
            head.get_or_insert(page["head"].as_u64().expect("a head"));
            let messages = page["messages"].as_array().expect("messages").clone();
            assert!(messages.len() <= limit as usize, "page over its limit");
            let Some(last) = messages.last() else { break };
            after = last["offset"].as_u64().expect("an offset");
            all.extend(messages);
        }
        (head.unwrap_or(0), all)
    }

    /// `/v1/status`.
    pub async fn status(&self) -> Value {
        let answer = self.get("/v1/status").await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        answer.body
    }

    /// Polls `/v1/status` until `role` shows, failing after `limit`.
    pub async fn wait_role(&self, role: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let status = self.status().await;
            if status["role"] == role {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not become {role} within {limit:?}: {status}",
                self.base
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Opens a channel's SSE stream with extra `headers` and `query`
    /// (empty, or starting with `?`), and checks that it is one: `200` with
    /// an event stream.
    ///
    /// # Panics
    /// When the request fails, is not answered within [`WAIT`], or the
    /// answer is not an event stream.
    pub async fn sse(&self, channel: &str, query: &str, headers: &[(&str, &str)]) -> SseClient {
        let url = format!("{}/v1/channels/{channel}/events{query}", self.base);
        let sse = within(
            "the SSE answer",
            WAIT,
            SseClient::open(&self.stream_http, &url, headers),
        )
        .await
        .expect("open the SSE stream");
        assert_eq!(sse.status, StatusCode::OK);
        let content_type = sse
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        sse
    }
}

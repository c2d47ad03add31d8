//! The SSE client of the tests: reads an event stream (WHATWG HTML,
//! "Server-sent events") block by block from a reqwest response, so that a
//! test sees message events and also the comment blocks that carry
//! Herald's heartbeats (a library such as `eventsource-stream` drops
//! those).
//!
//! Lines end with LF or CRLF (a lone CR, which Herald never sends, is not
//! taken as a line end). A block ends at an empty line; a block with at
//! least one field is an event, one of comment lines only is a comment; an
//! unfinished block at the end of the body is dropped, as the standard
//! says.

use std::pin::Pin;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde_json::Value;

use crate::{within, NODE_WAIT, WAIT};

/// One event of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The last `id` field, if any.
    pub id: Option<String>,
    /// The last `event` field (the event's type), if any.
    pub event: Option<String>,
    /// The `data` fields, joined with `\n`.
    pub data: String,
}

/// One block of an event stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseItem {
    /// A block with at least one field.
    Event(SseEvent),
    /// A block of comment lines only (`:`), such as a heartbeat; the text
    /// after each colon, one line each.
    Comment(String),
}

/// How an event stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEnd {
    /// The body finished cleanly.
    Closed,
    /// The body broke; the transport's error.
    Broken(String),
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// One SSE response being read.
pub struct SseClient {
    /// The response's status code.
    pub status: u16,
    /// The response's headers.
    pub headers: reqwest::header::HeaderMap,
    body: ByteStream,
    /// Bytes received and not yet split into lines.
    pending: Vec<u8>,
    /// The lines of the block being read.
    block: Vec<String>,
    /// Set once the body ended; every later read returns it.
    end: Option<SseEnd>,
    /// The last reconnection time the stream announced (`retry:`, ms).
    pub retry_ms: Option<u64>,
}

impl SseClient {
    /// Opens `url` (`Accept: text/event-stream`), sending `Last-Event-ID`
    /// when given. Whatever the status, the answer is returned for the test
    /// to check.
    ///
    /// # Panics
    /// When the request fails or no answer comes within [`NODE_WAIT`].
    pub async fn connect(client: &reqwest::Client, url: &str, last_event_id: Option<&str>) -> Self {
        let headers: Vec<(&str, &str)> = last_event_id
            .map(|id| ("last-event-id", id))
            .into_iter()
            .collect();
        within("SSE connect", NODE_WAIT, Self::open(client, url, &headers))
            .await
            .expect("SSE request")
    }

    /// Opens `url` (`Accept: text/event-stream`) with extra `headers`;
    /// `Err` when the request failed (no answer came).
    pub async fn open(
        client: &reqwest::Client,
        url: &str,
        headers: &[(&str, &str)],
    ) -> reqwest::Result<Self> {
        let mut request = client.get(url).header("accept", "text/event-stream");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        Ok(Self::from_response(request.send().await?))
    }

    /// Reads the body of `response` as an event stream.
    pub fn from_response(response: reqwest::Response) -> Self {
        Self {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: Box::pin(response.bytes_stream()),
            pending: Vec::new(),
            block: Vec::new(),
            end: None,
            retry_ms: None,
        }
    }

    /// The next event or comment block, or how the stream ended.
    pub async fn read_item(&mut self) -> Result<SseItem, SseEnd> {
        loop {
            while let Some(line) = self.next_line() {
                if !line.is_empty() {
                    self.block.push(line);
                    continue;
                }
                let block = std::mem::take(&mut self.block);
                if let Some(retry) = block.iter().rev().find_map(|l| l.strip_prefix("retry:")) {
                    self.retry_ms = retry.trim().parse().ok().or(self.retry_ms);
                }
                if let Some(item) = Self::parse_block(&block) {
                    return Ok(item);
                }
            }
            if let Some(end) = &self.end {
                return Err(end.clone());
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.pending.extend_from_slice(&chunk),
                Some(Err(e)) => self.end = Some(SseEnd::Broken(e.to_string())),
                None => self.end = Some(SseEnd::Closed),
            }
        }
    }

    /// The next event or comment block (a heartbeat); `None` when the
    /// stream ended.
    pub async fn next_item(&mut self) -> Option<SseItem> {
        self.read_item().await.ok()
    }

    /// The next event, comments skipped; `None` when the stream ended.
    pub async fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            match self.next_item().await? {
                SseItem::Event(event) => return Some(event),
                SseItem::Comment(_) => {}
            }
        }
    }

    /// The next event's message (its JSON data), or how the stream ended.
    ///
    /// # Panics
    /// When the event is not of type `message`, its data is not JSON, or
    /// its id is not the message's `offset`.
    pub async fn read_message(&mut self) -> Result<Value, SseEnd> {
        let event = loop {
            match self.read_item().await? {
                SseItem::Event(event) => break event,
                SseItem::Comment(_) => {}
            }
        };
        assert_eq!(event.event.as_deref(), Some("message"));
        let value: Value = serde_json::from_str(&event.data).expect("event data is JSON");
        assert_eq!(
            event.id.as_deref(),
            Some(value["offset"].to_string().as_str()),
            "the id is the message's offset"
        );
        Ok(value)
    }

    /// [`SseClient::read_message`]; `None` when the stream ended.
    pub async fn next_message(&mut self) -> Option<Value> {
        self.read_message().await.ok()
    }

    /// The next message as `(offset, message)`, within [`WAIT`].
    ///
    /// # Panics
    /// When the stream ended or no message came in time, and as
    /// [`SseClient::read_message`].
    pub async fn expect_message(&mut self) -> (u64, Value) {
        let message = within("the next SSE event", WAIT, self.read_message())
            .await
            .unwrap_or_else(|end| panic!("the SSE stream ended: {end:?}"));
        let offset = message["offset"].as_u64().expect("a numeric offset");
        (offset, message)
    }

    /// The next whole line of `pending` without its line end, if one has
    /// arrived.
    fn next_line(&mut self) -> Option<String> {
        let end = self.pending.iter().position(|b| *b == b'\n')?;
        let mut line: Vec<u8> = self.pending.drain(..=end).collect();
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        Some(String::from_utf8(line).expect("an event stream is UTF-8"))
    }

    /// The item of one block's lines; `None` for a block without lines,
    /// and for one whose only field is `retry` (no event is dispatched for
    /// it: WHATWG HTML, "Server-sent events", "Processing model").
    fn parse_block(lines: &[String]) -> Option<SseItem> {
        let mut event = SseEvent {
            id: None,
            event: None,
            data: String::new(),
        };
        let mut data: Vec<&str> = Vec::new();
        let mut comments: Vec<&str> = Vec::new();
        let mut fields = 0;
        for line in lines {
            if let Some(comment) = line.strip_prefix(':') {
                comments.push(comment);
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            if field == "retry" {
                continue;
            }
            fields += 1;
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => event.id = Some(value.to_owned()),
                "event" => event.event = Some(value.to_owned()),
                "data" => data.push(value),
                _ => {}
            }
        }
        event.data = data.join("\n");
        if fields > 0 {
            Some(SseItem::Event(event))
        } else if !comments.is_empty() {
            Some(SseItem::Comment(comments.join("\n")))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn a_block_with_fields_is_an_event() {
        assert_eq!(
            SseClient::parse_block(&lines("id: 7\nevent: message\ndata: {\"a\":\ndata: 1}")),
            Some(SseItem::Event(SseEvent {
                id: Some("7".to_owned()),
                event: Some("message".to_owned()),
                data: "{\"a\":\n1}".to_owned(),
            }))
        );
    }

    #[test]
    fn a_block_of_comments_is_a_comment() {
        assert_eq!(
            SseClient::parse_block(&lines(":")),
            Some(SseItem::Comment(String::new()))
        );
        assert_eq!(SseClient::parse_block(&[]), None);
    }
}

//! Extractors whose rejections come out as [`Error`], so that every bad
//! request gets the JSON error shape.

use axum::body::Body;
use axum::extract::{FromRequestParts, Path, Query};
use axum::http::header::{CONTENT_LENGTH, EXPECT};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use herald_core::{ChannelName, IdempotencyKey, Offset, Tags, MAX_CHANNEL_NAME_BYTES};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::error::Category;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;

/// The `{channel}` path segment, validated.
#[derive(Debug)]
pub struct ChannelPath(pub ChannelName);

impl<S: Send + Sync> FromRequestParts<S> for ChannelPath {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        // The segment is percent-decoded first; what does not decode to
        // UTF-8 text cannot be a channel name either.
        let Path(name) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| {
                Error::InvalidChannel(format!(
                    "the name does not decode to text; a channel name is 1 to \
                     {MAX_CHANNEL_NAME_BYTES} bytes of ASCII letters, digits, '_', '-', '.', ':'"
                ))
            })?;
        ChannelName::new(name)
            .map(Self)
            .map_err(|e| Error::InvalidChannel(e.to_string()))
    }
}

/// Query parameters parsed into `T` by [`FromQuery`]; any failure is
/// `invalid_query`, in Herald's words (which parameter, what it takes).
#[derive(Debug)]
pub struct ValidQuery<T>(pub T);

impl<T: FromQuery, S: Send + Sync> FromRequestParts<S> for ValidQuery<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|_| {
                Error::InvalidQuery(
                    "the query string is not URL-encoded UTF-8 text (name=value&name=value)"
                        .to_owned(),
                )
            })?;
        T::from_query(&QueryParams(pairs)).map(Self)
    }
}

/// A route's query parameters, parsed from the decoded `name=value` pairs.
pub trait FromQuery: Sized {
    /// Reads the parameters the route knows; others are ignored.
    ///
    /// # Errors
    /// [`Error::InvalidQuery`] naming the parameter and the values it takes.
    fn from_query(params: &QueryParams) -> Result<Self, Error>;
}

/// The decoded `name=value` pairs of a query string, in order.
#[derive(Debug)]
pub struct QueryParams(Vec<(String, String)>);

/// Longest part of a refused value quoted back in an error message, in
/// characters.
const MAX_QUOTED_VALUE_CHARS: usize = 40;

impl QueryParams {
    /// The value of `name`, if given; given more than once is an error.
    pub fn get(&self, name: &str) -> Result<Option<&str>, Error> {
        let mut values = self.0.iter().filter(|(n, _)| n == name);
        let first = values.next().map(|(_, v)| v.as_str());
        if values.next().is_some() {
            return Err(Error::InvalidQuery(format!(
                "{name} is given more than once; give it once"
            )));
        }
        Ok(first)
    }

    /// `name` as an integer from `min` to `max`, if given.
    pub fn integer(&self, name: &str, min: u64, max: u64) -> Result<Option<u64>, Error> {
        let Some(text) = self.get(name)? else {
            return Ok(None);
        };
        match parse_decimal(text) {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(Error::InvalidQuery(format!(
                "{name} must be an integer from {min} to {max}, got {}",
                quoted(text)
            ))),
        }
    }

    /// `name` as one of `allowed` (exact, case-sensitive), if given.
    pub fn one_of(
        &self,
        name: &str,
        allowed: &[&'static str],
    ) -> Result<Option<&'static str>, Error> {
        let Some(text) = self.get(name)? else {
            return Ok(None);
        };
        allowed
            .iter()
            .find(|a| **a == text)
            .map(|a| Some(*a))
            .ok_or_else(|| {
                let list: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
                Error::InvalidQuery(format!(
                    "{name} must be {} or left out, got {}",
                    list.join(" or "),
                    quoted(text)
                ))
            })
    }
}

/// `text` as a non-negative decimal integer: one or more ASCII digits and
/// nothing else (no sign, no space), at most `u64::MAX`. Rust's
/// `u64::from_str` would also take a leading `+`, which Herald's documented
/// syntax does not have.
pub fn parse_decimal(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// `text` in double quotes, cut to [`MAX_QUOTED_VALUE_CHARS`].
fn quoted(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTED_VALUE_CHARS) {
        Some((end, _)) => format!("{:?}…", &text[..end]),
        None => format!("{text:?}"),
    }
}

/// The publish body `{"data": <any JSON value>}`, with `data` kept as its
/// exact text, and optionally `"tags": {"<key>": "<value>", ...}`. Any or
/// no `Content-Type` is accepted. A body (declared by `Content-Length` or
/// streamed) over `max_message_bytes` is `payload_too_large`; it is read to
/// its end (up to 8 MiB) before the answer, because clients that send the
/// whole body before reading the answer would otherwise see a reset
/// connection instead of the 413.
#[derive(Debug)]
pub struct PublishBody {
    /// The text of `data`.
    pub data: Arc<RawValue>,
    /// The message's tags (none without `tags`).
    pub tags: Tags,
    /// The whole body exactly as received (what a standby forwards).
    pub raw: Bytes,
}

/// Exactly the object `{"data": <value>}` or `{"data": <value>, "tags":
/// {<string>: <string>, ...}}`: no other field, no repeat, and not an array
/// (which serde's derived struct visitor would accept).
struct Envelope {
    data: Box<RawValue>,
    tags: Tags,
}

impl<'de> Deserialize<'de> for Envelope {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(EnvelopeVisitor)
    }
}

struct EnvelopeVisitor;

impl<'de> Visitor<'de> for EnvelopeVisitor {
    type Value = Envelope;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            r#"an object {"data": <any JSON value>} with optional "tags": {<string>: <string>}"#,
        )
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Envelope, A::Error> {
        let mut data: Option<Box<RawValue>> = None;
        let mut tags: Option<Tags> = None;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "data" if data.is_some() => return Err(de::Error::duplicate_field("data")),
                "data" => data = Some(map.next_value()?),
                "tags" if tags.is_some() => return Err(de::Error::duplicate_field("tags")),
                "tags" => tags = Some(map.next_value()?),
                _ => return Err(de::Error::unknown_field(&key, &["data", "tags"])),
            }
        }
        let data = data.ok_or_else(|| de::Error::missing_field("data"))?;
        Ok(Envelope {
            data,
            tags: tags.unwrap_or_default(),
        })
    }
}

/// How much of an oversize body is still read (and discarded) so that the
/// client, which may be busy writing it, sees the 413 answer rather than a
/// connection reset; a larger body gets the 413 and the connection closes.
const DRAIN_LIMIT: u64 = 8 * 1024 * 1024;

/// How long reading the rest of an oversize body may take.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

impl PublishBody {
    /// Reads `body` (at most `limit_bytes`, see [`read_limited`]) and
    /// parses it.
    ///
    /// # Errors
    /// As [`read_limited`] and [`parse_publish_body`].
    pub async fn read(headers: &HeaderMap, body: Body, limit_bytes: usize) -> Result<Self, Error> {
        let raw = read_limited(headers, body, limit_bytes).await?;
        let (data, tags) = parse_publish_body(&raw)?;
        Ok(Self { data, tags, raw })
    }
}

/// Reads a request body of at most `limit` bytes; no more than `limit`
/// bytes are ever buffered. A body (declared by `Content-Length` or
/// streamed) over the limit is `payload_too_large`; it is read to its end
/// (up to 8 MiB, discarded) before the answer, because clients that send
/// the whole body before reading the answer would otherwise see a reset
/// connection instead of the 413.
///
/// Except when the client waits for `100 Continue` (`Expect:
/// 100-continue`, RFC 9110 §10.1.1): a declared length over the limit is
/// then answered at once, without reading the body, so the client never
/// sends it (hyper sends `100 Continue` only when the body is first read).
///
/// # Errors
/// [`Error::PayloadTooLarge`]; [`Error::InvalidBody`] when the body cannot
/// be read.
pub async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit_bytes: usize,
) -> Result<Bytes, Error> {
    let limit = limit_bytes as u64;
    let too_large = Error::PayloadTooLarge { limit: limit_bytes };
    let declared = declared_length(headers);
    let waits_for_continue = expects_continue(headers);
    if declared.is_some_and(|len| len > DRAIN_LIMIT || (waits_for_continue && len > limit)) {
        return Err(too_large);
    }
    let mut body = body.into_data_stream();
    let mut buf = BytesMut::new();
    let mut seen = 0u64;
    if declared.is_none_or(|len| len <= limit) {
        while let Some(chunk) = body.next().await {
            let chunk =
                chunk.map_err(|e| Error::InvalidBody(format!("cannot read the body: {e}")))?;
            seen += chunk.len() as u64;
            if seen > limit {
                break;
            }
            buf.extend_from_slice(&chunk);
        }
        if seen <= limit {
            return Ok(buf.freeze());
        }
    }
    // Oversize: read the rest and discard it, bounded in bytes and time.
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while let Some(Ok(chunk)) = body.next().await {
            seen += chunk.len() as u64;
            if seen > DRAIN_LIMIT {
                break;
            }
        }
    })
    .await;
    Err(too_large)
}

/// Whether the client waits for `100 Continue` before it sends the body
/// (`Expect: 100-continue`, case-insensitive, RFC 9110 §10.1.1).
pub fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get(EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("100-continue"))
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Deepest nesting of arrays and objects accepted in `data`: 128 levels,
/// the recursion limit of serde_json and of many clients' parsers, so every
/// subscriber can read what it is sent.
pub const MAX_DATA_DEPTH: usize = 128;

/// Parses `{"data": <value>}` (with optional `"tags"`) into the data and
/// the tags: not JSON, or `data` nested deeper than [`MAX_DATA_DEPTH`] →
/// `invalid_json`; JSON of another shape (tags that are not an object of
/// strings included) → `invalid_body`.
pub fn parse_publish_body(bytes: &[u8]) -> Result<(Arc<RawValue>, Tags), Error> {
    let invalid_json = |e: serde_json::Error| Error::InvalidJson(e.to_string());
    match serde_json::from_slice::<Envelope>(bytes) {
        Ok(envelope) => {
            check_depth(envelope.data.get())?;
            Ok((Arc::from(envelope.data), envelope.tags))
        }
        Err(e) => match e.classify() {
            Category::Syntax | Category::Eof | Category::Io => Err(invalid_json(e)),
            // A shape error can come before a syntax error further on: the
            // body is `invalid_body` only if it is JSON at all.
            Category::Data => match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                Ok(_) => Err(Error::InvalidBody(e.to_string())),
                Err(syntax) => Err(invalid_json(syntax)),
            },
        },
    }
}

/// Refuses `data` (a valid JSON text) nested deeper than [`MAX_DATA_DEPTH`].
///
/// # Errors
/// [`Error::InvalidJson`] naming the limit.
pub fn check_depth(json: &str) -> Result<(), Error> {
    // The depth is at most the number of `[` and `{` (those inside strings
    // included); counting them is a much cheaper loop than the scan that
    // tracks strings, and settles the common case.
    let openers = json.bytes().filter(|b| matches!(b, b'[' | b'{')).count();
    if openers > MAX_DATA_DEPTH && nesting_depth(json) > MAX_DATA_DEPTH {
        return Err(Error::InvalidJson(format!(
            "data is nested deeper than {MAX_DATA_DEPTH} levels"
        )));
    }
    Ok(())
}

/// The deepest nesting of arrays and objects in `json`, a valid JSON text.
fn nesting_depth(json: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for b in json.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The optional `Idempotency-Key` header, validated.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, Error> {
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Error::InvalidIdempotencyKey(
            "the Idempotency-Key header appears more than once".to_owned(),
        ));
    }
    let text = value.to_str().map_err(|_| {
        Error::InvalidIdempotencyKey("idempotency key must be visible ASCII (0x21-0x7E)".to_owned())
    })?;
    IdempotencyKey::new(text)
        .map(Some)
        .map_err(|e| Error::InvalidIdempotencyKey(e.to_string()))
}

/// `?after=N` of the subscription routes.
#[derive(Debug)]
pub struct AfterQuery {
    /// Deliver messages with offsets above this one (default 0: all).
    pub after: Option<Offset>,
}

impl FromQuery for AfterQuery {
    fn from_query(params: &QueryParams) -> Result<Self, Error> {
        Ok(Self {
            after: params.integer("after", 0, Offset::MAX)?,
        })
    }
}

/// Where a subscription resumes: after the `Last-Event-ID` header's offset
/// when present (WHATWG HTML, "Server-sent events"), else after
/// `?after=N`; `None` when neither is given (the beginning, for a
/// subscriber that may read history; the head for one that may not). The header must be exactly a
/// non-negative decimal integer ([`parse_decimal`]; the HTTP layer has
/// already removed the whitespace around a field value, RFC 9110 §5.5),
/// given once.
///
/// # Errors
/// [`Error::InvalidLastEventId`] for any other value, or a header given
/// more than once.
pub fn resume_point(headers: &HeaderMap, query: &AfterQuery) -> Result<Option<Offset>, Error> {
    let mut values = headers.get_all("last-event-id").iter();
    match values.next() {
        Some(_) if values.next().is_some() => Err(Error::InvalidLastEventId),
        Some(value) => value
            .to_str()
            .ok()
            .and_then(parse_decimal)
            .map(Some)
            .ok_or(Error::InvalidLastEventId),
        None => Ok(query.after),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn body_shapes() {
        let (data, tags) = parse_publish_body(br#"{"data": {"a": [1, 2]}}"#).unwrap();
        assert_eq!(data.get(), r#"{"a": [1, 2]}"#);
        assert!(tags.is_empty());
        assert_eq!(
            parse_publish_body(br#"{"data":null}"#).unwrap().0.get(),
            "null"
        );
        let (data, tags) =
            parse_publish_body(br#"{"tags": {"k": "v", "a": ""}, "data": 1}"#).unwrap();
        assert_eq!(data.get(), "1");
        assert_eq!(tags.iter().collect::<Vec<_>>(), [("a", ""), ("k", "v")]);
        let unclosed = "[".repeat(1000);
        let deep = format!(r#"{{"data":{}1{}}}"#, "[".repeat(200), "]".repeat(200));
        for bad_json in [
            &b""[..],
            b"{",
            b"{\"data\": 1} x",
            b"nope",
            unclosed.as_bytes(),
            deep.as_bytes(),
        ] {
            assert!(
                matches!(parse_publish_body(bad_json), Err(Error::InvalidJson(_))),
                "{bad_json:?}"
            );
        }
        for bad_body in [
            &br#"{}"#[..],
            br#"{"data":1,"x":2}"#,
            br#"[1]"#,
            br#""data""#,
            br#"{"data":1,"data":2}"#,
            br#"{"data":1,"tags":{"k":1}}"#,
            br#"{"data":1,"tags":["k"]}"#,
            br#"{"data":1,"tags":{},"tags":{}}"#,
            br#"{"tags":{"k":"v"}}"#,
        ] {
            assert!(
                matches!(parse_publish_body(bad_body), Err(Error::InvalidBody(_))),
                "{bad_body:?}"
            );
        }
    }

    #[test]
    fn nesting_depth_ignores_brackets_in_strings() {
        assert_eq!(nesting_depth("1"), 0);
        assert_eq!(nesting_depth(r#"[{"a":[1]},[]]"#), 3);
        assert_eq!(nesting_depth(r#"["[[[\"]]]", {"k]": "{"}]"#), 2);
        let at_limit = format!(
            "{}{}",
            "[".repeat(MAX_DATA_DEPTH),
            "]".repeat(MAX_DATA_DEPTH)
        );
        assert!(parse_publish_body(format!(r#"{{"data":{at_limit}}}"#).as_bytes()).is_ok());
    }

    fn params(pairs: &[(&str, &str)]) -> QueryParams {
        QueryParams(
            pairs
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    fn query_error(e: Error) -> String {
        match e {
            Error::InvalidQuery(message) => message,
            other => panic!("not invalid_query: {other:?}"),
        }
    }

    #[test]
    fn query_parameters_in_heralds_words() {
        let p = params(&[("after", "7"), ("limit", "x"), ("role", "a"), ("role", "b")]);
        assert_eq!(p.integer("after", 0, 10).unwrap(), Some(7));
        assert_eq!(p.integer("absent", 0, 10).unwrap(), None);
        assert_eq!(
            query_error(p.integer("limit", 1, 1000).unwrap_err()),
            "limit must be an integer from 1 to 1000, got \"x\""
        );
        assert_eq!(
            query_error(p.integer("after", 0, 5).unwrap_err()),
            "after must be an integer from 0 to 5, got \"7\""
        );
        assert_eq!(
            query_error(p.one_of("role", &["holder"]).unwrap_err()),
            "role is given more than once; give it once"
        );
        let p = params(&[("after", "+7")]);
        assert_eq!(
            query_error(p.integer("after", 0, 10).unwrap_err()),
            "after must be an integer from 0 to 10, got \"+7\""
        );
        let p = params(&[("role", "Holder")]);
        assert_eq!(
            query_error(p.one_of("role", &["holder"]).unwrap_err()),
            "role must be \"holder\" or left out, got \"Holder\""
        );
        // A long value is quoted in part only.
        let long = "9".repeat(500);
        let p = params(&[("after", &long)]);
        let message = query_error(p.integer("after", 0, u64::MAX).unwrap_err());
        assert!(
            message.ends_with(&format!("got \"{}\"…", "9".repeat(40))),
            "{message}"
        );
    }

    #[test]
    fn last_event_id_wins_over_after() {
        let mut h = HeaderMap::new();
        let q = AfterQuery { after: Some(3) };
        assert_eq!(resume_point(&h, &q).unwrap(), Some(3));
        assert_eq!(resume_point(&h, &AfterQuery { after: None }).unwrap(), None);
        h.insert("last-event-id", HeaderValue::from_static("7"));
        assert_eq!(resume_point(&h, &q).unwrap(), Some(7));
        h.insert("last-event-id", HeaderValue::from_static("-1"));
        assert!(matches!(
            resume_point(&h, &q),
            Err(Error::InvalidLastEventId)
        ));
        h.insert("last-event-id", HeaderValue::from_static("x"));
        assert!(matches!(
            resume_point(&h, &q),
            Err(Error::InvalidLastEventId)
        ));
        // Only the documented syntax: digits, nothing else.
        for bad in [
            "+7",
            "7 ",
            " 7",
            "0x7",
            "7.0",
            "1e3",
            "",
            "18446744073709551616",
        ] {
            h.insert("last-event-id", HeaderValue::from_str(bad).unwrap());
            assert!(
                matches!(resume_point(&h, &q), Err(Error::InvalidLastEventId)),
                "{bad:?}"
            );
        }
        h.insert(
            "last-event-id",
            HeaderValue::from_static("18446744073709551615"),
        );
        assert_eq!(resume_point(&h, &q).unwrap(), Some(u64::MAX));
        h.append("last-event-id", HeaderValue::from_static("1"));
        assert!(matches!(
            resume_point(&h, &q),
            Err(Error::InvalidLastEventId)
        ));
    }

    #[test]
    fn idempotency_keys() {
        let mut h = HeaderMap::new();
        assert!(idempotency_key(&h).unwrap().is_none());
        h.insert("idempotency-key", HeaderValue::from_static("order-1"));
        assert_eq!(idempotency_key(&h).unwrap().unwrap().as_str(), "order-1");
        h.insert("idempotency-key", HeaderValue::from_static("a b"));
        assert!(matches!(
            idempotency_key(&h),
            Err(Error::InvalidIdempotencyKey(_))
        ));
        h.insert("idempotency-key", HeaderValue::from_static("k1"));
        h.append("idempotency-key", HeaderValue::from_static("k2"));
        assert!(matches!(
            idempotency_key(&h),
            Err(Error::InvalidIdempotencyKey(_))
        ));
        h.insert("idempotency-key", HeaderValue::from_static(""));
        assert!(matches!(
            idempotency_key(&h),
            Err(Error::InvalidIdempotencyKey(_))
        ));
    }
}

//! What a Durable Streams request says in its headers and body, checked:
//! the protocol's headers (PROTOCOL.md of durable-streams/durable-streams,
//! "Create", "Append", "Idempotent producers") and the messages of an
//! append. Every refusal is a 400 `invalid_stream_request` that names the
//! header, and changes nothing.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderMap;
use bytes::Bytes;
use herald_core::{Payload, Producer};
use serde_json::value::RawValue;

use herald_http::error::Error;

/// What one message of an append weighs beyond its bytes, in bytes: about
/// what the node holds for it besides its text while the append is parsed,
/// queued and written (its place in the list, the reference to its text,
/// the allocation's own header). An append's messages weigh at most
/// `durable_streams.max_append_bytes` together, so a body of millions of
/// tiny elements is refused instead of becoming millions of values.
pub(crate) const MESSAGE_OVERHEAD_BYTES: usize = 32;

/// The size limits of an append's messages, in bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AppendLimits {
    /// Largest message: `max_message_bytes`, the limit of every stored
    /// message whatever protocol wrote it.
    pub(crate) message_bytes: usize,
    /// Most bytes the messages of one append weigh together, each its
    /// length plus [`MESSAGE_OVERHEAD_BYTES`]:
    /// `durable_streams.max_append_bytes`.
    pub(crate) append_bytes: usize,
}

impl AppendLimits {
    /// The limits of `settings` and the wing's `config`.
    pub(crate) fn of(
        settings: &herald_http::shared::Settings,
        config: &super::config::DurableStreamsConfig,
    ) -> Self {
        Self {
            message_bytes: settings.max_message_bytes,
            append_bytes: config.max_append_bytes,
        }
    }

    /// 413 when one message of `len` bytes is over the limit.
    fn check_message(self, len: usize) -> Result<(), Error> {
        if len > self.message_bytes {
            return Err(Error::AppendTooLarge(format!(
                "a message of {len} bytes is larger than the limit of {} bytes \
                 (max_message_bytes); nothing was appended",
                self.message_bytes
            )));
        }
        Ok(())
    }

    /// 413 when messages weighing `weight` bytes are over the limit.
    fn check_weight(self, weight: usize) -> Result<(), Error> {
        if weight > self.append_bytes {
            return Err(Error::AppendTooLarge(format!(
                "the append's messages weigh more than {} bytes (their lengths plus \
                 {MESSAGE_OVERHEAD_BYTES} bytes each, durable_streams.max_append_bytes); send \
                 fewer per request; nothing was appended",
                self.append_bytes
            )));
        }
        Ok(())
    }
}

/// Longest `Stream-TTL`, in seconds (100 years): every expiry stays a
/// valid time on both databases.
const MAX_TTL_S: u64 = 100 * 365 * 24 * 3600;

/// Largest producer epoch and sequence number: 2^53 - 1, the largest
/// integer every client language (JavaScript's numbers) holds exactly.
const MAX_PRODUCER_NUMBER: u64 = (1 << 53) - 1;

/// Longest `Producer-Id`, in bytes: a stream stores it once per producer
/// (docs/durable-streams.md, "Idempotent producers").
pub(crate) const MAX_PRODUCER_ID_BYTES: usize = 256;

/// Longest `Stream-Seq`, in bytes: the stream stores the last one.
pub(crate) const MAX_STREAM_SEQ_BYTES: usize = 256;

fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidStreamRequest(message.into())
}

/// The value of header `name` as text, if present.
fn text<'h>(headers: &'h HeaderMap, name: &str) -> Result<Option<&'h str>, Error> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.trim()))
            .map_err(|_| invalid(format!("{name} must be visible ASCII"))),
    }
}

/// The request's `Content-Type`, if it has a non-empty one.
pub(crate) fn content_type(headers: &HeaderMap) -> Result<Option<String>, Error> {
    Ok(text(headers, CONTENT_TYPE.as_str())?
        .filter(|s| !s.is_empty())
        .map(str::to_owned))
}

/// Whether the request asks to close the stream (`Stream-Closed: true`,
/// in any case; any other value is no).
pub(crate) fn closes(headers: &HeaderMap) -> bool {
    headers
        .get("stream-closed")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// `Stream-TTL` in seconds: a decimal integer without sign, leading zero
/// or fraction.
pub(crate) fn ttl_s(headers: &HeaderMap) -> Result<Option<u64>, Error> {
    let Some(value) = text(headers, "stream-ttl")? else {
        return Ok(None);
    };
    let canonical = value == "0"
        || (!value.is_empty()
            && !value.starts_with('0')
            && value.bytes().all(|b| b.is_ascii_digit()));
    match value.parse::<u64>() {
        Ok(ttl) if canonical && ttl <= MAX_TTL_S => Ok(Some(ttl)),
        _ => Err(invalid(format!(
            "Stream-TTL must be a whole number of seconds (at most {MAX_TTL_S}) without sign or \
             leading zero, got {value:?}"
        ))),
    }
}

/// `Stream-Expires-At` as ms since the Unix epoch: an RFC 3339 time with
/// `Z` or a numeric offset (RFC 3339, section 5.6).
pub(crate) fn expires_at_ms(headers: &HeaderMap) -> Result<Option<i64>, Error> {
    let Some(value) = text(headers, "stream-expires-at")? else {
        return Ok(None);
    };
    parse_rfc3339_ms(value).map(Some).ok_or_else(|| {
        invalid(format!(
            "Stream-Expires-At must be an RFC 3339 time, got {value:?}"
        ))
    })
}

/// Parses an RFC 3339 date-time into ms since the Unix epoch.
fn parse_rfc3339_ms(value: &str) -> Option<i64> {
    let (local, offset_s): (&str, i64) = if let Some(local) = value.strip_suffix(['Z', 'z']) {
        (local, 0)
    } else {
        let split = value.len().checked_sub(6)?;
        let (local, zone) = value.split_at(split);
        let sign = match zone.as_bytes()[0] {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let (h, m) = zone[1..].split_once(':')?;
        let (h, m): (i64, i64) = (h.parse().ok()?, m.parse().ok()?);
        if !(0..24).contains(&h) || !(0..60).contains(&m) {
            return None;
        }
        (local, sign * (h * 3600 + m * 60))
    };
    if !local.contains('T') && !local.contains('t') {
        return None;
    }
    let time = humantime::parse_rfc3339_weak(local).ok()?;
    let ms = match time.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).ok()?,
        Err(e) => -i64::try_from(e.duration().as_millis()).ok()?,
    };
    ms.checked_sub(offset_s * 1000)
}

/// A producer number header (`Producer-Epoch`, `Producer-Seq`).
fn producer_number(headers: &HeaderMap, name: &str) -> Result<Option<u64>, Error> {
    let Some(value) = text(headers, name)? else {
        return Ok(None);
    };
    match value.parse::<u64>() {
        Ok(n) if value.bytes().all(|b| b.is_ascii_digit()) && n <= MAX_PRODUCER_NUMBER => {
            Ok(Some(n))
        }
        _ => Err(invalid(format!(
            "{name} must be an integer from 0 to {MAX_PRODUCER_NUMBER}, got {value:?}"
        ))),
    }
}

/// The idempotent producer: `Producer-Id` (1 to
/// [`MAX_PRODUCER_ID_BYTES`] bytes), `Producer-Epoch` and `Producer-Seq`,
/// all three or none.
pub(crate) fn producer(headers: &HeaderMap) -> Result<Option<Producer>, Error> {
    let id = text(headers, "producer-id")?;
    let epoch = producer_number(headers, "producer-epoch")?;
    let seq = producer_number(headers, "producer-seq")?;
    match (id, epoch, seq) {
        (None, None, None) => Ok(None),
        (Some(""), _, _) => Err(invalid("Producer-Id must not be empty")),
        (Some(id), _, _) if id.len() > MAX_PRODUCER_ID_BYTES => Err(invalid(format!(
            "Producer-Id must be at most {MAX_PRODUCER_ID_BYTES} bytes, got {}",
            id.len()
        ))),
        (Some(id), Some(epoch), Some(seq)) => Ok(Some(Producer {
            id: id.to_owned(),
            epoch,
            seq,
        })),
        _ => Err(invalid(
            "Producer-Id, Producer-Epoch and Producer-Seq go together: send all three or none",
        )),
    }
}

/// `Stream-Seq`: an opaque text compared as bytes, of at most
/// [`MAX_STREAM_SEQ_BYTES`].
pub(crate) fn stream_seq(headers: &HeaderMap) -> Result<Option<String>, Error> {
    match text(headers, "stream-seq")? {
        Some(seq) if seq.len() > MAX_STREAM_SEQ_BYTES => Err(invalid(format!(
            "Stream-Seq must be at most {MAX_STREAM_SEQ_BYTES} bytes, got {}",
            seq.len()
        ))),
        seq => Ok(seq.map(str::to_owned)),
    }
}

/// The messages of a body for a stream of `json` mode: in JSON mode, a
/// top-level array is one message per element (flattened one level; an
/// empty one is refused unless `empty_array_ok`, for a creation), any other
/// value one message; otherwise the body's bytes, as consecutive messages
/// of at most `limits.message_bytes` each (none when empty: a reader of
/// the stream gets the same bytes, one after the other). Every message is
/// held to `limits`. A JSON body of whitespace only is no message: a
/// creation's, or refused (as an empty array) for an append.
///
/// # Errors
/// 400 when a JSON body does not parse, or is empty (whitespace only, or
/// an empty array) where that is not allowed; 413
/// [`Error::AppendTooLarge`] when a JSON message (an element or a lone
/// value) is larger than `limits.message_bytes`, or the messages weigh
/// more than `limits.append_bytes` together.
pub(crate) fn messages(
    json: bool,
    body: &Bytes,
    empty_array_ok: bool,
    limits: AppendLimits,
) -> Result<Vec<Payload>, Error> {
    if !json {
        if body.is_empty() {
            return Ok(Vec::new());
        }
        let pieces = body.chunks(limits.message_bytes.max(1));
        limits.check_weight(body.len() + pieces.len() * MESSAGE_OVERHEAD_BYTES)?;
        return Ok(pieces
            .map(|piece| Payload::Bytes(Arc::from(piece)))
            .collect());
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        if !empty_array_ok {
            return Err(invalid(
                "a JSON append needs a JSON value: the body is only whitespace",
            ));
        }
        return Ok(Vec::new());
    }
    let text = std::str::from_utf8(body).map_err(|_| invalid("a JSON stream takes UTF-8 JSON"))?;
    herald_http::extract::check_depth(text).map_err(|e| invalid(e.to_string()))?;
    let value: &RawValue =
        serde_json::from_str(text).map_err(|e| invalid(format!("the body is not JSON: {e}")))?;
    if value.get().starts_with('[') {
        let items = bounded_array(value.get(), limits)?;
        if items.is_empty() && !empty_array_ok {
            return Err(invalid("an empty JSON array appends nothing"));
        }

        return Ok(items
            .into_iter()
            .map(|item| Payload::Json(Arc::from(item)))
            .collect());
    }
    limits.check_message(value.get().len())?;
    Ok(vec![Payload::Json(Arc::from(value.to_owned()))])
}

/// The elements of the JSON array `text`, each as its exact text, each
/// held to `limits`; stops at the first element over them, so a body of
/// millions of tiny elements never becomes millions of values.
fn bounded_array(text: &str, limits: AppendLimits) -> Result<Vec<Box<RawValue>>, Error> {
    struct Elements<'a> {
        limits: AppendLimits,
        /// The 413 that stopped the walk, if one did.
        refused: &'a mut Option<Error>,
    }
    impl<'de> serde::de::Visitor<'de> for Elements<'_> {
        type Value = Vec<Box<RawValue>>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON array")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut items = Vec::new();
            let mut weight = 0usize;
            while let Some(item) = seq.next_element::<Box<RawValue>>()? {
                let len = item.get().len();
                weight = weight.saturating_add(len + MESSAGE_OVERHEAD_BYTES);
                if let Err(e) = self
                    .limits
                    .check_message(len)
                    .and_then(|()| self.limits.check_weight(weight))
                {
                    *self.refused = Some(e);
                    return Err(serde::de::Error::custom("over the size limits"));
                }
                items.push(item);
            }
            Ok(items)
        }
    }
    use serde::Deserializer as _;
    let mut refused = None;
    let parsed = serde_json::Deserializer::from_str(text).deserialize_seq(Elements {
        limits,
        refused: &mut refused,
    });
    if let Some(e) = refused {
        return Err(e);
    }
    parsed.map_err(|e| invalid(format!("the body is not a JSON array: {e}")))
}

/// Milliseconds since the Unix epoch now, on this node's clock (for the
/// cursor only; every stored time is the storage's).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis()
        .try_into()
        .unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn ttl_takes_canonical_whole_seconds_only() {
        assert_eq!(
            ttl_s(&headers(&[("stream-ttl", "3600")])).unwrap(),
            Some(3600)
        );
        assert_eq!(ttl_s(&headers(&[("stream-ttl", "0")])).unwrap(), Some(0));
        for bad in ["abc", "-1", "00060", "+60", "60.5", "1e3", ""] {
            assert!(ttl_s(&headers(&[("stream-ttl", bad)])).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn expiry_times_take_z_and_offsets() {
        let z = expires_at_ms(&headers(&[(
            "stream-expires-at",
            "2026-09-01T12:00:00.123Z",
        )]));
        let plus = expires_at_ms(&headers(&[(
            "stream-expires-at",
            "2026-09-01T14:00:00.123+02:00",
        )]));
        assert_eq!(z.unwrap(), Some(1_788_264_000_123));
        assert_eq!(plus.unwrap(), Some(1_788_264_000_123));
        assert!(expires_at_ms(&headers(&[("stream-expires-at", "not-a-timestamp")])).is_err());
    }

    #[test]
    fn producers_need_all_three_headers_with_plain_numbers() {
        let p = producer(&headers(&[
            ("producer-id", "p"),
            ("producer-epoch", "1"),
            ("producer-seq", "0"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((p.id.as_str(), p.epoch, p.seq), ("p", 1, 0));
        assert!(producer(&headers(&[("producer-id", "p")])).is_err());
        assert!(producer(&headers(&[
            ("producer-id", ""),
            ("producer-epoch", "0"),
            ("producer-seq", "0")
        ]))
        .is_err());
        let long = "p".repeat(MAX_PRODUCER_ID_BYTES + 1);
        assert!(producer(&headers(&[
            ("producer-id", long.as_str()),
            ("producer-epoch", "0"),
            ("producer-seq", "0")
        ]))
        .is_err());
        assert!(producer(&headers(&[
            ("producer-id", &long[1..]),
            ("producer-epoch", "0"),
            ("producer-seq", "0")
        ]))
        .is_ok());
        let seq = "9".repeat(MAX_STREAM_SEQ_BYTES + 1);
        assert!(stream_seq(&headers(&[("stream-seq", seq.as_str())])).is_err());
        assert!(stream_seq(&headers(&[("stream-seq", &seq[1..])])).is_ok());
        for bad in ["1abc", "0xyz", "1e3", "-1", "9007199254740992"] {
            let h = headers(&[
                ("producer-id", "p"),
                ("producer-epoch", bad),
                ("producer-seq", "0"),
            ]);
            assert!(producer(&h).is_err(), "{bad:?}");
        }
    }

    /// The default limits: 64 KiB messages, 16 MiB appends.
    const LIMITS: AppendLimits = AppendLimits {
        message_bytes: 64 * 1024,
        append_bytes: 16 * 1024 * 1024,
    };

    #[test]
    fn json_bodies_flatten_one_level() {
        let texts = |body: &str| -> Vec<String> {
            messages(true, &Bytes::from(body.to_owned()), false, LIMITS)
                .unwrap()
                .iter()
                .map(|p| p.to_json_text().into_owned())
                .collect()
        };
        assert_eq!(texts(r#"{"a":1}"#), [r#"{"a":1}"#]);
        assert_eq!(texts(r#"[{"a":1},{"b":2}]"#), [r#"{"a":1}"#, r#"{"b":2}"#]);
        assert_eq!(texts("[[1,2],[3]]"), ["[1,2]", "[3]"]);
        assert!(messages(true, &Bytes::from_static(b"[]"), false, LIMITS).is_err());
        assert!(messages(true, &Bytes::from_static(b"[]"), true, LIMITS)
            .unwrap()
            .is_empty());
        assert!(messages(true, &Bytes::from_static(b"{oops"), false, LIMITS).is_err());
        assert!(messages(true, &Bytes::from_static(b" \n\t "), false, LIMITS).is_err());
        assert!(messages(true, &Bytes::from_static(b" \n"), true, LIMITS)
            .unwrap()
            .is_empty());
        assert_eq!(
            messages(false, &Bytes::from_static(b"\0x"), false, LIMITS)
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn an_append_is_bounded_by_bytes_not_by_a_count() {
        // 30 000 small elements, as a client's batch of a burst holds:
        // all taken.
        let burst = format!("[{}0]", r#"{"n":12345},"#.repeat(29_999));
        assert_eq!(
            messages(true, &Bytes::from(burst), false, LIMITS)
                .unwrap()
                .len(),
            30_000
        );
        // Millions of tiny elements weigh more than the append's bytes.
        let tiny = format!("[{}0]", "0,".repeat(LIMITS.append_bytes / 2 - 1));
        let refused = messages(true, &Bytes::from(tiny), false, LIMITS).unwrap_err();
        assert!(matches!(refused, Error::AppendTooLarge(_)), "{refused:?}");
        // The heaviest accepted: exactly the limit.
        let fits = LIMITS.append_bytes / (1 + MESSAGE_OVERHEAD_BYTES);
        let most = format!("[{}0]", "0,".repeat(fits - 1));
        assert_eq!(
            messages(true, &Bytes::from(most), false, LIMITS)
                .unwrap()
                .len(),
            fits
        );
        let one_more = format!("[{}0]", "0,".repeat(fits));
        assert!(messages(true, &Bytes::from(one_more), false, LIMITS).is_err());
    }

    #[test]
    fn every_message_is_held_to_the_message_limit() {
        let big = format!("\"{}\"", "x".repeat(LIMITS.message_bytes - 1));
        // An element and a lone value one byte over.
        for body in [format!("[1,{big}]"), big.clone()] {
            let refused = messages(true, &Bytes::from(body), false, LIMITS).unwrap_err();
            assert!(matches!(refused, Error::AppendTooLarge(_)), "{refused:?}");
            assert_eq!(refused.status(), 413);
            assert_eq!(refused.code(), "payload_too_large");
        }
        // At the limit: taken.
        let most = format!("\"{}\"", "x".repeat(LIMITS.message_bytes - 2));
        assert_eq!(
            messages(true, &Bytes::from(format!("[{most}]")), false, LIMITS)
                .unwrap()
                .len(),
            1
        );
        let bytes = Bytes::from("x".repeat(LIMITS.message_bytes));
        assert_eq!(messages(false, &bytes, false, LIMITS).unwrap().len(), 1);
        // A byte stream's append over it: consecutive messages at most
        // the limit each, the same bytes in order.
        let body: Vec<u8> = (0..2 * LIMITS.message_bytes + 5)
            .map(|i| (i % 251) as u8)
            .collect();
        let pieces = messages(false, &Bytes::from(body.clone()), false, LIMITS).unwrap();
        assert_eq!(pieces.len(), 3);
        assert!(pieces.iter().all(|p| p.len() <= LIMITS.message_bytes));
        let joined: Vec<u8> = pieces.iter().flat_map(|p| p.as_bytes().to_vec()).collect();
        assert_eq!(joined, body);
    }
}

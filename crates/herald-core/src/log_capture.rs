//! Test-only (feature `testing`): the log records a `tracing` subscriber
//! writes, kept in memory so that a test can read them back as JSON.
//!
//! A test builds its own subscriber (`tracing_subscriber::fmt()`, with the
//! format it checks) with [`LogLines`] as its writer, runs the code under
//! it, then reads [`LogLines::records`]. [`json_records`] does all of that
//! for the common case: the JSON format with each event's fields at the
//! top level of its record.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use tracing_subscriber::fmt::MakeWriter;

/// The bytes a subscriber wrote, shared by every clone (one writer per
/// event, all appending to the same buffer).
#[derive(Debug, Clone, Default)]
pub struct LogLines(Arc<Mutex<Vec<u8>>>);

impl LogLines {
    /// What was written so far, as text (lossy UTF-8).
    pub fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Every line written so far, each parsed as one JSON record.
    ///
    /// # Panics
    /// When a line is not JSON: the subscriber was not built with a JSON
    /// format, which is a mistake of the test.
    pub fn records(&self) -> Vec<Value> {
        self.text()
            .lines()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("a log line is not JSON ({e}): {line}"))
            })
            .collect()
    }
}

impl io::Write for LogLines {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogLines {
    type Writer = LogLines;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// The JSON records `log` makes while it runs under a subscriber of its
/// own (the JSON format, every event's fields flattened into its record),
/// on this thread only.
pub fn json_records(log: impl FnOnce()) -> Vec<Value> {
    let lines = LogLines::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(lines.clone())
        .json()
        .flatten_event(true)
        .finish();
    tracing::subscriber::with_default(subscriber, log);
    lines.records()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_hold_the_fields_of_each_event() {
        let records = json_records(|| {
            tracing::warn!(channel = "news", offset = 7, "first");
            tracing::info!("second");
        });
        assert_eq!(records.len(), 2, "{records:?}");
        assert_eq!(records[0]["message"], "first");
        assert_eq!(records[0]["channel"], "news");
        assert_eq!(records[0]["offset"], 7);
        assert_eq!(records[0]["level"], "WARN");
        assert_eq!(records[1]["message"], "second");
    }
}

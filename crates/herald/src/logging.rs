//! Log set-up: `tracing` records on stderr, human-readable or JSON.

use std::collections::HashSet;
use std::fmt;
use std::sync::OnceLock;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{Format, Json, JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// How `herald serve` writes its logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// One readable line per record.
    Human,
    /// One JSON object per record, for log shippers.
    Json,
}

/// Installs the global subscriber. The level comes from `RUST_LOG`
/// (default `info`).
pub(crate) fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,refinery_core=warn"));
    // Colours only for a person at a terminal, not in files or journals.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().event_format(json_records()).try_init(),
    };
}

/// This node's id, once `herald serve` knows it: from then on every JSON
/// record carries it as `node_id` (docs/operations.md, "Log lines").
static NODE_ID: OnceLock<String> = OnceLock::new();

/// Makes `node_id` a field of every JSON record written from now on (a
/// record's own `node_id`, or a span's, still wins). Only the first call
/// counts: a process is one node.
pub(crate) fn set_node_id(node_id: &str) {
    let _ = NODE_ID.set(node_id.to_owned());
}

/// The node id as the fields of an outermost span: `{"node_id": ...}`.
fn node_fields() -> Option<String> {
    NODE_ID
        .get()
        .map(|id| serde_json::json!({ "node_id": id }).to_string())
}

/// The JSON record format: one object per line with `timestamp`, `level`,
/// the event's fields (`message` among them), `target`, the fields of the
/// spans the event was made in, and `spans` (those spans, root first, each
/// with its `name` and fields).
fn json_records() -> SpanFieldsOnTop<Format<Json>> {
    SpanFieldsOnTop(
        tracing_subscriber::fmt::format()
            .json()
            .flatten_event(true)
            .with_current_span(false),
    )
}

/// Wraps a JSON event format so that the fields of the spans an event was
/// made in also appear at the top level of its record, as its own fields
/// do: a field that a task attaches once through a span (`node_id`) stays
/// where log queries look for it. An event's own field wins over a span's
/// of the same name, and an inner span's over an outer one's. The node's
/// id ([`set_node_id`]) is added as if by an outermost span. A record made
/// outside any span before the node id is known is written exactly as the
/// wrapped format writes it.
struct SpanFieldsOnTop<F>(F);

impl<S, F> FormatEvent<S, JsonFields> for SpanFieldsOnTop<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    F: FormatEvent<S, JsonFields>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut record = String::new();
        self.0.format_event(ctx, Writer::new(&mut record), event)?;
        // Innermost span first; the node's id counts as the outermost.
        let mut spans: Vec<String> = ctx
            .event_scope()
            .into_iter()
            .flatten()
            .map(|span| {
                span.extensions()
                    .get::<FormattedFields<JsonFields>>()
                    .map(|f| f.fields.clone())
                    .unwrap_or_default()
            })
            .collect();
        spans.extend(node_fields());
        if spans.is_empty() {
            return writer.write_str(&record);
        }
        match with_fields_on_top(&record, &spans) {
            Some(lifted) => writer.write_str(&lifted),
            None => writer.write_str(&record),
        }
    }
}

/// `record` (one JSON object and a newline) with the fields of `spans`
/// (each a JSON object, innermost first) appended at its top level, each
/// name once and none the record already has. `None` when `record` is not
/// a JSON object.
fn with_fields_on_top(record: &str, spans: &[String]) -> Option<String> {
    let object = record.trim_end();
    let present: serde_json::Map<String, serde_json::Value> = serde_json::from_str(object).ok()?;
    let mut names: HashSet<String> = present.into_iter().map(|(name, _)| name).collect();
    let mut out = object.strip_suffix('}')?.to_owned();
    for span in spans {
        let Ok(serde_json::Value::Object(fields)) = serde_json::from_str(span) else {
            continue;
        };
        for (name, value) in fields {
            if names.insert(name.clone()) {
                out.push(',');
                out.push_str(&serde_json::Value::String(name).to_string());
                out.push(':');
                out.push_str(&value.to_string());
            }
        }
    }
    out.push_str("}\n");
    Some(out)
}

/// `error` and its causes on one line, `outer: cause: ...` as anyhow's
/// `{:#}` writes them, but each cause once: the chain stops at an error
/// that already quotes its causes in its own message and also returns them
/// as its source (`herald_storage::Error`, `herald_server::StartError`).
pub(crate) fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&cause.to_string());
        if cause.is::<herald_storage::Error>() || cause.is::<herald_server::StartError>() {
            break;
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use anyhow::Context;
    use herald_core::log_capture::LogLines;

    use serde_json::Value;

    use super::*;

    fn records(log: impl FnOnce()) -> Vec<Value> {
        let lines = LogLines::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(lines.clone())
            .json()
            .event_format(json_records())
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        lines.records()
    }

    #[test]
    fn span_fields_are_top_level_fields_of_json_records() {
        let records = records(|| {
            tracing::info!(token = 1, "outside");
            let outer = tracing::info_span!("lease", node_id = "node-a", lease = "writer");
            let _outer = outer.enter();
            let inner = tracing::info_span!("attempt", lease = "inner", attempt = 2);
            let _inner = inner.enter();
            tracing::warn!(token = 7, node_id = "event", "inside");
        });
        let [outside, inside] = &records[..] else {
            panic!("{records:?}");
        };
        assert_eq!(outside["message"], "outside");
        assert_eq!(outside["token"], 1);
        assert!(outside.get("spans").is_none(), "{outside}");

        assert_eq!(inside["message"], "inside");
        assert_eq!(inside["level"], "WARN");
        assert_eq!(inside["token"], 7);
        // The event's own field, then the innermost span's, win.
        assert_eq!(inside["node_id"], "event");
        assert_eq!(inside["lease"], "inner");
        assert_eq!(inside["attempt"], 2);
        // The span list is still there.
        assert_eq!(inside["spans"][0]["name"], "lease");
        assert_eq!(inside["spans"][0]["node_id"], "node-a");
        assert_eq!(inside["spans"][1]["lease"], "inner");
    }

    #[test]
    fn span_fields_are_appended_once_and_other_text_is_left_alone() {
        let record = "{\"level\":\"INFO\",\"message\":\"x\"}\n";
        assert_eq!(
            with_fields_on_top(record, &["{\"node_id\":\"a\"}".to_owned()]).as_deref(),
            Some("{\"level\":\"INFO\",\"message\":\"x\",\"node_id\":\"a\"}\n")
        );
        assert_eq!(with_fields_on_top("not json\n", &[]), None);
        assert_eq!(with_fields_on_top(record, &[]).as_deref(), Some(record));
    }

    /// A storage error quotes its cause and also returns it as its source:
    /// the line names the cause once, as before the source was kept.
    #[test]
    fn a_storage_cause_is_printed_once() {
        let json = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let storage = herald_storage::Error::Migration {
            message: json.to_string(),
            source: Some(Box::new(json)),
        };
        let started: Result<(), _> = Err(herald_server::StartError::Storage(storage));
        let e = started.context("server failed").unwrap_err();
        assert_eq!(
            one_line(&e),
            "server failed: storage: migration failed: EOF while parsing an object at line 1 column 1"
        );
        // Any other chain is printed whole, as `{:#}` does.
        let io = std::io::Error::other("disk on fire");
        let e = anyhow::Error::new(io).context("cannot write the node id");
        assert_eq!(one_line(&e), format!("{e:#}"));
    }
}

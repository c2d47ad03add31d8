// Follows one Herald channel with Node's `eventsource` package, an
// implementation of the WHATWG EventSource (HTML, "Server-sent events") that
// behaves as browsers do: it reconnects by itself with Last-Event-ID after a
// stream ends or breaks, and gives up for good on any answer other than 200
// with text/event-stream.
//
//   node follow.mjs <events URL>
//
// It reports on stdout, one JSON object per line:
//
//   {"type":"open"}
//       a connection was answered 200 with text/event-stream
//   {"type":"message","id":"3","offset":3,"data":{...}}
//       one message event: its id, and the offset and data of its JSON
//   {"type":"error","readyState":0,"code":null,"message":"..."}
//       the connection failed or ended; readyState 0 (CONNECTING): the
//       client reconnects by itself, after its reconnection time
//   {"type":"error","readyState":2,"code":503,"message":"..."}
//       the client gave up for good (CLOSED); the script then exits with
//       status 1
//
// It exits with status 0 when its stdin ends.

import { EventSource } from "eventsource";

const url = process.argv[2];
if (!url) {
  process.stderr.write("usage: node follow.mjs <events URL>\n");
  process.exit(2);
}

const report = (record, then) => process.stdout.write(`${JSON.stringify(record)}\n`, then);

const events = new EventSource(url);

events.addEventListener("open", () => report({ type: "open" }));

events.addEventListener("message", (event) => {
  const message = JSON.parse(event.data);
  report({ type: "message", id: event.lastEventId, offset: message.offset, data: message.data });
});

events.addEventListener("error", (event) => {
  const closed = events.readyState === EventSource.CLOSED;
  report(
    {
      type: "error",
      readyState: events.readyState,
      code: event.code ?? null,
      message: event.message ?? null,
    },
    closed ? () => process.exit(1) : undefined,
  );
});

process.stdin.on("end", () => {
  events.close();
  process.exit(0);
});
process.stdin.resume();

// Server-Sent Events over fetch(), so that the Authorization header can be
// sent (EventSource cannot), with reconnection and Last-Event-ID resumes.

import { authHeaders, errorFrom } from "./api.js";

// Incremental parser for the text/event-stream format: feed it decoded
// text; it calls onEvent({type, data, id}) for each complete event.
export class SseParser {
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.buffer = "";
    this.reset();
  }

  reset() {
    this.type = "";
    this.data = [];
    this.id = undefined;
  }

  feed(text) {
    this.buffer += text;
    // Lines end with CRLF, LF or CR; a trailing CR may be half of a CRLF,
    // so it waits for the next chunk.
    for (;;) {
      const match = /\r\n|\n|\r(?=[^\n])/.exec(this.buffer);
      if (!match) break;
      const line = this.buffer.slice(0, match.index);
      this.buffer = this.buffer.slice(match.index + match[0].length);
      this.line(line);
    }
  }

  line(line) {
    if (line === "") {
      if (this.data.length || this.type) {
        this.onEvent({ type: this.type || "message", data: this.data.join("\n"), id: this.id });
      }
      this.reset();
      return;
    }
    if (line.startsWith(":")) return; // comment (heartbeat)
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") this.type = value;
    else if (field === "data") this.data.push(value);
    else if (field === "id" && !value.includes("\0")) this.id = value;
    // "retry" and unknown fields are ignored.
  }
}

const sleep = (ms, signal) => new Promise((resolve) => {
  const onAbort = () => { clearTimeout(t); resolve(); };
  const t = setTimeout(() => { signal.removeEventListener("abort", onAbort); resolve(); }, ms);
  signal.addEventListener("abort", onAbort, { once: true });
});

// Follows a stream until stop() is called:
//   url(lastId)      -> the URL of each (re)connection
//   onEvent(event)   -> return "end" to stop following (e.g. channel deleted)
//   onStatus(status) -> "live" | "reconnecting" | "stopped"
//   onError(err)     -> an HTTP error answer (ApiError); 4xx other than
//                       408/429 stop the stream, anything else is retried
//   retryMs          -> pause before reconnecting
//   idleMs           -> a connection that brings nothing (no event, no
//                       comment) for this long is taken as dead and
//                       replaced; a connection lost without a word (a
//                       network cut, a sleeping laptop) would otherwise
//                       never end
// Each reconnection sends Last-Event-ID with the last `id:` seen.
export function followSse({ url, onEvent, onStatus = () => {}, onError = () => {}, retryMs = 1000, idleMs = 35000, lastId = null }) {
  const stopper = new AbortController();
  let current = null;
  let stopped = false;
  const stop = (status = "stopped") => {
    if (stopped) return;
    stopped = true;
    stopper.abort();
    current?.abort();
    onStatus(status);
  };

  (async () => {
    while (!stopped) {
      current = new AbortController();
      try {
        const headers = { Accept: "text/event-stream", ...authHeaders() };
        if (lastId !== null) headers["Last-Event-ID"] = lastId;
        const response = await fetch(url(lastId), { headers, signal: current.signal, cache: "no-store" });
        if (!response.ok) {
          const err = await errorFrom(response);
          onError(err);
          if (err.status >= 400 && err.status < 500 && err.status !== 408 && err.status !== 429) {
            stop();
            return;
          }
        } else {
          onStatus("live");
          const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
          // Aborting the request ends the pending read below.
          const connection = current;
          let idle = setTimeout(() => connection.abort(), idleMs);
          const parser = new SseParser((event) => {
            if (stopped) return;
            if (event.id !== undefined) lastId = event.id;
            if (onEvent(event) === "end") stop();
          });
          try {
            while (!stopped) {
              const { value, done } = await reader.read();
              if (done) break;
              clearTimeout(idle);
              idle = setTimeout(() => connection.abort(), idleMs);
              parser.feed(value);
            }
          } finally {
            clearTimeout(idle);
          }
        }
      } catch {
        // Network failure or abort: retried below unless stopped.
      }
      if (stopped) return;
      onStatus("reconnecting");
      await sleep(retryMs, stopper.signal);
    }
  })();

  return { stop, get lastId() { return lastId; } };
}

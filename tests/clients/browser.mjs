// Runs centrifuge-js (npm `centrifuge`, its browser bundle
// dist/centrifuge.js) in headless Chromium, driven by playwright-core, for
// Herald's browser check of its Centrifugo protocol.
//
//   node browser.mjs <Chromium binary> <connection token> <channel>
//
// It serves a small page and the bundle over HTTP on a free loopback port
// and reports the page's origin, which the server must allow for the
// page's WebSocket; then it reads the WebSocket URL as the first line of
// its stdin, opens the page in Chromium, and the page's client connects to
// that URL with the token and subscribes to the channel. It reports on
// stdout, one JSON object per line:
//
//   {"type":"origin","origin":"http://127.0.0.1:PORT"}
//   {"type":"subscribed","channel":"...","offset":N,"epoch":"...","userAgent":"..."}
//   {"type":"publication","channel":"...","offset":N,"data":...}
//
// and exits with status 0 after the first publication, once the browser
// and the HTTP server are closed. Anything else the page sees (a
// disconnect, a subscription error, an uncaught exception) is reported as
// {"type":"failed",...} and ends it with status 1. On SIGTERM, SIGINT or
// when its stdin ends it closes the browser and exits with status 1.

import http from "node:http";
import { readFile } from "node:fs/promises";
import readline from "node:readline";
import { launchChromium } from "./chromium.mjs";

const [executablePath, token, channel] = process.argv.slice(2);
if (!channel) {
  process.stderr.write("usage: node browser.mjs <chromium> <token> <channel> (WebSocket URL on stdin)\n");
  process.exit(2);
}

const report = (record) => process.stdout.write(`${JSON.stringify(record)}\n`);

// The package's browser bundle, which sets `globalThis.Centrifuge` (the
// package's "exports" do not name it, so it is read by its path).
const bundle = await readFile(new URL("./node_modules/centrifuge/dist/centrifuge.js", import.meta.url));

const page = `<!doctype html>
<html>
<head><meta charset="utf-8"><title>Herald browser check</title>
<script src="/centrifuge.js"></script></head>
<body>
<script>
const params = new URLSearchParams(location.search);
const channel = params.get("channel");
const client = new Centrifuge(params.get("ws"), { token: params.get("token") });
client.on("disconnected", (ctx) =>
  window.report({ type: "failed", what: "disconnected", code: ctx.code, message: ctx.reason }));
client.on("error", (ctx) =>
  window.report({ type: "failed", what: "client error", code: ctx.error.code ?? null, message: ctx.error.message }));
const sub = client.newSubscription(channel);
sub.on("subscribed", (ctx) =>
  window.report({
    type: "subscribed",
    channel,
    offset: ctx.streamPosition ? Number(ctx.streamPosition.offset) : null,
    epoch: ctx.streamPosition ? ctx.streamPosition.epoch : null,
    userAgent: navigator.userAgent,
  }));
sub.on("error", (ctx) =>
  window.report({ type: "failed", what: "subscription error", code: ctx.error.code ?? null, message: ctx.error.message }));
sub.on("publication", (ctx) =>
  window.report({ type: "publication", channel, offset: Number(ctx.offset), data: ctx.data }));
sub.subscribe();
client.connect();
</script>
</body>
</html>
`;

const server = http.createServer((req, res) => {
  const path = new URL(req.url, "http://localhost").pathname;
  if (path === "/") {
    res.writeHead(200, { "content-type": "text/html; charset=utf-8" });
    res.end(page);
  } else if (path === "/centrifuge.js") {
    res.writeHead(200, { "content-type": "text/javascript; charset=utf-8" });
    res.end(bundle);
  } else {
    res.writeHead(404);
    res.end();
  }
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const pageUrl = new URL(`http://127.0.0.1:${server.address().port}/`);
report({ type: "origin", origin: pageUrl.origin });
// The WebSocket URL: the first line of stdin (the end of stdin before it
// ends the script, as later).
const lines = readline.createInterface({ input: process.stdin });
const wsUrl = await new Promise((resolve) => {
  lines.once("line", resolve);
  lines.once("close", () => {
    server.close();
    process.exit(1);
  });
});
lines.removeAllListeners("close");
pageUrl.searchParams.set("ws", wsUrl);
pageUrl.searchParams.set("token", token);
pageUrl.searchParams.set("channel", channel);

// A fresh profile, off the network beyond loopback (chromium.mjs).
const browser = await launchChromium(executablePath);

let closing = false;
const finish = async (status) => {
  if (closing) {
    return;
  }
  closing = true;
  await browser.close().catch(() => {});
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
  process.exit(status);
};
for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"]) {
  process.on(signal, () => finish(1));
}
lines.on("close", () => finish(1));

try {
  const context = await browser.newContext();
  const tab = await context.newPage();
  tab.on("pageerror", (error) => {
    report({ type: "failed", what: "page error", message: String(error) });
    finish(1);
  });
  await tab.exposeFunction("report", (record) => {
    report(record);
    if (record.type === "publication") {
      finish(0);
    } else if (record.type === "failed") {
      finish(1);
    }
  });
  await tab.goto(pageUrl.href);
} catch (error) {
  report({ type: "failed", what: "browser", message: String(error) });
  await finish(1);
}

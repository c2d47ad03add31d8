// Drives centrifuge-js (npm `centrifuge`, Centrifugo's JavaScript SDK) under
// Node with the `ws` package, for Herald's tests of its Centrifugo protocol.
//
//   node centrifuge.mjs <URL> <connection token> [--get-token] [--protobuf]
//
// With --protobuf the SDK's protobuf build speaks the binary protocol (its
// data are bytes: JSON text, encoded and decoded here, so that reports are
// the same in both forms).
//
// The URL picks the transport: `ws://.../connection/websocket` WebSocket,
// `http://.../connection/http_stream` HTTP streaming, `http://.../connection/sse`
// SSE (with the `eventsource` package); the last two send their commands to
// `/emulation` on the same host.
//
// With --get-token the client and its subscriptions made with a token have
// a getToken: each call answers the next token queued by a "tokens" command
// (the connection's, or a channel's with "channel"), or, once the queue is
// empty, the last one it answered; each call is reported.
//
// It reads commands on stdin, one JSON object per line:
//
//   {"op":"subscribe","channel":"news:a"}
//   {"op":"subscribe","channel":"chat:a","joinLeave":true}   asks for joins and leaves
//   {"op":"subscribe","channel":"news:a","token":"..."}     with a subscription token
//   {"op":"subscribe","channel":"news:a","tagsFilter":{...}} with a tags filter
//   {"op":"subscribe","channel":"news:a","delta":"fossil"}  asks for Fossil deltas
//   {"op":"delta_stats","channel":"news:a"}                 the SDK's deltaStats()
//   {"op":"subscribe","channel":"news:a","getState":true}   with a getState, which
//       answers the positions queued by "states", in turn (each call reported)
//   {"op":"states","channel":"news:a","states":[{"offset":N,"epoch":"..."}, ...]}
//   {"op":"tokens","tokens":["...", ...]}                    queues getToken's answers
//   {"op":"tokens","channel":"news:a","tokens":["...", ...]} a subscription's
//   {"op":"unsubscribe","channel":"news:a"}
//   {"op":"publish","channel":"room:a","data":{...}}
//   {"op":"history","channel":"news:a","limit":10}
//   {"op":"presence","channel":"news:a"}
//   {"op":"presence_stats","channel":"news:a"}
//   {"op":"disconnect"}            the client's own disconnect()
//   {"op":"connect"}               connect() again
//
// and reports on stdout, one JSON object per line:
//
//   {"type":"connected","client":"..."}
//   {"type":"connecting","code":N,"reason":"..."}   (it reconnects by itself)
//   {"type":"disconnected","code":N,"reason":"..."}
//   {"type":"subscribed","channel":"...","recoverable":true,"wasRecovering":false,
//    "recovered":false,"offset":N,"epoch":"..."}
//   {"type":"subscribing","channel":"...","code":N,"reason":"..."}
//   {"type":"unsubscribed","channel":"...","code":N,"reason":"..."}
//   {"type":"publication","channel":"...","offset":N,"data":...,"tags":{...}|null}
//   {"type":"join","channel":"...","client":"...","user":"...","connInfo":...,"chanInfo":...}
//   {"type":"leave","channel":"...","client":"...","user":"...","connInfo":...,"chanInfo":...}
//   {"type":"server_subscribed","channel":"...","recoverable":true,"wasRecovering":false,
//    "recovered":false,"offset":N,"epoch":"...","data":...|null}
//                                  a server-side subscription (the token's `subs`)
//   {"type":"server_publication","channel":"...","offset":N,"data":...,"tags":{...}|null}
//   {"type":"server_unsubscribed","channel":"..."}
//   {"type":"published","channel":"..."}
//   {"type":"history","channel":"...","offsets":[...],"offset":N,"epoch":"..."}
//   {"type":"presence","channel":"...","clients":{"<client>":{"client":"...","user":"...",
//    "connInfo":...,"chanInfo":...}}}
//   {"type":"presence_stats","channel":"...","numClients":N,"numUsers":N}
//   {"type":"failed","op":"...","code":N,"message":"..."}  a command's error
//   {"type":"get_token","channel":"..."|null}       a getToken call (--get-token)
//   {"type":"get_state","channel":"..."}            a getState call
//   {"type":"delta_stats","channel":"...","full":N,"deltas":N}
//
// It exits with status 0 when its stdin ends.

import { EventSource } from "eventsource";
import WebSocket from "ws";
import readline from "node:readline";

const [url, token, ...modes] = process.argv.slice(2);
const protobuf = modes.includes("--protobuf");
const { Centrifuge } = protobuf ? await import("centrifuge/build/protobuf") : await import("centrifuge");
// The application's JSON values as the SDK carries them in this form.
const encode = protobuf ? (value) => new TextEncoder().encode(JSON.stringify(value)) : (value) => value;
const decode = protobuf
  ? (bytes) => (bytes && bytes.length > 0 ? JSON.parse(new TextDecoder().decode(bytes)) : null)
  : (value) => value;
if (!url) {
  process.stderr.write("usage: node centrifuge.mjs <WebSocket URL> <token>\n");
  process.exit(2);
}

const report = (record) => process.stdout.write(`${JSON.stringify(record)}\n`);

// getToken's queued answers, by channel ("" for the connection's), and the
// last answer of each.
const queued = new Map();
const answered = new Map();
const tokenGetter = (channel) => () => {
  report({ type: "get_token", channel: channel || null });
  const queue = queued.get(channel) ?? [];
  if (queue.length > 0) {
    answered.set(channel, queue.shift());
  }
  return Promise.resolve(answered.get(channel) ?? "");
};
const withGetToken = modes.includes("--get-token");
// A publication's tags, `null` for none (the protobuf build gives `{}`).
const tagsOf = (ctx) => (ctx.tags && Object.keys(ctx.tags).length > 0 ? ctx.tags : null);

// getState's queued positions, by channel.
const states = new Map();
const stateGetter = (channel) => () => {
  report({ type: "get_state", channel });
  const queue = states.get(channel) ?? [];
  return queue.length > 0 ? Promise.resolve(queue.shift()) : Promise.reject(new Error("no state queued"));
};

const { pathname, origin } = new URL(url);
const emulated = { "/connection/http_stream": "http_stream", "/connection/sse": "sse" }[pathname];
const endpoint = emulated ? [{ transport: emulated, endpoint: url }] : url;

const client = new Centrifuge(endpoint, {
  websocket: WebSocket,
  eventsource: EventSource,
  emulationEndpoint: `${origin}/emulation`,
  token: token || undefined,
  getToken: withGetToken ? tokenGetter("") : undefined,
  // Reconnect soon after a restart, so that the tests do not wait long.
  minReconnectDelay: 100,
  maxReconnectDelay: 1000,
});

client.on("connected", (ctx) => report({ type: "connected", client: ctx.client }));
client.on("connecting", (ctx) => report({ type: "connecting", code: ctx.code, reason: ctx.reason }));
client.on("disconnected", (ctx) => report({ type: "disconnected", code: ctx.code, reason: ctx.reason }));
// Server-side subscriptions are reported by the client object itself.
client.on("subscribed", (ctx) =>
  report({
    type: "server_subscribed",
    channel: ctx.channel,
    recoverable: ctx.recoverable,
    wasRecovering: ctx.wasRecovering,
    recovered: ctx.recovered,
    offset: ctx.streamPosition ? Number(ctx.streamPosition.offset) : null,
    epoch: ctx.streamPosition ? ctx.streamPosition.epoch : null,
    data: decode(ctx.data) ?? null,
  }),
);
client.on("publication", (ctx) =>
  report({
    type: "server_publication",
    channel: ctx.channel,
    offset: Number(ctx.offset),
    data: decode(ctx.data),
    tags: tagsOf(ctx),
  }),
);
client.on("unsubscribed", (ctx) => report({ type: "server_unsubscribed", channel: ctx.channel }));

const clientInfo = (info) => ({
  client: info.client,
  user: info.user,
  connInfo: decode(info.connInfo) ?? null,
  chanInfo: decode(info.chanInfo) ?? null,
});

const joinLeaveReport = (type, channel) => (ctx) => report({ type, channel, ...clientInfo(ctx.info) });

const subscription = (channel, options = {}) => {
  const existing = client.getSubscription(channel);
  if (existing) {
    return existing;
  }
  const sub = client.newSubscription(channel, options);
  sub.on("subscribed", (ctx) =>
    report({
      type: "subscribed",
      channel,
      recoverable: ctx.recoverable,
      wasRecovering: ctx.wasRecovering,
      recovered: ctx.recovered,
      offset: ctx.streamPosition ? Number(ctx.streamPosition.offset) : null,
      epoch: ctx.streamPosition ? ctx.streamPosition.epoch : null,
    }),
  );
  sub.on("subscribing", (ctx) => report({ type: "subscribing", channel, code: ctx.code, reason: ctx.reason }));
  sub.on("unsubscribed", (ctx) => report({ type: "unsubscribed", channel, code: ctx.code, reason: ctx.reason }));
  sub.on("join", joinLeaveReport("join", channel));
  sub.on("leave", joinLeaveReport("leave", channel));
  sub.on("publication", (ctx) =>
    report({ type: "publication", channel, offset: Number(ctx.offset), data: decode(ctx.data), tags: tagsOf(ctx) }),
  );
  sub.on("error", (ctx) =>
    report({ type: "failed", op: "subscription", channel, code: ctx.error.code, message: ctx.error.message }),
  );
  return sub;
};

const failed = (op) => (e) => report({ type: "failed", op, code: e.code ?? null, message: e.message ?? String(e) });

const run = (command) => {
  switch (command.op) {
    case "subscribe": {
      const options = { joinLeave: command.joinLeave === true };
      if (command.tagsFilter) {
        options.tagsFilter = command.tagsFilter;
      }
      if (command.delta) {
        options.delta = command.delta;
      }
      if (command.getState) {
        options.getState = stateGetter(command.channel);
      }
      if (command.token) {
        options.token = command.token;
        if (withGetToken) {
          options.getToken = tokenGetter(command.channel);
        }
      }
      subscription(command.channel, options).subscribe();
      break;
    }
    case "delta_stats": {
      const stats = subscription(command.channel).deltaStats();
      report({ type: "delta_stats", channel: command.channel, full: stats.numFullPayloads, deltas: stats.numDeltaPayloads });
      break;
    }
    case "states":
      states.set(command.channel, [...(states.get(command.channel) ?? []), ...command.states]);
      break;
    case "tokens": {
      const channel = command.channel ?? "";
      queued.set(channel, [...(queued.get(channel) ?? []), ...command.tokens]);
      break;
    }
    case "unsubscribe":
      subscription(command.channel).unsubscribe();
      break;
    case "publish":
      subscription(command.channel)
        .publish(encode(command.data))
        .then(() => report({ type: "published", channel: command.channel }), failed("publish"));
      break;
    case "history":
      subscription(command.channel)
        .history({ limit: command.limit })
        .then(
          (result) =>
            report({
              type: "history",
              channel: command.channel,
              offsets: result.publications.map((p) => Number(p.offset)),
              offset: Number(result.offset),
              epoch: result.epoch,
            }),
          failed("history"),
        );
      break;
    case "presence":
      subscription(command.channel)
        .presence()
        .then(
          (result) =>
            report({
              type: "presence",
              channel: command.channel,
              clients: Object.fromEntries(Object.entries(result.clients).map(([id, info]) => [id, clientInfo(info)])),
            }),
          failed("presence"),
        );
      break;
    case "presence_stats":
      subscription(command.channel)
        .presenceStats()
        .then(
          (result) =>
            report({
              type: "presence_stats",
              channel: command.channel,
              numClients: result.numClients,
              numUsers: result.numUsers,
            }),
          failed("presence_stats"),
        );
      break;
    case "disconnect":
      client.disconnect();
      break;
    case "connect":
      client.connect();
      break;
    default:
      report({ type: "failed", op: command.op, code: null, message: "unknown op" });
  }
};

const lines = readline.createInterface({ input: process.stdin });
lines.on("line", (line) => {
  if (line.trim()) {
    run(JSON.parse(line));
  }
});
lines.on("close", () => {
  client.disconnect();
  process.exit(0);
});

client.connect();

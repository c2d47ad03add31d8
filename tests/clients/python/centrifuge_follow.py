"""Drives centrifuge-python (PyPI `centrifuge-python`, Centrifugo's Python
client SDK) for Herald's tests, as tests/clients/centrifuge.mjs drives
centrifuge-js: the same commands in, the same reports out, so that one test
runs either SDK.

    python centrifuge_follow.py <WebSocket URL> <connection token> [--protobuf]

With --protobuf the SDK speaks the binary protocol; its data are bytes (JSON
text, encoded and decoded here, so that reports are the same in both forms).

It connects at once and reads commands on stdin, one JSON object per line:

    {"op":"subscribe","channel":"news:a"}
    {"op":"subscribe","channel":"chat:a","joinLeave":true}   asks for joins and leaves
    {"op":"unsubscribe","channel":"news:a"}
    {"op":"publish","channel":"room:a","data":{...}}
    {"op":"history","channel":"news:a","limit":10}
    {"op":"presence","channel":"news:a"}
    {"op":"presence_stats","channel":"news:a"}
    {"op":"disconnect"}            the client's own disconnect()
    {"op":"connect"}               connect() again

and reports on stdout, one JSON object per line:

    {"type":"connected","client":"..."}
    {"type":"connecting","code":N,"reason":"..."}   (it reconnects by itself)
    {"type":"disconnected","code":N,"reason":"..."}
    {"type":"subscribed","channel":"...","recoverable":true,"wasRecovering":false,
     "recovered":false,"offset":N,"epoch":"..."}
    {"type":"subscribing","channel":"...","code":N,"reason":"..."}
    {"type":"unsubscribed","channel":"...","code":N,"reason":"..."}
    {"type":"publication","channel":"...","offset":N,"data":...,"tags":{...}|null}
    {"type":"join","channel":"...","client":"...","user":"...","connInfo":...,"chanInfo":...}
    {"type":"leave","channel":"...","client":"...","user":"...","connInfo":...,"chanInfo":...}
    {"type":"server_subscribed","channel":"...","recoverable":true,"wasRecovering":false,
     "recovered":false,"offset":N,"epoch":"...","data":...|null}
                                   a server-side subscription (the token's `subs`)
    {"type":"server_publication","channel":"...","offset":N,"data":...,"tags":{...}|null}
    {"type":"server_unsubscribed","channel":"..."}
    {"type":"published","channel":"..."}
    {"type":"history","channel":"...","offsets":[...],"offset":N,"epoch":"..."}
    {"type":"presence","channel":"...","clients":{"<client>":{"client":"...","user":"...",
     "connInfo":...,"chanInfo":...}}}
    {"type":"presence_stats","channel":"...","numClients":N,"numUsers":N}
    {"type":"failed","op":"...","code":N,"message":"..."}  a command's or the SDK's error

The SDK gives a publication without tags an empty dict: it is reported as
null, as centrifuge-js reports its missing tags. A command that waits for an
answer (publish, history, presence, presence_stats) runs in a task of its
own, as centrifuge.mjs runs it in a promise, so that the next command is read
meanwhile. It disconnects and exits with status 0 when its stdin ends.
"""

import asyncio
import json
import sys

from centrifuge import Client, ClientEventHandler, SubscriptionEventHandler


def report(record):
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


PROTOBUF = "--protobuf" in sys.argv[3:]


def decode(data):
    """An application value as the SDK hands it over in this form."""
    if PROTOBUF and isinstance(data, (bytes, bytearray)):
        return json.loads(data) if data else None
    return data


def encode(value):
    """An application value as the SDK takes it in this form."""
    return json.dumps(value).encode() if PROTOBUF else value


def client_info(info):
    return {
        "client": info.client,
        "user": info.user,
        "connInfo": decode(info.conn_info),
        "chanInfo": decode(info.chan_info),
    }


def position(ctx):
    position = ctx.stream_position
    return {
        "recoverable": ctx.recoverable,
        "wasRecovering": ctx.was_recovering,
        "recovered": ctx.recovered,
        "offset": position.offset if position else None,
        "epoch": position.epoch if position else None,
    }


def publication(kind, channel, pub):
    return {"type": kind, "channel": channel, "offset": pub.offset, "data": decode(pub.data), "tags": pub.tags or None}


def failure(op, error):
    # A server's error (ReplyError) carries its code; the SDK's own errors
    # (timeouts, a disconnected client) do not.
    return {"type": "failed", "op": op, "code": getattr(error, "code", None), "message": str(error)}


class ClientEvents(ClientEventHandler):
    async def on_connecting(self, ctx):
        report({"type": "connecting", "code": ctx.code, "reason": ctx.reason})

    async def on_connected(self, ctx):
        report({"type": "connected", "client": ctx.client})

    async def on_disconnected(self, ctx):
        report({"type": "disconnected", "code": ctx.code, "reason": ctx.reason})

    async def on_error(self, ctx):
        # Transport errors come with every reconnect attempt; the
        # connecting reports say what happened.
        pass

    # Server-side subscriptions are reported by the client object itself.
    async def on_subscribed(self, ctx):
        report({"type": "server_subscribed", "channel": ctx.channel, **position(ctx), "data": decode(ctx.data)})

    async def on_publication(self, ctx):
        report(publication("server_publication", ctx.channel, ctx.pub))

    async def on_unsubscribed(self, ctx):
        report({"type": "server_unsubscribed", "channel": ctx.channel})


class SubscriptionEvents(SubscriptionEventHandler):
    def __init__(self, channel):
        self.channel = channel

    async def on_subscribing(self, ctx):
        report({"type": "subscribing", "channel": self.channel, "code": ctx.code, "reason": ctx.reason})

    async def on_subscribed(self, ctx):
        report({"type": "subscribed", "channel": self.channel, **position(ctx)})

    async def on_unsubscribed(self, ctx):
        report({"type": "unsubscribed", "channel": self.channel, "code": ctx.code, "reason": ctx.reason})

    async def on_publication(self, ctx):
        report(publication("publication", self.channel, ctx.pub))

    async def on_join(self, ctx):
        report({"type": "join", "channel": self.channel, **client_info(ctx.info)})

    async def on_leave(self, ctx):
        report({"type": "leave", "channel": self.channel, **client_info(ctx.info)})

    async def on_error(self, ctx):
        report({**failure("subscription", ctx.error), "channel": self.channel})


class Runner:
    def __init__(self, client):
        self.client = client
        # Commands awaiting their answer; kept until done (the event loop
        # holds tasks weakly only).
        self.pending = set()

    def subscription(self, channel, join_leave=False):
        existing = self.client.get_subscription(channel)
        if existing is not None:
            return existing
        return self.client.new_subscription(channel, SubscriptionEvents(channel), join_leave=join_leave)

    def answer(self, op, call, on_result):
        async def run():
            try:
                result = await call
            except Exception as e:  # every error of the command is its report
                report(failure(op, e))
                return
            if on_result is not None:
                report(on_result(result))

        task = asyncio.ensure_future(run())
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def run(self, command):
        op = command.get("op")
        channel = command.get("channel")
        if op == "subscribe":
            await self.subscription(channel, command.get("joinLeave") is True).subscribe()
        elif op == "unsubscribe":
            await self.subscription(channel).unsubscribe()
        elif op == "publish":
            self.answer(
                op,
                self.subscription(channel).publish(encode(command["data"])),
                lambda _: {"type": "published", "channel": channel},
            )
        elif op == "history":
            self.answer(
                op,
                self.subscription(channel).history(limit=command.get("limit", 0)),
                lambda result: {
                    "type": "history",
                    "channel": channel,
                    "offsets": [p.offset for p in result.publications],
                    "offset": result.offset,
                    "epoch": result.epoch,
                },
            )
        elif op == "presence":
            self.answer(
                op,
                self.subscription(channel).presence(),
                lambda result: {
                    "type": "presence",
                    "channel": channel,
                    "clients": {key: client_info(info) for key, info in result.clients.items()},
                },
            )
        elif op == "presence_stats":
            self.answer(
                op,
                self.subscription(channel).presence_stats(),
                lambda result: {
                    "type": "presence_stats",
                    "channel": channel,
                    "numClients": result.num_clients,
                    "numUsers": result.num_users,
                },
            )
        elif op == "disconnect":
            await self.client.disconnect()
        elif op == "connect":
            # connect() returns once the first attempt is over; the reports
            # say how it went.
            self.answer(op, self.client.connect(), None)
        else:
            report({"type": "failed", "op": op, "code": None, "message": "unknown op"})


async def main():
    url, token = sys.argv[1:3]
    # Reconnect soon after a loss, so that the tests do not wait long.
    client = Client(
        url,
        events=ClientEvents(),
        token=token,
        min_reconnect_delay=0.1,
        max_reconnect_delay=1.0,
        use_protobuf=PROTOBUF,
    )
    runner = Runner(client)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await client.connect()
    while True:
        line = await reader.readline()
        if not line:
            break
        if line.strip():
            await runner.run(json.loads(line))
    await client.disconnect()


if __name__ == "__main__":
    asyncio.run(main())

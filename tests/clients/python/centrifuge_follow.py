"""Drives centrifuge-python (PyPI `centrifuge-python`, Centrifugo's Python
client SDK) for Herald's tests, as tests/clients/centrifuge.mjs drives
centrifuge-js: the same commands in, the same reports out, so that one test
runs either SDK.

    python centrifuge_follow.py <WebSocket URL> <connection token>

It connects at once and reads commands on stdin, one JSON object per line:

    {"op":"subscribe","channel":"news:a"}

and reports on stdout, one JSON object per line:

    {"type":"connected","client":"..."}
    {"type":"connecting","code":N,"reason":"..."}   (it reconnects by itself)
    {"type":"disconnected","code":N,"reason":"..."}
    {"type":"subscribed","channel":"...","recoverable":true,"wasRecovering":false,
     "recovered":false,"offset":N,"epoch":"..."}
    {"type":"subscribing","channel":"...","code":N,"reason":"..."}
    {"type":"publication","channel":"...","offset":N,"data":...}
    {"type":"failed","op":"...","code":N,"message":"..."}  an error the SDK reports

It disconnects and exits with status 0 when its stdin ends.
"""

import asyncio
import json
import sys

from centrifuge import Client, ClientEventHandler, SubscriptionEventHandler


def report(record):
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


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


class SubscriptionEvents(SubscriptionEventHandler):
    def __init__(self, channel):
        self.channel = channel

    async def on_subscribing(self, ctx):
        report({"type": "subscribing", "channel": self.channel, "code": ctx.code, "reason": ctx.reason})

    async def on_subscribed(self, ctx):
        position = ctx.stream_position
        report(
            {
                "type": "subscribed",
                "channel": self.channel,
                "recoverable": ctx.recoverable,
                "wasRecovering": ctx.was_recovering,
                "recovered": ctx.recovered,
                "offset": position.offset if position else None,
                "epoch": position.epoch if position else None,
            }
        )

    async def on_publication(self, ctx):
        report({"type": "publication", "channel": self.channel, "offset": ctx.pub.offset, "data": ctx.pub.data})

    async def on_error(self, ctx):
        report({"type": "failed", "op": "subscription", "code": ctx.code, "message": str(ctx.error)})


async def main():
    url, token = sys.argv[1:3]
    # Reconnect soon after a loss, so that the tests do not wait long.
    client = Client(url, events=ClientEvents(), token=token, min_reconnect_delay=0.1, max_reconnect_delay=1.0)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await client.connect()
    while True:
        line = await reader.readline()
        if not line:
            break
        if not line.strip():
            continue
        command = json.loads(line)
        if command.get("op") == "subscribe":
            channel = command["channel"]
            sub = client.new_subscription(channel, SubscriptionEvents(channel))
            await sub.subscribe()
        else:
            report({"type": "failed", "op": command.get("op"), "code": None, "message": "unknown op"})
    await client.disconnect()


if __name__ == "__main__":
    asyncio.run(main())

"""Drives centrifuge-python (PyPI `centrifuge-python`, Centrifugo's Python
client SDK) against a Herald node, for Herald's tests of its Centrifugo
protocol; publishes go through `cent`, the server API client.

    python centrifuge_sdk.py <WebSocket URL> <token> <API URL> <API key> <channel>

The scenario: connect with the token, subscribe, receive 3 publications,
read the history, disconnect while 2 more are published, connect again and
recover them. It prints one JSON object with what the SDK saw, for the
test to check, and exits 0; any wait longer than 20 s fails it.
"""

import asyncio
import json
import sys

from cent import AsyncClient, PublishRequest
from centrifuge import Client, SubscriptionEventHandler

WAIT = 20


class Events(SubscriptionEventHandler):
    def __init__(self):
        self.publications = []
        self.subscribed = []
        self.changed = asyncio.Condition()

    async def on_subscribed(self, ctx):
        async with self.changed:
            position = ctx.stream_position
            self.subscribed.append(
                {
                    "recoverable": ctx.recoverable,
                    "was_recovering": ctx.was_recovering,
                    "recovered": ctx.recovered,
                    "offset": position.offset if position else None,
                    "epoch": position.epoch if position else None,
                }
            )
            self.changed.notify_all()

    async def on_publication(self, ctx):
        async with self.changed:
            self.publications.append({"offset": ctx.pub.offset, "data": ctx.pub.data})
            self.changed.notify_all()

    async def wait(self, predicate):
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(predicate), WAIT)


async def main():
    ws_url, token, api_url, api_key, channel = sys.argv[1:6]
    api = AsyncClient(api_url, api_key)
    client = Client(ws_url, token=token, min_reconnect_delay=0.1, max_reconnect_delay=1.0)
    events = Events()
    sub = client.new_subscription(channel, events)
    await client.connect()
    await sub.subscribe()
    await events.wait(lambda: len(events.subscribed) == 1)
    for n in (1, 2, 3):
        await api.publish(PublishRequest(channel=channel, data={"n": n}))
    await events.wait(lambda: len(events.publications) >= 3)
    history = await sub.history(limit=10)
    await client.disconnect()
    for n in (4, 5):
        await api.publish(PublishRequest(channel=channel, data={"n": n}))
    await client.connect()
    await events.wait(lambda: len(events.subscribed) == 2)
    await events.wait(lambda: len(events.publications) >= 5)
    await client.disconnect()
    await api.close()
    print(
        json.dumps(
            {
                "subscribed": events.subscribed,
                "publications": events.publications,
                "history": {
                    "offsets": [p.offset for p in history.publications],
                    "offset": history.offset,
                    "epoch": history.epoch,
                },
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main())

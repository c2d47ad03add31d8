"""Drives `cent` (PyPI, Centrifugo's Python server API client) against a
Herald node, for Herald's tests of its Centrifugo server API.

    python cent_api.py <API URL> <API key> <channel>

It runs one scenario and prints one JSON object per step on stdout, for the
test to check: publishes (one repeated with its idempotency key), a
broadcast, history, a batch, channels, info, presence (which Herald
answers "not available"), a publish with tags and the history that shows
them, then history_remove and the history after it. Exits 0 when every
call returned.
"""

import json
import sys

from cent import (
    BatchRequest,
    BroadcastRequest,
    ChannelsRequest,
    Client,
    HistoryRemoveRequest,
    HistoryRequest,
    InfoRequest,
    PresenceRequest,
    PublishRequest,
)
from cent.exceptions import CentApiResponseError


def report(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def main():
    url, key, channel = sys.argv[1:4]
    with Client(url, key) as client:
        for n in (1, 2):
            r = client.publish(PublishRequest(channel=channel, data={"n": n}))
            report("publish", offset=r.offset, epoch=r.epoch)
        for _ in range(2):
            r = client.publish(
                PublishRequest(channel=channel, data={"n": 3}, idempotency_key="cent-3")
            )
            report("publish_keyed", offset=r.offset, epoch=r.epoch)
        r = client.broadcast(BroadcastRequest(channels=[channel, channel + "-b"], data={"n": 4}))
        report(
            "broadcast",
            offsets=[resp.result.offset if resp.result else None for resp in r.responses],
        )
        r = client.history(HistoryRequest(channel=channel, limit=100))
        report(
            "history",
            offsets=[p.offset for p in r.publications],
            data=[p.data for p in r.publications],
            offset=r.offset,
            epoch=r.epoch,
        )
        r = client.batch(
            BatchRequest(
                requests=[
                    PublishRequest(channel=channel, data={"n": 5}),
                    HistoryRequest(channel=channel, limit=0),
                ]
            )
        )
        report("batch", publish_offset=r.replies[0].offset, history_offset=r.replies[1].offset)
        r = client.channels(ChannelsRequest())
        names = sorted(r.channels.keys())
        report(
            "channels",
            channels=names,
            num_clients=[r.channels[name].num_clients for name in names],
        )
        r = client.info(InfoRequest())
        report("info", uids=[node.uid for node in r.nodes])
        try:
            client.presence(PresenceRequest(channel=channel))
            report("presence", code=None)
        except CentApiResponseError as e:
            report("presence", code=e.code)
        r = client.publish(
            PublishRequest(channel=channel, data={"n": 6}, tags={"kind": "tagged"})
        )
        report("publish_tagged", offset=r.offset)
        r = client.history(HistoryRequest(channel=channel, limit=100))
        report("history_tags", tags=[p.tags for p in r.publications])
        client.history_remove(HistoryRemoveRequest(channel=channel))
        r = client.history(HistoryRequest(channel=channel, limit=100))
        report(
            "history_removed",
            offsets=[p.offset for p in r.publications],
            offset=r.offset,
            epoch=r.epoch,
        )


if __name__ == "__main__":
    main()

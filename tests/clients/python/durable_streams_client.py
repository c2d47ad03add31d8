"""Drives the Durable Streams protocol's Python client (PyPI
durable-streams) against a Herald stream URL, for
crates/herald/tests/durable_streams_client.rs; the same reports as
tests/clients/durable-streams-client.mjs:

    python durable_streams_client.py <stream-url> <count> <live-mode>

It creates the JSON stream, follows it from the start in <live-mode> (sse
or long-poll) on a thread that resumes from its last offset when its
connection breaks, and appends {"n": 0} .. {"n": count-1} as an idempotent
producer (Producer-Id, -Epoch, -Seq headers; the client has no producer of
its own), one at a time, sending an append that failed again with the same
headers. Halfway it prints {"half": true} and goes on (the test kills the
holder then). It prints {"produced": count, "retried": k}, then
{"followed": [...], "resumed": r} once the reader has count items (or 60 s
passed), then {"stored": [...]} from a catch-up read, and exits.
"""

import json
import sys
import threading
import time

from durable_streams import DurableStream, stream


def say(value):
    print(json.dumps(value), flush=True)


def main():
    url, count, live = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    DurableStream.create(url, content_type="application/json")

    followed = []
    resumed = 0
    done = threading.Event()

    def follow():
        nonlocal resumed
        offset = "-1"
        while len(followed) < count:
            res = None
            try:
                with stream(url, offset=offset, live=live) as res:
                    for batch in res.iter_json_batches():
                        followed.extend(item["n"] for item in batch)
                        if len(followed) >= count:
                            break
            except Exception:  # a broken connection: resume from the offset
                resumed += 1
                time.sleep(0.1)
            # The offset after what was read: over SSE the client learns it
            # from the control event that follows each batch of data.
            if res is not None:
                offset = res.offset
        done.set()

    threading.Thread(target=follow, daemon=True).start()

    seq = {"value": 0}
    producer = DurableStream(
        url,
        content_type="application/json",
        batching=False,
        headers={
            "Producer-Id": "herald-test",
            "Producer-Epoch": "0",
            "Producer-Seq": lambda: str(seq["value"]),
        },
    )
    retried = 0
    for n in range(count):
        seq["value"] = n
        while True:
            try:
                producer.append({"n": n})
                break
            except Exception:  # sent again with the same producer headers
                retried += 1
                time.sleep(0.1)
        if n == count // 2:
            say({"half": True})
    say({"produced": count, "retried": retried})

    done.wait(60)
    say({"followed": list(followed), "resumed": resumed})
    with stream(url, offset="-1", live=False) as res:
        say({"stored": [item["n"] for item in res.read_json()]})


main()

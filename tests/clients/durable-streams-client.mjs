// Drives @durable-streams/client (the protocol's TypeScript client) against
// a Herald stream URL, for crates/herald/tests/durable_streams_client.rs:
//
//   node durable-streams-client.mjs <stream-url> <count> <live-mode>
//
// It creates the JSON stream, follows it from the start in <live-mode>
// (sse or long-poll), and appends {"n": 0} .. {"n": count-1} as an
// idempotent producer (Producer-Id, -Epoch, -Seq), one at a time. Halfway
// it prints {"half": true} and goes on (the test kills the holder then).
// It prints {"produced": count, "retried": k} once every append is
// acknowledged (k: requests the client sent again), then
// {"followed": [...], "resumed": r} with the n of every item the reader
// received, in order, once it has received count items (or 60 s passed),
// and how often it resumed after a broken connection, then
// {"stored": [...]} from a catch-up read, and exits.
import { BackoffDefaults, DurableStream, stream } from '@durable-streams/client'

const [url, countText, live] = process.argv.slice(2)
const count = Number(countText)
const say = (value) => process.stdout.write(JSON.stringify(value) + '\n')

// Appends that failed and were sent again (the client's backoff).
let retried = 0
const handle = await DurableStream.create({
  url,
  contentType: 'application/json',
  backoffOptions: { ...BackoffDefaults, onFailedAttempt: () => { retried++ } },
})

// The reader: follows from the start; when its connection breaks (the
// node it reads from was killed), it resumes from the last offset it got,
// as the protocol intends, and counts the resumptions.
const followed = []
let resumed = 0
let reader
const follow = (async () => {
  let offset = '-1'
  while (followed.length < count) {
    try {
      reader = await stream({ url, offset, live, onError: () => ({}) })
      await new Promise((resolve, reject) => {
        reader.subscribeJson((batch) => {
          for (const item of batch.items) followed.push(item.n)
          offset = batch.offset
          if (followed.length >= count) resolve()
        })
        reader.closed.then(resolve, reject)
      })
    } catch {
      resumed++
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
  }
})()
// The producer: one append at a time as producer "herald-test", epoch 0,
// sequence n. The client retries an append that failed (a connection the
// killed holder broke, a 503 while the cluster takes over) with the same
// producer headers, so the server can tell a retry from a new append.
for (let n = 0; n < count; n++) {
  await handle.append(JSON.stringify({ n }), {
    producerId: 'herald-test',
    producerEpoch: 0,
    producerSeq: n,
  })
  if (n === Math.floor(count / 2)) say({ half: true })
}
say({ produced: count, retried })

await Promise.race([follow, new Promise((resolve) => setTimeout(resolve, 60000))])
reader.cancel()
say({ followed, resumed })
const stored = await (await stream({ url, offset: '-1', live: false })).json()
say({ stored: stored.map((item) => item.n) })
process.exit(0)

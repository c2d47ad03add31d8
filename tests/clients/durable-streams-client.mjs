// Drives @durable-streams/client (the protocol's TypeScript client) against
// a Herald stream URL, for crates/herald/tests/durable_streams_client.rs:
//
//   node durable-streams-client.mjs <stream-url> <count> <live-mode>
//
// It creates the JSON stream, follows it from the start in <live-mode>
// (sse or long-poll), and appends {"n": 0} .. {"n": count-1} through an
// IdempotentProducer, one batch in flight at a time. Halfway it prints
// {"half": true} and waits for a line on stdin (the test kills the holder
// meanwhile), then goes on. It prints {"produced": count} once every
// append is acknowledged, then {"followed": [...]} with the n of every item
// the reader received, in order, once it has received count items (or 60 s
// passed), with how often it resumed after a broken connection, then {"stored": [...]} from a catch-up read, and exits.
import { createInterface } from 'node:readline'
import { DurableStream, IdempotentProducer, stream } from '@durable-streams/client'

const [url, countText, live] = process.argv.slice(2)
const count = Number(countText)
const say = (value) => process.stdout.write(JSON.stringify(value) + '\n')
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]()

const handle = await DurableStream.create({ url, contentType: 'application/json' })

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
const errors = []
const producer = new IdempotentProducer(handle, 'herald-test', {
  lingerMs: 0,
  maxInFlight: 1,
  onError: (e) => errors.push(String(e)),
})
for (let n = 0; n < count; n++) {
  producer.append(JSON.stringify({ n }))
  if (n === Math.floor(count / 2)) {
    await producer.flush()
    say({ half: true })
    await lines.next()
  }
}
await producer.flush()
say({ produced: count, errors })

await Promise.race([follow, new Promise((resolve) => setTimeout(resolve, 60000))])
reader.cancel()
say({ followed, resumed })
const stored = await (await stream({ url, offset: '-1', live: false })).json()
say({ stored: stored.map((item) => item.n) })
process.exit(0)

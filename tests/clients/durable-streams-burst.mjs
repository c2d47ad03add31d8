// Drives @durable-streams/client's IdempotentProducer in a burst against a
// Herald stream URL, for crates/herald/tests/durable_streams_client.rs:
//
//   node durable-streams-burst.mjs <stream-url> <count>
//
// It creates the JSON stream, appends {"n": 0} .. {"n": count-1} through
// one IdempotentProducer as fast as the loop runs (the producer batches
// them: far more than ten thousand per request once the loop outruns its
// linger), then flush()es, and prints {"errors": [...]} with the message
// of every error the producer reported, then {"stored": [...]} with the n
// of every item a catch-up read returns, and exits.
import { DurableStream, IdempotentProducer, stream } from '@durable-streams/client'

const [url, countText] = process.argv.slice(2)
const count = Number(countText)
// Resolves once the line is written: the exit below must not cut it.
const say = (value) =>
  new Promise((resolve) => process.stdout.write(JSON.stringify(value) + '\n', resolve))

const handle = await DurableStream.create({ url, contentType: 'application/json' })
const errors = []
const producer = new IdempotentProducer(handle, 'herald-burst', {
  onError: (error) => errors.push(String(error && error.message ? error.message : error)),
})
for (let n = 0; n < count; n++) producer.append(JSON.stringify({ n }))
try {
  await producer.flush()
} catch (error) {
  errors.push(String(error && error.message ? error.message : error))
}
await say({ errors })
const stored = await (await stream({ url, offset: '-1', live: false })).json()
await say({ stored: stored.map((item) => item.n) })
process.exit(0)

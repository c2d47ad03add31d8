// Append to a Durable Streams stream on Herald and read it back with the
// protocol's TypeScript client (npm @durable-streams/client).
import { DurableStream, stream } from '@durable-streams/client'

const url = process.env.STREAM_URL ?? 'http://127.0.0.1:7700/ds/shop/orders'

// Creates the stream (or opens it, if it exists with the same type).
const orders = await DurableStream.create({ url, contentType: 'application/json' })

// An append to a JSON stream is JSON text: stringify objects yourself.
await orders.append(JSON.stringify({ item: 'tea', qty: 2 }))
await orders.append(JSON.stringify({ item: 'cake', qty: 1 }))

// Everything stored so far, from the start (offset -1), without waiting.
const res = await stream({ url, offset: '-1', live: false })
for (const order of await res.json()) console.log(JSON.stringify(order))

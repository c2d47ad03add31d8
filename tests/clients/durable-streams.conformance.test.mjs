// The Durable Streams server conformance suite
// (@durable-streams/server-conformance-tests), run by vitest against the
// Herald node whose stream prefix URL is in DS_CONFORMANCE_URL (e.g.
// http://127.0.0.1:7700/ds, without a trailing slash). DS_LONG_POLL_MS is
// the node's long-poll timeout in ms (the suite waits a little longer for
// a long-poll answer). Run by crates/herald/tests/durable_streams.rs.
import { runConformanceTests } from '@durable-streams/server-conformance-tests'

const baseUrl = process.env.DS_CONFORMANCE_URL
if (!baseUrl) {
  throw new Error('DS_CONFORMANCE_URL must name the stream prefix URL of a Herald node')
}

runConformanceTests({
  baseUrl,
  longPollTimeoutMs: Number(process.env.DS_LONG_POLL_MS ?? 1000),
})

// vitest's settings for durable-streams.conformance.test.mjs: that file
// only, one worker, and a per-case limit of 30 s so that a busy machine
// does not fail a case that only runs slowly (the suite's own cases bound
// what they wait for themselves).
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['durable-streams.conformance.test.mjs'],
    testTimeout: 30000,
    hookTimeout: 30000,
    fileParallelism: false,
    watch: false,
  },
})

import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import {
  type Algorithm,
  decodeCall,
  decodeReply,
  encodeCall,
  encodeReply,
  type Operation,
  type ScriptCall,
} from '../../src/plugins/rate-limit/protocol.ts'

// The codec between the engine's named calls and replies and the scripts' KEYS, ARGV and reply
// arrays, without Redis: every operation of every algorithm survives a round trip, and literal
// replies of the scripts decode to what they mean.

const ALGORITHMS: Algorithm[] = ['fixed-window', 'sliding-log', 'sliding-counter', 'token-bucket', 'gcra']
const OPERATIONS: Operation[] = ['consume', 'peek', 'refund']

/** A call in its canonical form: what the engine builds for `algorithm`. */
function callFor(algorithm: Algorithm, operation: Operation): ScriptCall {
  const bucket = algorithm === 'token-bucket'
  const quota = (limit: number) =>
    bucket ? { limit, windowMs: 0, refillPerSecond: 2.5 } : { limit, windowMs: 60_000, refillPerSecond: 0 }
  const refund = operation === 'refund'
  const call: ScriptCall = {
    operation,
    nonce: algorithm === 'sliding-log' ? 'abc1' : '',
    policies: [
      {
        key: 'p{t}:a',
        quota: quota(10),
        cost: 2,
        maxDelayMs: refund ? 0 : 500,
        refundWindow: refund ? 41_000 : 0,
      },
      { key: 'p{t}:b', quota: quota(100), cost: 1, maxDelayMs: 0, refundWindow: 0 },
    ],
    blocks: refund ? [] : [{ policy: 1, key: 'p{t}:b:block', blockMs: 30_000 }],
    penalties: [],
  }
  if (algorithm === 'fixed-window' && !refund)
    call.penalties.push({
      policy: 0,
      key: 'p{t}:a:rejections',
      banAfter: 3,
      exponentialBackoff: true,
      continueExceeding: false,
    })
  return call
}

describe('script calls', () => {
  for (const algorithm of ALGORITHMS) {
    for (const operation of OPERATIONS) {
      test(`${algorithm} ${operation}: decode(encode(call)) is the call`, () => {
        const call = callFor(algorithm, operation)
        const { keys, argv } = encodeCall(algorithm, call)
        assert.deepEqual(decodeCall(algorithm, keys, argv), call)
      })
    }
  }

  test('the wire layout: op code, nonce, four per policy, then (policy number, ms or spec) per extra key', () => {
    const { keys, argv } = encodeCall('fixed-window', callFor('fixed-window', 'consume'))
    assert.deepEqual(keys, ['p{t}:a', 'p{t}:b', 'p{t}:a:rejections', 'p{t}:b:block'])
    // The penalty spec is (ban + 1) * 4 + 2 * backoff + continue; a negative number marks it.
    assert.deepEqual(argv, ['c', '', 10, 60_000, 2, 500, 100, 60_000, 1, 0, -1, 18, 2, 30_000])
  })

  test('the token bucket sends its refill per second where the others send their window', () => {
    const { argv } = encodeCall('token-bucket', callFor('token-bucket', 'peek'))
    assert.deepEqual(argv.slice(0, 6), ['p', '', 10, 2.5, 2, 500])
  })

  test('a refund sends the window of its consume in the last slot of the policy', () => {
    const { argv } = encodeCall('sliding-counter', callFor('sliding-counter', 'refund'))
    assert.deepEqual(argv, ['r', '', 10, 60_000, 2, 41_000, 100, 60_000, 1, 0])
  })

  test('the ARGV the scripts are called with by hand decodes by name', () => {
    const call = decodeCall('fixed-window', ['k', 'k:block'], ['c', '', 5, 1000, 1, 0, 1, 200])
    assert.deepEqual(call, {
      operation: 'consume',
      nonce: '',
      policies: [
        {
          key: 'k',
          quota: { limit: 5, windowMs: 1000, refillPerSecond: 0 },
          cost: 1,
          maxDelayMs: 0,
          refundWindow: 0,
        },
      ],
      blocks: [{ policy: 0, key: 'k:block', blockMs: 200 }],
      penalties: [],
    })
  })

  test('an unknown operation code is refused', () => {
    assert.throws(() => decodeCall('gcra', ['k'], ['x', '', 5, 1000, 1, 0]), /unknown rate-limit operation x/)
  })
})

describe('script replies', () => {
  test('a rejected fixed window with penalties: four numbers per policy, then ban states', () => {
    const wire = [0, 0, 0, 8000, 8000, 8000, 7, 8000, 0, 8000, 2, 0]
    const reply = decodeReply(wire, 2)
    assert.deepEqual(reply, {
      allowed: false,
      delayMs: 0,
      reportsBans: true,
      policies: [
        { remaining: 0, resetMs: 8000, retryMs: 8000, refundWindow: 8000, ban: 'began' },
        { remaining: 7, resetMs: 8000, retryMs: 0, refundWindow: 8000, ban: 'none' },
      ],
    })
    assert.deepEqual(encodeReply(reply), wire)
  })

  test('a delayed token bucket: allowed, with the wait', () => {
    const wire = [1, 250, 0, 2000, 0, 0]
    const reply = decodeReply(wire, 1)
    assert.deepEqual(reply, {
      allowed: true,
      delayMs: 250,
      reportsBans: false,
      policies: [{ remaining: 0, resetMs: 2000, retryMs: 0, refundWindow: 0, ban: 'none' }],
    })
    assert.deepEqual(encodeReply(reply), wire)
  })

  test('a sliding counter names its window index for the refund; a banned policy says so', () => {
    assert.equal(decodeReply([1, 0, 3, 700, 0, 1_733_000], 1).policies[0]!.refundWindow, 1_733_000)
    assert.equal(decodeReply([0, 0, 0, 500, 500, 500, 1], 1).policies[0]!.ban, 'banned')
  })

  test('a refund replies only its verdict', () => {
    const reply = decodeReply([1, 0], 0)
    assert.deepEqual(reply, { allowed: true, delayMs: 0, policies: [], reportsBans: false })
    assert.deepEqual(encodeReply(reply), [1, 0])
  })
})

import { callScript, defineScript, type ScriptClient } from '../../redis/scripts.ts'

/**
 * The calling convention of the rate-limit scripts (src/lua/rate-limit-*.lua), in one place: what a
 * call and a reply hold, by name, and the one encoder and decoder of each between those names and
 * the flat KEYS, ARGV and reply arrays Redis passes. The engine encodes calls and decodes replies;
 * the memory store, which answers the same calls in this process, decodes calls and encodes replies.
 *
 * KEYS: each policy's key (KEYS[1..n]), then one key per block or penalty.
 * ARGV: ARGV[1] the operation ('c' consume, 'p' peek, 'r' refund), ARGV[2] the nonce, then four per
 *       policy i from b = 3 + (i - 1) * 4: ARGV[b] limit or capacity, ARGV[b+1] window ms or
 *       refill per second, ARGV[b+2] cost, ARGV[b+3] max delay ms, or on a refund the consume's
 *       window; then per extra key (policy number i, block ms) for a block and (-i, penalty spec)
 *       for a penalty. Every script has this layout, whether or not it uses each slot.
 * Reply: allowed 0/1, delay ms, then four per policy (remaining, reset ms, retry ms, refund
 *       window), then, when the call has penalties, one ban state per policy (0, 1, 2). A refund
 *       replies only the first two.
 * Blocks (src/lua/include/rate-limit-blocks-*.lua): while a block key lives the request is
 *       rejected, nothing counted, and its policy replies remaining 0 with the block's TTL as its
 *       reset and retry; a consume its policy rejects starts the block.
 */

/**
 * How a policy counts; each algorithm is one script. `concurrency` counts requests in flight: a
 * request's slot is taken by a consume (its lease is the quota's window) and removed by a refund
 * under the request's nonce, which the engine sends when the response ends.
 */
export type Algorithm =
  | 'fixed-window'
  | 'sliding-log'
  | 'sliding-counter'
  | 'token-bucket'
  | 'gcra'
  | 'concurrency'

/** The rate-limit script of each algorithm. */
export const SCRIPT_OF_ALGORITHM = {
  'fixed-window': 'rateLimitFixedWindow',
  'sliding-log': 'rateLimitSlidingLog',
  'sliding-counter': 'rateLimitSlidingCounter',
  'token-bucket': 'rateLimitTokenBucket',
  gcra: 'rateLimitGcra',
  concurrency: 'rateLimitConcurrency',
} as const satisfies Record<Algorithm, string>

export type RateLimitScript = (typeof SCRIPT_OF_ALGORITHM)[Algorithm]

/** Each script's definition: its KEYS and ARGV as encodeCall lays them out, its reply as decodeReply reads it. */
const rateLimitScript = (name: RateLimitScript) =>
  defineScript({
    name,
    keys: ['...keys'],
    args: ['operation', 'nonce', '...quotas'],
    reply: (raw) => raw as number[],
  })

const DEFINITION_OF_ALGORITHM = {
  'fixed-window': rateLimitScript(SCRIPT_OF_ALGORITHM['fixed-window']),
  'sliding-log': rateLimitScript(SCRIPT_OF_ALGORITHM['sliding-log']),
  'sliding-counter': rateLimitScript(SCRIPT_OF_ALGORITHM['sliding-counter']),
  'token-bucket': rateLimitScript(SCRIPT_OF_ALGORITHM['token-bucket']),
  gcra: rateLimitScript(SCRIPT_OF_ALGORITHM.gcra),
  concurrency: rateLimitScript(SCRIPT_OF_ALGORITHM.concurrency),
} satisfies Record<Algorithm, unknown>

/** Consume the cost, only check it (change nothing), or give back what an earlier consume took. */
export type Operation = 'consume' | 'peek' | 'refund'

/** The one-letter codes keep the scripts' common path to a string comparison. */
const OPERATION_CODES = { consume: 'c', peek: 'p', refund: 'r' } as const satisfies Record<Operation, string>

/** A policy's quota as its script takes it. */
export interface Quota {
  /** Units per window; the token bucket's capacity. */
  limit: number
  /** The window (GCRA: period) in ms; 0 for the token bucket. */
  windowMs: number
  /** The token bucket's refill in tokens per second; 0 for the other algorithms. */
  refillPerSecond: number
}

export interface PolicyCall {
  /** The policy's counter (a String, Hash or Sorted Set by algorithm). */
  key: string
  quota: Quota
  /** Whole units, 1 or more (the engine skips a policy a request costs nothing under). */
  cost: number
  /** Token bucket and GCRA: the longest wait accepted instead of a rejection (consume and peek). */
  maxDelayMs: number
  /** Refund only: which window the consume counted in (the reply's `refundWindow` then). */
  refundWindow: number
}

/** A policy with blockMs: while its block key lives, the request is rejected and nothing counted. */
export interface BlockCall {
  /** Index of the policy in the call's `policies`. */
  policy: number
  key: string
  blockMs: number
}

/** A fixed-window policy with ban, exponentialBackoff or continueExceeding: its rejections key. */
export interface PenaltyCall {
  /** Index of the policy in the call's `policies`. */
  policy: number
  /** Rejected requests of the counter's window, with the counter's TTL. */
  key: string
  /** Rejections before a ban; -1: no ban. */
  banAfter: number
  exponentialBackoff: boolean
  continueExceeding: boolean
}

export interface ScriptCall {
  operation: Operation
  /** Sliding log: the request's nonce, its members are `<nonce>:<unit>`; '' for the other scripts. */
  nonce: string
  policies: PolicyCall[]
  blocks: BlockCall[]
  penalties: PenaltyCall[]
}

/** A fixed window's ban: none, banned, or banned from this request on (onBanReach is due). */
export type BanState = 'none' | 'banned' | 'began'

const BAN_CODES = { none: 0, banned: 1, began: 2 } as const satisfies Record<BanState, number>
const BAN_STATES: readonly BanState[] = ['none', 'banned', 'began']

export interface PolicyReply {
  /** Units left; on a consume it counts this request, on a peek it is the quota as it stands. */
  remaining: number
  /** ms until more quota is available. */
  resetMs: number
  /** When rejected: ms until a request of this cost can pass; 0 otherwise. */
  retryMs: number
  /** What a refund of this consume passes back: the fixed window's TTL, the sliding counter's window index; else 0. */
  refundWindow: number
  ban: BanState
}

export interface ScriptReply {
  /** All or nothing: every policy of the call admitted the request. */
  allowed: boolean
  /** Token bucket and GCRA with maxDelayMs: how long to wait before going ahead. */
  delayMs: number
  policies: PolicyReply[]
  /** The call had penalties: the reply carries each policy's ban state. */
  reportsBans: boolean
}

export type WireArgument = string | number

/** The second quota number of the ARGV: the token bucket's refill, every other algorithm's window. */
const isBucket = (algorithm: Algorithm) => algorithm === 'token-bucket'

/** A fixed window's penalties as one number: (ban + 1) * 4 + 2 * backoff + continue. */
function penaltySpec(penalty: PenaltyCall): number {
  return (
    (penalty.banAfter + 1) * 4 + (penalty.exponentialBackoff ? 2 : 0) + (penalty.continueExceeding ? 1 : 0)
  )
}

export function encodeCall(algorithm: Algorithm, call: ScriptCall): { keys: string[]; argv: WireArgument[] } {
  const keys: string[] = []
  const argv: WireArgument[] = [OPERATION_CODES[call.operation], call.nonce]
  const bucket = isBucket(algorithm)
  for (const policy of call.policies) {
    const { quota } = policy
    keys.push(policy.key)
    argv.push(
      quota.limit,
      bucket ? quota.refillPerSecond : quota.windowMs,
      policy.cost,
      call.operation === 'refund' ? policy.refundWindow : policy.maxDelayMs,
    )
  }
  // Per policy, its block and then its penalty key: the order the scripts read them in is free.
  for (let index = 0; index < call.policies.length; index++) {
    for (const block of call.blocks) {
      if (block.policy !== index) continue
      keys.push(block.key)
      argv.push(index + 1, block.blockMs)
    }
    for (const penalty of call.penalties) {
      if (penalty.policy !== index) continue
      keys.push(penalty.key)
      argv.push(-(index + 1), penaltySpec(penalty))
    }
  }
  return { keys, argv }
}

/** Runs an encoded call on the script of `algorithm`: the reply as decodeReply reads it. */
export function runEncoded(
  client: ScriptClient,
  algorithm: Algorithm,
  { keys, argv }: { keys: readonly string[]; argv: readonly WireArgument[] },
): Promise<number[]> {
  const [operation = '', nonce = '', ...quotas] = argv
  return callScript(client, DEFINITION_OF_ALGORITHM[algorithm], { keys }, { operation, nonce, quotas })
}

export function decodeCall(
  algorithm: Algorithm,
  keys: readonly string[],
  argv: readonly WireArgument[],
): ScriptCall {
  const code = argv[0]
  const operation = (Object.keys(OPERATION_CODES) as Operation[]).find((op) => OPERATION_CODES[op] === code)
  if (!operation) throw new Error(`unknown rate-limit operation ${String(code)}`)
  // Two ARGV per extra key and four per policy key: policies = (#ARGV - 2) / 2 - #KEYS.
  const policyCount = (argv.length - 2) / 2 - keys.length
  const bucket = isBucket(algorithm)
  const call: ScriptCall = { operation, nonce: String(argv[1]), policies: [], blocks: [], penalties: [] }
  for (let index = 0; index < policyCount; index++) {
    const at = 2 + index * 4
    const second = Number(argv[at + 1])
    const fourth = Number(argv[at + 3])
    call.policies.push({
      key: keys[index]!,
      quota: {
        limit: Number(argv[at]),
        windowMs: bucket ? 0 : second,
        refillPerSecond: bucket ? second : 0,
      },
      cost: Number(argv[at + 2]),
      maxDelayMs: operation === 'refund' ? 0 : fourth,
      refundWindow: operation === 'refund' ? fourth : 0,
    })
  }
  for (let extra = 0; extra < keys.length - policyCount; extra++) {
    const at = 2 + 4 * policyCount + 2 * extra
    const number = Number(argv[at])
    const value = Number(argv[at + 1])
    const key = keys[policyCount + extra]!
    // A negative policy number tells a penalty key from a block key.
    if (number > 0) call.blocks.push({ policy: number - 1, key, blockMs: value })
    else
      call.penalties.push({
        policy: -number - 1,
        key,
        banAfter: Math.floor(value / 4) - 1,
        exponentialBackoff: value % 4 >= 2,
        continueExceeding: value % 2 === 1,
      })
  }
  return call
}

export function encodeReply(reply: ScriptReply): number[] {
  const wire = [reply.allowed ? 1 : 0, reply.delayMs]
  for (const policy of reply.policies)
    wire.push(policy.remaining, policy.resetMs, policy.retryMs, policy.refundWindow)
  if (reply.reportsBans) for (const policy of reply.policies) wire.push(BAN_CODES[policy.ban])
  return wire
}

/** A script's reply for a call of `policyCount` policies. */
export function decodeReply(wire: readonly number[], policyCount: number): ScriptReply {
  const bansAt = 2 + 4 * policyCount
  const reportsBans = wire.length > bansAt
  const policies: PolicyReply[] = []
  for (let index = 0; index < policyCount; index++) {
    const at = 2 + index * 4
    policies.push({
      remaining: wire[at]!,
      resetMs: wire[at + 1]!,
      retryMs: wire[at + 2]!,
      refundWindow: wire[at + 3]!,
      ban: reportsBans ? BAN_STATES[wire[bansAt + index]!]! : 'none',
    })
  }
  return { allowed: wire[0] === 1, delayMs: wire[1]!, policies, reportsBans }
}

import { codes, defineScript } from '../../redis/scripts.ts'

// The idempotency record's scripts (src/lua/idempotency-*.lua). Each takes the record's one key.

const CLAIM_KIND = codes({
  new: 'new',
  takeover: 'takeover',
  mismatch: 'mismatch',
  conflict: 'conflict',
  replay: 'replay',
})

export const IDEMPOTENCY_CLAIM = defineScript({
  name: 'idempotencyClaim',
  keys: ['record'],
  args: ['fingerprint', 'token', 'leaseMs', 'retentionMs'],
  /** Bulk strings as Buffers: a replayed body is byte-exact. */
  buffers: true,
  /** What the request gets, and the rest of the reply (a conflict's lease left, a replay's response). */
  reply: (raw) => {
    const [kind, ...rest] = raw as Buffer[]
    return { kind: CLAIM_KIND(String(kind)), rest }
  },
})

export const IDEMPOTENCY_RENEW = defineScript({
  name: 'idempotencyRenew',
  keys: ['record'],
  args: ['token', 'leaseMs'],
  reply: codes({ renewed: 1, notOwner: 0 }),
})

export const IDEMPOTENCY_COMPLETE = defineScript({
  name: 'idempotencyComplete',
  keys: ['record'],
  args: ['token', 'status', 'headers', 'body', 'kept', 'retentionMs'],
  reply: codes({ stored: 1, notOwner: 0 }),
})

export const IDEMPOTENCY_RELEASE = defineScript({
  name: 'idempotencyRelease',
  keys: ['record'],
  args: ['token'],
  reply: codes({ deleted: 1, notOwner: 0 }),
})

import { codes, defineScript, integer } from '../../redis/scripts.ts'

// The session store's scripts (src/lua/session-*.lua).

/** A session's times as the scripts read them on the Redis clock (epoch ms). */
export const SESSION_CREATE = defineScript({
  name: 'sessionCreate',
  keys: ['session'],
  /** fields: field, value pairs of initial data. */
  args: ['idleTimeoutMs', 'absoluteTimeoutMs', 'principal', '...fields'],
  reply: (raw) => {
    const [createdAt, expiresAt, absoluteExpiresAt] = (raw as unknown[]).map(Number) as [
      number,
      number,
      number,
    ]
    return { createdAt, expiresAt, absoluteExpiresAt }
  },
})

export const SESSION_INDEX_ADD = defineScript({
  name: 'sessionIndexAdd',
  keys: ['index'],
  args: ['id', 'absoluteTimeoutMs'],
  /** The number of ids in the index. */
  reply: integer,
})

const SET_FAILURE = codes({ gone: -1, tooLarge: -2 })

export const SESSION_SET = defineScript({
  name: 'sessionSet',
  keys: ['session'],
  /** changes: the n fields to delete, then field, value pairs to write. */
  args: ['idleTimeoutMs', 'maxBytes', 'deleteCount', '...changes'],
  /** Saved with the new expiry after a touch (0 without one), or why nothing was saved. */
  reply: (raw): { saved: true; expiresAt: number } | { saved: false; failure: 'gone' | 'tooLarge' } => {
    const reply = Number(raw)
    return reply < 0 ? { saved: false, failure: SET_FAILURE(reply) } : { saved: true, expiresAt: reply }
  },
})

export const SESSION_DESCRIBE = defineScript({
  name: 'sessionDescribe',
  keys: ['session'],
  args: [],
  /** null when the session does not exist or its absolute lifetime has passed; idleTimeoutMs 0: the store's. */
  reply: (raw) => {
    if (!raw) return null
    const [principal, createdAt, absoluteExpiresAt, idleTimeoutMs, expiresAt] = raw as unknown[]
    return {
      principal: String(principal),
      createdAt: Number(createdAt),
      absoluteExpiresAt: Number(absoluteExpiresAt),
      idleTimeoutMs: Number(idleTimeoutMs),
      expiresAt: Number(expiresAt),
    }
  },
})

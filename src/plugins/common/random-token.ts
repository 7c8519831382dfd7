import { randomFillSync } from 'node:crypto'

// Tokens are made on hot paths (several per transfer: idempotency owners, cache generations, lock
// owners). One getrandom call per token costs more than the rest of making it, so they are cut
// from a pool of the system's CSPRNG output refilled 4 KiB at a time, as crypto.randomUUID does.
// Each byte is used once.
const POOL_BYTES = 4096
const pool = Buffer.alloc(POOL_BYTES)
let used = POOL_BYTES

/** `bytes` (at most 4096) random bytes, encoded. */
export function randomToken(bytes: number, encoding: 'base64url' | 'hex' = 'base64url'): string {
  if (used + bytes > POOL_BYTES) {
    randomFillSync(pool)
    used = 0
  }
  used += bytes
  return pool.toString(encoding, used - bytes, used)
}

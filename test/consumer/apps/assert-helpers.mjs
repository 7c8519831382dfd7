// Shared by the consumer apps: a unique key prefix per run, a plain ioredis client, and a closer.
import { randomBytes } from 'node:crypto'
import { Redis } from 'ioredis'

export const prefix = (name) => `consumer:${name}:${randomBytes(4).toString('hex')}:`

export function newRedis() {
  return new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379')
}

export async function done(name, app, redis) {
  await app.close()
  await redis.quit()
  console.log(`ok ${name}`)
}

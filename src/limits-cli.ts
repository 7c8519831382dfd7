// `npm run limits -- <command>`: the demo's rate-limit overrides (docs/demo/operations.md), changed
// on the Redis and Postgres of a running deployment (REDIS_URL or REDIS_CLUSTER_NODES, and
// DATABASE_URL, as the gateway has them: its keys live under the database's identity). Every
// gateway instance applies a change at once, or within 5 s if the message is lost.
//
//   list
//   set <policy> <key> <limit> --ttl <duration> [--reason <text>] [--by <name>]
//   remove <policy> <key> [--reason <text>] [--by <name>]
//   history [--count <n>]
//
// <key> is the identity the policy keys by: `customer:<id>` (transfers, transfers-shadow),
// `ip:<address>` or an IP range `ip:<network>/<prefix>` (ip, login-ip), `username:<name>` (login).
import { userInfo } from 'node:os'
import { pathToFileURL } from 'node:url'
import { parseArgs } from 'node:util'
import Fastify from 'fastify'
import { createRedisClient, rateLimit } from 'fastify-redis-gateway'
import { loadConfig } from './config.ts'
import { createPgDatabase } from './db/database.ts'
import { demoRateLimits } from './rate-limits.ts'

const USAGE = `usage: npm run limits -- list
       npm run limits -- set <policy> <key> <limit> --ttl <duration> [--reason <text>] [--by <name>]
       npm run limits -- remove <policy> <key> [--reason <text>] [--by <name>]
       npm run limits -- history [--count <n>]
(REDIS_URL or REDIS_CLUSTER_NODES, and DATABASE_URL, as the gateway has them; --key-prefix as its keyPrefix)`

/** Runs one command; resolves with what to print. Exported for the tests, which run it in process. */
export async function runLimits(args: string[], env: NodeJS.ProcessEnv = process.env): Promise<string> {
  const { values, positionals } = parseArgs({
    args,
    allowPositionals: true,
    options: {
      ttl: { type: 'string' },
      reason: { type: 'string' },
      by: { type: 'string' },
      count: { type: 'string' },
      'key-prefix': { type: 'string', default: '' },
    },
  })
  const [command, ...rest] = positionals
  const config = loadConfig(env)
  if (!config.databaseUrl)
    throw new UsageError(
      'DATABASE_URL is unset: the overrides live under the database identity of the deployment',
    )
  if (!config.redis.url && !config.redis.clusterNodes)
    throw new UsageError('REDIS_URL (or REDIS_CLUSTER_NODES) is unset: give the Redis the gateway uses')
  const database = createPgDatabase({ connectionString: config.databaseUrl, max: 1 })
  const redis = createRedisClient(config.redis)
  // Only the policies' names and limits matter here: none buffered, so this process never joins
  // the gateway's instances.
  const { policies = [], namedPolicies = [] } = demoRateLimits(config.rateLimits)
  const app = Fastify({ logger: false })
  try {
    const [row] = await database.query<{ identity: string }>('SELECT identity FROM database_identity')
    await app.register(rateLimit, {
      redis,
      keyPrefix: `${values['key-prefix']}${row!.identity}:rl:`,
      namedPolicies: [...policies, ...namedPolicies].map((policy) => ({ ...policy, sync: false })),
      overrides: true,
    })
    await app.ready()
    const { overrides } = app.rateLimiter
    const note = { reason: values.reason, by: values.by ?? userInfo().username }
    switch (command) {
      case 'list': {
        const list = await overrides.list()
        if (list.length === 0) return 'no overrides in force'
        return list
          .map(
            (o) =>
              `${o.policy} ${o.key} limit ${o.limit} until ${new Date(o.expiresAt).toISOString()}${o.reason ? ` (${o.reason}, by ${o.by})` : ''}`,
          )
          .join('\n')
      }
      case 'set': {
        const [policy, key, limit] = rest
        if (!policy || !key || !limit || !values.ttl) throw new UsageError(USAGE)
        const set = await overrides.set(policy, key, { limit: Number(limit), ttl: values.ttl, ...note })
        return `set: ${set.policy} ${set.key} limit ${set.limit} until ${new Date(set.expiresAt).toISOString()}`
      }
      case 'remove': {
        const [policy, key] = rest
        if (!policy || !key) throw new UsageError(USAGE)
        return (await overrides.remove(policy, key, note))
          ? `removed: ${policy} ${key}`
          : `no override of ${policy} ${key}`
      }
      case 'history': {
        const changes = await overrides.history(values.count ? Number(values.count) : 20)
        return changes
          .map(
            (c) =>
              `${new Date(c.at).toISOString()} ${c.action} ${c.policy} ${c.key}${c.limit === null ? '' : ` limit ${c.limit} for ${c.ttlMs} ms`}${c.reason ? ` (${c.reason})` : ''}${c.by ? ` by ${c.by}` : ''}`,
          )
          .join('\n')
      }
      default:
        throw new UsageError(USAGE)
    }
  } finally {
    await app.close()
    redis.disconnect()
    await database.close()
  }
}

class UsageError extends Error {}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  runLimits(process.argv.slice(2)).then(
    (text) => console.log(text),
    (err: Error) => {
      console.error(err instanceof UsageError ? err.message : `limits: ${err.message}`)
      process.exitCode = 1
    },
  )
}

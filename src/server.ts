import { buildApp } from './app.ts'
import { ConfigError, loadConfig } from './config.ts'
import { HOW_TO_GET_REDIS, resolveDevRedis } from './embedded/redis-server.ts'
import { seedDemo } from './ledger/seed.ts'
import { startTracing } from './otel-export.ts'
import { handleShutdownSignals } from './shutdown.ts'

// Run in reverse order of start on shutdown or a failed boot (the app before the Redis it uses).
const stops: Array<() => Promise<void>> = []
const stopAll = async () => {
  for (const stop of stops.reverse()) await stop().catch((err) => console.error('shutdown step failed', err))
}

async function main() {
  // Before the app is built, so @fastify/otel instruments it; first in, so flushed after the app closed.
  const stopTracing = await startTracing()
  if (stopTracing) stops.push(stopTracing)
  const config = loadConfig()

  // Embedded default: no REDIS_URL and nothing on the standard port means a private redis-server.
  if (!config.redis.clusterNodes) {
    const redis = await resolveDevRedis(config.redis.url)
    config.redis.url = redis.url
    if (redis.spawned) {
      stops.push(redis.spawned.stop)
      console.error(`Started redis-server on ${redis.url} (no persistence; stopped on exit)`)
    }
  }

  const app = await buildApp(config)
  stops.push(() => app.close())
  if (config.seedDemo) await seedDemo(app.db)
  if (!config.databaseUrl) app.log.info('DATABASE_URL is unset: using embedded PGlite (in memory)')

  handleShutdownSignals(app, { ...config.shutdown, stop: stopAll })

  await app.listen({ port: config.port, host: config.host })
}

main().catch(async (err: Error) => {
  console.error(err instanceof ConfigError || err.message === HOW_TO_GET_REDIS ? err.message : err)
  await stopAll()
  process.exit(1)
})

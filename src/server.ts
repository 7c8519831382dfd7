import { buildApp } from './app.ts'
import { ConfigError, loadConfig } from './config.ts'
import { HOW_TO_GET_REDIS, redisAnswers, startRedisServer } from './embedded/redis-server.ts'
import { seedDemo } from './ledger/ledger.ts'

async function main() {
  const config = loadConfig()
  const stops: Array<() => Promise<void>> = []

  // Embedded default: no REDIS_URL and nothing on the standard port means a private redis-server.
  if (!config.redis.url && !config.redis.clusterNodes) {
    if (await redisAnswers('127.0.0.1', 6379)) config.redis.url = 'redis://127.0.0.1:6379'
    else {
      const server = await startRedisServer()
      config.redis.url = server.url
      stops.push(server.stop)
      console.error(`Started redis-server on ${server.url} (no persistence; stopped on exit)`)
    }
  }

  const app = await buildApp(config)
  stops.unshift(() => app.close())
  if (config.seedDemo) await seedDemo(app.db)
  if (!config.databaseUrl) app.log.info('DATABASE_URL is unset: using embedded PGlite (in memory)')

  let stopping = false
  const shutdown = async (signal: string) => {
    if (stopping) return
    stopping = true
    app.log.info({ signal }, 'shutting down')
    for (const stop of stops) await stop().catch((err) => app.log.error({ err }, 'shutdown step failed'))
    process.exit(0)
  }
  process.on('SIGINT', shutdown)
  process.on('SIGTERM', shutdown)

  await app.listen({ port: config.port, host: config.host })
}

main().catch((err: Error) => {
  if (err instanceof ConfigError || err.message === HOW_TO_GET_REDIS) console.error(err.message)
  else console.error(err)
  process.exit(1)
})

// A gateway process for test/demo/shutdown.test.ts: the demo app as server.ts builds it, with the event
// workers and the scheduler on and their timings from TEST_SCHEDULER / TEST_EVENT_CONSUMER, and
// server.ts's shutdown on SIGTERM (src/shutdown.ts: drain, grace period, workers stopped, exit 0).
import { buildApp } from '../../src/app.ts'
import { loadConfig } from '../../src/config.ts'
import { createPgDatabase } from '../../src/db/database.ts'
import { handleShutdownSignals } from '../../src/shutdown.ts'

const config = loadConfig(process.env)
const database = createPgDatabase({ connectionString: config.databaseUrl!, max: 10 })
const app = await buildApp(config, {
  database,
  keyPrefix: process.env.TEST_KEY_PREFIX,
  eventWorkers: 'on',
  eventConsumer: JSON.parse(process.env.TEST_EVENT_CONSUMER ?? '{}'),
  scheduler: { instanceId: `gw-${process.pid}`, ...JSON.parse(process.env.TEST_SCHEDULER ?? '{}') },
})
handleShutdownSignals(app, {
  ...config.shutdown,
  async stop() {
    await app.close()
    await database.close()
  },
})
const url = await app.listen({ port: 0, host: '127.0.0.1' })
process.stdout.write(`READY ${url}\n`)

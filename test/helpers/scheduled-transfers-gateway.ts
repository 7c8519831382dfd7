// A gateway process for test/demo/scheduled-transfers-processes.test.ts: the demo app as server.ts builds
// it, with the scheduler on and its timings (and this process's instance id) from TEST_SCHEDULER.
import { buildApp } from '../../src/app.ts'
import { loadConfig } from '../../src/config.ts'
import { createPgDatabase } from '../../src/db/database.ts'

const config = loadConfig(process.env)
const database = createPgDatabase({ connectionString: config.databaseUrl!, max: 10 })
const app = await buildApp(config, {
  database,
  keyPrefix: process.env.TEST_KEY_PREFIX,
  scheduler: { instanceId: `gw-${process.pid}`, ...JSON.parse(process.env.TEST_SCHEDULER ?? '{}') },
})
const url = await app.listen({ port: 0, host: '127.0.0.1' })
process.stdout.write(`READY ${url}\n`)
process.on('SIGTERM', async () => {
  await app.close()
  await database.close()
  process.exit(0)
})

// The demo gateway as a benchmark target: configured by the same environment variables as
// `npm start`, seeded, listening on a free port, announcing `LISTENING <url>` for the runner.
import { buildApp } from '../../src/app.ts'
import { loadConfig } from '../../src/config.ts'
import { seedDemo } from '../../src/ledger/seed.ts'

const app = await buildApp(loadConfig({ ...process.env, PORT: '0' }))
await seedDemo(app.db)
const url = await app.listen({ port: 0, host: '127.0.0.1' })
process.on('SIGTERM', () => app.close().then(() => process.exit(0)))
console.log(`LISTENING ${url}`)

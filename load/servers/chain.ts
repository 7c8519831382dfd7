// The demo gateway with its whole chain (rate limit, session, cache, idempotency), configured by the
// environment like `npm start`, plus GET /__bench/counters: the database statement and transaction
// counts, so a scenario can report Postgres work per request. Seeds the demo customers.
import { buildApp } from '../../src/app.ts'
import { loadConfig } from '../../src/config.ts'
import { seedDemo } from '../../src/ledger/ledger.ts'

const app = await buildApp(loadConfig({ ...process.env, PORT: '0' }))
let transactions = 0
app.db.observe?.({ transaction: () => void transactions++ })
app.get('/__bench/counters', { schema: { hide: true } }, async () => ({
  dbQueries: app.db.queryCount,
  dbTransactions: transactions,
}))
await seedDemo(app.db)
const url = await app.listen({ port: 0, host: '127.0.0.1' })
process.on('SIGTERM', () => app.close().then(() => process.exit(0)))
console.log(`LISTENING ${url}`)

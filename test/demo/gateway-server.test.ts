import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { after, test } from 'node:test'
import { Redis } from 'ioredis'
import { freePort, HOW_TO_GET_REDIS, resolveDevRedis } from '../../src/embedded/redis-server.ts'
import { startDemoProcess } from '../helpers/demo-process.ts'

const children: Array<{ kill(): void }> = []
after(() => {
  for (const child of children) child.kill()
})

/** Runs `src/server.ts` like `npm start` does; killed when the tests end. */
function startServer(env: Record<string, string>) {
  const server = startDemoProcess(env)
  children.push(server.child)
  return server
}

test('npm start without DATABASE_URL serves the contract on embedded PGlite, seeded', async () => {
  const port = await freePort()
  const server = startServer({ PORT: String(port), REDIS_URL: 'redis://127.0.0.1:6379' })
  const url = await server.listening
  assert.match(server.output(), /embedded PGlite/)
  const login = await fetch(`${url}/session`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ username: 'alice', password: 'demo-password' }),
  })
  assert.equal(login.status, 200)
  const cookie = login.headers.get('set-cookie')!.split(';')[0]!
  const accounts = (await (await fetch(`${url}/accounts`, { headers: { cookie } })).json()) as {
    accounts: Array<{ accountId: number; balance: number; currency: string }>
  }
  assert.deepEqual(
    accounts.accounts.map((a) => [a.currency, a.balance]),
    [['VND', 100_000_000]],
  )
  const transfer = await fetch(`${url}/transfers`, {
    method: 'POST',
    // A new key per run: the shared Redis keeps a completed key's response for 24 h, and this run's
    // fresh PGlite would otherwise get the previous run's transfer replayed instead of a new one.
    headers: { cookie, 'content-type': 'application/json', 'idempotency-key': `readme-${randomUUID()}` },
    body: JSON.stringify({
      fromAccountId: accounts.accounts[0]!.accountId,
      toAccountId: 2,
      amount: 5000,
      currency: 'VND',
    }),
  })
  assert.equal(transfer.status, 201)
  const balance = (await (
    await fetch(`${url}/accounts/${accounts.accounts[0]!.accountId}/balance`, { headers: { cookie } })
  ).json()) as {
    balance: number
  }
  assert.equal(balance.balance, 100_000_000 - 5000)
  assert.equal((await fetch(`${url}/ready`)).status, 200)
  // Sessions live in Redis: remove this one so the shared test Redis keeps nothing of ours.
  await fetch(`${url}/session`, { method: 'DELETE', headers: { cookie } })
  server.child.kill('SIGTERM')
  assert.equal(await server.exited, 0, 'graceful shutdown exits 0')
})

test('a bad variable stops the boot with a message naming it and a non-zero exit', async () => {
  const server = startServer({ RATE_LIMIT_TRANSFERS: 'lots' })
  assert.equal(await server.exited, 1)
  assert.match(server.output(), /Invalid environment variable RATE_LIMIT_TRANSFERS/)
})

test('with nothing on the probed port a private redis-server is started, and stopped', async () => {
  const port = await freePort()
  const { url, spawned } = await resolveDevRedis(undefined, { host: '127.0.0.1', port })
  assert.ok(spawned, 'a redis-server was started')
  const client = new Redis(url)
  assert.equal(await client.ping(), 'PONG')
  assert.deepEqual(await client.config('GET', 'save'), ['save', ''], 'persistence off')
  client.disconnect()
  await spawned.stop()
  assert.equal((await resolveDevRedis('redis://example:1')).url, 'redis://example:1', 'an explicit URL wins')
})

test('without redis-server on PATH the error says how to get Redis', async () => {
  const port = await freePort()
  await assert.rejects(
    resolveDevRedis(undefined, { host: '127.0.0.1', port }, 'redis-server-not-installed'),
    {
      message: HOW_TO_GET_REDIS,
    },
  )
})

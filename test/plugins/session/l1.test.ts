import assert from 'node:assert/strict'
import { after, before, describe, test } from 'node:test'
import Fastify, { type FastifyInstance, type LightMyRequestResponse } from 'fastify'
import metricsPlugin from '../../../src/plugins/metrics/index.ts'
import { connectRedis, createRedisClient, type RedisClient } from '../../../src/plugins/redis/index.ts'
import sessionPlugin, { type SessionValue, sessionHandle } from '../../../src/plugins/session/index.ts'
import {
  scanKeys,
  startTcpProxy,
  TEST_REDIS_URL,
  TEST_SECRET,
  testRedisConnection,
  uniquePrefix,
} from '../../helpers/index.ts'
import { delta, scrape } from '../../helpers/metrics-scrape.ts'

// Three instances of a gateway (three apps in this process, each with its own client and its own
// L1), one key prefix. A session loaded on an instance is answered from its L1 with no command; a
// change or an end on one instance reaches the others' L1 through the invalidation channel: once
// it has arrived (`l1.settled()`: a PING on each subscriber, answered after the messages queued
// before it) they refuse or reread the session. While an instance's subscriber is down, it reads
// from Redis, so a revoked session is refused at once.

const keyPrefix = uniquePrefix('sessl1')
let admin: RedisClient

interface Instance {
  app: FastifyInstance
  client: RedisClient
  /** Commands this instance's client sent while `counting` was on. */
  sent: string[]
  counting: boolean
}

let instances: Instance[] = []

async function startInstance(
  connection: { url?: string } = testRedisConnection(),
  l1: { ttlMs: number } | true = true,
): Promise<Instance> {
  const client = createRedisClient(connection)
  await connectRedis(client)
  const instance: Instance = { app: Fastify(), client, sent: [], counting: false }
  const original = client.sendCommand.bind(client) as (
    command: { name: string },
    ...rest: unknown[]
  ) => unknown
  ;(client as unknown as { sendCommand: typeof original }).sendCommand = (command, ...rest) => {
    if (instance.counting) instance.sent.push(command.name)
    return original(command, ...rest)
  }
  const { app } = instance
  await app.register(sessionPlugin, { redis: client, secrets: [TEST_SECRET], keyPrefix, l1 })
  await app.register(metricsPlugin, { processMetrics: false })
  app.post<{ Body: { user: string; data?: Record<string, SessionValue> } }>(
    '/login',
    async (request, reply) => {
      await reply.regenerateSession(request.body.user, request.body.data)
      return { ok: true }
    },
  )
  app.post('/logout', async (_request, reply) => {
    await reply.destroySession()
    return reply.code(204).send()
  })
  app.post('/logout-everywhere', { config: { session: 'required' } }, async (request) => ({
    ended: await app.sessions.destroyAll(request.session!.principal),
  }))
  app.delete<{ Params: { handle: string } }>(
    '/devices/:handle',
    { config: { session: 'required' } },
    async (request) => ({
      ended: await app.sessions.destroySession(request.session!.principal, request.params.handle),
    }),
  )
  app.put<{ Body: { value: SessionValue } }>(
    '/theme',
    { config: { session: 'required' } },
    async (request) => {
      request.session!.set('theme', request.body.value)
      return { ok: true }
    },
  )
  app.get('/me', { config: { session: 'required' } }, async (request) => ({
    principal: request.session!.principal,
    theme: request.session!.get('theme') ?? null,
    decision: request.sessionDecision,
  }))
  await app.ready()
  return instance
}

before(async () => {
  admin = createRedisClient(testRedisConnection())
  await connectRedis(admin)
  instances = await Promise.all([startInstance(), startInstance(), startInstance()])
})
after(async () => {
  for (const { app, client } of instances) {
    await app.close()
    await client.quit()
  }
  const keys = await scanKeys(admin, keyPrefix)
  if (keys.length) await admin.del(...keys)
  await admin.quit()
})

type Cookie = string
const cookieOf = (res: LightMyRequestResponse): Cookie => {
  const sid = res.cookies.find((c) => c.name === 'sid')
  assert.ok(sid, 'a session cookie')
  return `sid=${sid.value}`
}
const idOf = (cookie: Cookie) => cookie.slice('sid='.length).split('.')[0]!

async function login(on: Instance, user = 'alice'): Promise<Cookie> {
  const res = await on.app.inject({ method: 'POST', url: '/login', payload: { user } })
  assert.equal(res.statusCode, 200, res.body)
  return cookieOf(res)
}

const me = (on: Instance, cookie: Cookie) => on.app.inject({ url: '/me', headers: { cookie } })

/** The commands `on`'s client sends while `run` runs. */
async function commandsOf(on: Instance, run: () => Promise<unknown>): Promise<string[]> {
  on.sent = []
  on.counting = true
  try {
    await run()
  } finally {
    on.counting = false
  }
  return on.sent
}

/** Loads the session on `on` twice: the second load is answered from its L1. */
async function warm(on: Instance, cookie: Cookie): Promise<void> {
  assert.equal((await me(on, cookie)).statusCode, 200)
  assert.ok(on.app.sessions.l1!.holds(idOf(cookie)), 'the L1 holds the session after a load')
}

/** Waits until every instance has applied the invalidations published so far. */
const settled = () => Promise.all(instances.map(({ app }) => app.sessions.l1!.settled()))

/** Waits for `condition`, checking every 5 ms, failing after 5 s (an upper bound, not a timing assertion). */
async function until(condition: () => boolean, what: string): Promise<void> {
  for (let waited = 0; !condition(); waited += 5) {
    if (waited > 5000) assert.fail(`still waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
}

describe('the L1', () => {
  test('a session loaded on an instance is answered from its L1 without any Redis command', async () => {
    const [a, b] = instances as [Instance, Instance]
    // Registration waited for each L1's subscription: ready means it serves.
    assert.deepEqual(
      instances.map(({ app }) => app.sessions.l1!.subscribed),
      [true, true, true],
    )
    const cookie = await login(a)
    // B has never seen it: it reads the hash and slides the idle expiry, and keeps it.
    const first = await commandsOf(b, () => me(b, cookie))
    assert.deepEqual(first.sort(), ['hgetall', 'pexpire'])
    let res: LightMyRequestResponse | undefined
    const second = await commandsOf(b, async () => {
      res = await me(b, cookie)
    })
    assert.deepEqual(second, [], 'no command for an L1 hit')
    assert.equal(res!.statusCode, 200)
    assert.deepEqual(res!.json(), { principal: 'alice', theme: null, decision: 'found' })
  })

  test('a field set on one instance is read, new, on the others once the invalidation arrived', async () => {
    const [a, b, c] = instances as [Instance, Instance, Instance]
    const cookie = await login(a)
    await warm(b, cookie)
    await warm(c, cookie)
    const res = await a.app.inject({
      method: 'PUT',
      url: '/theme',
      headers: { cookie },
      payload: { value: 'dark' },
    })
    assert.equal(res.statusCode, 200)
    await settled()
    for (const on of [b, c]) {
      assert.equal(on.app.sessions.l1!.holds(idOf(cookie)), false, 'dropped from every L1')
      assert.equal((await me(on, cookie)).json().theme, 'dark')
    }
  })

  const revocations: Array<[string, (on: Instance, cookie: Cookie) => Promise<unknown>]> = [
    ['logout', (on, cookie) => on.app.inject({ method: 'POST', url: '/logout', headers: { cookie } })],
    [
      'log out everywhere',
      (on, cookie) => on.app.inject({ method: 'POST', url: '/logout-everywhere', headers: { cookie } }),
    ],
    [
      'a new login on the device',
      (on, cookie) =>
        on.app.inject({ method: 'POST', url: '/login', headers: { cookie }, payload: { user: 'alice' } }),
    ],
    [
      'ending the device by its handle',
      async (on, cookie) => {
        const other = await login(on)
        const res = await on.app.inject({
          method: 'DELETE',
          url: `/devices/${sessionHandle(idOf(cookie))}`,
          headers: { cookie: other },
        })
        assert.deepEqual(res.json(), { ended: true })
      },
    ],
  ]
  for (const [name, revoke] of revocations)
    test(`${name} on one instance: the others refuse the session once the invalidation arrived`, async () => {
      const [a, b, c] = instances as [Instance, Instance, Instance]
      const cookie = await login(a)
      for (const on of instances) await warm(on, cookie)
      await revoke(a, cookie)
      assert.equal((await me(a, cookie)).statusCode, 401, 'refused at once where it was revoked')
      await settled()
      for (const on of [b, c]) {
        assert.equal(on.app.sessions.l1!.holds(idOf(cookie)), false)
        assert.equal((await me(on, cookie)).statusCode, 401)
      }
    })

  test('session_l1_lookups_total counts hits and misses, session_l1_invalidations_total the ids received', async () => {
    const [a, b] = instances as [Instance, Instance]
    const before = await scrape(b.app)
    const cookie = await login(a)
    await me(b, cookie)
    const res = await me(b, cookie)
    assert.equal(res.json().decision, 'found')
    await a.app.inject({ method: 'POST', url: '/logout', headers: { cookie } })
    await settled()
    const moved = delta(before, await scrape(b.app))
    assert.equal(moved('session_l1_lookups_total', { result: 'miss' }), 1)
    assert.equal(moved('session_l1_lookups_total', { result: 'hit' }), 1)
    // The login (regenerateSession destroys no presented session) published nothing; the logout one id.
    assert.equal(moved('session_l1_invalidations_total'), 1)
    assert.equal(moved('session_decisions_total', { decision: 'found' }), 1)
    assert.equal(moved('session_decisions_total', { decision: 'slid' }), 1)
  })

  test('a store of its own (no L1) publishes its changes too', async () => {
    const [a, b] = instances as [Instance, Instance]
    const cookie = await login(a)
    await warm(b, cookie)
    const { SessionStore } = await import('../../../src/plugins/session/index.ts')
    const store = new SessionStore(admin, { keyPrefix })
    assert.equal(store.l1, null)
    await store.destroyAll('alice')
    await settled()
    assert.equal((await me(b, cookie)).statusCode, 401)
  })
})

describe('while the invalidation channel is down', () => {
  /** The CLIENT IDs of the instances' subscriber connections. */
  async function subscriberIds(): Promise<string[]> {
    const list = (await admin.call('CLIENT', 'LIST', 'TYPE', 'pubsub')) as string
    const name = `${keyPrefix}session-l1`
    return list
      .split('\n')
      .filter((line) => line.includes(` name=${name} `))
      .map((line) => /(?:^| )id=(\d+)/.exec(line)![1]!)
  }

  test('killed subscribers: a session revoked meanwhile is refused at once, and the L1 serves again once resubscribed', async () => {
    const [a, b, c] = instances as [Instance, Instance, Instance]
    const cookie = await login(a)
    for (const on of instances) await warm(on, cookie)
    const ids = await subscriberIds()
    assert.equal(ids.length, 3, 'one subscriber per instance')
    const dropped = instances.map(
      ({ app }) => new Promise((resolve) => app.sessions.l1!.connection.once('close', resolve)),
    )
    // Only this suite's connections: others may be using the shared Redis.
    for (const id of ids) await admin.call('CLIENT', 'KILL', 'ID', id)
    await Promise.all(dropped)
    // The message of this logout reaches nobody (or an instance already subscribed again, whose
    // L1 was cleared): every instance reads the session from Redis.
    await a.app.inject({ method: 'POST', url: '/logout', headers: { cookie } })
    for (const on of [b, c]) assert.equal((await me(on, cookie)).statusCode, 401, 'refused at once')
    await Promise.all(instances.map(({ app }) => app.sessions.l1!.whenSubscribed()))
    const again = await login(a)
    await warm(b, again)
    assert.deepEqual(await commandsOf(b, () => me(b, again)), [], 'the L1 serves again')
  })

  test('a subscriber gone silent (no FIN): within two heartbeats the session is read from Redis, never served stale', async (t) => {
    // An instance whose connections pass through a proxy the test freezes: they stay open and
    // nothing passes, as when a network or a host goes away without closing anything. Its L1 keeps
    // a session for a minute by its TTL: only the heartbeat can take it out of service sooner.
    const url = new URL(TEST_REDIS_URL)
    const proxy = await startTcpProxy(Number(url.port || 6379), url.hostname)
    const silent = await startInstance({ url: `redis://127.0.0.1:${proxy.port}` }, { ttlMs: 60_000 })
    t.after(async () => {
      proxy.thaw()
      await silent.app.close()
      silent.client.disconnect()
      await proxy.close()
    })
    const [a] = instances as [Instance]
    const cookie = await login(a)
    await warm(silent, cookie)
    proxy.freeze()
    await a.app.inject({ method: 'POST', url: '/logout', headers: { cookie } })
    // Its heartbeat PING goes unanswered for an interval (1 s): the L1 is bypassed, the load waits
    // on Redis and gives up (503). Waited for well within the L1's TTL.
    let status = 200
    for (const deadline = Date.now() + 20_000; status === 200 && Date.now() < deadline; ) {
      status = (await me(silent, cookie)).statusCode
      if (status === 200) await new Promise((resolve) => setTimeout(resolve, 100))
    }
    assert.equal(status, 503, 'the revoked session was served from the L1 of a silent subscriber')
    // The network comes back: the revoked session is refused.
    proxy.thaw()
    await until(() => silent.app.sessions.l1!.subscribed, 'the heartbeat to be answered')
    assert.equal((await me(silent, cookie)).statusCode, 401)
  })

  test('a disconnected subscriber: every load reads Redis until it is subscribed again', async () => {
    const [a, b] = instances as [Instance, Instance]
    const cookie = await login(a)
    await warm(b, cookie)
    const l1 = b.app.sessions.l1!
    l1.connection.disconnect()
    await until(() => !l1.subscribed, 'the subscriber to be down')
    assert.equal(l1.size, 0, 'cleared when the channel went down')
    assert.ok((await commandsOf(b, () => me(b, cookie))).includes('hgetall'), 'read from Redis')
    assert.ok((await commandsOf(b, () => me(b, cookie))).includes('hgetall'), 'and again: nothing kept')
    await a.app.inject({ method: 'POST', url: '/logout', headers: { cookie } })
    assert.equal((await me(b, cookie)).statusCode, 401, 'a revoked session is refused at once')
    await l1.connection.connect()
    await l1.whenSubscribed()
    const again = await login(a)
    await warm(b, again)
    assert.deepEqual(await commandsOf(b, () => me(b, again)), [], 'the L1 serves again')
  })
})

describe('the L1 of a store, on its own clock', () => {
  /** A store with an L1 on instance A's client (its commands counted), its clock moved by hand. */
  async function clockedStore(l1: { maxEntries: number; ttlMs: number }, touchAfterMs: number) {
    const clock = { now: 5_000_000 }
    const { SessionStore } = await import('../../../src/plugins/session/index.ts')
    const store = new SessionStore(instances[0]!.client, {
      keyPrefix,
      idleTimeoutMs: 30_000,
      touchAfterMs,
      now: () => clock.now,
      l1,
    })
    await store.l1!.whenSubscribed()
    return { store, clock }
  }

  test('a hit slides the idle expiry when due with a PEXPIRE alone, which also finds a session gone', async () => {
    const a = instances[0]!
    const { store, clock } = await clockedStore({ maxEntries: 10, ttlMs: 5000 }, 1000)
    try {
      const { id } = await store.create('zoe')
      const key = store.sessionKey(id)
      clock.now += 10
      const decide = async () => (await store.loadPresented(id)).decision
      assert.deepEqual(await commandsOf(a, decide), ['hgetall'], 'a miss: read, not slid (created just now)')
      clock.now += 10
      assert.deepEqual(await commandsOf(a, decide), [], 'a hit')
      assert.equal(await decide(), 'found')
      clock.now += 1000
      let decision = ''
      assert.deepEqual(await commandsOf(a, async () => (decision = await decide())), ['pexpire'])
      assert.equal(decision, 'slid')
      assert.ok((await admin.pttl(key)) > 29_000, 'slid by the idle timeout')
      // Deleted by hand: nothing published, so the L1 answers until its ttl or the next slide.
      await admin.del(key)
      clock.now += 10
      assert.equal(await decide(), 'found')
      clock.now += 1000
      assert.deepEqual(await commandsOf(a, async () => (decision = await decide())), ['pexpire'])
      assert.equal(decision, 'ended', 'the slide found no key')
      assert.equal(store.l1!.holds(id), false)
    } finally {
      store.close()
    }
  })

  test('an entry serves for ttlMs after its load, and maxEntries bounds the L1 (the oldest load goes)', async () => {
    const a = instances[0]!
    const { store, clock } = await clockedStore({ maxEntries: 2, ttlMs: 5000 }, 20_000)
    try {
      const sessions = [await store.create('yan'), await store.create('yan'), await store.create('yan')]
      await store.load(sessions[0]!.id)
      clock.now += 4999
      assert.deepEqual(await commandsOf(a, () => store.load(sessions[0]!.id)), [], 'within ttlMs: a hit')
      clock.now += 1
      assert.deepEqual(
        await commandsOf(a, () => store.load(sessions[0]!.id)),
        ['hgetall'],
        'ttlMs after: read',
      )
      await store.load(sessions[1]!.id)
      await store.load(sessions[2]!.id)
      assert.equal(store.l1!.size, 2)
      assert.equal(store.l1!.holds(sessions[0]!.id), false, 'the oldest load evicted')
      assert.ok(store.l1!.holds(sessions[2]!.id))
    } finally {
      store.close()
    }
  })
})

import assert from 'node:assert/strict'
import { test } from 'node:test'
import {
  GatewayError,
  InvalidOptionError,
  PROBLEM_CODES,
  RedisConnectionError,
  RouteNotProtectedError,
  UnknownOptionError,
} from '../../src/plugins/common/errors.ts'
import { HttpProblem } from '../../src/plugins/common/problem.ts'

// The library's errors and problems as a caller sees them: a class to test, a stable code, and the
// problem body a plugin sends.

test("errors carry their class's name and a stable code, and keep a cause", () => {
  const cause = new Error('ECONNREFUSED')
  const unreachable = new RedisConnectionError('redis: cannot connect', '127.0.0.1:1', { cause })
  assert.ok(unreachable instanceof GatewayError)
  assert.equal(unreachable.name, 'RedisConnectionError')
  assert.equal(unreachable.code, 'FRG_REDIS_UNREACHABLE')
  assert.equal(unreachable.address, '127.0.0.1:1')
  assert.equal(unreachable.cause, cause)
  const unknown = new UnknownOptionError('x: unknown option `y`', 'y', ['z'])
  assert.ok(unknown instanceof InvalidOptionError)
  assert.equal(unknown.name, 'UnknownOptionError')
  assert.equal(unknown.code, 'FRG_UNKNOWN_OPTION')
  const route = new RouteNotProtectedError('no plugin', 'POST', '/x')
  assert.deepEqual([route.code, route.method, route.url], ['FRG_ROUTE_NOT_PROTECTED', 'POST', '/x'])
})

test("a plugin's problem body carries its code; an app's own problem has none", () => {
  const limited = new HttpProblem(429, 'rate-limited', 'Too Many Requests', 'Try again in 3 s', {
    headers: { 'retry-after': '3' },
    extra: { policy: 'api' },
  })
  assert.equal(limited.message, 'Try again in 3 s')
  assert.deepEqual(limited.headers, { 'retry-after': '3' })
  assert.deepEqual(limited.toJSON(), {
    type: '/problems/rate-limited',
    title: 'Too Many Requests',
    status: 429,
    detail: 'Try again in 3 s',
    code: 'FRG_RATE_LIMITED',
    policy: 'api',
  })
  const own = new HttpProblem(404, 'account-not-found', 'Not Found', 'No such account')
  assert.equal(own.code, undefined)
  assert.deepEqual(own.toJSON(), {
    type: '/problems/account-not-found',
    title: 'Not Found',
    status: 404,
    detail: 'No such account',
  })
  assert.deepEqual(own.headers, {})
})

test('every problem code is FRG_ and upper case, one per slug', () => {
  const codes = Object.values(PROBLEM_CODES)
  for (const code of codes) assert.match(code, /^FRG_[A-Z_]+$/)
  assert.equal(new Set(codes).size, codes.length)
})

import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { durationOption, parseDuration } from '../../src/plugins/rate-limit/duration.ts'

// Durations as the rate-limit options take them ('10s', '1 minute', milliseconds) and as the
// gateway's environment variables write them ('30m', '8h').

describe('parseDuration (plugin options)', () => {
  test('a number is milliseconds as it is', () => {
    assert.equal(parseDuration(1500), 1500)
    assert.equal(parseDuration(0), 0)
    assert.equal(parseDuration(-1), -1)
  })

  test('every unit, short and long, in any case, with or without a space', () => {
    const cases: Array<[string, number]> = [
      ['500ms', 500],
      ['2 msecs', 2],
      ['3 milliseconds', 3],
      ['10s', 10_000],
      ['1 sec', 1000],
      ['2 Seconds', 2000],
      ['1m', 60_000],
      ['1 minute', 60_000],
      ['5 mins', 300_000],
      ['2h', 7_200_000],
      ['1 HR', 3_600_000],
      ['3 hours', 10_800_000],
      ['1d', 86_400_000],
      ['2 days', 172_800_000],
      ['  7s  ', 7000],
    ]
    for (const [text, ms] of cases) assert.equal(parseDuration(text), ms, text)
  })

  test('a decimal is exact once float noise is rounded off, and may leave a fraction of a millisecond', () => {
    assert.equal(parseDuration('1.5s'), 1500)
    assert.equal(parseDuration('0.1s'), 100)
    assert.equal(parseDuration('1.5 days'), 129_600_000)
    assert.equal(parseDuration('0.5ms'), 0.5)
  })

  test('anything else is not a duration', () => {
    for (const value of [
      '10',
      's',
      '10 parsecs',
      '-1s',
      '1e3ms',
      '10 s s',
      '',
      null,
      undefined,
      {},
      [1000],
      10n,
    ])
      assert.equal(parseDuration(value), undefined, String(value))
  })
})

describe('durationOption (an option checked at registration)', () => {
  const fail = (message: string): never => {
    throw new Error(message)
  }

  test('returns the whole number of milliseconds of a number or a string', () => {
    assert.equal(durationOption('windowMs', 60_000, 1, fail), 60_000)
    assert.equal(durationOption('windowMs', '1 minute', 1, fail), 60_000)
    assert.equal(durationOption('maxDelayMs', 0, 0, fail), 0)
  })

  test('a string that is not a duration says so and gives examples', () => {
    assert.throws(
      () => durationOption('windowMs', '10 parsecs', 1, fail),
      /^Error: `windowMs`: '10 parsecs' is not a duration \(milliseconds, or a number and a unit: '500ms', '10s', '1 minute', '2h'\)$/,
    )
  })

  test('below the minimum, fractional or not a number: what is expected, and the string given', () => {
    assert.throws(
      () => durationOption('blockMs', 0, 1, fail),
      /^Error: `blockMs` must be a positive whole number/,
    )
    assert.throws(
      () => durationOption('maxDelayMs', -1, 0, fail),
      /`maxDelayMs` must be a non-negative whole number/,
    )
    assert.throws(() => durationOption('blockMs', 1.5, 1, fail), /`blockMs` must be a positive whole number/)
    assert.throws(() => durationOption('blockMs', '0.5ms', 1, fail), /\(got '0\.5ms'\)$/)
    assert.throws(() => durationOption('blockMs', true, 1, fail), /or a duration string such as '500ms'/)
  })

  test('an option that may also be a function says so', () => {
    assert.throws(
      () => durationOption('windowMs', 0, 1, fail, true),
      /milliseconds, a duration string such as .*, or a function of the request$/,
    )
  })
})

/** A duration: milliseconds, or a string with a unit such as '500ms', '10s', '1 minute', '2h', '1.5 days'. */
export type Duration = number | string

const UNITS: Record<string, number> = {
  ms: 1,
  msec: 1,
  msecs: 1,
  millisecond: 1,
  milliseconds: 1,
  s: 1000,
  sec: 1000,
  secs: 1000,
  second: 1000,
  seconds: 1000,
  m: 60_000,
  min: 60_000,
  mins: 60_000,
  minute: 60_000,
  minutes: 60_000,
  h: 3_600_000,
  hr: 3_600_000,
  hrs: 3_600_000,
  hour: 3_600_000,
  hours: 3_600_000,
  d: 86_400_000,
  day: 86_400_000,
  days: 86_400_000,
}

const FORMAT = /^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$/i

export const DURATION_EXAMPLES = "'500ms', '10s', '1 minute', '2h'"

/**
 * Milliseconds of a duration, or undefined when it is not one: a number is taken as milliseconds,
 * a string needs a number and a unit (ms, s, m, h, d and their long forms). The result may be any
 * number; callers check its range (a whole, positive number of milliseconds, usually).
 */
export function parseDuration(value: unknown): number | undefined {
  if (typeof value === 'number') return value
  if (typeof value !== 'string') return undefined
  const match = FORMAT.exec(value)
  if (!match) return undefined
  const unit = UNITS[match[2]!.toLowerCase()]
  if (unit === undefined) return undefined
  // Decimal digits times a whole factor: 1.5s is 1500 exactly once rounded off float noise.
  const ms = Number(match[1]) * unit
  return Math.abs(ms - Math.round(ms)) < 1e-6 ? Math.round(ms) : ms
}

/**
 * A duration option checked at registration: milliseconds (a whole number, at least `min`) or a
 * duration string. `fail` receives the message (without the plugin/policy prefix).
 */
export function durationOption(
  option: string,
  value: unknown,
  min: 0 | 1,
  fail: (message: string) => never,
  orFunction = false,
): number {
  const ms = parseDuration(value)
  const kind = min === 0 ? 'non-negative' : 'positive'
  if (typeof value === 'string' && ms === undefined)
    fail(
      `\`${option}\`: '${value}' is not a duration (milliseconds, or a number and a unit: ${DURATION_EXAMPLES})`,
    )
  if (ms === undefined || !Number.isSafeInteger(ms) || ms < min)
    fail(
      `\`${option}\` must be a ${kind} whole number of milliseconds${orFunction ? ',' : ' or'} a duration string such as ${DURATION_EXAMPLES}` +
        (orFunction ? ', or a function of the request' : '') +
        (typeof value === 'string' ? ` (got '${value}')` : ''),
    )
  return ms!
}

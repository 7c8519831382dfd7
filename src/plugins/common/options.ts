import type { AnyRedisClient, RedisClient } from '../../redis/client.ts'
import { checkRedisOption, describeValue } from '../../redis/client.ts'
import { InvalidOptionError, UnknownOptionError } from './errors.ts'
import { closest } from './spelling.ts'

// One option checker for every plugin and primitive: a wrong value and an unknown key both fail at
// registration (or at the call that took them), naming the owner, the option and what is expected.
// An unknown key is never ignored: a misspelt `algoritm:` or another library's `max:` would
// otherwise switch a guarantee off in silence.
//
// A plugin declares its options once, and everything else comes from that declaration:
//
//   export const CACHE_OPTIONS = declareOptions('cache plugin', {
//     ttlMs: option.integer({ min: 1, default: 60_000, doc: 'fresh lifetime of an entry' }),
//     onLoadError: option.oneOf(['serve-stale', 'fail'] as const, { default: 'serve-stale', doc: '...' }),
//     redis: option.redisClient({ default: '`app.redis`', doc: '...' }),   // a docs text, no value
//     serialize: option.function<(value: unknown) => string>({ default: JSON.stringify, doc: '...' }),
//     name: option.required(option.string({ doc: '...' })),
//   }, { hints: { max: '`limit` is ...' }, check(settings, fail) { if (...) fail('...') } })
//
//   export type CachePluginOptions = OptionsOf<typeof CACHE_OPTIONS>   // the input type
//   const settings = CACHE_OPTIONS.read(options)   // frozen, defaults applied, typed SettingsOf<...>
//   CACHE_OPTIONS.read(route.config.cache, `route GET /x: config.cache`)   // a nested object
//   CACHE_OPTIONS.docsRows()   // [{ name, type, default, description }], what docs/<plugin>.md shows
//
// Every kind fails with one message: "<owner>: `<name>` must be <expected>, got <shown value>", e.g.
// "cache plugin: `ttlMs` must be an integer of at least 1, got 0". A custom reader words its own.

/** A wrong value as a message shows it: a number as written, anything else by its type. */
export const shown = (value: unknown): string =>
  typeof value === 'number' ? String(value) : describeValue(value)

/**
 * A value a user's function returned or a request carried, shown without its content (a key, a
 * principal or a handle may be a secret): a number as written, anything else by its type.
 */
export const shownType = (value: unknown): string =>
  typeof value === 'number' ? String(value) : value === null ? 'null' : `a ${typeof value}`

/** Throws an InvalidOptionError `<owner>: <where>: <message>`. */
export type Fail = (message: string) => never

/**
 * One option: how it is read and how it is documented. `In` is what a caller passes, `Out` the
 * setting read from it (undefined when not given and there is no default). Made by `option.*`.
 */
export interface Option<In, Out, Required extends boolean = false> {
  /** The type as the docs show it: `integer ≥ 1`, `'serve-stale' | 'fail'`, `function`. */
  readonly type: string
  /** The default as the docs show it (`60000`, `` `cache:` ``, `none`). */
  readonly defaultText: string
  /** What the option does, as the docs table's description. */
  readonly doc: string
  readonly required: Required
  /**
   * The setting for `value` (undefined when the caller left it out). `name` is the option's name,
   * `fail` throws the owner's InvalidOptionError with the message given as is.
   */
  read(value: unknown, name: string, fail: Fail, owner: string): Out
  /** Type only: what a caller passes. */
  readonly __input?: In
}

// biome-ignore lint/suspicious/noExplicitAny: any option, whatever it reads.
export type AnyOption = Option<any, any, boolean>
export type Declarations = Readonly<Record<string, AnyOption>>

interface Spec<T> {
  /** The description shown in the docs. */
  doc: string
  /** The value used when the option is not given. */
  default?: T
  /** The default as the docs show it, when the value alone would not say it (`0 (off)`). */
  defaultText?: string
}

interface RangeSpec<T> extends Spec<T> {
  min?: number
  max?: number
}

/** A default as the docs show it. */
function defaultTextOf(spec: Spec<unknown>): string {
  if (spec.defaultText !== undefined) return spec.defaultText
  const value = spec.default
  if (value === undefined) return 'none'
  // Thousands grouped by a space, as the docs write them: 60 000.
  if (typeof value === 'number')
    return value >= 1000 ? value.toLocaleString('en-US').replaceAll(',', ' ') : String(value)
  if (typeof value === 'function') return `\`${value.name || 'function'}\``
  return `\`${String(value)}\``
}

/**
 * An option read by `accept`: the value when it is right, else a failure "`name` must be
 * <expected>, got <value>". A missing value gives the default.
 */
function simple<In, Out>(
  type: string,
  expected: string,
  spec: Spec<unknown>,
  accept: (value: unknown) => boolean,
): Option<In, Out> {
  return {
    type,
    defaultText: defaultTextOf(spec),
    doc: spec.doc,
    required: false,
    read(value, name, fail) {
      if (value === undefined) return spec.default as Out
      if (!accept(value)) fail(`\`${name}\` must be ${expected}, got ${shown(value)}`)
      return value as Out
    },
  }
}

function rangeText(kind: string, { min, max }: RangeSpec<number>): string {
  if (min !== undefined && max !== undefined) return `${kind} from ${min} to ${max}`
  if (min !== undefined) return `${kind} of at least ${min}`
  if (max !== undefined) return `${kind} of at most ${max}`
  return kind
}

const inRange = (value: number, { min, max }: RangeSpec<number>) =>
  (min === undefined || value >= min) && (max === undefined || value <= max)

function integer(spec: RangeSpec<number> & { default: number }): Option<number, number>
function integer(spec: RangeSpec<number>): Option<number, number | undefined>
function integer(spec: RangeSpec<number>): Option<number, number | undefined> {
  return simple(
    rangeText('integer', spec),
    rangeText('an integer', spec),
    spec,
    (value) => Number.isSafeInteger(value) && inRange(value as number, spec),
  )
}

function number(spec: RangeSpec<number> & { default: number }): Option<number, number>
function number(spec: RangeSpec<number>): Option<number, number | undefined>
function number(spec: RangeSpec<number>): Option<number, number | undefined> {
  return simple(
    rangeText('number', spec),
    rangeText('a number', spec),
    spec,
    (value) => typeof value === 'number' && Number.isFinite(value) && inRange(value, spec),
  )
}

function string(spec: Spec<string> & { default: string }): Option<string, string>
function string(spec: Spec<string>): Option<string, string | undefined>
function string(spec: Spec<string>): Option<string, string | undefined> {
  return simple('string', 'a string', spec, (value) => typeof value === 'string')
}

function boolean(spec: Spec<boolean> & { default: boolean }): Option<boolean, boolean>
function boolean(spec: Spec<boolean>): Option<boolean, boolean | undefined>
function boolean(spec: Spec<boolean>): Option<boolean, boolean | undefined> {
  return simple('boolean', 'true or false', spec, (value) => typeof value === 'boolean')
}

/** `'a' or 'b'`, `'a', 'b' or 'c'`. */
function alternatives(values: readonly unknown[]): string {
  const quoted = values.map((value) => (typeof value === 'string' ? `'${value}'` : String(value)))
  return quoted.length < 2 ? (quoted[0] ?? '') : `${quoted.slice(0, -1).join(', ')} or ${quoted.at(-1)}`
}

function oneOf<const V extends readonly (string | number | boolean)[]>(
  values: V,
  spec: Spec<V[number]> & { default: V[number] },
): Option<V[number], V[number]>
function oneOf<const V extends readonly (string | number | boolean)[]>(
  values: V,
  spec: Spec<V[number]>,
): Option<V[number], V[number] | undefined>
function oneOf<const V extends readonly (string | number | boolean)[]>(
  values: V,
  spec: Spec<V[number]>,
): Option<V[number], V[number] | undefined> {
  const quoted = (value: unknown) => (typeof value === 'string' ? `'${value}'` : String(value))
  const defaultText =
    spec.defaultText ?? (spec.default === undefined ? 'none' : `\`${quoted(spec.default)}\``)
  return simple(values.map(quoted).join(' | '), alternatives(values), { ...spec, defaultText }, (value) =>
    values.includes(value as V[number]),
  )
}

/**
 * A function; `type` words what it must be in the message and the docs (default `a function`):
 * `option.function<PrincipalFunction>({ type: 'a function of the request returning who the caller is', doc })`.
 */
function fn<F>(spec: Spec<F> & { default: F; type?: string }): Option<F, F>
function fn<F>(spec: Spec<F> & { type?: string }): Option<F, F | undefined>
function fn<F>(spec: Spec<F> & { type?: string }): Option<F, F | undefined> {
  const expected = spec.type ?? 'a function'
  return simple('function', expected, spec, (value) => typeof value === 'function')
}

/**
 * An ioredis client (Redis or Cluster, or iovalkey's); undefined when not given (the plugin then
 * uses the redis plugin's `app.redis`). A wrong value is a RedisClientError (FRG_REDIS_CLIENT_INVALID).
 */
function redisClient(
  spec: Omit<Spec<never>, 'default'> = { doc: 'an ioredis `Redis` or `Cluster`', defaultText: '`app.redis`' },
): Option<AnyRedisClient, RedisClient | undefined> {
  return {
    type: 'ioredis client',
    defaultText: spec.defaultText ?? '`app.redis`',
    doc: spec.doc,
    required: false,
    read: (value, _name, _fail, owner) => (value === undefined ? undefined : checkRedisOption(owner, value)),
  }
}

/**
 * Any other option: `read(value, fail)` returns the setting for a value that is given (never
 * undefined) or calls `fail(message)`, the message naming the option ("`path` must be ...").
 * `type` is the type as the docs show it.
 */
function custom<T, In = T>(
  spec: Spec<T> & { type: string; read(value: unknown, fail: Fail, name: string): T; default: T },
): Option<In, T>
function custom<T, In = T>(
  spec: Spec<T> & { type: string; read(value: unknown, fail: Fail, name: string): T },
): Option<In, T | undefined>
function custom<T, In = T>(
  spec: Spec<T> & { type: string; read(value: unknown, fail: Fail, name: string): T },
): Option<In, T | undefined> {
  return {
    type: spec.type,
    defaultText: defaultTextOf(spec),
    doc: spec.doc,
    required: false,
    read: (value, name, fail) => (value === undefined ? spec.default : spec.read(value, fail, name)),
  }
}

/** The same option, which the caller must give: "`name` is required". */
function required<In, Out>(option: Option<In, Out, boolean>): Option<In, Exclude<Out, undefined>, true> {
  return {
    ...option,
    defaultText: 'required',
    required: true,
    read(value, name, fail, owner) {
      if (value === undefined) fail(`\`${name}\` is required`)
      return option.read(value, name, fail, owner) as Exclude<Out, undefined>
    },
  }
}

/** The option kinds; each gives a reader with a default and a description (see the header). */
export const option = {
  integer,
  number,
  string,
  boolean,
  oneOf,
  function: fn,
  redisClient,
  custom,
  required,
}

type InputOf<O> = O extends Option<infer In, unknown, boolean> ? In : never
type RequiredKeys<D> = { [K in keyof D]: D[K] extends Option<unknown, unknown, true> ? K : never }[keyof D]
type OptionalKeys<D> = Exclude<keyof D, RequiredKeys<D>>
type Flat<T> = { [K in keyof T]: T[K] }
type DeclarationsOf<T> = T extends DeclaredOptions<infer D> ? D : T

/** The options object a caller passes: `OptionsOf<typeof CACHE_OPTIONS>`. */
export type OptionsOf<T> = Flat<
  { [K in RequiredKeys<DeclarationsOf<T>>]: InputOf<DeclarationsOf<T>[K]> } & {
    [K in OptionalKeys<DeclarationsOf<T>>]?: InputOf<DeclarationsOf<T>[K]>
  }
>

/** The settings read from it, defaults applied: `SettingsOf<typeof CACHE_OPTIONS>`. */
export type SettingsOf<T> = {
  readonly [K in keyof DeclarationsOf<T>]: DeclarationsOf<T>[K] extends Option<unknown, infer Out, boolean>
    ? Out
    : never
}

/** One row of a plugin's options table in its docs page. */
export interface OptionDocsRow {
  name: string
  type: string
  default: string
  description: string
}

export interface DeclaredOptions<D extends Declarations> {
  /** Who owns the options, first in every message (`cache plugin`). */
  readonly owner: string
  readonly declarations: D
  /** The option names, in declaration order. */
  readonly keys: readonly string[]
  /** The owner's checker, for checks the declarations do not cover (`checker.fail(message)`). */
  readonly checker: OptionChecker
  /**
   * The settings for `options` (undefined reads as `{}`), frozen, defaults applied; throws an
   * InvalidOptionError for a wrong value, an UnknownOptionError for an unknown key. `where` names
   * a nested object in messages (`route GET /x: config.cache`).
   */
  read(options: unknown, where?: string): SettingsOf<D>
  /** Throws what `read` would throw, building no settings: for options given per call. */
  check(options: unknown, where?: string): void
  /** The docs table rows, in declaration order. */
  docsRows(): OptionDocsRow[]
}

/**
 * Declares `owner`'s options once: see the header. `hints` maps other libraries' names to what to
 * write instead; `check(settings, fail)` runs after every option was read, for rules across options.
 */
export function declareOptions<const D extends Declarations>(
  owner: string,
  declarations: D,
  rules: { hints?: OptionHints; check?: (settings: SettingsOf<D>, fail: Fail) => void } = {},
): DeclaredOptions<D> {
  const keys = Object.keys(declarations)
  const checker = optionChecker(owner, rules.hints)
  // Options read per call (a `getOrLoad`'s, say) must not build a function each time: one per place.
  const failers = new Map<string, Fail>()
  const failAt = (where = ''): Fail => {
    let fail = failers.get(where)
    if (fail) return fail
    const at = where ? `${where}: ` : ''
    fail = (message) => checker.fail(`${at}${message}`)
    // At most this many places (`where`): past them, one is built per call.
    if (failers.size < 1000) failers.set(where, fail)
    return fail
  }
  const wholeReadNeeded = rules.check !== undefined || keys.some((key) => declarations[key]!.required)
  /** `options` (undefined reads as `{}`) as an object of known keys; throws otherwise. */
  const checkedObject = (options: unknown, where: string | undefined): Record<string, unknown> => {
    const given: unknown = options === undefined ? {} : options
    if (typeof given !== 'object' || given === null || Array.isArray(given))
      checker.fail(`${where ? `${where} ` : 'options '}must be an object, got ${describeValue(given)}`)
    checker.known(given as object, keys, where)
    return given as Record<string, unknown>
  }
  return {
    owner,
    declarations,
    keys,
    checker,
    read(options, where) {
      const given = checkedObject(options, where)
      const fail = failAt(where)
      const settings: Record<string, unknown> = {}
      for (const key of keys) settings[key] = declarations[key]!.read(given[key], key, fail, owner)
      rules.check?.(settings as SettingsOf<D>, fail)
      return Object.freeze(settings) as SettingsOf<D>
    },
    check(options, where) {
      // A missing required option or a rule across options needs every setting: the whole read.
      if (wholeReadNeeded) {
        this.read(options, where)
        return
      }
      const given = checkedObject(options, where)
      // Otherwise only what was given can be wrong (defaults are not).
      for (const key of Object.keys(given))
        if (given[key] !== undefined) declarations[key]!.read(given[key], key, failAt(where), owner)
    },
    docsRows: () =>
      keys.map((name) => {
        const { type, defaultText, doc } = declarations[name]!
        return { name, type, default: defaultText, description: doc }
      }),
  }
}

/**
 * Every key of an options type, listed once: `optionKeys<MyOptions>({ a: true, b: true })`. Typed
 * so that an option added to the interface and not listed here fails to compile. (Options declared
 * with `declareOptions` have their keys already.)
 */
export function optionKeys<T>(keys: { [K in keyof Required<T>]: true }): readonly string[] {
  return Object.keys(keys)
}

/** Names other libraries use for an option, mapped to what to write here instead. */
export type OptionHints = Readonly<Record<string, string>>

export interface OptionChecker {
  /** Throws an InvalidOptionError `<owner>: <message>`. */
  fail(message: string): never
  /**
   * Throws an UnknownOptionError for the first key of `value` not in `known`, listing the valid
   * keys, with a "did you mean" for a close spelling and the hint for another library's name.
   * `where` names the object inside the owner's options (`policy 'ip'`, `route GET /x: config.cache`).
   */
  known(value: object, known: readonly string[], where?: string): void
}

export function optionChecker(owner: string, hints: OptionHints = {}): OptionChecker {
  const fail = (message: string): never => {
    throw new InvalidOptionError(`${owner}: ${message}`)
  }
  return {
    fail,
    known(value, known, where) {
      for (const key of Object.keys(value)) {
        if (known.includes(key)) continue
        const at = where ? `${where}: ` : ''
        const hint = Object.hasOwn(hints, key) ? hints[key] : undefined
        const suggestion = hint ? undefined : closest(key, known)
        const advice = hint ? ` ${hint}.` : suggestion ? ` Did you mean \`${suggestion}\`?` : ''
        throw new UnknownOptionError(
          `${owner}: ${at}unknown option \`${key}\`.${advice} Valid options: ${known.join(', ')}.`,
          key,
          known,
        )
      }
    },
  }
}

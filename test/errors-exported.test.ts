import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { test } from 'node:test'
import { GatewayError } from '../src/redis/errors.ts'

// Every error class the package exports (its root and each subpath of package.json) is a
// GatewayError, whatever built-in it extends, and docs/errors.md names it next to its code.

const root = new URL('..', import.meta.url)
const pkg = JSON.parse(readFileSync(new URL('package.json', root), 'utf8')) as {
  exports: Record<string, { default?: string } | string>
}

/** Every exported class whose instances are errors, by name, from every entry of the package. */
async function exportedErrorClasses(): Promise<Map<string, { prototype: unknown }>> {
  const classes = new Map<string, { prototype: unknown }>()
  for (const target of Object.values(pkg.exports)) {
    const file = /^\.\/dist\/(.+)\.js$/.exec(
      typeof target === 'string' ? target : (target.default ?? ''),
    )?.[1]
    if (!file) continue
    const entry = (await import(new URL(`src/${file}.ts`, root).href)) as Record<string, unknown>
    for (const [name, value] of Object.entries(entry))
      if (typeof value === 'function' && value.prototype instanceof Error) classes.set(name, value)
  }
  return classes
}

test('every exported error class is a GatewayError that docs/errors.md names with its code', async () => {
  const classes = await exportedErrorClasses()
  assert.ok(classes.size > 30, `only ${classes.size} error classes found`)
  const paragraphs = readFileSync(new URL('docs/errors.md', root), 'utf8').split(/\n\s*\n/)
  for (const [name, errorClass] of classes) {
    assert.ok(
      errorClass === GatewayError || errorClass.prototype instanceof GatewayError,
      `${name} is not a GatewayError`,
    )
    assert.ok(
      paragraphs.some((text) => text.includes(`\`${name}\``) && /`FRG_[A-Z0-9_]+`/.test(text)),
      `docs/errors.md names ${name} nowhere near a code`,
    )
  }
})

test('an error over a built-in is an instance of both, keeps its code, and plain errors are not GatewayErrors', async () => {
  const { SessionTooLargeError } = await import('../src/plugins/session/errors.ts')
  const { CacheKeyInvalidError } = await import('../src/plugins/cache/errors.ts')
  const tooLarge = new SessionTooLargeError('too large')
  assert.ok(tooLarge instanceof GatewayError && tooLarge instanceof RangeError)
  assert.equal(tooLarge.code, 'FRG_SESSION_TOO_LARGE')
  const badKey = new CacheKeyInvalidError('x')
  assert.ok(
    badKey instanceof GatewayError && badKey instanceof TypeError && badKey instanceof CacheKeyInvalidError,
  )
  assert.equal(badKey.name, 'CacheKeyInvalidError')
  assert.ok(!(new TypeError('x') instanceof GatewayError))
  assert.ok(!(new TypeError('x') instanceof CacheKeyInvalidError))
  assert.ok(!((null as unknown) instanceof GatewayError))
})

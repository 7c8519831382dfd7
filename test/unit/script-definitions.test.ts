import assert from 'node:assert/strict'
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { test } from 'node:test'
import { pathToFileURL } from 'node:url'
import { scriptDefinitions, scriptSources } from '../../src/redis/scripts.ts'

// Every script of src/lua has exactly one typed definition (defineScript or defineModes, beside the
// code calling it), and the KEYS and ARGV its Lua header describes are those the definition sends.

const src = new URL('../../src/', import.meta.url)
const lua = new URL('lua/', src)

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name)
    if (entry.isDirectory()) return sourceFiles(path)
    return entry.name.endsWith('.ts') ? [path] : []
  })
}

/** `rate-limit-gcra.lua` is the script `rateLimitGcra`. */
const scriptName = (file: string) =>
  file.replace(/\.lua$/, '').replace(/-([a-z])/g, (_, c: string) => c.toUpperCase())

/** The comment lines a script opens with (its header), without the include lines. */
function header(file: string): string {
  const lines = readFileSync(new URL(file, lua), 'utf8').split('\n')
  const end = lines.findIndex((line) => !line.startsWith('--'))
  return lines
    .slice(0, end)
    .filter((line) => !line.startsWith('-- #include'))
    .join('\n')
}

/** The highest n of `KEYS[n` (or `ARGV[n`) the header names, 0 for none: `KEYS[2..n]` counts 2. */
const highest = (text: string, array: 'KEYS' | 'ARGV') =>
  Math.max(0, ...[...text.matchAll(new RegExp(`${array}\\[(\\d+)`, 'g'))].map((m) => Number(m[1])))

/**
 * The range the header's highest index must fall in: the named entries, one more when the last
 * takes the rest (the header names where the rest starts, or not).
 */
function expected(slots: readonly string[], lead = 0): [number, number] {
  const rest = slots.at(-1)?.startsWith('...') ? 1 : 0
  const fixed = lead + slots.length - rest
  return [fixed, fixed + rest]
}

test('every script of src/lua has one definition, whose KEYS and ARGV its header describes', async () => {
  // Importing every module that defines scripts registers them all (a second definition throws).
  const definers = sourceFiles(src.pathname).filter(
    (path) => !path.endsWith('redis/scripts.ts') && /define(Script|Modes)\(/.test(readFileSync(path, 'utf8')),
  )
  for (const path of definers) await import(pathToFileURL(path).href)

  const files = readdirSync(lua).filter((file) => file.endsWith('.lua'))
  assert.deepEqual([...scriptDefinitions.keys()].sort(), files.map(scriptName).sort())
  assert.deepEqual([...scriptSources.keys()].sort(), files.map(scriptName).sort())

  for (const file of files) {
    const shape = scriptDefinitions.get(scriptName(file) as never)!
    const text = header(file)
    const [keysLow, keysHigh] = expected(shape.keys)
    const keys = highest(text, 'KEYS')
    assert.ok(
      keys >= keysLow && keys <= keysHigh,
      `${file}: header names KEYS up to ${keys}, definition ${shape.keys}`,
    )
    // A script of several modes takes the mode as ARGV[1]: its header covers the longest mode.
    const modes = Object.entries(shape.args)
    const ranges = modes.map(([mode, args]) => expected(args, mode === '' ? 0 : 1))
    const argvLow = Math.max(...ranges.map(([low]) => low))
    const argvHigh = Math.max(...ranges.map(([, high]) => high))
    const argv = highest(text, 'ARGV')
    assert.ok(
      argv >= argvLow && argv <= argvHigh,
      `${file}: header names ARGV up to ${argv}, definition ${modes.map(([mode, args]) => `${mode} ${args}`).join('; ')}`,
    )
    if (keys === 0) assert.match(text, /KEYS/, `${file}: header describes KEYS`)
    if (argv === 0) assert.match(text, /ARGV/, `${file}: header describes ARGV`)
    for (const mode of modes.map(([mode]) => mode).filter(Boolean))
      assert.match(text, new RegExp(`ARGV\\[1\\] '${mode}'`), `${file}: header describes mode '${mode}'`)
  }
})

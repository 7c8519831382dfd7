import type { FastifyInstance } from 'fastify'

/** One scrape of GET /metrics, read as numbers: `value(name, labels)` matches labels in any order. */
export interface Scrape {
  value(name: string, labels?: Record<string, string>): number
}

export async function scrape(app: FastifyInstance, path = '/metrics'): Promise<Scrape> {
  const response = await app.inject({ url: path })
  if (response.statusCode !== 200) throw new Error(`${path} answered ${response.statusCode}`)
  return parse(response.body)
}

export function parse(text: string): Scrape {
  const samples: Array<{ name: string; labels: Record<string, string>; value: number }> = []
  for (const line of text.split('\n')) {
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line)
    if (!match) continue
    const labels: Record<string, string> = {}
    for (const pair of (match[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
      labels[pair[1]!] = pair[2]!
    }
    samples.push({ name: match[1]!, labels, value: Number(match[3]) })
  }
  return {
    /** Sum over every series of `name` carrying these labels (0 when none): a counter's total. */
    value(name, wanted = {}) {
      return samples
        .filter((s) => s.name === name && Object.entries(wanted).every(([k, v]) => s.labels[k] === v))
        .reduce((sum, s) => sum + s.value, 0)
    },
  }
}

/** Differences between two scrapes, for "moved by exactly" assertions. */
export const delta =
  (before: Scrape, after: Scrape) =>
  (name: string, labels?: Record<string, string>): number =>
    after.value(name, labels) - before.value(name, labels)

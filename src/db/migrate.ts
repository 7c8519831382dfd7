import { readdirSync, readFileSync } from 'node:fs'
import type { Database } from './database.ts'

const MIGRATIONS = new URL('./migrations/', import.meta.url)

export function migrationFiles(dir: URL = MIGRATIONS): string[] {
  return readdirSync(dir)
    .filter((file) => /^\d{3}_[a-z0-9_]+\.sql$/.test(file))
    .sort()
}

/**
 * Applies migrations/NNN_name.sql in order, each recorded in schema_migrations, all in one
 * transaction behind an advisory lock so that instances starting together apply them once.
 * Returns the names applied now; throws (naming the file) on the first failure.
 */
export async function migrate(db: Database, dir: URL = MIGRATIONS): Promise<string[]> {
  return db.transaction(async (tx) => {
    await tx.query('SELECT pg_advisory_xact_lock(7290061)')
    await tx.query(
      'CREATE TABLE IF NOT EXISTS schema_migrations (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())',
    )
    const applied = new Set(
      (await tx.query<{ name: string }>('SELECT name FROM schema_migrations')).map((r) => r.name),
    )
    const now: string[] = []
    for (const file of migrationFiles(dir)) {
      if (applied.has(file)) continue
      try {
        for (const statement of splitStatements(readFileSync(new URL(file, dir), 'utf8')))
          await tx.query(statement)
      } catch (err) {
        throw new Error(`Migration ${file} failed: ${(err as Error).message}`)
      }
      await tx.query('INSERT INTO schema_migrations (name) VALUES ($1)', [file])
      now.push(file)
    }
    return now
  })
}

/** Migrations are plain DDL separated by semicolons at line ends (no function bodies), one query each. */
function splitStatements(sql: string): string[] {
  return sql
    .replace(/--.*$/gm, '')
    .split(/;\s*$/m)
    .map((s) => s.trim())
    .filter(Boolean)
}

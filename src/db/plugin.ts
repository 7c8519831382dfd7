import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { createPgDatabase, createPgliteDatabase, type Database } from './database.ts'
import { observeDatabase } from './metrics.ts'
import { migrate } from './migrate.ts'

export interface PostgresPluginOptions {
  /** Use this database instead of creating one; the caller then owns it and closes it. */
  database?: Database
  /** postgres:// URL; when neither this nor `database` is given, embedded PGlite (in memory) is used. */
  connectionString?: string
  /** Apply src/db/migrations at registration (default true). */
  migrate?: boolean
}

declare module 'fastify' {
  interface FastifyInstance {
    db: Database
  }
}

async function postgresPlugin(app: FastifyInstance, options: PostgresPluginOptions) {
  const owned = !options.database
  const db =
    options.database ??
    (options.connectionString
      ? createPgDatabase({ connectionString: options.connectionString })
      : await createPgliteDatabase())
  if (owned) app.addHook('onClose', () => db.close())
  if (options.migrate !== false) {
    const applied = await migrate(db)
    if (applied.length) app.log.info({ applied, kind: db.kind }, 'database migrated')
  }
  app.decorate('db', db)
  // The demo's own Postgres series, in the metrics plugin's registry once the app is ready.
  let stopObserving = () => {}
  app.addHook('onReady', async () => {
    if (app.hasDecorator('metrics')) stopObserving = observeDatabase(app.metrics.registry, db)
  })
  app.addHook('onClose', async () => stopObserving())
}

export default fp(postgresPlugin, { name: 'postgres', fastify: '5.x' })

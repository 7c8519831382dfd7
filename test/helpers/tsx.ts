/**
 * Node's arguments to run a TypeScript file of this repository in a child process. The demo imports
 * the library by the package's name, and the package's "exports" point at dist/ unless this
 * condition picks src/ (package.json); tsx compiles the TypeScript.
 */
export const RUN_TYPESCRIPT = ['--conditions=fastify-redis-gateway:source', '--import', 'tsx']

// A module resolve hook (registered by generate.ts): openapi-typescript's `import ts from 'typescript'`
// gets the compiler API of typescript-api.mjs; every other import of `typescript` is left alone.
const OPENAPI_TYPESCRIPT = /[/\\]node_modules[/\\]openapi-typescript[/\\]/
const API = new URL('./typescript-api.mjs', import.meta.url).href

export async function resolve(specifier, context, nextResolve) {
  if (specifier === 'typescript' && OPENAPI_TYPESCRIPT.test(context.parentURL ?? '')) {
    return { url: API, shortCircuit: true }
  }
  return nextResolve(specifier, context)
}

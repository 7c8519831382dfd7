// The types walkthrough.ts is written against are generated from the served document by
// test/demo/openapi-client.test.ts (`npm run test:openapi`) into a temporary folder, and the walk-through is
// type-checked against them there (a tsconfig that maps this module name to the generated file and
// leaves this file out). The repository-wide `npm run typecheck` runs before anything is generated:
// for it, the generated module is this stand-in, which checks nothing about the API.
declare module 'gateway-openapi-client' {
  // biome-ignore lint/suspicious/noExplicitAny: a stand-in; the real `paths` is generated from the document
  export type paths = any
}

// openapi-typescript 7 builds its output with the TypeScript compiler API (`ts.factory`,
// `ts.createPrinter`). This repository type-checks with TypeScript 7, whose package has no such API,
// and a second `typescript` package (5 or 6) in node_modules would contend for its `tsc` command.
// ts-morph ships the compiler API bundled, without a command: typescript-hook.mjs hands this module
// to openapi-typescript, and only to it, as `typescript`.
import tsMorph from 'ts-morph'

export default tsMorph.ts

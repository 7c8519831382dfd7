import { test } from 'node:test'
import fc from 'fast-check'

/**
 * Model runs: random sequences of commands (operations and faults alike) against the real code on
 * real servers, each checked against a plain in-memory model (fast-check's model-based testing).
 * `npm run test:model` runs every `test/model/*.model.ts`; a failure prints its seed, its shrunk
 * command path and the command that replays it. Settings come from the environment, which
 * test/model/run.ts sets from its flags:
 *
 * - MODEL_RUNS: runs per model (default: the model's CI budget);
 * - MODEL_SEED, MODEL_PATH, MODEL_REPLAY_PATH: replay one failure (with MODEL_ONLY naming the model);
 * - MODEL_ONLY: run only this model;
 * - MODEL_TIME_LIMIT_MS: stop drawing new runs of a model after this long (default 60 s); a failure
 *   found before is still reported.
 */

export type ModelCommand<Model extends object, Real> = fc.AsyncCommand<Model, Real>

export interface ModelSpec<Model extends object, Real> {
  /** The model's name: `npm run test:model -- --model <name>` runs it alone. */
  name: string
  /** The commands, faults among them, as arbitraries; each is drawn with the same weight. */
  commands: ReadonlyArray<fc.Arbitrary<ModelCommand<Model, Real>>>
  /** A fresh model and real system per run (a new key prefix or a new server). */
  setup(scheduler: fc.Scheduler | null): Promise<{ model: Model; real: Real }>
  /** Always called at the end of a run, passed or not. */
  teardown(real: Real): Promise<void>
  /** Checked after every command: what the model says is what a user of the real system sees. */
  invariant?(model: Model, real: Real): Promise<void>
  /** Runs in CI (the budget); MODEL_RUNS overrides it. */
  runs: number
  /** Commands per run at most (default 40). */
  maxCommands?: number
  /**
   * Draws a scheduler per run (fc.scheduler), handed to setup: the real system routes its steps
   * through it (interleaveCommands), and each command's run is awaited through it, so operations a
   * command starts together interleave step by step in an order the seed replays.
   */
  scheduled?: boolean
  /** node:test timeout of the whole model (default 10 minutes). */
  timeoutMs?: number
}

export interface ModelSettings {
  runs: number
  only: string | undefined
  seed: number | undefined
  path: string | undefined
  replayPath: string | undefined
  timeLimitMs: number
}

export function modelSettings(budget: number, env = process.env): ModelSettings {
  const number = (name: string) => {
    const text = env[name]
    if (text === undefined || text === '') return undefined
    const value = Number(text)
    if (!Number.isSafeInteger(value)) throw new Error(`${name}=${text} is not an integer`)
    return value
  }
  return {
    runs: number('MODEL_RUNS') ?? budget,
    only: env.MODEL_ONLY || undefined,
    seed: number('MODEL_SEED'),
    path: env.MODEL_PATH || undefined,
    replayPath: env.MODEL_REPLAY_PATH || undefined,
    timeLimitMs: number('MODEL_TIME_LIMIT_MS') ?? 60_000,
  }
}

/**
 * Wraps each command: with a scheduler, its run is awaited through `scheduler.waitFor`, which
 * releases the scheduled steps (the Redis commands of interleaveCommands) in the order it draws;
 * then the spec's invariant is checked.
 */
class Wrapped<Model extends object, Real> implements ModelCommand<Model, Real> {
  constructor(
    private readonly command: ModelCommand<Model, Real>,
    private readonly invariant: ((model: Model, real: Real) => Promise<void>) | undefined,
    private readonly scheduler: () => fc.Scheduler | null,
  ) {}
  check(model: Readonly<Model>): boolean {
    return this.command.check(model)
  }
  async run(model: Model, real: Real): Promise<void> {
    const scheduler = this.scheduler()
    const ran = this.command.run(model, real)
    await (scheduler ? scheduler.waitFor(ran) : ran)
    if (!this.invariant) return
    const checked = this.invariant(model, real)
    try {
      await (scheduler ? scheduler.waitFor(checked) : checked)
    } catch (err) {
      throw new Error(`invariant after ${this.command.toString()}: ${(err as Error).message}`, { cause: err })
    }
  }
  toString(): string {
    return this.command.toString()
  }
}

/** The replay path fast-check appends to a commands value: `/*replayPath="..."*\/`. */
function replayPathOf(counterexample: unknown): string | undefined {
  const values = Array.isArray(counterexample) ? counterexample : [counterexample]
  for (const value of values) {
    const match = /\/\*replayPath="([^"]*)"\*\//.exec(String(value))
    if (match) return match[1]
  }
  return undefined
}

/** The command that replays one failure of `name`. */
export function replayCommand(
  name: string,
  seed: number,
  path: string,
  replayPath: string | undefined,
): string {
  const replay = replayPath ? ` --replay-path '${replayPath}'` : ''
  return `npm run test:model -- --model ${name} --seed=${seed} --path '${path}'${replay}`
}

/** Registers the model as a node:test test (skipped when MODEL_ONLY names another model). */
export function modelTest<Model extends object, Real>(spec: ModelSpec<Model, Real>): void {
  const settings = modelSettings(spec.runs)
  const skip = settings.only !== undefined && settings.only !== spec.name
  test(`model: ${spec.name}`, { skip, timeout: spec.timeoutMs ?? 600_000 }, async (t) => {
    const replaying = settings.seed !== undefined
    let scheduler: fc.Scheduler | null = null
    const invariant = spec.invariant?.bind(spec)
    const commands = fc.commands(
      spec.commands.map((arbitrary) =>
        arbitrary.map((command) => new Wrapped(command, invariant, () => scheduler) as typeof command),
      ),
      {
        maxCommands: spec.maxCommands ?? 40,
        // Without it fast-check's default size caps a run far below maxCommands.
        size: 'max',
        ...(replaying && settings.replayPath ? { replayPath: settings.replayPath } : {}),
      },
    )
    const run = async (drawn: fc.Scheduler | null, cmds: Iterable<ModelCommand<Model, Real>>) => {
      scheduler = drawn
      const { model, real } = await spec.setup(drawn)
      try {
        await fc.asyncModelRun(() => ({ model, real }), cmds)
      } finally {
        await spec.teardown(real)
      }
    }
    const schedulers: fc.Arbitrary<fc.Scheduler | null> = spec.scheduled ? fc.scheduler() : fc.constant(null)
    const property = fc.asyncProperty(schedulers, commands, (drawn, cmds) => run(drawn, cmds))
    let runsDone = 0
    const details = await fc.check(property, {
      numRuns: settings.runs,
      ...(replaying ? { seed: settings.seed, path: settings.path, endOnFailure: true } : {}),
      interruptAfterTimeLimit: replaying ? undefined : settings.timeLimitMs,
      reporter: undefined,
      examples: [],
    })
    runsDone = details.numRuns
    if (details.failed && details.counterexample === null)
      throw new Error(
        `model "${spec.name}": no run ended within ${settings.timeLimitMs} ms (seed ${details.seed}): a run hangs or the budget is too small`,
      )
    if (!details.failed) {
      t.diagnostic(
        `${runsDone} runs of up to ${spec.maxCommands ?? 40} commands${details.interrupted ? ' (time limit reached)' : ''}`,
      )
      return
    }
    const replayPath = replayPathOf(details.counterexample)
    const replay = replayCommand(spec.name, details.seed, details.counterexamplePath ?? '', replayPath)
    const error = details.errorInstance as Error | undefined
    throw new Error(
      [
        `model "${spec.name}" failed after ${details.numRuns} run(s), shrunk ${details.numShrinks} time(s)`,
        `seed ${details.seed}, path '${details.counterexamplePath}'${replayPath ? `, replay path '${replayPath}'` : ''}`,
        // The counterexample is [scheduler, commands]; the scheduler is null in an unscheduled model.
        ...(details.counterexample?.[0] ? [`scheduler: ${fc.stringify(details.counterexample[0])}`] : []),
        `commands: ${fc.stringify(details.counterexample?.[1])}`,
        `error: ${error?.stack ?? String(error)}`,
        `replay: ${replay}`,
      ].join('\n'),
      { cause: error },
    )
  })
}

/**
 * Lets a scheduler choose the order in which a client's commands leave for Redis: each command is
 * sent only when the scheduler releases it, so concurrent operations interleave command by command
 * in an order fast-check draws (and replays from the seed). Works on an ioredis client, whose
 * every command, script calls included, goes through `sendCommand`.
 */
export function interleaveCommands<
  Client extends { sendCommand(command: unknown, ...rest: unknown[]): unknown },
>(client: Client, scheduler: fc.Scheduler): Client {
  const send = client.sendCommand.bind(client)
  client.sendCommand = ((command: { name?: string; promise?: Promise<unknown> }, ...rest: unknown[]) => {
    void scheduler
      .schedule(Promise.resolve(), `redis ${command.name ?? '?'}`)
      .then(() => send(command, ...rest))
      .catch(() => {})
    return command.promise
  }) as Client['sendCommand']
  return client
}

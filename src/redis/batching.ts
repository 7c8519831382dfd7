import type { Writable } from 'node:stream'

let corked: Writable[] = []
const uncorkAll = () => {
  for (const stream of corked) stream.uncork()
  corked = []
}

/**
 * The script calls of one event-loop turn (the requests that arrived together) leave in one write
 * on a user's own client too: the first call of a turn corks the connection's socket and
 * setImmediate, after the turn's I/O callbacks, uncorks it. Redis then reads them in one read and
 * answers in one write, instead of a syscall per call on each side. Order and replies are
 * unchanged and nothing waits beyond the turn; the user's other commands of the turn ride along.
 * A Cluster (no socket of its own: each command goes to its node's) is left as it is.
 */
export function corkForTurn(client: object): void {
  const stream = (client as { stream?: Writable }).stream
  if (!stream || 'nodes' in client || corked.includes(stream)) return
  stream.cork()
  if (corked.length === 0) setImmediate(uncorkAll)
  corked.push(stream)
}

/** The longest interval between two heartbeat PINGs on an L1's subscriber (at most the L1's TTL). */
const HEARTBEAT_MS = 1000

export interface HeartbeatHandlers {
  /** Whether there is a subscription to watch now (nothing is sent otherwise). */
  live(): boolean
  /** A PING on the subscriber's connection. */
  ping(): Promise<unknown>
  /** A PING went unanswered for a whole interval: messages may be that late too. */
  late(): void
  /** The late PING was answered: what was delivered late came before it, and was applied. */
  onTime(): void
}

/**
 * The heartbeat of an L1's pub/sub subscriber: a PING every interval (1 s, or the L1's TTL if
 * shorter). A channel that answers late delivers late, so an L1 serves only while its PING is
 * answered within an interval; this also finds a connection that died without closing (a host or
 * a network gone: the socket would look open for minutes). The session and cache L1s share it.
 */
export class SubscriberHeartbeat {
  /** The last PING went unanswered for a whole interval, and no answer has come since. */
  late = false
  #pinging = false
  /** Bumped at every drop of the connection: a PING answered on an older one says nothing now. */
  #connection = 0
  readonly #timer: NodeJS.Timeout

  constructor(
    l1TtlMs: number,
    private readonly handlers: HeartbeatHandlers,
  ) {
    this.#timer = setInterval(() => this.#beat(), Math.min(HEARTBEAT_MS, l1TtlMs))
    this.#timer.unref()
  }

  #beat(): void {
    if (!this.handlers.live()) return
    if (this.#pinging) {
      if (!this.late) {
        this.late = true
        this.handlers.late()
      }
      return
    }
    this.#pinging = true
    const connection = this.#connection
    this.handlers.ping().then(
      () => {
        if (connection !== this.#connection) return
        this.#pinging = false
        if (this.late) {
          this.late = false
          this.handlers.onTime()
        }
      },
      () => {
        // Timed out (a client's commandTimeout): no answer within its bound is late too. Or the
        // connection dropped: its 'close' takes the L1 down and calls dropped().
        if (connection !== this.#connection) return
        this.#pinging = false
        if (!this.late) {
          this.late = true
          this.handlers.late()
        }
      },
    )
  }

  /** The subscriber's connection dropped: a PING in flight on it is forgotten. */
  dropped(): void {
    this.#connection++
    this.#pinging = false
    this.late = false
  }

  stop(): void {
    clearInterval(this.#timer)
  }
}

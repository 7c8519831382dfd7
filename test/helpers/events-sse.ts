// A minimal Server-Sent Events client for the notification tests, on node:http with a connection
// of its own per stream (no pooled keep-alive connection outlives a test).
import { request } from 'node:http'

export interface SseMessage {
  id: string
  event: string
  data: Record<string, unknown>
}

export interface SseConnection {
  status: number
  contentType: string
  /** The body of a response that is not an event stream (a problem). */
  body: string
  messages: SseMessage[]
  comments: string[]
  /** What a browser would send as Last-Event-ID: the latest `id:` line, with or without data. */
  lastEventId: string | null
  /** Resolves once the stream ended (the server closed it, or close()). */
  ended: Promise<void>
  /** Waits until `n` messages arrived (fails after `ms`, or if the stream ends first). */
  waitFor(n: number, ms?: number): Promise<SseMessage[]>
  close(): void
}

export function openSse(url: string, headers: Record<string, string>): Promise<SseConnection> {
  return new Promise((resolve, reject) => {
    const req = request(url, { headers, agent: false })
    req.on('error', reject)
    req.on('response', (res) => {
      const contentType = String(res.headers['content-type'] ?? '')
      const messages: SseMessage[] = []
      const comments: string[] = []
      const waiters = new Set<() => void>()
      const notify = () => {
        for (const w of [...waiters]) w()
      }
      let done = false
      let body = ''
      let pending = ''
      const ended = new Promise<void>((end) => {
        const finish = () => {
          done = true
          notify()
          end()
        }
        res.on('end', finish)
        res.on('close', finish)
        res.on('error', finish)
      })
      const connection: SseConnection = {
        status: res.statusCode ?? 0,
        contentType,
        get body() {
          return body
        },
        messages,
        comments,
        lastEventId: null,
        ended,
        async waitFor(n, ms = 15_000) {
          const deadline = Date.now() + ms
          while (messages.length < n) {
            if (done) throw new Error(`stream ended with ${messages.length} of ${n} messages`)
            const left = deadline - Date.now()
            if (left <= 0) throw new Error(`timed out with ${messages.length} of ${n} messages`)
            await new Promise<void>((wake) => {
              const timer = setTimeout(wake, left)
              const w = () => {
                clearTimeout(timer)
                waiters.delete(w)
                wake()
              }
              waiters.add(w)
            })
          }
          return messages
        },
        close: () => req.destroy(),
      }
      res.setEncoding('utf8')
      if (!contentType.startsWith('text/event-stream')) {
        res.on('data', (chunk: string) => {
          body += chunk
        })
        res.on('end', () => resolve(connection))
        return
      }
      let opened = false
      res.on('data', (chunk: string) => {
        pending += chunk
        let cut = pending.indexOf('\n\n')
        while (cut >= 0) {
          const frame = pending.slice(0, cut)
          pending = pending.slice(cut + 2)
          const message: Partial<SseMessage> = {}
          for (const line of frame.split('\n')) {
            if (line.startsWith(':')) comments.push(line.slice(1).trim())
            else if (line.startsWith('id: ')) message.id = line.slice(4)
            else if (line.startsWith('event: ')) message.event = line.slice(7)
            else if (line.startsWith('data: ')) message.data = JSON.parse(line.slice(6))
          }
          // An `id:` without data (a stream ending at its position) moves Last-Event-ID, shows nothing.
          if (message.id) connection.lastEventId = message.id
          if (message.id && message.data !== undefined) messages.push(message as SseMessage)
          cut = pending.indexOf('\n\n')
        }
        notify()
        // Ready once the server said it is subscribed (its first comment).
        if (!opened && comments.includes('connected')) {
          opened = true
          resolve(connection)
        }
      })
      void ended.then(() => resolve(connection))
    })
    req.end()
  })
}

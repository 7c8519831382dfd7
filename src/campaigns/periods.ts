// The calendar periods campaigns count in, all in UTC: ISO 8601 weeks (Monday to Sunday; week 1
// holds the year's first Thursday, so 2026-12-31 is in 2026-W53 and 2027-01-01 too) and days.

export const DAY_MS = 86_400_000
const WEEK_MS = 7 * DAY_MS

export interface Period {
  /** `2026-W49` for a week, `2026-11-30` for a day. */
  name: string
  startMs: number
  /** The first millisecond after the period. */
  endMs: number
}

/** The ISO week that `at` falls in (UTC). */
export function isoWeek(at: Date | number): Period {
  const time = new Date(at).getTime()
  const dayStart = time - (((time % DAY_MS) + DAY_MS) % DAY_MS)
  // getUTCDay: Sunday 0; ISO counts Monday 1 to Sunday 7.
  const weekday = new Date(dayStart).getUTCDay() || 7
  const startMs = dayStart - (weekday - 1) * DAY_MS
  // The week belongs to the year of its Thursday; its number counts from that year's first Thursday.
  const thursday = new Date(startMs + 3 * DAY_MS)
  const year = thursday.getUTCFullYear()
  const week = Math.floor((thursday.getTime() - Date.UTC(year, 0, 1)) / WEEK_MS) + 1
  return { name: `${year}-W${String(week).padStart(2, '0')}`, startMs, endMs: startMs + WEEK_MS }
}

/** The UTC day that `at` falls in. */
export function utcDay(at: Date | number): Period {
  const time = new Date(at).getTime()
  const startMs = time - (((time % DAY_MS) + DAY_MS) % DAY_MS)
  return { name: new Date(startMs).toISOString().slice(0, 10), startMs, endMs: startMs + DAY_MS }
}

/** One throughput ratio for the chart: the median over rounds of A's req/s over B's, with the lowest and highest round. */
export interface RatioBar {
  label: string
  median: number
  min: number
  max: number
  /** The ratio the claim needs (1.3 for "at least 1.3x"); drawn as a tick on the bar's row. */
  target?: number
}

const escapeXml = (text: string) =>
  text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;')

/**
 * A horizontal bar chart of ratios as a standalone SVG, written by hand so the suite needs no
 * plotting dependency: a bar per ratio at its median, a whisker from min to max, a dashed line at
 * 1.0x (parity) and a red tick at each target.
 */
export function ratioChart(bars: RatioBar[], title: string): string {
  const labelWidth = 330
  const plotWidth = 460
  const rowHeight = 28
  const top = 48
  const height = top + Math.max(bars.length, 1) * rowHeight + 40
  const width = labelWidth + plotWidth + 70
  const highest = Math.max(2, ...bars.map((b) => Math.max(b.max, b.target ?? 0)))
  const scaleMax = Math.ceil(highest * 2) / 2
  const x = (value: number) => labelWidth + (Math.max(0, value) / scaleMax) * plotWidth
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">`,
    `<rect width="${width}" height="${height}" fill="#fff"/>`,
    `<text x="${width / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">${escapeXml(title)}</text>`,
  ]
  const axisY = top + bars.length * rowHeight + 6
  for (let tick = 0; tick <= scaleMax + 1e-9; tick += 0.5) {
    parts.push(
      `<line x1="${x(tick)}" y1="${top - 6}" x2="${x(tick)}" y2="${axisY}" stroke="#eee"/>`,
      `<text x="${x(tick)}" y="${axisY + 16}" text-anchor="middle" fill="#555">${tick.toFixed(1)}x</text>`,
    )
  }
  parts.push(
    `<line x1="${x(1)}" y1="${top - 6}" x2="${x(1)}" y2="${axisY}" stroke="#333" stroke-dasharray="4 3"/>`,
  )
  bars.forEach((bar, i) => {
    const y = top + i * rowHeight
    const met = bar.target === undefined || bar.median >= bar.target
    parts.push(
      `<text x="${labelWidth - 8}" y="${y + 15}" text-anchor="end">${escapeXml(bar.label)}</text>`,
      `<rect x="${labelWidth}" y="${y + 4}" width="${x(bar.median) - labelWidth}" height="16" fill="${met ? '#4c78a8' : '#e45756'}"/>`,
      `<line x1="${x(bar.min)}" y1="${y + 12}" x2="${x(bar.max)}" y2="${y + 12}" stroke="#222" stroke-width="1.5"/>`,
      `<line x1="${x(bar.min)}" y1="${y + 7}" x2="${x(bar.min)}" y2="${y + 17}" stroke="#222"/>`,
      `<line x1="${x(bar.max)}" y1="${y + 7}" x2="${x(bar.max)}" y2="${y + 17}" stroke="#222"/>`,
      `<text x="${x(Math.max(bar.max, bar.median)) + 6}" y="${y + 15}" fill="#222">${bar.median.toFixed(2)}x</text>`,
    )
    if (bar.target !== undefined) {
      parts.push(
        `<line x1="${x(bar.target)}" y1="${y + 1}" x2="${x(bar.target)}" y2="${y + 23}" stroke="#d62728" stroke-width="2"><title>target ${bar.target}x</title></line>`,
      )
    }
  })
  if (bars.length === 0) {
    parts.push(`<text x="${labelWidth}" y="${top + 15}" fill="#555">no ratios reported</text>`)
  }
  parts.push('</svg>')
  return `${parts.join('\n')}\n`
}

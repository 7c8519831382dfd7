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

/** One line of a line chart: points (x, y) joined in x order. */
export interface LineSeries {
  label: string
  /** Lines sharing a colour index share a colour (one setting, two traffic shapes). */
  colorIndex: number
  dashed?: boolean
  points: Array<[number, number]>
}

const PALETTE = ['#4c78a8', '#f58518', '#54a24b', '#e45756', '#72b7b2', '#b279a2']

/**
 * Line charts side by side as one standalone SVG, written by hand like ratioChart: one panel per
 * metric, the x axis on a log2 scale (instance counts 1, 2, 4, 8), the y axis from 0 to a round
 * maximum, and one legend for every panel's lines.
 */
export function lineCharts(
  panels: Array<{ title: string; series: LineSeries[] }>,
  title: string,
  xLabel: string,
): string {
  const panelWidth = 300
  const panelHeight = 220
  const left = 50
  const gap = 40
  const top = 60
  const legend = panels[0]?.series ?? []
  const legendTop = top + panelHeight + 50
  const width = left + panels.length * (panelWidth + gap)
  const height = legendTop + legend.length * 18 + 20
  const xs = [...new Set(panels.flatMap((p) => p.series.flatMap((s) => s.points.map(([x]) => x))))].sort(
    (a, b) => a - b,
  )
  const xMin = Math.log2(Math.max(1, xs[0] ?? 1))
  const xMax = Math.max(xMin + 1, Math.log2(Math.max(1, xs.at(-1) ?? 2)))
  const niceMax = (value: number) => {
    if (value <= 0) return 1
    const magnitude = 10 ** Math.floor(Math.log10(value))
    return ([1, 2, 2.5, 5, 10].find((step) => step * magnitude >= value) ?? 10) * magnitude
  }
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">`,
    `<rect width="${width}" height="${height}" fill="#fff"/>`,
    `<text x="${width / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">${escapeXml(title)}</text>`,
  ]
  panels.forEach((panel, p) => {
    const x0 = left + p * (panelWidth + gap)
    const yMax = niceMax(Math.max(0, ...panel.series.flatMap((s) => s.points.map(([, y]) => y))))
    const px = (x: number) => x0 + ((Math.log2(Math.max(1, x)) - xMin) / (xMax - xMin)) * panelWidth
    const py = (y: number) => top + panelHeight - (y / yMax) * panelHeight
    parts.push(
      `<text x="${x0 + panelWidth / 2}" y="${top - 14}" text-anchor="middle" font-weight="bold">${escapeXml(panel.title)}</text>`,
      `<line x1="${x0}" y1="${top + panelHeight}" x2="${x0 + panelWidth}" y2="${top + panelHeight}" stroke="#333"/>`,
      `<line x1="${x0}" y1="${top}" x2="${x0}" y2="${top + panelHeight}" stroke="#333"/>`,
      `<text x="${x0 + panelWidth / 2}" y="${top + panelHeight + 34}" text-anchor="middle" fill="#555">${escapeXml(xLabel)}</text>`,
    )
    for (let i = 0; i <= 4; i++) {
      const y = (yMax * i) / 4
      parts.push(
        `<line x1="${x0}" y1="${py(y)}" x2="${x0 + panelWidth}" y2="${py(y)}" stroke="#eee"/>`,
        `<text x="${x0 - 6}" y="${py(y) + 4}" text-anchor="end" fill="#555">${Number(y.toPrecision(3))}</text>`,
      )
    }
    for (const x of xs)
      parts.push(
        `<text x="${px(x)}" y="${top + panelHeight + 16}" text-anchor="middle" fill="#555">${x}</text>`,
      )
    for (const series of panel.series) {
      const points = [...series.points].sort((a, b) => a[0] - b[0])
      if (points.length === 0) continue
      const color = PALETTE[series.colorIndex % PALETTE.length]
      const path = points.map(([x, y]) => `${px(x).toFixed(1)},${py(y).toFixed(1)}`).join(' ')
      parts.push(
        `<polyline points="${path}" fill="none" stroke="${color}" stroke-width="2"${series.dashed ? ' stroke-dasharray="5 4"' : ''}><title>${escapeXml(series.label)}</title></polyline>`,
        ...points.map(
          ([x, y]) =>
            `<circle cx="${px(x).toFixed(1)}" cy="${py(y).toFixed(1)}" r="3" fill="${color}"><title>${escapeXml(`${series.label}: ${x} → ${y}`)}</title></circle>`,
        ),
      )
    }
  })
  legend.forEach((series, i) => {
    const y = legendTop + i * 18
    const color = PALETTE[series.colorIndex % PALETTE.length]
    parts.push(
      `<line x1="${left}" y1="${y}" x2="${left + 30}" y2="${y}" stroke="${color}" stroke-width="2"${series.dashed ? ' stroke-dasharray="5 4"' : ''}/>`,
      `<text x="${left + 38}" y="${y + 4}">${escapeXml(series.label)}</text>`,
    )
  })
  parts.push('</svg>')
  return `${parts.join('\n')}\n`
}

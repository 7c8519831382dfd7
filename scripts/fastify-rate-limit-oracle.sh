#!/usr/bin/env bash
# The oracle of the @fastify/rate-limit compat layer: @fastify/rate-limit 11.2.0's own test files,
# unchanged, run against our build (its index.js replaced by a re-export of
# dist/compat/fastify-rate-limit.js). Prints passed/failed per file and fails when any file passes
# fewer tests than scripts/fastify-rate-limit-oracle.baseline.json says.
#
# Its Redis test file runs FLUSHALL on 127.0.0.1:6379, so that file runs only inside a private
# network namespace (unshare -rn) with a redis-server of its own: never against this machine's Redis.
#
#   bash scripts/fastify-rate-limit-oracle.sh            # build, run, compare with the baseline
#   bash scripts/fastify-rate-limit-oracle.sh --record   # the same, then write the baseline
#   ORACLE_SKIP_BUILD=1 ...                              # use dist/ as it is
#   ORACLE_VERBOSE=1 ...                                 # print each file's TAP report
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
version=11.2.0
baseline=scripts/fastify-rate-limit-oracle.baseline.json
record=${1:-}

command -v redis-server >/dev/null || { echo "redis-server is needed (apt-get install redis-server)" >&2; exit 1; }
command -v unshare >/dev/null || { echo "unshare (util-linux) is needed" >&2; exit 1; }

if [ -z "${ORACLE_SKIP_BUILD:-}" ]; then npm run build >/dev/null; fi
[ -f dist/compat/fastify-rate-limit.js ] || { echo "dist/compat/fastify-rate-limit.js missing: npm run build" >&2; exit 1; }

work=$(mktemp -d /tmp/fastify-rate-limit-oracle.XXXXXX)
# ORACLE_KEEP=1 keeps the folder (its out-*.tap files hold each file's report).
if [ -z "${ORACLE_KEEP:-}" ]; then trap 'rm -rf "$work"' EXIT; else echo "oracle folder: $work"; fi
cd "$work"
npm pack "@fastify/rate-limit@$version" --silent >/dev/null
tar xzf "fastify-rate-limit-$version.tgz"
cd package
# Its devDependencies (fastify, ioredis, fake timers...). --ignore-scripts: no install script runs,
# so nothing downloads a prebuilt binary (sqlite3, used only by its examples, stays unbuilt).
npm install --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null

cat >index.js <<EOF
'use strict'
// The oracle: @fastify/rate-limit's tests against fastify-redis-gateway's compat layer.
const compat = require('$repo/dist/compat/fastify-rate-limit.js')
module.exports = compat.default
module.exports.default = compat.fastifyRateLimit
module.exports.fastifyRateLimit = compat.fastifyRateLimit
module.exports.normalizeIP = compat.normalizeIP
EOF

# Upstream runs `node --test` (test/**/*.test.js); one file at a time here, to count per file.
files=$(find test -name '*.test.js' | sort)
results=$work/results.tsv
: >"$results"
run_file() { # file -> "file<TAB>pass<TAB>fail"
  local file=$1 out=$work/out-${1//\//_}.tap
  local cmd="timeout 300 node --test --test-force-exit --test-reporter=tap --test-concurrency=1 $file"
  if grep -q ioredis "$file"; then
    # Private network namespace: its own loopback and its own Redis on 127.0.0.1:6379.
    unshare -rn sh -c "ip link set lo up
      redis-server --port 6379 --bind 127.0.0.1 --daemonize yes --save '' --appendonly no \
        --dir '$work' --pidfile '$work/redis.pid' --logfile '$work/redis.log'
      for i in \$(seq 1 50); do redis-cli -p 6379 ping >/dev/null 2>&1 && break; sleep 0.1; done
      $cmd; rc=\$?; redis-cli -p 6379 shutdown nosave >/dev/null 2>&1; exit \$rc" >"$out" 2>&1 || true
  else
    $cmd >"$out" 2>&1 || true
  fi
  local pass fail
  pass=$(grep -E '^# pass ' "$out" | tail -1 | awk '{print $3}')
  fail=$(grep -E '^# fail ' "$out" | tail -1 | awk '{print $3}')
  printf '%s\t%s\t%s\n' "$file" "${pass:-0}" "${fail:-0}" >>"$results"
  if [ -n "${ORACLE_VERBOSE:-}" ]; then cat "$out"; fi
}

started=$(date +%s)
for file in $files; do run_file "$file"; done
elapsed=$(($(date +%s) - started))

cd "$repo"
node - "$results" "$baseline" "$record" "$elapsed" <<'EOF'
const fs = require('node:fs')
const [results, baselinePath, record, elapsed] = process.argv.slice(2)
const rows = fs.readFileSync(results, 'utf8').trim().split('\n').map((line) => {
  const [file, pass, fail] = line.split('\t')
  return { file, pass: Number(pass), fail: Number(fail) }
})
const base = fs.existsSync(baselinePath) ? JSON.parse(fs.readFileSync(baselinePath, 'utf8')) : { files: {} }
let below = 0
const width = Math.max(...rows.map((r) => r.file.length))
for (const r of rows) {
  const want = base.files[r.file]
  const flag = want !== undefined && r.pass < want ? `  BELOW BASELINE (${want})` : ''
  if (flag) below++
  console.log(`${r.file.padEnd(width)}  ${String(r.pass).padStart(3)} passed  ${String(r.fail).padStart(3)} failed${flag}`)
}
const pass = rows.reduce((n, r) => n + r.pass, 0)
const fail = rows.reduce((n, r) => n + r.fail, 0)
console.log(`oracle (@fastify/rate-limit ${'11.2.0'} tests, ${elapsed} s): ${pass} passed, ${fail} failed; baseline ${base.total ?? 'none'}`)
if (record === '--record') {
  const files = Object.fromEntries(rows.map((r) => [r.file, r.pass]))
  fs.writeFileSync(baselinePath, `${JSON.stringify({ version: '11.2.0', total: pass, files }, null, 2)}\n`)
  console.log(`baseline written: ${baselinePath}`)
} else if (below > 0 || (base.total !== undefined && pass < base.total)) {
  console.error('fewer tests pass than the baseline')
  process.exit(1)
}
EOF

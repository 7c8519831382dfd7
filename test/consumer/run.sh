#!/usr/bin/env bash
# The consumer test: pack the package, install the tarball into an empty folder with only fastify and
# ioredis (plus iovalkey for one app), and run plain JavaScript apps that use each plugin alone, on every supported Node; then
# type-check a TypeScript consumer against the shipped .d.ts. Needs Redis (REDIS_URL, default local).
# CONSUMER_NODE_VERSIONS="22 24 26" (default) picks the Node majors, from the npm registry's `node` package.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== pack"
tarball=$(cd "$repo" && npm pack --silent --pack-destination "$work" | tail -n 1)
tar -tzf "$work/$tarball" | sed 's#^package/##' | sort > "$work/files.txt"
echo "$(wc -l < "$work/files.txt") files in $tarball"
if grep -vE '^(dist/|docs/|README.md$|LICENSE$|package.json$)' "$work/files.txt"; then
  echo "the tarball holds files a user does not need (above)" >&2; exit 1
fi

install_into() { # folder, ioredis version
  mkdir -p "$1"
  cp -r "$here/apps" "$here/typed" "$1/"
  (cd "$1" && npm init -y >/dev/null && npm pkg set type=module >/dev/null &&
    npm install --no-audit --no-fund --silent "$work/$tarball" fastify@5 "ioredis@$2")
  for demo_only in pg @electric-sql/pglite tsx @fastify/swagger @fastify/swagger-ui typebox; do
    if [ -e "$1/node_modules/$demo_only" ]; then echo "installing the package pulled $demo_only" >&2; exit 1; fi
  done
  echo "installed with ioredis $(node -p "require('$1/node_modules/ioredis/package.json').version"):" \
    "$(du -sh "$1/node_modules" | cut -f1) in node_modules"
}

run_apps() { # folder, node major
  local node=(npx -y -p "node@$2" node)
  echo "-- Node $("${node[@]}" --version) in $(basename "$1")"
  for app in rate-limit idempotency session cache metrics redis primitives mistakes; do
    (cd "$1" && "${node[@]}" "apps/$app.mjs")
  done
}

echo "== install (ioredis 6)"
install_into "$work/v6" 6
echo "== install iovalkey next to ioredis 6 (an optional peer: the iovalkey app and the typed consumer use it)"
(cd "$work/v6" && npm install --no-audit --no-fund --silent iovalkey@^0.4.0)
echo "== install (ioredis 5)"
install_into "$work/v5" 5

echo "== run"
for major in ${CONSUMER_NODE_VERSIONS:-22 24 26}; do run_apps "$work/v6" "$major"; done
run_apps "$work/v5" 22
echo "-- the plugins on an iovalkey client, Node 22"
(cd "$work/v6" && npx -y -p node@22 node apps/iovalkey.mjs)

echo "== typecheck a TypeScript consumer against the shipped types"
# ioredis 6.1's own declarations import the untyped `redis-errors`: a consumer that checks library
# types (skipLibCheck false, as this one does to check ours) needs @types/redis-errors, ours or not.
(cd "$work/v6" && npm install --no-audit --no-fund --silent typescript@5.9 @types/node@22 @types/redis-errors@1 &&
  npx tsc -p typed/tsconfig.json && echo "ok types")
echo "consumer test passed"

#!/usr/bin/env bash
# Issue 4 benchmark: `preflight check` over fixture (a) (8x H100, 8x CX-7)
# with the shipped checklist plus every hardware kind (bench/hardware-a.yaml),
# median of RUNS (default 20) fresh processes. Target: median <= 100 ms.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/timing.sh
RUNS=${RUNS:-20}
cargo build --release --quiet
BIN=target/release/preflight
FIX=fixtures/h100-ib-healthy
args=(check --root "$FIX/root" --checks bench/hardware-a.yaml --format json)
# The fixture's environment only, as a launcher would give it.
mapfile -t envs < <(grep -v '^\s*$' "$FIX/env" || true)
"$BIN" "${args[@]}" >/dev/null || true   # warm the page cache
read -r median min max < <(median_ms "$RUNS" env -i "${envs[@]}" "$BIN" "${args[@]}")
checks=$(env -i "${envs[@]}" "$BIN" "${args[@]}" | grep -c '"id":' || true)
echo "fixture (a), $checks checks, $RUNS runs: median ${median} ms (min ${min}, max ${max}); target <= 100 ms"

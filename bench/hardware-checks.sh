#!/usr/bin/env bash
# Issue 4 benchmark: `preflight check` over fixture (a) (8x H100, 8x CX-7)
# with the shipped checklist plus every hardware kind (bench/hardware-a.yaml),
# median of RUNS (default 20) fresh processes. Target: median <= 100 ms.
# The fixture is healthy: any exit but 0 (a check that cannot read its
# input, a moved fixture) fails the bench instead of timing it.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/timing.sh
RUNS=${RUNS:-20}
. bench/binary.sh
BIN=$(preflight_bin)
FIX=fixtures/h100-ib-healthy
args=(check --root "$FIX/root" --checks bench/hardware-a.yaml --format json)
# The fixture's environment only, as a launcher would give it.
mapfile -t envs < <(grep -v '^\s*$' "$FIX/env" || true)
env -i "${envs[@]}" "$BIN" "${args[@]}" >/dev/null   # warm the page cache; must pass
out=$(median_ms "$RUNS" env -i "${envs[@]}" "$BIN" "${args[@]}")
read -r median min max <<<"$out"
checks=$(env -i "${envs[@]}" "$BIN" "${args[@]}" | grep -c '"id":')
echo "fixture (a), $checks checks, $RUNS runs: median ${median} ms (min ${min}, max ${max}); target <= 100 ms"

#!/usr/bin/env bash
# `preflight check` with the shipped checklist on this machine: median of
# RUNS (default 20) runs of the release binary, beside LBNL NHC's typical
# 0.5 s per node (NHC is not packaged for Debian; its figure is the one its
# authors publish). This machine's verdict may be ready or not ready (exit
# 0 or 1); anything else (a usage error, an incomplete run) fails the bench.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/timing.sh
RUNS=${RUNS:-20}
. bench/binary.sh
bin=$(preflight_bin)
export BENCH_OK_EXIT="0 1"
"$bin" check >/dev/null || [[ $? == 1 ]]   # warm the page cache once
out=$(median_ms "$RUNS" "$bin" check)
read -r median min max <<<"$out"
checks=$("$bin" check --format json | grep -c '"id"') || true
echo "preflight check ($checks shipped checks), $RUNS runs: median ${median} ms (min ${min}, max ${max})"
echo "LBNL NHC, typical per node: 500 ms"

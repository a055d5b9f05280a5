#!/usr/bin/env bash
# Issue 4 benchmark: `preflight check` over fixture (a) (8x H100, 8x CX-7)
# with the shipped checklist plus every hardware kind (bench/hardware-a.yaml),
# run RUNS times (default 20); prints each wall time and the median in ms.
# Target: median <= 100 ms.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-20}
cargo build --release --quiet
BIN=target/release/preflight
FIX=fixtures/h100-ib-healthy
args=(check --root "$FIX/root" --checks bench/hardware-a.yaml --format json)
# The fixture's environment only, as a launcher would give it.
mapfile -t envs < <(grep -v '^\s*$' "$FIX/env" || true)
"$BIN" "${args[@]}" >/dev/null || true   # warm the page cache
times=()
for _ in $(seq "$RUNS"); do
  start=$(date +%s%N)
  env -i "${envs[@]}" "$BIN" "${args[@]}" >/dev/null || true
  end=$(date +%s%N)
  times+=($(( (end - start) / 1000 )))
done
sorted=($(printf '%s\n' "${times[@]}" | sort -n))
n=${#sorted[@]}
if (( n % 2 )); then med=${sorted[n/2]}; else med=$(( (sorted[n/2-1] + sorted[n/2]) / 2 )); fi
printf 'runs (ms):'; for t in "${times[@]}"; do printf ' %d.%03d' $((t/1000)) $((t%1000)); done; echo
printf 'min %d.%03d ms, median %d.%03d ms, max %d.%03d ms over %d runs\n' \
  $((sorted[0]/1000)) $((sorted[0]%1000)) $((med/1000)) $((med%1000)) \
  $((sorted[n-1]/1000)) $((sorted[n-1]%1000)) "$n"
checks=$(env -i "${envs[@]}" "$BIN" "${args[@]}" | grep -c '"id":' || true)
echo "checks per run: $checks"

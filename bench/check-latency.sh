#!/usr/bin/env bash
# `preflight check` with the shipped checklist on this machine: median of 20
# runs of the release binary, beside LBNL NHC's typical 0.5 s per node (NHC
# is not packaged for Debian; its figure is the one its authors publish).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/timing.sh
cargo build --release --quiet
bin=target/release/preflight
"$bin" check >/dev/null || true   # warm the page cache once
read -r median min max < <(median_ms 20 "$bin" check)
checks=$("$bin" check --format json | grep -c '"id"')
echo "preflight check ($checks shipped checks), 20 runs: median ${median} ms (min ${min}, max ${max})"
echo "LBNL NHC, typical per node: 500 ms"

#!/usr/bin/env bash
# Issue 37: the rendezvous from 4,096 to 131,072 ranks, each phase, and
# the time per rank, in one table.
#
#   bench/rendezvous-slope.sh [N ...]      (default 4096 16384 65536 131072)
#
# Each size: one real rank 0 (`preflight run`, release build, the shipped
# cluster checks) and N-1 ranks played by preflight-rank-sim in the
# `nodes` layout, 8 ranks per node (each node's leader carries its
# node's check-ins, as torchrun's agents and Slurm's tasks do), the
# simulated nodes spread over one process per 4,096 (each process may hold
# only 20,000 descriptors here). Every simulated node answers its probe
# plan with real probes to the other nodes' real listeners, so the
# simulator does on these two cores what a real cluster's nodes do each on
# their own: its CPU time is printed beside rank 0's.
#
# Columns: check-in = first connection to the last check-in sent; rank 0's
# own phases (its report's `phases`): probes (bounded by its 2 s probe
# deadline), comparisons and report, verdicts sent; total = first
# connection to the last verdict received by a simulated rank; per rank =
# total / N. A run whose ranks do not all get rank 0's verdict fails.
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(4096 16384 65536 131072)
if [[ -n ${BIN:-} ]]; then
    # The tests' build holds it (their dev-dependency turns rank-sim on):
    # no second debug build of the crate, which would also replace theirs.
    cargo test --workspace --no-run --quiet
    sim=target/debug/preflight-rank-sim
    rank0=$(realpath "$BIN")
else
    cargo build --release --quiet --features rank-sim --bins
    sim=target/release/preflight-rank-sim
    rank0=$PWD/target/release/preflight
fi
ulimit -Hn "$(cat /proc/sys/fs/nr_open)" 2>/dev/null || true
ulimit -n "$(ulimit -Hn)"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), open files $(ulimit -n)"
printf '| ranks (nodes) | check-in | rank 0: probes | rank 0: comparisons + report | rank 0: verdicts sent | total | per rank | rank 0 RSS | CPU: rank 0 / simulator |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for n in "${sizes[@]}"; do
    nodes=$(( (n + 7) / 8 ))
    out=$("$sim" --preflight "$rank0" --world "$n" --layout "nodes:$nodes" \
        --root fixtures/h100-ib-healthy/root --timeout "${TIMEOUT:-120s}") || {
        echo "$out" >&2
        echo "rendezvous-slope: $n ranks: the ranks did not all get rank 0's verdict" >&2
        exit 1
    }
    field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$out" | head -1; }
    first=$(sed -n 's/.*first at \([0-9]*\) ms, p50.*/\1/p' <<<"$out")
    last=$(sed -n 's/^verdict: .* last at \([0-9]*\) ms (.*/\1/p' <<<"$out")
    phases=$(sed -n 's/^rank 0: check-ins until \([0-9]*\) ms, probes \([0-9]*\) ms, comparisons and report \([0-9]*\) ms, verdicts sent \([0-9]*\) ms/\1 \2 \3 \4/p' <<<"$out")
    read -r _ probes assemble sends <<<"$phases"
    cpu=$(sed -n 's/^cpu: rank 0 \([0-9.]*\) s, simulator \([0-9.]*\) s.*/\1 s \/ \2 s/p' <<<"$out")
    total=$((last - first))
    printf '| %s (%s) | %s ms | %s ms | %s ms | %s ms | %s ms | %s µs | %s MB | %s |\n' \
        "$n" "$nodes" "$(field checkin_ms)" "$probes" "$assemble" "$sends" "$total" \
        "$(awk -v t="$total" -v n="$n" 'BEGIN {printf "%.0f", t * 1000 / n}')" \
        "$(field rank0_rss_mb)" "$cpu"
done

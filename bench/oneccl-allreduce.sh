#!/usr/bin/env bash
# oneCCL against the built-in TCP backend, side by side in one run: `preflight
# bench --backends tcp,oneccl` with 4 ranks on loopback (node mode), the
# allreduce sweep of both backends (×2 from 8 B to 64 MiB), verified element
# by element as every run is. Prints both tables and the busbw per size.
#
#   bench/oneccl-allreduce.sh [--ranks N] [--max-size 64MiB] [--runs 3]
#
# Every parameter the published figures depend on is pinned here: 2 warm-up
# and 5 timed iterations per size (bench's own defaults are 5 and 20), step
# factor 2. A run that fails, or a backend that does not pass, fails the
# bench (exit 1) after the table.
# The library: PREFLIGHT_ONECCL_LIB, else the test cache that
# tests/setup/collective-libs.sh fills (run it first; it is idempotent).
# preflight adds CCL_YIELD=sched_yield (few cores) and CCL_KVS_IFACE=lo itself
# and reports them; nothing else is set here.
set -euo pipefail
cd "$(dirname "$0")/.."

ranks=4
max=64MiB
runs=3
while [ $# -gt 0 ]; do
    case "$1" in
        --ranks) ranks=$2; shift 2 ;;
        --max-size) max=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done

cache=${PREFLIGHT_LIB_CACHE:-/var/cache/preflight-test-libs}
lib=${PREFLIGHT_ONECCL_LIB:-$cache/oneccl/lib/libccl.so.2}
if [ ! -e "$lib" ]; then
    echo "no oneCCL at $lib: run tests/setup/collective-libs.sh or set PREFLIGHT_ONECCL_LIB" >&2
    exit 1
fi

. bench/binary.sh
bin=$(preflight_bin)
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)," \
    "$(lscpu | sed -n 's/^Model name: *//p' | head -1), kernel $(uname -r); $(date -u +%Y-%m-%d)"
echo "preflight bench --backends tcp,oneccl --nproc-per-node $ranks --max-size $max --step-factor 2 --warmup 2 --iters 5 --oneccl-lib $lib"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq 1 "$runs"); do
    "$bin" bench --backends tcp,oneccl --oneccl-lib "$lib" --nproc-per-node "$ranks" \
        --max-size "$max" --step-factor 2 --warmup 2 --iters 5 --step-timeout 60s --timeout 120s \
        --format json >"$out/run$i.json" || echo "run $i: preflight bench exited $?" >&2
done

python3 - "$out" "$runs" <<'EOF'
import json, sys, statistics
out, runs = sys.argv[1], int(sys.argv[2])
table = {}  # (backend, bytes) -> [busbw...]
init = {}
failed = 0
for i in range(1, runs + 1):
    try:
        with open(f"{out}/run{i}.json") as f:
            r = json.load(f)
    except (OSError, ValueError) as e:
        print(f"run {i}: no report ({e})")
        failed += 1
        continue
    c = r.get("collective") or {}
    for b in c.get("backends", []):
        if b["verdict"] != "pass":
            print(f"run {i}: {b['name']} {b['verdict']}: {b.get('ended') or b.get('reason')}")
            failed += 1
            continue
        init.setdefault(b["name"], []).append(b["init_ms"])
        for row in b["sweep"]:
            if row["op"] == "allreduce":
                table.setdefault((b["name"], row["bytes"]), []).append(row["busbw"])
sizes = sorted({s for (_, s) in table})
print(f"\nallreduce busbw GB/s, median of {runs} runs (init ms: " +
      ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in init.items()) + ")")
print(f"{'size':>10} {'tcp':>8} {'oneccl':>8} {'oneccl/tcp':>11}")
for s in sizes:
    t = table.get(("tcp", s)); o = table.get(("oneccl", s))
    tm = statistics.median(t) if t else float("nan")
    om = statistics.median(o) if o else float("nan")
    ratio = om / tm if t and o and tm > 0 else float("nan")
    print(f"{s:>10} {tm:>8.3f} {om:>8.3f} {ratio:>11.2f}")
if failed or not table:
    print(f"FAILED: {failed} backend runs did not pass")
    sys.exit(1)
EOF

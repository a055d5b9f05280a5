#!/usr/bin/env bash
# 64 MiB allreduce busbw with 4 ranks on loopback, side by side in one run:
# preflight bench (the TCP backend: same-host pairs over Unix sockets, its
# default, and with PREFLIGHT_COLL_SAME_HOST=tcp over loopback TCP), PyTorch
# Gloo (Debian python3-torch), OpenMPI MPI_Allreduce (Debian openmpi-bin, a
# tiny C program compiled here; over TCP, and over its shared-memory
# transport, the same-host peer of preflight's Unix sockets) and iperf3's
# single stream (the path's limit). Figures go into bench/RESULTS.md under
# issue 6.
#
#   bench/collective-allreduce.sh [ROUNDS]     (default 3 rounds of each)
#
# Installs what is missing with apt (python3-torch takes about 90 s).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
# Debian's python3-torch lives with the system Python, not a pyenv shim's.
py=/usr/bin/python3
n=4
bytes=$((64 << 20))
need=()
# mpicc is not enough: openmpi-bin without libopenmpi-dev has no mpi.h.
printf '#include <mpi.h>\n' | mpicc -E -x c - >/dev/null 2>&1 || need+=(openmpi-bin libopenmpi-dev)
command -v iperf3 >/dev/null || need+=(iperf3)
$py -c 'import torch' 2>/dev/null || need+=(python3-torch)
# PEERS=0 (CI's short run): preflight's rows only, nothing to install.
[[ ${PEERS:-1} == 0 ]] && need=()
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y "${need[@]}" >/dev/null
fi
. bench/binary.sh
bin=$(preflight_bin)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)," \
    "$(lscpu | sed -n 's/^Model name: *//p' | head -1), kernel $(uname -r); $(date -u +%Y-%m-%d)"

busbw() { awk -v b="$bytes" -v n="$n" -v s="$1" 'BEGIN { printf "%.3f", b / s / 1e9 * 2 * (n - 1) / n }'; }

# preflight_round direct|unix|tcp: the same-host transport.
preflight_round() {
    local port=$((29600 + RANDOM % 200)) pids=()
    for r in $(seq 0 $((n - 1))); do
        PREFLIGHT_COLL_SAME_HOST=$1 RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port PREFLIGHT_TOKEN=04e4cf50d3c25dce204503d1d8ed04d4 \
            "$bin" bench --backends tcp --max-size 64MiB --iters 5 \
            --format json >"$work/p$r.json" 2>"$work/p$r.err" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
    # A round that failed says why: rank 0's last words, and its verdict.
    python3 -c 'import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("rank 0 wrote no report: %s" % e, file=sys.stderr)
    sys.exit(0)
if not any(x["op"] == "allreduce" and x["bytes"] == 64 << 20 for b in r.get("collective", {}).get("backends", []) for x in b.get("sweep", [])):
    print("rank 0: %s; %s" % (r.get("verdict"), "; ".join(c["id"] + ": " + c.get("message", "") for c in r.get("checks", []) if c.get("status") in ("fail", "error"))[:600]), file=sys.stderr)
' "$work/p0.json" || true
    [ -s "$work/p0.json" ] || tail -3 "$work/p0.err" >&2
    python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
rows = [x for b in r["collective"]["backends"] if b["name"] == "tcp" for x in b["sweep"]
        if x["op"] == "allreduce" and x["bytes"] == 64 << 20]
links = r["collective"].get("links", [])
# The transport every pair used must be the one asked for.
mode = sys.argv[2]
unix = all(len(l["unix_peers"]) == 3 for l in links)
direct = all(len(l.get("direct_peers", [])) == 3 for l in links)
none = all(not l["unix_peers"] and not l.get("direct_peers") for l in links)
ok = len(links) == 4 and {"direct": unix and direct, "unix": unix and not any(l.get("direct_peers") for l in links), "tcp": none}[mode]
print(("%.3f" % rows[0]["busbw"] if rows else "failed") + ("" if ok else "(transport?)"))' "$work/p0.json" "$1"
}

cp bench/gloo_allreduce.py "$work/gloo.py"
gloo_round() {
    local port=$((29800 + RANDOM % 100)) pids=()
    for r in $(seq 0 $((n - 1))); do
        RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port GLOO_SOCKET_IFNAME=lo \
            $py "$work/gloo.py" >"$work/g$r.out" 2>/dev/null &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
    busbw "$(cat "$work/g0.out")"
}

[[ ${PEERS:-1} == 0 ]] || mpicc -O2 -o "$work/mpi" bench/mpi_allreduce.c
mpi_round() {
    # TCP between the ranks, as Gloo and preflight's tcp row.
    busbw "$(mpirun --allow-run-as-root --oversubscribe -np $n --mca btl tcp,self \
        --mca btl_tcp_if_include lo "$work/mpi" 2>/dev/null | tail -1)"
}
mpi_sm_round() {
    # OpenMPI's same-host transport (vader: shared memory, single-copy
    # through CMA where the kernel allows it).
    busbw "$(mpirun --allow-run-as-root --oversubscribe -np $n --mca btl vader,self \
        "$work/mpi" 2>/dev/null | tail -1)"
}

iperf_round() {
    iperf3 -s -1 -p 5299 -B 127.0.0.1 >/dev/null 2>&1 &
    sleep 0.3
    iperf3 -c 127.0.0.1 -p 5299 -t 3 -J 2>/dev/null |
        python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e9))'
}

# Every round runs each contender once, so a busy minute on this shared
# machine weighs on all of them alike.
labels=("preflight bench (direct, default)" "preflight bench (unix)" "preflight bench (tcp)"
    "PyTorch Gloo" "OpenMPI MPI_Allreduce (tcp)" "OpenMPI MPI_Allreduce (vader, shm)" "iperf3 single stream")
runs=("preflight_round direct" "preflight_round unix" "preflight_round tcp"
    gloo_round mpi_round mpi_sm_round iperf_round)
source bench/rounds.sh
rounds_table "$rounds"

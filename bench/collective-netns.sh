#!/usr/bin/env bash
# 64 MiB allreduce busbw with 4 ranks across 4 namespace hosts on a bridge
# (one rank per host, GLOO_SOCKET_IFNAME=eth0): preflight bench (TCP
# backend), PyTorch Gloo, and iperf3 one stream host 0 -> host 1. OpenMPI
# across namespaces needs an ssh agent per host (see the test-hosts
# reference) and is not in this script. Needs root.
#
#   bench/collective-netns.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
n=4
bytes=$((64 << 20))
py=/usr/bin/python3
tag=pc$$
br=${tag}br
net=10.231.77
cargo build --release -q
bin=$PWD/target/release/preflight
work=$(mktemp -d)
cleanup() {
    for i in $(seq 0 $((n - 1))); do ip netns del "${tag}_$i" 2>/dev/null || true; done
    ip link del "$br" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
ip link add "$br" type bridge && ip link set "$br" up
ip addr add $net.254/24 dev "$br"
for i in $(seq 0 $((n - 1))); do
    ns=${tag}_$i
    ip netns add "$ns"
    ip link add "v${tag}$i" type veth peer name eth0 netns "$ns"
    ip link set "v${tag}$i" master "$br" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add $net.$((i + 1))/24 dev eth0
    ip -n "$ns" link set eth0 up
done
echo "machine: $(nproc) cores, kernel $(uname -r); $(date -u +%Y-%m-%d); 4 namespace hosts on a bridge"
busbw() { awk -v b="$bytes" -v n="$n" -v s="$1" 'BEGIN { if (s > 0) printf "%.3f", b / s / 1e9 * 2 * (n - 1) / n; else printf "failed" }'; }

preflight_round() {
    local port=$((29600 + RANDOM % 200)) pids=()
    for r in $(seq 0 $((n - 1))); do
        ip netns exec "${tag}_$r" env RANK=$r WORLD_SIZE=$n MASTER_ADDR=$net.1 MASTER_PORT=$port \
            PREFLIGHT_TOKEN=bench GLOO_SOCKET_IFNAME=eth0 \
            "$bin" bench --backends tcp --max-size 64MiB --iters 5 --format json >"$work/p$r.json" 2>/dev/null &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
    python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
rows = [x for b in r["collective"]["backends"] if b["name"] == "tcp" for x in b["sweep"]
        if x["op"] == "allreduce" and x["bytes"] == 64 << 20]
print("%.3f" % rows[0]["busbw"] if rows else "failed")' "$work/p0.json"
}

cp bench/gloo_allreduce.py "$work/gloo.py"
gloo_round() {
    local port=$((29800 + RANDOM % 100)) pids=()
    for r in $(seq 0 $((n - 1))); do
        ip netns exec "${tag}_$r" env RANK=$r WORLD_SIZE=$n MASTER_ADDR=$net.1 MASTER_PORT=$port \
            GLOO_SOCKET_IFNAME=eth0 $py "$work/gloo.py" >"$work/g$r.out" 2>/dev/null &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
    busbw "$(cat "$work/g0.out" 2>/dev/null || echo 0)"
}

iperf_round() {
    ip netns exec "${tag}_1" iperf3 -s -1 -p 5299 -B $net.2 >/dev/null 2>&1 &
    sleep 0.3
    ip netns exec "${tag}_0" iperf3 -c $net.2 -p 5299 -t 3 -J 2>/dev/null |
        python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e9))'
}

printf "%-28s" "preflight bench (tcp)"; for _ in $(seq "$rounds"); do printf " %s" "$(preflight_round)"; done; echo " GB/s busbw"
printf "%-28s" "PyTorch Gloo"; for _ in $(seq "$rounds"); do printf " %s" "$(gloo_round)"; done; echo " GB/s busbw"
printf "%-28s" "iperf3 single stream"; for _ in $(seq "$rounds"); do printf " %s" "$(iperf_round)"; done; echo " GB/s"

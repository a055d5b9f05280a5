#!/usr/bin/env bash
# Verdicts under slowness, counted (issue "slow is not broken"), on
# namespace hosts on a bridge, each with its own hostname (hN), one rank
# per host, `preflight run` with its defaults and the cluster checks:
#   soak     ROUNDS_HEALTHY healthy rounds of 3 hosts while 2 busy loops
#            per core run on the machine: every verdict must be READY with
#            no straggler, slow link, slow step or silent node named.
#   starved  ROUNDS_STARVED rounds of 3 hosts, then of 4, with h2's rank
#            held to 1 % of a CPU by a cgroup: every round must name h2,
#            and only h2, as the straggler.
# Prints each count; exits 1 when any verdict was wrong, so that CI's
# short run (bench/ci.sh) catches a regression. Needs root (namespaces,
# cgroups).
#
#   bench/slowness.sh                              (50 and 20 rounds)
#   ROUNDS_HEALTHY=3 ROUNDS_STARVED=2 bench/slowness.sh
set -euo pipefail
cd "$(dirname "$0")/.."
healthy_rounds=${ROUNDS_HEALTHY:-50}
starved_rounds=${ROUNDS_STARVED:-20}
n=4
tag=ps$$
br=${tag}br
net=10.231.79
. bench/binary.sh
bin=$(preflight_bin)
work=$(mktemp -d)
loops=()
cg=
cleanup() {
    for p in "${loops[@]}"; do kill "$p" 2>/dev/null || true; done
    for i in $(seq 0 $((n - 1))); do ip netns del "${tag}_$i" 2>/dev/null || true; done
    ip link del "$br" 2>/dev/null || true
    [[ -n $cg ]] && rmdir "$cg" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
ip link add "$br" type bridge && ip link set "$br" up
for i in $(seq 0 $((n - 1))); do
    ns=${tag}_$i
    ip netns add "$ns"
    ip link add "v${tag}$i" type veth peer name eth0 netns "$ns"
    ip link set "v${tag}$i" master "$br" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add $net.$((i + 1))/24 dev eth0
    ip -n "$ns" link set eth0 up
    printf '127.0.0.1 localhost\n' >"$work/hosts$i"
done
for i in $(seq 0 $((n - 1))); do
    for j in $(seq 0 $((n - 1))); do echo "$net.$((j + 1)) h$j" >>"$work/hosts$i"; done
done

# A cgroup held to 1 % of one CPU (v2 cpu.max, else v1's CFS quota).
if grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    echo +cpu >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    cg=/sys/fs/cgroup/$tag
    mkdir "$cg" && echo "1000 100000" >"$cg/cpu.max"
elif [[ -e /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]]; then
    cg=/sys/fs/cgroup/cpu/$tag
    mkdir "$cg" && echo 100000 >"$cg/cpu.cfs_period_us" && echo 1000 >"$cg/cpu.cfs_quota_us"
else
    echo "bench/slowness.sh: no cgroup CPU controller to hold a rank with" >&2
    exit 1
fi

echo "machine: $(nproc) cores, kernel $(uname -r); $(date -u +%Y-%m-%d); namespace hosts on a bridge"

# One run of `hosts` ranks; rank `held` (or none) starts in the cgroup.
# Prints the verdict line: "exit codes; straggler ranks; findings".
one_run() {
    local hosts=$1 held=$2 port=$((29600 + RANDOM % 300)) pids=() r
    for r in $(seq 0 $((hosts - 1))); do
        ip netns exec "${tag}_$r" unshare --uts --mount sh -c \
            'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"' sh "h$r" "$work/hosts$r" \
            env RANK=$r WORLD_SIZE=$hosts LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=h0 MASTER_PORT=$port \
            PREFLIGHT_TOKEN=04e4cf50d3c25dce204503d1d8ed04d4 \
            "$bin" run --no-shipped --checks checks/cluster.yaml --timeout 60s --format json \
            >"$work/r$r.json" 2>"$work/r$r.err" &
        pids+=($!)
        if [[ $r == "$held" ]]; then echo "$!" >"$cg/cgroup.procs"; fi
    done
    local codes=()
    for p in "${pids[@]}"; do
        wait "$p" && codes+=(0) || codes+=($?)
    done
    python3 - "$work/r0.json" "${codes[*]}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c = r.get("collective") or {}
warned = [x["id"] + ": " + x["message"] for x in r["checks"] if x["status"] != "pass" and x["status"] != "skip"]
print("codes %s; stragglers %s; %s" % (sys.argv[2].replace(" ", ","), c.get("straggler_ranks", []),
      " | ".join(warned) if warned else "no finding"))
PY
}

wrong=0
start=$SECONDS
for l in $(seq $(($(nproc) * 2))); do
    (while :; do :; done) &
    loops+=($!)
done
bad=0
for k in $(seq "$healthy_rounds"); do
    line=$(one_run 3 none)
    if [[ $line != "codes 0,0,0; stragglers []; no finding" ]]; then
        bad=$((bad + 1))
        echo "healthy round $k: $line" >&2
    fi
done
for p in "${loops[@]}"; do kill "$p" 2>/dev/null || true; done
loops=()
echo "soak: $healthy_rounds healthy rounds of 3 hosts under $(($(nproc) * 2)) busy loops: $bad wrong verdicts ($((SECONDS - start)) s)"
wrong=$((wrong + bad))
for hosts in 3 4; do
    start=$SECONDS
    bad=0
    for k in $(seq "$starved_rounds"); do
        line=$(one_run "$hosts" 2)
        # h2 named, and no other rank or node (as the tests hold it:
        # tests/collective/netns.rs); the run is READY with the warning.
        zeros=$(printf '0,%.0s' $(seq "$hosts"))
        others=0
        for o in $(seq 0 $((hosts - 1))); do
            [[ $o != 2 && ($line == *"node h$o"* || $line == *"(h$o "*) ]] && others=1
        done
        if [[ $others == 1 || $line != "codes ${zeros%,}; stragglers [2]; "*"collective.stragglers: node h2 (rank 2) is starved of CPU"* ]]; then
            bad=$((bad + 1))
            echo "starved round $k of $hosts hosts: $line" >&2
        fi
    done
    echo "starved: $starved_rounds rounds of $hosts hosts, h2 held to 1 % of a CPU: $((starved_rounds - bad)) named h2 alone, $bad wrong ($((SECONDS - start)) s)"
    wrong=$((wrong + bad))
done
if ((wrong)); then
    echo "FAILED: $wrong wrong verdicts" >&2
    exit 1
fi

#!/usr/bin/env bash
# 64 MiB allreduce busbw with 4 ranks across 4 namespace hosts on a bridge
# (one rank per host, GLOO_SOCKET_IFNAME=eth0): preflight bench (TCP
# backend: different network namespaces never use its same-host Unix
# sockets), PyTorch Gloo, OpenMPI MPI_Allreduce (mpirun from the root
# namespace, one sshd per namespace host as its launch agent, btl tcp on
# the bridge's subnet), iperf3 one stream host 0 -> host 1, and iperf3's
# ring: four streams at once, host i -> host i+1, the allreduce ring's
# traffic on the same two cores. The ring's aggregate / 4 is the busbw a
# 4-rank ring allreduce would reach if moving bytes were all it did
# (6 segments of S/4 cross the ring per S allreduced, busbw = 1.5 S / t).
# iperf3 reuses one cache-hot buffer, so this ceiling is above what any
# allreduce over 64 MiB buffers can reach. Needs root;
# installs openssh-server, openmpi-bin, python3-torch, iperf3 if missing.
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
need=()
# mpicc is not enough: openmpi-bin without libopenmpi-dev has no mpi.h.
printf '#include <mpi.h>\n' | mpicc -E -x c - >/dev/null 2>&1 || need+=(openmpi-bin libopenmpi-dev)
command -v iperf3 >/dev/null || need+=(iperf3)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
$py -c 'import torch' 2>/dev/null || need+=(python3-torch)
# PEERS=0 (CI's short run): preflight's rows only, nothing to install.
[[ ${PEERS:-1} == 0 ]] && need=()
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y "${need[@]}" >/dev/null
fi
. bench/binary.sh
bin=$(preflight_bin)
work=$(mktemp -d)
sshd_pids=()
cleanup() {
    for p in "${sshd_pids[@]}"; do kill "$p" 2>/dev/null || true; done
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
# One sshd per namespace host: OpenMPI's launch agent.
mkdir -p /run/sshd
ssh-keygen -q -t ed25519 -N '' -f "$work/hostkey"
ssh-keygen -q -t ed25519 -N '' -f "$work/id"
cp "$work/id.pub" "$work/authorized_keys"
cat >"$work/ssh_config" <<CONF
Host *
  User root
  IdentityFile $work/id
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
CONF
for i in $(seq 0 $((n - 1))); do
    cat >"$work/sshd$i.conf" <<CONF
ListenAddress $net.$((i + 1)):22
HostKey $work/hostkey
PidFile $work/sshd$i.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
AuthorizedKeysFile $work/authorized_keys
StrictModes no
UsePAM no
UseDNS no
CONF
    ip netns exec "${tag}_$i" /usr/sbin/sshd -D -f "$work/sshd$i.conf" -E "$work/sshd$i.log" &
    sshd_pids+=($!)
done
echo "machine: $(nproc) cores, kernel $(uname -r); $(date -u +%Y-%m-%d); 4 namespace hosts on a bridge"
busbw() { awk -v b="$bytes" -v n="$n" -v s="$1" 'BEGIN { if (s > 0) printf "%.3f", b / s / 1e9 * 2 * (n - 1) / n; else printf "failed" }'; }

preflight_round() {
    local port=$((29600 + RANDOM % 200)) pids=()
    for r in $(seq 0 $((n - 1))); do
        ip netns exec "${tag}_$r" env RANK=$r WORLD_SIZE=$n MASTER_ADDR=$net.1 MASTER_PORT=$port \
            PREFLIGHT_TOKEN=04e4cf50d3c25dce204503d1d8ed04d4 GLOO_SOCKET_IFNAME=eth0 \
            "$bin" bench --backends tcp --max-size 64MiB --iters 5 --format json >"$work/p$r.json" 2>/dev/null &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
    python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
rows = [x for b in r["collective"]["backends"] if b["name"] == "tcp" for x in b["sweep"]
        if x["op"] == "allreduce" and x["bytes"] == 64 << 20]
links = r["collective"].get("links", [])
# Namespace hosts are different hosts: every pair must have used TCP.
ok = len(links) == 4 and all(not l["unix_peers"] and not l.get("direct_peers") for l in links)
print(("%.3f" % rows[0]["busbw"] if rows else "failed") + ("" if ok else "(transport?)"))' "$work/p0.json"
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

[[ ${PEERS:-1} == 0 ]] || mpicc -O2 -o "$work/mpi" bench/mpi_allreduce.c
hosts=$(for i in $(seq 0 $((n - 1))); do echo "$net.$((i + 1)):1"; done | paste -sd,)
mpi_round() {
    # One rank per namespace host, started by each host's sshd; the data
    # path is TCP over the bridge, as for the others.
    busbw "$(timeout 120 mpirun --allow-run-as-root -np $n --host "$hosts" \
        --mca plm_rsh_agent "ssh -F $work/ssh_config" --mca btl tcp,self \
        --mca btl_tcp_if_include $net.0/24 --mca oob_tcp_if_include $net.0/24 \
        "$work/mpi" 2>"$work/mpi.err" | tail -1 || echo 0)"
}

iperf_round() {
    ip netns exec "${tag}_1" iperf3 -s -1 -p 5299 -B $net.2 >/dev/null 2>&1 &
    sleep 0.3
    ip netns exec "${tag}_0" iperf3 -c $net.2 -p 5299 -t 3 -J 2>/dev/null |
        python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e9))'
}

iperf_ring_round() {
    local i pids=()
    for i in $(seq 0 $((n - 1))); do
        ip netns exec "${tag}_$i" iperf3 -s -1 -p 5300 -B $net.$((i + 1)) >/dev/null 2>&1 &
        pids+=($!)
    done
    sleep 0.3
    for i in $(seq 0 $((n - 1))); do
        ip netns exec "${tag}_$i" iperf3 -c $net.$(((i + 1) % n + 1)) -p 5300 -t 3 -J \
            >"$work/ring$i.json" 2>/dev/null &
        pids+=($!)
    done
    # Not a bare wait: the sshds run in the background too.
    for i in "${pids[@]}"; do wait "$i" || true; done
    python3 -c '
import json, sys
total = sum(json.load(open(f))["end"]["sum_received"]["bits_per_second"] / 8e9 for f in sys.argv[1:])
print("%.3f" % (total / 4))' "$work"/ring*.json 2>/dev/null || echo failed
}

labels=("preflight bench (tcp)" "PyTorch Gloo" "OpenMPI MPI_Allreduce (tcp)" "iperf3 single stream"
    "iperf3 ring of 4 (aggregate / 4)")
runs=(preflight_round gloo_round mpi_round iperf_round iperf_ring_round)
source bench/rounds.sh
rounds_table "$rounds"

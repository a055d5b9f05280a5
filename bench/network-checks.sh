#!/usr/bin/env bash
# Cost of the network and env checks (issue 3) in `preflight check`: the
# median wall time of N runs of the shipped checklist with them, and with
# them left out by id (--skip), in two environments: a bare shell (most
# network checks skip: no MASTER_ADDR) and a job's environment (all run).
#
# usage: bench/network-checks.sh [RUNS]   (default 20, or RUNS; builds --release)
# Ready or not ready (exit 0 or 1) is a fair outcome on this machine; any
# other exit fails the bench rather than being timed.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-${RUNS:-20}}
export BENCH_OK_EXIT="0 1"
. bench/binary.sh
bin=$(preflight_bin)

# The checks this issue ships.
ids=(net.hostname net.master_route net.master_port_free net.rendezvous_ports_free
     net.firewall env.lint env.nccl_ib_disable launch.env)
skip=()
for id in "${ids[@]}"; do skip+=(--skip "$id"); done

job_env=(MASTER_ADDR=127.0.0.1 MASTER_PORT=29400 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0
         LOCAL_WORLD_SIZE=1 NCCL_SOCKET_IFNAME=lo GLOO_SOCKET_IFNAME=lo NCCL_DEBUG=WARN
         NCCL_IB_HCA=^mlx5_9 CUDA_VISIBLE_DEVICES=0)

. bench/timing.sh
# Median wall time in ms of `$@`, after one warm-up run (which must
# end as the timed ones may).
median() {
  median_ms 1 "$@" >/dev/null
  local out
  out=$(median_ms "$runs" "$@")
  echo "${out%% *}"
}

bare_with=$(median env -i PATH="$PATH" "$bin" check --format json)
bare_without=$(median env -i PATH="$PATH" "$bin" check --format json "${skip[@]}")
job_with=$(median env -i PATH="$PATH" "${job_env[@]}" "$bin" check --format json)
job_without=$(median env -i PATH="$PATH" "${job_env[@]}" "$bin" check --format json "${skip[@]}")

echo "runs per figure: $runs"
echo "bare environment: with ${bare_with} ms, without ${bare_without} ms, added $(awk "BEGIN {printf \"%.1f\", $bare_with - $bare_without}") ms"
echo "job environment:  with ${job_with} ms, without ${job_without} ms, added $(awk "BEGIN {printf \"%.1f\", $job_with - $job_without}") ms"

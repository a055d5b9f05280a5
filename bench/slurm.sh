#!/usr/bin/env bash
# Issue 22: `preflight slurm healthcheck` beside LBNL NHC on the same node
# (a real Slurm 22.05 cluster in network namespaces, as tests/services/slurm.rs
# builds it), and sbatch to the job's first line with the prolog's cluster
# stage on and off (3 nodes). Installs Slurm and munge when missing.
# NHC is not packaged for Debian: NHC_DIR names its source tree (a clone
# of github.com/mej/nhc; its scripts run from there); without it, only
# preflight's side is measured.
set -euo pipefail
cd "$(dirname "$0")/.."
# RUNS health checks (20) and JOBS sbatch jobs each way (10; each waits
# about 3 s on slurmctld's scheduling, which CI's short run need not).
export PREFLIGHT_BENCH_RUNS=${RUNS:-20} PREFLIGHT_BENCH_JOBS=${JOBS:-10}
for n in "$PREFLIGHT_BENCH_RUNS" "$PREFLIGHT_BENCH_JOBS"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench/slurm.sh: RUNS and JOBS are counts (1 or more): $n" >&2; exit 2; }
done
for p in slurmctld slurmd slurm-client munge; do
    dpkg -s "$p" >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$p" >/dev/null
done
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), $(date -u +%Y-%m-%d); $(slurmctld -V)"
if [[ -n "${NHC_DIR:-}" ]]; then
    chmod +x "$NHC_DIR"/nhc "$NHC_DIR"/helpers/* 2>/dev/null || true
fi
# PROFILE=dev (CI's short run) reuses the test build instead of a release one.
profile=(--release)
[[ ${PROFILE:-release} == dev ]] && profile=()
cargo test "${profile[@]}" --quiet --test services -- --ignored --nocapture slurm::bench_healthcheck_beside_nhc 2>&1 \
    | grep -E "^(preflight|LBNL|sbatch|the prolog)"

#!/usr/bin/env bash
# Issue 5: the cluster stage side by side with PyTorch's Gloo rendezvous, in
# one run, on loopback.
#  1. healthy: 4 ranks of `preflight run` (shipped checklist, release build)
#     versus 4 Python processes doing init_process_group("gloo") and one
#     allreduce; wall time from start to the last rank's exit.
#  2. one rank missing: 3 of 4 ranks, `--timeout 10s` versus timeout=10 s;
#     time to the verdict, and what each names.
# Installs Debian's python3-torch when it is missing (about 90 s). The torch
# side runs on each torch: Debian's 1.13, and the current torch in
# PREFLIGHT_TORCH_VENV (default /opt/preflight-torch) where it is installed.
# RUNS (default 10) and TORCH_RUNS (3) set the repetitions; PEERS=0 leaves
# torch out (CI's short run). A run whose ranks do not end as the case
# expects (0 healthy, 1 with a rank missing) fails the bench, never timed.
# Both sides get the system PATH, as on a cluster node: a developer's pyenv
# shim on PATH costs about 0.14 s per python3 start, and preflight's NCCL
# probe asks python3 for its site-packages (where pip's torch keeps NCCL).
# The healthy case is one node with 4 local ranks (LOCAL_WORLD_SIZE=4); the
# missing-rank case is 4 nodes of one rank each (SLURM_JOB_NODELIST), so the
# missing rank's host can be named.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
peers=${PEERS:-1}
if [[ $peers == 1 ]] && ! $PY -c 'import torch' 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch >/dev/null
fi
. bench/binary.sh
bin=$(preflight_bin)
runs=${RUNS:-10}
torch_runs=${TORCH_RUNS:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
median() { sort -n | awk '{t[NR]=$1} END {m=(NR%2)?t[(NR+1)/2]:(t[NR/2]+t[NR/2+1])/2; printf "%d %d %d\n", m, t[1], t[NR]}'; }

# $1: command (preflight|torch), $2: ranks to start (e.g. "0 1 2 3"), $3: world size,
# $4: the port (picked before the clock starts: a python3 start is ~20 ms),
# $5: the exit every rank must end with (preflight; torch's are printed)
sys_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
job() {
    local kind=$1 ranks=$2 world=$3 port=$4 want=${5:-0} pids=() r layout code
    for r in $ranks; do
        if [[ ${LAYOUT:-one-node} == one-node ]]; then
            layout="LOCAL_RANK=$r LOCAL_WORLD_SIZE=$world"
        else
            layout="SLURM_JOB_NODELIST=node[1-$world] LOCAL_RANK=0 LOCAL_WORLD_SIZE=1"
        fi
        if [[ $kind == preflight ]]; then
            env -i PATH="$sys_path" RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
                PREFLIGHT_TOKEN=04e4cf50d3c25dce204503d1d8ed04d4 $layout \
                "$bin" run --timeout "${TIMEOUT:-60s}" >"$out/$kind.$r" 2>&1 &
        else
            env -i PATH="$sys_path" RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
                BENCH_TIMEOUT_S="${TIMEOUT_S:-1800}" $PY bench/torch_gloo.py >"$out/$kind.$r" 2>&1 &
        fi
        pids+=($!)
    done
    r=0
    for p in "${pids[@]}"; do
        code=0
        wait "$p" || code=$?
        if [[ $kind == preflight && $code != "$want" ]]; then
            echo "failed: preflight rank $r exited $code, expected $want:" >&2
            tail -5 "$out/$kind.$r" >&2
            return 1
        fi
        r=$((r + 1))
    done
}

timed() { local s e; s=$(now_ms); "$@" || return 1; e=$(now_ms); echo $((e - s)); }

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), $(date -u +%Y-%m-%d)"
torch_pys=("$PY")
venv=${PREFLIGHT_TORCH_VENV:-/opt/preflight-torch}
[[ -x $venv/bin/python ]] && "$venv/bin/python" -c 'import torch' 2>/dev/null && torch_pys+=("$venv/bin/python")

"$bin" check >/dev/null 2>&1 || true  # warm the page cache (its verdict is not the bench's)
for ((i = 0; i < runs; i++)); do timed job preflight "0 1 2 3" 4 "$(free_port)"; done >"$out/p.raw"
median <"$out/p.raw" >"$out/p"
read -r p_med p_min p_max <"$out/p"
echo "healthy, preflight run, 4 ranks, $runs runs: median ${p_med} ms (min ${p_min}, max ${p_max}); rank 0: $(tail -1 "$out/preflight.0")"
grep -E "^ *(WARN|FAIL)" "$out/preflight.0" | sed 's/^ */  rank 0: /' || true
if [[ $peers == 1 ]]; then
    for PY in "${torch_pys[@]}"; do
        version=$($PY -c 'import torch; print(torch.__version__)' 2>/dev/null)
        for ((i = 0; i < torch_runs; i++)); do timed job torch "0 1 2 3" 4 "$(free_port)"; done >"$out/t.raw"
        median <"$out/t.raw" >"$out/t"
        read -r t_med t_min t_max <"$out/t"
        echo "healthy, torch $version gloo init + allreduce, 4 ranks, $torch_runs runs: median ${t_med} ms (min ${t_min}, max ${t_max}); rank 0: $(cat "$out/torch.0")"
        echo "speedup over torch $version: $(awk -v a="$t_med" -v b="$p_med" 'BEGIN {printf "%.1f", a / b}')x"
    done
    PY=/usr/bin/python3
fi

ms=$(LAYOUT=nodes TIMEOUT=10s timed job preflight "0 1 2" 4 "$(free_port)" 1)
echo "rank 3 missing, preflight --timeout 10s: verdict after ${ms} ms on every rank"
grep -h "cluster.barrier:" "$out/preflight.0" | head -1 | sed 's/^ */  rank 0 says: /'
echo "  rank 1 says: $(tail -1 "$out/preflight.1")"
if [[ $peers == 1 ]]; then
    for PY in "${torch_pys[@]}"; do
        version=$($PY -c 'import torch; print(torch.__version__)' 2>/dev/null)
        ms=$(LAYOUT=nodes TIMEOUT_S=10 timed job torch "0 1 2" 4 "$(free_port)")
        echo "rank 3 missing, torch $version timeout=10 s: exit after ${ms} ms"
        for r in 0 1 2; do echo "  $(cat "$out/torch.$r")"; done
    done
    PY=/usr/bin/python3
fi

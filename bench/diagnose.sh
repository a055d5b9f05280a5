#!/usr/bin/env bash
# `preflight diagnose` on a node of 4 hung ranks, on each torch (Debian's
# python3-torch 1.13, and the current torch in PREFLIGHT_TORCH_VENV where
# it is installed): a real torch job (Gloo) under torchrun, rank 2 stopped
# before an all_reduce and the others waiting in it; median of RUNS
# (default 10) runs at diagnose's defaults (a 2 s watch window, which a
# job that stands still waits out), without py-spy and with it, beside
# what an operator does by hand: py-spy dump of each of the 4 ranks, one
# after the other. The goal: 3 s a diagnosis. Each diagnose run must
# name rank 2 (exit 1).
#
#   bench/diagnose.sh            (PY_SPY: py-spy's path; else PREFLIGHT_PY_SPY,
#                                 else the py-spy rows are left out)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/timing.sh
RUNS=${RUNS:-10}
. bench/binary.sh
bin=$(preflight_bin)
py_spy=${PY_SPY:-${PREFLIGHT_PY_SPY:-}}
[[ -n $py_spy && -x $py_spy ]] || py_spy=
work=$(mktemp -d)
chmod 777 "$work"
job=
cleanup() {
    [[ -n $job ]] && kill -KILL -- "-$job" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
torches=(/usr/bin/torchrun)
venv=${PREFLIGHT_TORCH_VENV:-/opt/preflight-torch}
[[ -x $venv/bin/torchrun ]] && torches+=("$venv/bin/torchrun")
echo "machine: $(nproc) cores; $(date -u +%Y-%m-%d); 4 torch ranks (Gloo) under torchrun, rank 2 stopped"
for torchrun in "${torches[@]}"; do
python=$(dirname "$torchrun")/python3
[[ $torchrun == /usr/bin/torchrun ]] && python=/usr/bin/python3
version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null)
rm -f "$work/marker"
port=$((20000 + RANDOM % 5000))
setsid env JOB_MODE=stop JOB_RANK=2 JOB_MARKER="$work/marker" JOB_SECONDS=600 OMP_NUM_THREADS=1 \
    "$torchrun" --nproc_per_node 4 --master_port "$port" --redirects 1 --tee 1 \
    --log_dir "$work/logs" tests/services/torch_distributed/job.py >/dev/null 2>&1 &
job=$!
# Killed at the end of its turn: not one of this shell's jobs to report.
disown "$job"
for _ in $(seq 900); do [[ -e $work/marker ]] && break; sleep 0.1; done
[[ -e $work/marker ]] || { echo "the job never reached its mark" >&2; exit 1; }
pid=$(cat "$work/marker")
# Until the three others wait (diagnose names rank 2 and exits 1).
for _ in $(seq 100); do
    code=0; "$bin" diagnose --pid "$pid" --py-spy off >/dev/null 2>&1 || code=$?
    [[ $code == 1 ]] && break
done
[[ $code == 1 ]] || { echo "diagnose never named the stopped rank" >&2; exit 1; }
export BENCH_OK_EXIT=1
out=$(median_ms "$RUNS" "$bin" diagnose --pid "$pid" --py-spy off)
read -r median min max <<<"$out"
echo "torch $version: preflight diagnose, no py-spy, $RUNS runs: median ${median} ms (min ${min}, max ${max}); goal 3000 ms"
if [[ -n $py_spy ]]; then
    out=$(median_ms "$RUNS" "$bin" diagnose --pid "$pid" --py-spy "$py_spy")
    read -r median min max <<<"$out"
    echo "torch $version: preflight diagnose, with py-spy, $RUNS runs: median ${median} ms (min ${min}, max ${max}); goal 3000 ms"
    ranks=$(pgrep -f "tests/services/torch_distributed/job.py" | grep -vx "$job" | head -8 | tr '\n' ' ')
    by_hand() { for p in $ranks; do "$py_spy" dump --pid "$p" >/dev/null 2>&1 || true; done; }
    export BENCH_OK_EXIT=0
    out=$(median_ms "$RUNS" by_hand)
    read -r median min max <<<"$out"
    echo "torch $version: by hand: py-spy dump of each rank in turn, $RUNS runs: median ${median} ms (min ${min}, max ${max})"
else
    echo "(py-spy not found: PY_SPY or PREFLIGHT_PY_SPY; its rows left out)"
fi
kill -KILL -- "-$job" 2>/dev/null || true
job=
done

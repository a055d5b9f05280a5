#!/usr/bin/env bash
# The preflight NCCL backend for real on one machine with NVIDIA GPUs: node
# mode with one rank per GPU (--nproc-per-node auto), every rank's worker
# driving its GPU through nccl-sys.
#
#   tests/gpu/nccl-bench.sh [--max-size 256MiB] [--step-timeout 20s]
#
# 1. bench: `preflight bench --backends nccl --nproc-per-node auto`: the
#    five operations verified element by element (allreduce, broadcast,
#    allgather, send/recv, barrier; f32 and i32), then the sweep (allreduce,
#    allgather, broadcast from 8 B to --max-size) with busbw, and the note
#    naming the network NCCL chose (NET/IB or NET/Socket). NCCL is required
#    here, so a GPU or NCCL that does not work fails the script.
# 2. abort: the same with PREFLIGHT_TEST_COLL_HANG=1:1048576, so rank 1 stops
#    taking part above 1 MiB. Every other rank must end that step itself at
#    the step deadline with ncclCommAbort (its worker says so in the
#    backend's log, which the report keeps), and the report must name rank 1.
#    Needs 2 GPUs or more; skipped with one.
#
# Exit 0: both passed; 1: a failure (the log says which); 2: nothing to test
# here (no GPU, no cargo and no PREFLIGHT_BIN). The human report and every
# check's outcome go to ${NCCL_BENCH_LOG:-target/nccl-bench.log}, the JSON
# reports beside it (nccl-bench.json, nccl-abort.json), for bench/RESULTS.md.
# The bench runs twice (human, then JSON): the sweep is short on GPUs.
#
# Env: PREFLIGHT_BIN (a prebuilt preflight, built with `--features
# test-hooks` for the hang test: it links neither CUDA nor NCCL,
# so one built elsewhere runs here), PREFLIGHT_NCCL_LIB (else the loader,
# then Python's site-packages, then the test cache of
# tests/setup/collective-libs.sh). Leave NCCL_DEBUG unset to get the
# transport note: preflight then sets NCCL_DEBUG=INFO with a debug file of
# its own.
set -euo pipefail
cd "$(dirname "$0")/../.."

max_size=256MiB
step_timeout=20s
while [ $# -gt 0 ]; do
    case $1 in
    --max-size) max_size=$2; shift 2 ;;
    --step-timeout) step_timeout=$2; shift 2 ;;
    *) echo "nccl-bench.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

log=${NCCL_BENCH_LOG:-target/nccl-bench.log}
dir=$(dirname "$log")
mkdir -p "$dir"
: >"$log"
say() { echo "$*" | tee -a "$log"; }

if ! command -v nvidia-smi >/dev/null 2>&1; then
    say "skip: nvidia-smi not found: not an NVIDIA GPU machine"
    exit 2
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${gpus:-0}" -lt 1 ]; then
    say "skip: nvidia-smi lists no GPU"
    exit 2
fi

cache=${PREFLIGHT_LIB_CACHE:-/var/cache/preflight-test-libs}
if [ -z "${PREFLIGHT_NCCL_LIB:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 ' &&
    [ -e "$cache/nccl/lib/libnccl.so.2" ]; then
    export PREFLIGHT_NCCL_LIB=$cache/nccl/lib/libnccl.so.2
fi

bin=${PREFLIGHT_BIN:-}
if [ -z "$bin" ]; then
    if ! command -v cargo >/dev/null 2>&1; then
        say "skip: no cargo to build preflight; set PREFLIGHT_BIN to a prebuilt binary"
        exit 2
    fi
    cargo build --release -q --bin preflight --features test-hooks
    bin=target/release/preflight
fi
if [ ! -x "$bin" ]; then
    say "skip: $bin is not an executable"
    exit 2
fi

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(hostname), $(nproc) cores, kernel $(uname -r)"
    echo "preflight: $("$bin" --version 2>&1)"
    echo "PREFLIGHT_NCCL_LIB: ${PREFLIGHT_NCCL_LIB:-(unset: the search decides)}"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /'
    if [ -d /sys/class/infiniband ]; then
        for p in /sys/class/infiniband/*/ports/*; do
            [ -e "$p/state" ] && echo "rdma: ${p#/sys/class/infiniband/} $(cat "$p/state") $(cat "$p/link_layer" 2>/dev/null)"
        done
    fi
} | tee -a "$log"

# The one-rank-per-GPU runs share a port; a fixed free one avoids clashes
# with a job already on 29400.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo 29517)
common=(bench --backends nccl --nproc-per-node auto --master-port "$port" --color never
    --step-timeout "$step_timeout" --timeout 600s)

failed=0
check() { # check NAME CONDITION-TEXT COMMAND...
    local name=$1 what=$2
    shift 2
    if "$@"; then
        say "ok:   $name: $what"
    else
        say "FAIL: $name: $what"
        failed=1
    fi
}

# --- 1. bench --------------------------------------------------------------
say ""
say "== bench: $gpus GPU(s), sweep to $max_size =="
# The human report (the table for bench/RESULTS.md) into the log, then the
# same run as JSON for the checks below.
set +e
"$bin" "${common[@]}" --max-size "$max_size" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
json=$dir/nccl-bench.json
"$bin" "${common[@]}" --max-size "$max_size" --format json --output "$json" >/dev/null 2>&1
rc_json=$?
set -e
say "exit: $rc (JSON run: $rc_json, $json)"
flat=$(tr -d '\n' <"$json" | sed 's/  */ /g')
check bench "exit 0 (NCCL required and working)" test "$rc" = 0 -a "$rc_json" = 0
for op in allreduce broadcast allgather sendrecv barrier; do
    check bench "$op verified" grep -q "\"op\": *\"$op\", *\"status\": *\"verified\"" <<<"$flat"
done
check bench "sweep rows with busbw" grep -q '"busbw"' <<<"$flat"
check bench "the network NCCL chose is named" grep -q 'NCCL uses' <<<"$flat"

# --- 2. abort at the deadline ----------------------------------------------
say ""
if [ "$gpus" -lt 2 ]; then
    say "== abort: skipped (one GPU: a hang needs a peer) =="
else
    say "== abort: rank 1 held above 1 MiB, step deadline $step_timeout =="
    json=$dir/nccl-abort.json
    start=$(date +%s)
    set +e
    PREFLIGHT_TEST_COLL_HANG=1:1048576 "$bin" "${common[@]}" --max-size 8MiB \
        --format json --output "$json" >>"$log" 2>&1
    rc=$?
    set -e
    say "exit: $rc after $(($(date +%s) - start)) s ($json)"
    flat=$(tr -d '\n' <"$json" | sed 's/  */ /g')
    # What the report says of the end, and the workers' own lines.
    grep -o '"ended": *"[^"]*"' <<<"$flat" | sort -u | tee -a "$log" || true
    grep -o '"rank [0-9]*: preflight collective-worker: [^"]*"' <<<"$flat" | tee -a "$log" || true
    check abort "exit 1" [ "$rc" = 1 ]
    check abort "the held rank is named" grep -q 'rank 1 ([^)]*) stopped taking part' <<<"$flat"
    check abort "timed out at 2 MiB, the first size above the hold" grep -q 'timed out at 2 MiB' <<<"$flat"
    check abort "a waiting rank ended with ncclCommAbort itself" grep -q 'ncclCommAbort done' <<<"$flat"
    check abort "no worker had to be killed" bash -c '! grep -q "killed (the library" <<<"$1"' _ "$flat"
fi

say ""
if [ "$failed" = 0 ]; then
    say "result: pass (log: $log)"
else
    say "result: FAIL (log: $log)"
fi
exit "$failed"

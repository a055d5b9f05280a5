#!/usr/bin/env bash
# NCCL for real on a machine with NVIDIA GPUs, through nccl-sys: one process
# per GPU, the five operations verified element by element, an allreduce
# size sweep with busbw, and ncclCommAbort ending an init that cannot finish
# (a world with one rank that never starts) at a 5 s deadline.
#
#   tests/gpu/nccl-smoke.sh [--gpus N] [--sizes 1M,16M,64M,256M] [--deadline-s 60]
#
# NCCL is found as preflight finds it: PREFLIGHT_NCCL_LIB, the loader
# (libnccl.so.2, librccl.so.1), python site-packages (nvidia/nccl/lib); the
# test cache of tests/setup/collective-libs.sh is used when none of those
# has it. Exit 0: all passed; 2: no usable GPU or NCCL here (the probe line
# says which); 1: a failure. The log is also written to
# ${NCCL_SMOKE_LOG:-target/nccl-smoke.log} for bench/RESULTS.md.
# Env: NCCL_SMOKE_BIN (prebuilt binary), PREFLIGHT_NCCL_LIB, NCCL_DEBUG.
set -euo pipefail
cd "$(dirname "$0")/../.."

cache=${PREFLIGHT_LIB_CACHE:-/var/cache/preflight-test-libs}
if [ -z "${PREFLIGHT_NCCL_LIB:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 ' &&
    [ -e "$cache/nccl/lib/libnccl.so.2" ]; then
    export PREFLIGHT_NCCL_LIB=$cache/nccl/lib/libnccl.so.2
fi
# NCCL's own warnings are worth keeping in the log; INFO is too long here.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

# NCCL_SMOKE_BIN: a prebuilt smoke binary (it links neither CUDA nor NCCL),
# for GPU machines without cargo or without access to crates.io.
bin=${NCCL_SMOKE_BIN:-}
if [ -z "$bin" ]; then
    cargo build --release -q -p nccl-sys --example smoke
    bin=target/release/examples/smoke
fi
log=${NCCL_SMOKE_LOG:-target/nccl-smoke.log}
mkdir -p "$(dirname "$log")"
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(nproc) cores, kernel $(uname -r)"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /'
    fi
} | tee "$log"
set +e
"$bin" "$@" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
set -e
echo "exit: $rc (log: $log)"
exit "$rc"

#!/usr/bin/env bash
# tests/collective/standin.rs, the NCCL backend's whole path, run against the
# real libraries on a machine with NVIDIA GPUs: the same tests CI runs over
# the CPU stand-in (tests/standin/), only the library paths differ. The tests
# that need the stand-in's fault switches (a hang, a corruption, an async
# error, no device, the network NCCL says it chose) print "skipped" here and
# pass; the others (1 to 4 ranks with every operation verified and the sweep,
# two ranks on one GPU) must pass on the real library as they do on the
# stand-in.
#
#   tests/gpu/nccl-standin-suite.sh
#
# Env: PREFLIGHT_GPU_CUDA_LIB (default: libcuda.so.1 as the loader finds it),
# PREFLIGHT_GPU_NCCL_LIB (default: PREFLIGHT_NCCL_LIB, the loader's
# libnccl.so.2, then the cache of tests/setup/collective-libs.sh).
# Exit 0: all passed; 2: no GPU, driver or NCCL here; else cargo test's.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "nccl-standin-suite: no NVIDIA GPU here (nvidia-smi -L fails)" >&2
    exit 2
fi
from_loader() { ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n { print $NF; exit }'; }
cuda=${PREFLIGHT_GPU_CUDA_LIB:-$(from_loader libcuda.so.1)}
cache=${PREFLIGHT_LIB_CACHE:-/var/cache/preflight-test-libs}
nccl=${PREFLIGHT_GPU_NCCL_LIB:-${PREFLIGHT_NCCL_LIB:-$(from_loader libnccl.so.2)}}
if [ -z "$nccl" ] && [ -e "$cache/nccl/lib/libnccl.so.2" ]; then
    nccl=$cache/nccl/lib/libnccl.so.2
fi
if [ -z "$cuda" ] || [ -z "$nccl" ]; then
    echo "nccl-standin-suite: libcuda.so.1 (${cuda:-not found}) or libnccl.so.2 (${nccl:-not found}) missing; set PREFLIGHT_GPU_CUDA_LIB / PREFLIGHT_GPU_NCCL_LIB" >&2
    exit 2
fi
echo "nccl-standin-suite: libcuda $cuda, libnccl $nccl, $(nvidia-smi -L | wc -l) GPUs"
# Not PREFLIGHT_REQUIRE_LIBS: the fault-switch tests are meant to skip here.
PREFLIGHT_GPU_CUDA_LIB=$cuda PREFLIGHT_GPU_NCCL_LIB=$nccl \
    cargo test --test collective standin:: -- --test-threads 1 --nocapture

#!/usr/bin/env bash
# oneCCL CPU allreduce busbw through oneccl-sys: N ranks as N processes on
# loopback (default 4 ranks; sizes 4 KiB to 64 MiB), the table that goes into
# bench/RESULTS.md under issue 7.
#
#   bench/oneccl-allreduce.sh [--ranks N] [--sizes 4K,64K,1M,16M,64M]
#
# The library: PREFLIGHT_ONECCL_LIB, else the test cache that
# tests/setup/collective-libs.sh fills (run it first; it is idempotent).
# The TCP backend's figures join this run when the collective stage lands.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${PREFLIGHT_LIB_CACHE:-/var/cache/preflight-test-libs}
lib=${PREFLIGHT_ONECCL_LIB:-$cache/oneccl/lib/libccl.so.2}
if [ ! -e "$lib" ]; then
    echo "no oneCCL at $lib: run tests/setup/collective-libs.sh or set PREFLIGHT_ONECCL_LIB" >&2
    exit 1
fi

cargo build --release -q -p oneccl-sys --example allreduce_bench
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)," \
    "$(lscpu | sed -n 's/^Model name: *//p' | head -1), kernel $(uname -r); $(date -u +%Y-%m-%d)"
echo "env: CCL_KVS_IFACE=lo FI_PROVIDER=tcp FI_TCP_IFACE=lo CCL_YIELD=sched_yield CCL_ATL_SHM=1 (unless set)"
exec target/release/examples/allreduce_bench --lib "$lib" "$@"

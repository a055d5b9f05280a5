#!/usr/bin/env bash
# Fetches the real collective libraries the nccl-sys and oneccl-sys tests load,
# from PyPI, as ../shared/reference/collective-libraries.md describes.
#
#   PREFLIGHT_LIB_CACHE   where to keep them (default /var/cache/preflight-test-libs)
#   PREFLIGHT_SKIP_NCCL=1 skip the 351 MB nvidia-nccl-cu12 wheel
#
# Idempotent: a cache that already holds a file is reused as is, so CI can keep
# the directory between runs and still build it from nothing when it is gone.
# Prints the paths, one `NAME=PATH` a line, last.
set -euo pipefail

cache=${PREFLIGHT_LIB_CACHE:-/var/cache/preflight-test-libs}
oneccl_dir=$cache/oneccl/lib
oneccl2021_dir=$cache/oneccl-2021/lib
nccl_dir=$cache/nccl/lib
nccl_include=$cache/nccl/include
ptxas_dir=$cache/ptxas
mkdir -p "$oneccl_dir" "$oneccl2021_dir" "$nccl_dir" "$nccl_include" "$ptxas_dir"

pip_bin=()
if command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
    pip_bin=(python3 -m pip)
elif command -v pip3 >/dev/null 2>&1; then
    pip_bin=(pip3)
else
    echo "collective-libs.sh: no pip (apt-get install -y python3-pip)" >&2
    exit 1
fi
command -v unzip >/dev/null 2>&1 || {
    echo "collective-libs.sh: no unzip (apt-get install -y unzip)" >&2
    exit 1
}

# libccl.so.2 finds libfabric.so.1 through the loader; the wheel does not ship it.
if ! ldconfig -p 2>/dev/null | grep -q 'libfabric\.so\.1 '; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq --no-install-recommends libfabric1 >/dev/null ||
            { apt-get update -qq && apt-get install -y -qq --no-install-recommends libfabric1 >/dev/null; }
    else
        echo "collective-libs.sh: libfabric.so.1 missing and cannot apt-get install libfabric1" >&2
        exit 1
    fi
fi

# Downloads go to a temporary directory and only the files we keep (7 MB of
# the 99 MB for oneCCL) land in the cache; a half-finished run leaves no file
# that a later run would trust, because each is moved into place last.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ ! -s "$oneccl_dir/libccl.so.2" ] || [ ! -s "$oneccl_dir/libccl.so.1" ] ||
    [ ! -s "$oneccl_dir/libccl_legacy_cpu.so" ]; then
    # --no-deps: oneccl-cpu 2022.2.0 declares libfabric>=2.6, which PyPI lacks.
    "${pip_bin[@]}" download -q --no-deps oneccl-cpu==2022.2.0 oneccl==2022.2.0 -d "$tmp/wheels" >&2
    mkdir -p "$tmp/lib"
    unzip -q -j -o "$tmp"/wheels/oneccl_cpu-2022.2.0-*.whl '*/lib/libccl.so.1' -d "$tmp/lib"
    unzip -q -j -o "$tmp"/wheels/oneccl-2022.2.0-*.whl '*/lib/libccl.so.2' '*/lib/libccl_legacy_cpu.so' -d "$tmp/lib"
    for f in libccl.so.1 libccl.so.2 libccl_legacy_cpu.so; do
        mv -f "$tmp/lib/$f" "$oneccl_dir/$f"
    done
    rm -rf "$tmp/wheels" "$tmp/lib"
fi

# oneCCL 2021.16.2 (27 MB wheel): a real C++-only libccl.so.1, loadable alone,
# which oneccl-sys must report as an unsupported version.
if [ ! -s "$oneccl2021_dir/libccl.so.1" ]; then
    "${pip_bin[@]}" download -q --no-deps oneccl-cpu==2021.16.2 -d "$tmp/wheels" >&2
    mkdir -p "$tmp/lib"
    unzip -q -j -o "$tmp"/wheels/oneccl_cpu-2021.16.2-*.whl '*/lib/libccl.so.1' -d "$tmp/lib"
    mv -f "$tmp/lib/libccl.so.1" "$oneccl2021_dir/libccl.so.1"
    rm -rf "$tmp/wheels" "$tmp/lib"
fi

# NCCL 2.32.3: the library itself, and its nccl.h, against which the tests'
# CPU stand-in (tests/standin/) is compiled so that each NCCL function it
# defines is held to the real prototype.
nccl_version=2.32.3
if [ "${PREFLIGHT_SKIP_NCCL:-0}" != 1 ] &&
    { [ ! -s "$nccl_dir/libnccl.so.2" ] || [ ! -s "$nccl_include/nccl.h" ]; }; then
    "${pip_bin[@]}" download -q --no-deps "nvidia-nccl-cu12==$nccl_version" -d "$tmp/wheels" >&2
    mkdir -p "$tmp/lib" "$tmp/include"
    unzip -q -j -o "$tmp"/wheels/nvidia_nccl_cu12-*.whl '*/lib/libnccl.so.2' -d "$tmp/lib"
    unzip -q -j -o "$tmp"/wheels/nvidia_nccl_cu12-*.whl '*/include/nccl.h' -d "$tmp/include"
    mv -f "$tmp/include/nccl.h" "$nccl_include/nccl.h"
    mv -f "$tmp/lib/libnccl.so.2" "$nccl_dir/libnccl.so.2"
    rm -rf "$tmp/wheels" "$tmp/lib" "$tmp/include"
fi

# ptxas from CUDA 12.9 (the 40 MB nvidia-cuda-nvcc-cu12 wheel, 35 MB kept):
# the memory test's PTX (crates/nccl-sys/src/patterns.ptx) is compiled
# with it for each GPU generation, as the driver compiles it on a node.
ptxas_version=12.9.86
if [ ! -x "$ptxas_dir/ptxas" ]; then
    "${pip_bin[@]}" download -q --no-deps "nvidia-cuda-nvcc-cu12==$ptxas_version" -d "$tmp/wheels" >&2
    mkdir -p "$tmp/bin"
    unzip -q -j -o "$tmp"/wheels/nvidia_cuda_nvcc_cu12-*.whl '*/bin/ptxas' -d "$tmp/bin"
    chmod 755 "$tmp/bin/ptxas"
    mv -f "$tmp/bin/ptxas" "$ptxas_dir/ptxas"
    rm -rf "$tmp/wheels" "$tmp/bin"
fi

echo "PREFLIGHT_TEST_ONECCL_LIB=$oneccl_dir/libccl.so.2"
echo "PREFLIGHT_TEST_ONECCL_2021_LIB=$oneccl2021_dir/libccl.so.1"
if [ -s "$nccl_dir/libnccl.so.2" ]; then
    echo "PREFLIGHT_TEST_NCCL_LIB=$nccl_dir/libnccl.so.2"
fi
echo "PREFLIGHT_TEST_PTXAS=$ptxas_dir/ptxas"

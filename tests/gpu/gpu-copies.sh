#!/usr/bin/env bash
# gpu_bandwidth and gpu_memory_test for real on a machine with NVIDIA GPUs:
# the copy rates of every GPU beside its PCIe link's rate after encoding,
# then the memory test's kernels (PTX compiled by the driver) over 90% of
# free memory: each pattern alone (the share of free memory tested, the
# time, the rate), the shipped check at its defaults through `preflight
# run`, and the same under a 10 s run deadline. What bench/RESULTS.md
# records.
#
#   tests/gpu/gpu-copies.sh            (PREFLIGHT_BIN: a prebuilt binary)
#
# Exit 0: all ran and none could not be evaluated; 2: no NVIDIA GPU here;
# 1: otherwise. Reports go to ${GPU_COPIES_OUT:-target/gpu-copies}.
set -uo pipefail
cd "$(dirname "$0")/../.."

out=${GPU_COPIES_OUT:-target/gpu-copies}
mkdir -p "$out"
bin=${PREFLIGHT_BIN:-}
if [ -z "$bin" ]; then
    cargo build --release -q --bin preflight || exit 1
    bin=target/release/preflight
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-copies: no usable NVIDIA GPU here (nvidia-smi -L failed)"
    exit 2
fi
nvidia-smi --query-gpu=index,name,pci.bus_id,pcie.link.gen.max,pcie.link.width.max,memory.total,memory.free --format=csv,noheader | sed 's/^/gpu: /' | tee "$out/machine.txt"
failed=0
cat > "$out/checks.yaml" <<'YAML'
checks:
  - {id: gpu.copy, kind: gpu_bandwidth, area: accelerators}
  - {id: gpu.memory, kind: gpu_memory_test, area: accelerators}
YAML
"$bin" check --no-shipped --checks "$out/checks.yaml" --format json > "$out/report.json"
for p in walking_ones random address inversions; do
    printf 'checks:\n  - {id: gpu.memory.%s, kind: gpu_memory_test, area: accelerators, patterns: [%s]}\n' "$p" "$p" > "$out/$p.yaml"
    "$bin" check --no-shipped --checks "$out/$p.yaml" --format json > "$out/memory-$p.json"
done
# Each with a state directory of its own: a kept pass would be reused.
"$bin" run --only nvidia.memory_test --state-dir "$out/state-defaults" --format json > "$out/run-defaults.json"
"$bin" run --only nvidia.memory_test --timeout 10s --state-dir "$out/state-10s" --format json > "$out/run-10s.json"
python3 - "$out" <<'PY' || failed=1
import glob, json, os, sys
out = sys.argv[1]
bad = []
def show(path):
    r = json.load(open(path))
    for c in r["checks"]:
        if c["status"] in ("error", "fail"):
            bad.append(f"{os.path.basename(path)} {c['id']}: {c['message']}")
        for g in (c.get("copies") or {}).get("gpus", []):
            print(f"copies: GPU {g['index']} {g['bus_id']}: h2d {g['h2d_gbps']:.1f}, d2h {g['d2h_gbps']:.1f}, d2d {g['d2d_gbps']:.1f} GB/s")
        if "memory" in c["id"]:
            print(f"{os.path.basename(path)}: {c['id']} {c['status']} in {c.get('duration_ms', '?')} ms: {c.get('measured')} | {c['message']}")
show(f"{out}/report.json")
for p in ["walking_ones", "random", "address", "inversions"]:
    show(f"{out}/memory-{p}.json")
show(f"{out}/run-defaults.json")
show(f"{out}/run-10s.json")
for b in bad:
    print("FAILED:", b)
sys.exit(1 if bad else 0)
PY
exit "$failed"

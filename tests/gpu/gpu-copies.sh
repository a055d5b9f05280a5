#!/usr/bin/env bash
# gpu_bandwidth and gpu_memory_test for real on a machine with NVIDIA GPUs:
# the copy rates of every GPU beside its PCIe link's rate after encoding
# (what bench/RESULTS.md records), and the memory patterns over 5% of
# free memory.
#
#   tests/gpu/gpu-copies.sh            (PREFLIGHT_BIN: a prebuilt binary)
#
# Exit 0: both ran and neither could not be evaluated; 2: no NVIDIA GPU
# here; 1: otherwise. Reports go to ${GPU_COPIES_OUT:-target/gpu-copies}.
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
nvidia-smi --query-gpu=index,name,pci.bus_id,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader | sed 's/^/gpu: /' | tee "$out/machine.txt"
cat > "$out/checks.yaml" <<'YAML'
checks:
  - {id: gpu.copy, kind: gpu_bandwidth, area: accelerators}
  - {id: gpu.memory, kind: gpu_memory_test, area: accelerators, budget: 60s}
YAML
"$bin" check --no-shipped --checks "$out/checks.yaml" -v --color never | tee "$out/report.txt"
"$bin" check --no-shipped --checks "$out/checks.yaml" --format json > "$out/report.json"
python3 - "$out/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
bad = [c["id"] for c in r["checks"] if c["status"] == "error"]
for c in r["checks"]:
    for g in (c.get("copies") or {}).get("gpus", []):
        print(f"copies: GPU {g['index']} {g['bus_id']}: h2d {g['h2d_gbps']:.1f}, d2h {g['d2h_gbps']:.1f}, d2d {g['d2d_gbps']:.1f} GB/s")
sys.exit(1 if bad else 0)
PY

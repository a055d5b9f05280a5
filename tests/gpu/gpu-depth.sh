#!/usr/bin/env bash
# The GPU depth checks for real on a machine with NVIDIA GPUs: throttling,
# reset required, Xids, NVLink per link and DCGM's diagnostic, each run
# twice: live (NVML, dcgmi) and over this machine's own recorded outputs
# (nvidia-smi -q -x samples, nvidia-smi nvlink -s/-e/-R, dcgmi diag -j),
# so that the readers the fixtures test are proven on real output too.
#
#   tests/gpu/gpu-depth.sh            (PREFLIGHT_BIN: a prebuilt binary)
#
# Exit 0: every check ran and none could not be evaluated; 2: no NVIDIA
# GPU here; 1: a check errored, or a recorded output was not understood.
# The recordings and reports go to ${GPU_DEPTH_OUT:-target/gpu-depth}
# (kept as fixtures of a real node). Takes well under a minute plus
# DCGM's level 1 (seconds) where DCGM is installed.
set -uo pipefail
cd "$(dirname "$0")/../.."

out=${GPU_DEPTH_OUT:-target/gpu-depth}
mkdir -p "$out"
bin=${PREFLIGHT_BIN:-}
if [ -z "$bin" ]; then
    cargo build --release -q --bin preflight || exit 1
    bin=target/release/preflight
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-depth: no usable NVIDIA GPU here (nvidia-smi -L failed)"
    exit 2
fi
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(nproc) cores, kernel $(uname -r)"
    nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv,noheader | sed 's/^/gpu: /'
    echo "dcgmi: $(command -v dcgmi || echo absent)"
    echo "nv-hostengine: $(pgrep -x nv-hostengine >/dev/null && echo running || echo 'not running')"
} | tee "$out/machine.txt"

# This machine's own outputs, recorded as the kinds' parameters take them.
nvidia-smi -q -x > "$out/nvidia-smi-q.xml"
# Whole documents: R580 refuses `-d PERFORMANCE` with `-x`.
for i in 1 2 3; do nvidia-smi -q -x; sleep 0.5; done > "$out/samples.xml"
nvidia-smi nvlink -s > "$out/nvlink-s.txt" 2>&1
nvidia-smi nvlink -e > "$out/nvlink-e.txt" 2>&1
nvidia-smi nvlink -R > "$out/nvlink-R.txt" 2>&1
if command -v dcgmi >/dev/null 2>&1; then
    timeout 300 dcgmi diag -r 1 -j > "$out/dcgmi-r1.json" 2> "$out/dcgmi-r1.stderr"
    echo "dcgmi diag -r 1 -j: exit $?"
fi
(dmesg 2>/dev/null || true) | grep 'NVRM: Xid' > "$out/xid.log"

# The recorded outputs read back: the same kinds, this machine's data.
recorded="$out/recorded.yaml"
{
    echo "checks:"
    echo "  - {id: rec.throttle, kind: gpu_health, throttle: true, nvidia_smi_xml: \"$out/samples.xml\"}"
    echo "  - {id: rec.reset, kind: gpu_health, reset_required: true, nvidia_smi_xml: \"$out/nvidia-smi-q.xml\"}"
    echo "  - {id: rec.xid, kind: gpu_health, xid: true, kernel_log: \"$out/xid.log\"}"
    nvlink_extra=""
    grep -q 'Link [0-9]*: .*Errors' "$out/nvlink-e.txt" && nvlink_extra+=", nvidia_smi_nvlink_errors: \"$out/nvlink-e.txt\""
    grep -q 'Remote Device' "$out/nvlink-R.txt" && nvlink_extra+=", nvidia_smi_nvlink_remote: \"$out/nvlink-R.txt\""
    echo "  - {id: rec.nvlink, kind: nvlink, nvidia_smi_nvlink: \"$out/nvlink-s.txt\"$nvlink_extra}"
    if [ -s "$out/dcgmi-r1.json" ]; then
        echo "  - {id: rec.dcgm, kind: dcgm_diag, level: 1, dcgm_json: \"$out/dcgmi-r1.json\"}"
    fi
} > "$recorded"

# Live: the shipped NVIDIA checks (`--only nvidia` names the opt-in DCGM
# quick level; level 2 is left out as slow), then the recordings.
"$bin" check --only nvidia --skip slow --format json > "$out/live.json"
echo "live: exit $?"
"$bin" check --no-shipped --checks "$recorded" --format json > "$out/recorded.json"
echo "recorded: exit $?"
"$bin" check --only nvidia --skip slow -v || true

python3 - "$out/live.json" "$out/recorded.json" <<'PY'
import json, sys
bad = []
for path in sys.argv[1:]:
    report = json.load(open(path))
    for c in report["checks"]:
        line = f'{c["status"]:5} {c["id"]}: {c["message"][:300]}'
        print(line)
        depth = c["id"].startswith(("rec.", "nvidia.throttle", "nvidia.reset_required",
                                    "nvidia.nvlink", "nvidia.xid", "nvidia.dcgm"))
        if c["status"] == "error" and depth:
            bad.append(line)
    ids = [c["id"] for c in report["checks"]]
    if path.endswith("live.json"):
        for want in ["nvidia.throttle", "nvidia.reset_required", "nvidia.nvlink", "nvidia.xid", "nvidia.dcgm_quick"]:
            if not any(i == want or i.startswith(want + ":") for i in ids):
                bad.append(f"{want} did not run live")
        for c in report["checks"]:
            if c["id"] in ("nvidia.throttle", "nvidia.nvlink", "nvidia.reset_required") and c["status"] == "skip" \
                    and "under --root" in c["message"]:
                bad.append(f'{c["id"]} read nothing live: {c["message"]}')
print()
if bad:
    print("gpu-depth: FAILED")
    for b in bad:
        print("  " + b)
    sys.exit(1)
print("gpu-depth: every check ran; none errored")
PY

#!/usr/bin/env bash
# The AMD, Intel and Gaudi checks below the driver for real, on a node
# with that vendor's accelerators and tool: each check run live (the
# shipped amd.*, intel.* or habana.* checks) and over this node's own
# recorded outputs, so that the readers the fixtures test are proven on
# real output too (keep the recordings: they become fixtures).
#
#   tests/gpu/vendor-depth.sh            (PREFLIGHT_BIN: a prebuilt binary)
#
# Exit 0: every check ran and none errored; 2: no AMD (amd-smi or
# rocm-smi), Intel (xpu-smi) or Gaudi (hl-smi) accelerator here; 1: a check
# errored, or a recorded output was not understood. Recordings and
# reports go to ${VENDOR_DEPTH_OUT:-target/vendor-depth}. Takes seconds,
# plus xpu-smi's level-1 diagnostic (about a minute) on Intel.
set -uo pipefail
cd "$(dirname "$0")/../.."

out=${VENDOR_DEPTH_OUT:-target/vendor-depth}
mkdir -p "$out"
bin=${PREFLIGHT_BIN:-}
if [ -z "$bin" ]; then
    cargo build --release -q --bin preflight || exit 1
    bin=target/release/preflight
fi
recorded="$out/recorded.yaml"
echo "checks:" > "$recorded"
vendors=()

if command -v amd-smi >/dev/null 2>&1 && amd-smi list >/dev/null 2>&1; then
    vendors+=(amd)
    amd-smi metric --json > "$out/amd-metric.json" 2> "$out/amd-metric.stderr"
    amd-smi static --json > "$out/amd-static.json" 2> "$out/amd-static.stderr"
    amd-smi xgmi --json > "$out/amd-xgmi.json" 2> "$out/amd-xgmi.stderr" \
        || amd-smi xgmi -l --json > "$out/amd-xgmi.json" 2>> "$out/amd-xgmi.stderr"
    amd-smi bad-pages --json > "$out/amd-bad-pages.json" 2> "$out/amd-bad-pages.stderr"
    m="$out/amd-metric.json" s="$out/amd-static.json"
    cat >> "$recorded" <<EOF
  - {id: rec.amd.ecc, kind: amd_smi, subject: ecc, amd_smi_metric: "$m"}
  - {id: rec.amd.throttle, kind: amd_smi, subject: throttle, amd_smi_metric: "$m"}
  - {id: rec.amd.pcie, kind: amd_smi, subject: pcie, amd_smi_metric: "$m", amd_smi_static: "$s"}
  - {id: rec.amd.xgmi, kind: amd_smi, subject: xgmi, amd_smi_xgmi: "$out/amd-xgmi.json", amd_smi_metric: "$m"}
  - {id: rec.amd.reset, kind: amd_smi, subject: reset, amd_smi_bad_pages: "$out/amd-bad-pages.json", amd_smi_static: "$s"}
EOF
elif command -v rocm-smi >/dev/null 2>&1 && rocm-smi >/dev/null 2>&1; then
    vendors+=(amd)
    rocm-smi --showxgmierr --showtopotype --json > "$out/rocm-smi.json" 2> "$out/rocm-smi.stderr"
    echo "  - {id: rec.amd.xgmi, kind: amd_smi, subject: xgmi, rocm_smi_json: \"$out/rocm-smi.json\"}" >> "$recorded"
fi

if command -v xpu-smi >/dev/null 2>&1 && xpu-smi discovery >/dev/null 2>&1; then
    vendors+=(intel)
    # xpu-smi reads ZE_AFFINITY_MASK too: a mask would hide cards from it.
    env -u ZE_AFFINITY_MASK xpu-smi health -l -j > "$out/xpu-health.json" 2> "$out/xpu-health.stderr"
    env -u ZE_AFFINITY_MASK xpu-smi topology -m > "$out/xpu-topology.txt" 2> "$out/xpu-topology.stderr"
    env -u ZE_AFFINITY_MASK timeout 300 xpu-smi diag -l 1 -j > "$out/xpu-diag-l1.json" 2> "$out/xpu-diag.stderr"
    echo "xpu-smi diag -l 1 -j: exit $?"
    h="$out/xpu-health.json"
    cat >> "$recorded" <<EOF
  - {id: rec.intel.health, kind: xpu_smi, subject: health, xpu_smi_health: "$h"}
  - {id: rec.intel.xe_link, kind: xpu_smi, subject: xe_link, xpu_smi_health: "$h", xpu_smi_topology: "$out/xpu-topology.txt"}
  - {id: rec.intel.throttle, kind: xpu_smi, subject: throttle, xpu_smi_health: "$h"}
  - {id: rec.intel.diag, kind: xpu_smi, subject: diag, xpu_smi_diag: "$out/xpu-diag-l1.json"}
EOF
fi

if command -v hl-smi >/dev/null 2>&1 && hl-smi -L >/dev/null 2>&1; then
    vendors+=(habana)
    # The fields `preflight explain hl_smi` names (tests/plain/vendor_depth.rs
    # holds the two equal).
    fields=index,module_id,bus_id,name,serial,driver_version,ecc.errors.uncorrected.aggregate.total,ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.aggregate.total,ecc.errors.corrected.volatile.total,ecc.errors.dram.aggregate.total,ecc.errors.dram.volatile.total,ecc.errors.dram-corrected.aggregate.total,ecc.errors.dram-corrected.volatile.total
    hl-smi -Q "$fields" -f csv,nounits > "$out/hl-query.csv" 2> "$out/hl-query.stderr"
    hl-smi -q > "$out/hl-report.txt" 2> "$out/hl-report.stderr"
    for bus in $(hl-smi -Q bus_id -f csv,noheader); do
        echo "=== $bus ==="
        hl-smi -n link -i "$bus"
    done > "$out/hl-links.txt" 2> "$out/hl-links.stderr"
    q="$out/hl-query.csv" r="$out/hl-report.txt"
    cat >> "$recorded" <<EOF
  - {id: rec.habana.devices, kind: hl_smi, subject: devices, hl_smi_query: "$q"}
  - {id: rec.habana.ecc, kind: hl_smi, subject: ecc, hl_smi_query: "$q"}
  - {id: rec.habana.throttle, kind: hl_smi, subject: throttle, hl_smi_report: "$r"}
  - {id: rec.habana.reset, kind: hl_smi, subject: reset, hl_smi_report: "$r"}
  - {id: rec.habana.nic_ports, kind: hl_smi, subject: nic_ports, hl_smi_links: "$out/hl-links.txt"}
EOF
fi

if [ ${#vendors[@]} -eq 0 ]; then
    echo "vendor-depth: no AMD, Intel or Gaudi accelerator with its tool here"
    exit 2
fi
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(nproc) cores, kernel $(uname -r)"
    echo "vendors: ${vendors[*]}"
} | tee "$out/machine.txt"

only=()
for v in "${vendors[@]}"; do only+=(--only "$v"); done
# `--only VENDOR` runs the vendor's opt-in checks too (intel.xpu_diag).
"$bin" check "${only[@]}" --format json > "$out/live.json"
echo "live: exit $?"
"$bin" check --no-shipped --checks "$recorded" --format json > "$out/recorded.json"
echo "recorded: exit $?"
"$bin" check "${only[@]}" -v || true

python3 - "$out/live.json" "$out/recorded.json" <<'PY'
import json, sys
depth = ("rec.", "amd.ecc", "amd.xgmi", "amd.throttle", "amd.pcie", "amd.reset_required",
         "intel.xpu_", "intel.xe_link", "intel.throttle", "habana.devices", "habana.ecc",
         "habana.throttle", "habana.reset_required", "habana.nic_ports")
bad = []
for path in sys.argv[1:]:
    for c in json.load(open(path))["checks"]:
        line = f'{c["status"]:5} {c["id"]}: {c["message"][:300]}'
        print(line)
        if c["id"].startswith(depth):
            if c["status"] == "error":
                bad.append(line)
            if c["status"] == "skip" and "under --root" in c["message"]:
                bad.append(f'{c["id"]} read nothing live: {c["message"]}')
print()
if bad:
    print("vendor-depth: FAILED")
    for b in bad:
        print("  " + b)
    sys.exit(1)
print("vendor-depth: every check ran; none errored")
PY

#!/usr/bin/env bash
# Issue 19: `preflight report` over many node reports, as an Ansible play
# or a Slurm report_dir gathers them: N real `check` reports (one node's,
# renamed to N hostnames, every tenth one failing differently), merged to
# HTML, Markdown and JSON; wall time (median of RUNS) and peak memory.
# Uses dist/preflight (tools/release.sh) or target/release/preflight.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-dist/preflight}
[[ -x $BIN ]] || BIN=target/release/preflight
RUNS=${RUNS:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), $(date -u +%Y-%m-%d); $($BIN --version)"
# The broken tree is not ready (exit 1); anything else is not a report to merge.
"$BIN" check --root fixtures/h100-ib-broken --format json > "$work/one.json" || [[ $? == 1 ]]
for n in ${SIZES:-100 1000 10000}; do
    dir="$work/n$n"
    mkdir -p "$dir"
    python3 - "$work/one.json" "$dir" "$n" <<'PY'
import json, sys
base = json.load(open(sys.argv[1]))
for i in range(int(sys.argv[3])):
    r = json.loads(json.dumps(base))
    r["node"]["hostname"] = f"gpu{i:05d}"
    if i % 10:
        for c in r["checks"]:
            if c["status"] == "fail":
                c["status"], c["hint"] = "pass", None
        r["verdict"], r["exit_code"] = "ready", 0
    json.dump(r, open(f"{sys.argv[2]}/gpu{i:05d}.json", "w"))
PY
    size=$(du -sh "$dir" | cut -f1)
    for format in html markdown json; do
        times=()
        for _ in $(seq "$RUNS"); do
            start=$(date +%s%N)
            # Every tenth node fails: the merged verdict is not ready (1).
            "$BIN" report --format "$format" --output "$work/out.$format" "$dir" 2>/dev/null || [[ $? == 1 ]]
            times+=($(( ($(date +%s%N) - start) / 1000000 )))
        done
        median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(( (RUNS + 1) / 2 ))p")
        rss=$( { /usr/bin/time -f '%M' "$BIN" report --format "$format" --output "$work/out.$format" "$dir" 2>&1 >/dev/null | tail -1; } || true)
        out=$(du -h "$work/out.$format" | cut -f1)
        echo "$n node reports ($size): $format ${median} ms median of $RUNS, peak RSS ${rss} KiB, output $out"
    done
done

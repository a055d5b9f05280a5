#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 60) each, one per core at a
# time, from seed corpora made of the project's own fixtures and tests
# (fuzz/corpus/TARGET, not
# committed: rebuilt here each time, and what the fuzzer adds is kept
# between runs on one machine). A crash stops the run with the input
# under fuzz/artifacts/TARGET/; turn it into a regression test before
# fixing it. An input that takes longer than 5 s (15 s for nodelist) is a failure too
# (-timeout), and any taking over 1 s is reported (-report_slow_units): a
# parser that is merely slow on a hostile input would otherwise pass a
# short run. cargo fuzz needs nightly flags: RUSTC_BOOTSTRAP=1 lets the
# stable toolchain take them.
#
# `fuzz/run.sh build` only builds the targets (tools/test.sh does so
# beside the tests, at idle priority); a later run finds them built.
set -euo pipefail
cd "$(dirname "$0")"
SECONDS_EACH=${1:-60}
export RUSTC_BOOTSTRAP=1
targets=$(ls fuzz_targets | sed 's/\.rs$//')
# No sanitizer (-s none, on build and run alike, or run rebuilds): the
# parsers fuzzed are the crate's own safe Rust (no `unsafe` outside the
# -sys crates, which no target reaches), where AddressSanitizer finds
# nothing Rust's own checks miss, and costs build time and speed
# (bench/RESULTS.md: CI's fuzz phase).
sanitizer=(-s none)
build() {
    # cargo fuzz builds one named target or all of them.
    cargo fuzz build -O "${sanitizer[@]}" >/dev/null 2>&1 || cargo fuzz build -O "${sanitizer[@]}"
}
if [[ $SECONDS_EACH == build ]]; then
    build
    exit 0
fi
[[ $SECONDS_EACH =~ ^[0-9]+$ ]] || { echo "fuzz/run.sh: SECONDS must be a number of seconds, or \`build\`: $SECONDS_EACH" >&2; exit 2; }
root=..
seed() {
    local target=$1; shift
    mkdir -p "corpus/$target"
    for f in "$@"; do
        # A seed of the project's that is not there (a moved fixture, a
        # glob that matches nothing) fails the run rather than fuzzing from
        # less; this machine's own /proc files are taken where they exist.
        [[ $f == /proc/* && ! -e $f ]] && continue
        [[ -f $f ]] || { echo "fuzz: seed $f for $target is missing" >&2; exit 1; }
        cp -f "$f" "corpus/$target/seed-$(basename "$(dirname "$f")")-$(basename "$f")"
    done
    return 0
}
seed checklist $root/checks/*.yaml $root/fixtures/checklists/*/*.yaml $root/fixtures/reports/record-checks.yaml
seed profile $root/profiles/*.yaml
seed site_settings $root/contrib/slurm/settings.yaml $root/fixtures/checklists/valid/*.yaml
seed dcgm_json $root/fixtures/nvidia-tools/dcgm*.json
# nvidia_text: the first byte picks the reader (src/fuzzing.rs).
mkdir -p corpus/nvidia_text
for pair in 0:nvlink-h100-two-down.txt 1:nvlink-h100-errors.txt 2:nvlink-h100-remote-miswired.txt 0:nvlink-pcie.txt; do
    { printf "\\x0${pair%%:*}"; cat "$root/fixtures/nvidia-tools/${pair#*:}"; } > "corpus/nvidia_text/seed-${pair#*:}"
done
{ printf '\x03'; cat $root/fixtures/h100-ib-broken/root/dev/kmsg; } > corpus/nvidia_text/seed-kmsg
{ printf '\x04'; cat $root/fixtures/nvidia-tools/throttle-old-names.xml; } > corpus/nvidia_text/seed-samples
# amd_smi, xpu_smi, hl_smi: the first byte picks the output (src/fuzzing.rs).
vendor_seed() {
    local target=$1 dir=$2; shift 2
    mkdir -p "corpus/$target"
    for pair in "$@"; do
        local f=$root/fixtures/$dir/${pair#*:}
        [[ -f $f ]] || { echo "fuzz: seed $f for $target is missing" >&2; exit 1; }
        { printf "\\x0${pair%%:*}"; cat "$f"; } > "corpus/$target/seed-${pair#*:}"
    done
}
vendor_seed amd_smi amd-tools 0:metric-healthy.json 0:metric-broken.json 0:static.json 0:bad-pages-pending.json \
    1:xgmi-healthy.json 1:xgmi-link-down.json 1:xgmi-gpu-twice.json 2:rocm-smi-broken.json
vendor_seed xpu_smi intel-tools 0:diag-l1-pass.json 0:diag-l3-memory-fail.json 0:diag-busy.json \
    1:health-broken.json 2:topology-link-down.txt
vendor_seed hl_smi habana-tools 0:query-healthy.csv 0:query-broken.csv 1:report-broken.txt 2:links-two-down.txt
seed report $root/fixtures/reports/run-4node/*.json $root/tests/snapshots/mixed.json
seed nvidia_smi_xml $(find $root/fixtures -name '*.xml' | head -20)
seed proc_text $(find $root/fixtures -path '*proc*' -type f | head -40) /proc/net/tcp /proc/net/tcp6 /proc/self/stat
mkdir -p corpus/nodelist
printf 'gpu[001-004,010],login1' > corpus/nodelist/seed-list
printf 'rack[1-2]-node[01-03]' > corpus/nodelist/seed-nested
printf '2(x3),1' > corpus/nodelist/seed-counts
mkdir -p corpus/interface_selector corpus/firewall corpus/frame corpus/handshake
printf '\x00^lo,docker' > corpus/interface_selector/seed-nccl
printf '\x02=mlx5_0:1,mlx5_1' > corpus/interface_selector/seed-hca
printf '\x01*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp -m tcp --dport 29500:29510 -j DROP\nCOMMIT\n' > corpus/firewall/seed-iptables
# Frames as crates/preflight-cluster/src/protocol.rs writes them: "PFL", version 3, a
# big-endian length, a JSON body.
python3 - <<'PY'
import json, struct
def frame(msg):
    body = json.dumps(msg).encode()
    return b"PFL\x03" + struct.pack(">I", len(body)) + body
hello = frame({"type": "hello", "nonce": "00" * 16, "version": "0.1.0"})
challenge = frame({"type": "challenge", "nonce": "11" * 16})
proof = frame({"type": "proof", "proof": "22" * 32})
welcome = frame({"type": "welcome", "proof": "33" * 32})
rejected = frame({"type": "rejected", "reason": "another job", "fingerprint": "cffb3797"})
for name, data in [("hello", hello), ("rejected", rejected)]:
    open(f"corpus/frame/seed-{name}", "wb").write(data)
open("corpus/handshake/seed-server", "wb").write(hello + proof)
open("corpus/handshake/seed-client", "wb").write(challenge + welcome)
# The second pass's table (crates/preflight-collective/src/isolate/exchange.rs): a world
# byte, then per rank a block of time left (ms), the nodes' fingerprint,
# a count and (rank, rank, GB/s) pairs, 148 bytes each; rank 2 slow.
import os
os.makedirs("corpus/second_pass_table", exist_ok=True)
world = 8
blocks = b""
for r in range(world):
    pairs = [(r, b, 0.01 if 2 in (r, b) else 1.0) for b in range(r + 1, world)][:8]
    body = struct.pack("<QQI", 30000, 7, len(pairs))
    body += b"".join(struct.pack("<IId", a, b, g) for a, b, g in pairs)
    blocks += body.ljust(148, b"\0")
open("corpus/second_pass_table/seed-slow-rank-2", "wb").write(bytes([world]) + blocks)
PY
build

# Several targets at once, one a core (four at most): each keeps the CPU
# time it would have alone, and the run takes a fraction of the time.
jobs=$(nproc 2>/dev/null || echo 1)
((jobs > 4)) && jobs=4
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
run_one() {
    local t=$1 limit=5
    # Expanding a nodelist to its bound (1,048,576 hosts) takes 1-2 s
    # instrumented, by design: its limit is wider, still far below 1,200.
    [[ $t == nodelist ]] && limit=15
    local rc=0
    cargo fuzz run -O "${sanitizer[@]}" "$t" "corpus/$t" -- -max_total_time="$SECONDS_EACH" -max_len=65536 -rss_limit_mb=2048 \
        -timeout="$limit" -report_slow_units=1 > "$logs/$t.full" 2>&1 || rc=$?
    {
        echo "fuzz: $t for ${SECONDS_EACH}s"
        grep -E "^(#[0-9]+ +DONE|Done|==[0-9]+==|SUMMARY|Slowest unit|.*panicked|.*ERROR: libFuzzer)" "$logs/$t.full" | tail -6 || true
        ((rc == 0)) || { echo "fuzz: $t FAILED (exit $rc); its output's end:"; tail -40 "$logs/$t.full"; }
    } > "$logs/$t.out"
    return "$rc"
}
set -- $targets
failed=0
while (($#)); do
    batch=("${@:1:jobs}")
    pids=()
    for t in "${batch[@]}"; do
        run_one "$t" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do
        wait "$pid" || failed=1
    done
    for t in "${batch[@]}"; do
        cat "$logs/$t.out"
    done
    ((failed == 0)) || exit 1
    shift "${#batch[@]}"
done

#!/usr/bin/env bash
# `preflight diagnose` against a real NCCL communicator's RAS port (NCCL
# 2.24 and later turn RAS on by default, on localhost:28028): the smoke
# test's ranks keep their communicator for --hold-s seconds after the
# operations, and diagnose asks RAS meanwhile (JSON where this NCCL has
# it, else text). It must read the report (no error), find NCCL's version
# and at least one communicator, and name no rank (every rank is alive
# and level). The diagnosis is kept under $NCCL_RAS_OUT (default
# target/nccl-ras).
#
#   tests/gpu/nccl-ras.sh [--gpus N]
#
# Exit 0: passed; 2: no usable GPU or NCCL, or an NCCL before 2.24 (no
# RAS); 1: a failure. Env: PREFLIGHT_BIN (else target/release/preflight,
# built), NCCL_SMOKE_BIN, PREFLIGHT_NCCL_LIB.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${NCCL_RAS_OUT:-target/nccl-ras}
mkdir -p "$out"
cache=${PREFLIGHT_LIB_CACHE:-/var/cache/preflight-test-libs}
if [ -z "${PREFLIGHT_NCCL_LIB:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 ' &&
    [ -e "$cache/nccl/lib/libnccl.so.2" ]; then
    export PREFLIGHT_NCCL_LIB=$cache/nccl/lib/libnccl.so.2
fi
smoke=${NCCL_SMOKE_BIN:-}
if [ -z "$smoke" ]; then
    cargo build --release -q -p nccl-sys --example smoke
    smoke=target/release/examples/smoke
fi
preflight=${PREFLIGHT_BIN:-}
if [ -z "$preflight" ]; then
    cargo build --release -q
    preflight=target/release/preflight
fi
port=${NCCL_RAS_PORT:-28028}
export NCCL_RAS_ADDR=localhost:$port NCCL_DEBUG=${NCCL_DEBUG:-WARN}

rm -f "$out"/holding.*
NCCL_SMOKE_HOLD_FILE=$out/holding "$smoke" --sizes 1M --hold-s 40 "$@" > "$out/smoke.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
# The communicator is up, its operations done, once rank 0 holds it; the smoke test's own exit
# 2 (no GPU, no NCCL) ends this one with 2.
for _ in $(seq 1 120); do
    [ -e "$out/holding.0" ] && break
    if ! kill -0 "$pid" 2>/dev/null; then
        set +e; wait "$pid"; rc=$?; set -e
        cat "$out/smoke.log"
        [ "$rc" = 2 ] && exit 2
        echo "nccl-ras: the smoke test ended ($rc) before holding its communicator" >&2
        exit 1
    fi
    sleep 0.5
done
[ -e "$out/holding.0" ] || { echo "nccl-ras: no communicator within 60 s" >&2; exit 1; }
version=$(sed -n 's/^NCCL \([0-9.]*\) at.*/\1/p' "$out/smoke.log" | head -1)
echo "NCCL $version; asking RAS at localhost:$port"

set +e
"$preflight" diagnose --nccl-ras "localhost:$port" --format json --output "$out/diagnose.json"
rc=$?
set -e
fail=0
python3 - "$out/diagnose.json" "$rc" "$version" <<'PY' || fail=$?
import json, sys
d = json.load(open(sys.argv[1]))
rc, version = int(sys.argv[2]), sys.argv[3]
r = d.get("nccl_ras") or {}
print(f"RAS {r.get('format')}: NCCL {r.get('nccl_version')}, {r.get('communicators')} communicator(s), "
      f"findings {r.get('findings')}, culprits {r.get('culprits')}, error {r.get('error')}; exit {rc}")
major_minor = tuple(int(x) for x in (version or "0.0").split(".")[:2])
if major_minor < (2, 24):
    print("NCCL before 2.24 has no RAS: nothing to test"); sys.exit(2)
# The JSON form from NCCL 2.28.7, the text form before.
want = "json" if major_minor >= (2, 29) else None
assert r and not r.get("error"), "RAS was not read"
assert want is None or r.get("format") == want, f"NCCL {version} has the JSON form"
assert r.get("nccl_version"), "no NCCL version in RAS's answer"
assert (r.get("communicators") or 0) >= 1, "no communicator in RAS's answer"
assert not r.get("culprits"), "a rank named in a healthy job"
PY
kill "$pid" 2>/dev/null || true
exit "$fail"

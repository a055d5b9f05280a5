#!/usr/bin/env bash
# Line coverage of the NCCL backend (crates/preflight-collective/src/nccl*), measured the way
# `cargo llvm-cov` does (rustc's -C instrument-coverage, then llvm-profdata
# and llvm-cov), twice from one instrumented build: "before", the tests that
# existed before the CPU stand-in (the library's unit tests, the nccl-sys
# crate's tests, tests/collective/nccl.rs against the real libnccl without a
# GPU); "after", those plus tests/collective/standin.rs over the stand-in.
#
#   tools/coverage.sh            prints both reports, file by file
#
# cargo-llvm-cov wants the toolchain's llvm-tools component, which rustup
# cannot fetch here; Debian's llvm-19 reads this rustc's (LLVM 22) profiles
# (`apt-get install llvm-19`; LLVM_BIN names another bin directory). Every
# process writes its own profile; the cluster tests pass LLVM_PROFILE_FILE
# to the ranks they start, and the other tests' processes write the
# runtime's default (default_<module>_<pid>.profraw in the working
# directory, the repository), collected from there.
# Needs the libraries of tests/setup/collective-libs.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
llvm=${LLVM_BIN:-/usr/lib/llvm-19/bin}
for tool in llvm-profdata llvm-cov; do
    [ -x "$llvm/$tool" ] || { echo "coverage.sh: $llvm/$tool missing (apt-get install llvm-19)" >&2; exit 2; }
done
export CARGO_TARGET_DIR=target/coverage
# Continuous mode (%c, with counter relocation on Linux): counters live in
# the mmapped profile, so a worker killed with SIGKILL (as a worker is once
# its rank has its answer) keeps what it ran.
export RUSTFLAGS="-C instrument-coverage -C llvm-args=-runtime-counter-relocation"
export PREFLIGHT_REQUIRE_LIBS=1
out=$CARGO_TARGET_DIR/profiles
rm -rf "$out"
mkdir -p "$out/before" "$out/after"
rm -f default_*.profraw

# Every test binary and the preflight binary: the objects whose counters
# llvm-cov reads.
build() {
    cargo test --no-run --message-format=json "$@" 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])'
}
objects=$( { build -p preflight --test collective; build -p preflight-collective --lib; build -p nccl-sys; } | sort -u)

run() { # DIR, then cargo test arguments
    local dir=$1
    shift
    LLVM_PROFILE_FILE="$PWD/$out/$dir/%c%m_%p.profraw" cargo test -q "$@" >"$out/$dir.log" 2>&1 ||
        { echo "coverage.sh: cargo test $* failed (see $out/$dir.log)" >&2; exit 1; }
    mv default_*.profraw "$out/$dir/" 2>/dev/null || true
}
run before -p preflight-collective --lib
run before -p nccl-sys
run before -p preflight --test collective nccl::
cp "$out/before/"*.profraw "$out/after/"
run after -p preflight --test collective standin::

# llvm-cov takes the first object as its argument, the rest with -object.
args=()
for o in $objects; do
    if [ ${#args[@]} = 0 ]; then args=("$o"); else args+=(-object "$o"); fi
done
for set in before after; do
    # A process killed while writing its profile (a worker ended with
    # SIGKILL) leaves a torn file: skipped, and counted.
    "$llvm/llvm-profdata" merge -sparse --failure-mode=all "$out/$set/"*.profraw \
        -o "$out/$set.profdata" 2>"$out/$set.merge.log"
    echo "== $set: $(ls "$out/$set" | wc -l) profiles, $(grep -c 'is corrupt' "$out/$set.merge.log") torn"
    "$llvm/llvm-cov" report "${args[@]}" -instr-profile="$out/$set.profdata" \
        "$PWD"/crates/preflight-collective/src/nccl.rs "$PWD"/crates/preflight-collective/src/nccl/transport.rs \
        "$PWD"/crates/nccl-sys/src/*.rs | sed "s|$PWD/||"
done

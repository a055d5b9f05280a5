#!/usr/bin/env bash
# Every test of the project, from a fresh clone, as root on a Debian
# machine: installs what the tests need (.ci/install: apt packages, the
# real collective libraries, ansible-core, zig, cargo-fuzz; what is there
# already is kept), builds the binary to ship (tools/release.sh, which
# tests/plain/release.rs checks), runs every test of `cargo test
# --workspace`, its binaries side by side, with clippy over the declared
# lints and every fuzz target (built, then run for PREFLIGHT_FUZZ_SECONDS,
# default 20, each) beside them, then every bench script in a short mode.
# This is the README's one test command and what CI runs (.ci/run reads
# it from the README).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase says how long it took, so that CI's time is measured where
# it goes (bench/RESULTS.md keeps the figures).
phase() {
    local name=$1 start=$SECONDS
    shift
    "$@"
    echo "tools/test.sh: $name took $((SECONDS - start)) s"
}
# Work that only compiles or fuzzes (clippy, the fuzz targets' build and
# run) runs beside the tests, at idle priority (SCHED_IDLE): it takes only
# CPU no test wants, and most of the tests' time is waiting on a clock
# (hangs, time limits, Slurm), not computing. Clippy is joined before the
# benches, the fuzzing after them (the benches are short runs that only
# show each script still works, bench/ci.sh).
declare -A beside_pid
beside_logs=$(mktemp -d)
stop_beside() {
    local pid
    for pid in "${beside_pid[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
    rm -rf "$beside_logs"
}
trap stop_beside EXIT
beside() {
    local name=$1
    shift
    # Its own process group (setsid), so that a failing test phase stops
    # the whole of it; its own time said at its end.
    setsid chrt --idle 0 bash -c 'start=$SECONDS; rc=0; "$@" || rc=$?; echo "took $((SECONDS - start)) s" >&2; exit $rc' \
        _ "$@" > "$beside_logs/$name" 2>&1 &
    beside_pid[$name]=$!
}
joined() {
    local name=$1 start=$SECONDS rc=0
    wait "${beside_pid[$name]}" || rc=$?
    unset "beside_pid[$name]"
    local took
    took=$(tail -1 "$beside_logs/$name")
    sed '$d' "$beside_logs/$name"
    echo "tools/test.sh: $name (beside the tests) $took, joined after $((SECONDS - start)) s more"
    return "$rc"
}
# The test binaries side by side, each in a lane of its own: one per
# integration-test target of the project (tests/NAME/main.rs), and one for
# the rest (unit tests, the -sys crates' tests, doc tests). The tests'
# lock (tests/common/lock.rs) keeps a test that runs alone alone across
# them, and the others as many at once as there are CPUs; the rest's
# lane holds it shared, and one of those places, for its whole run. Each lane's
# output is shown whole when it ends, with its time.
side_by_side() {
    export PREFLIGHT_TEST_LOCK=${PREFLIGHT_TEST_LOCK:-/tmp/preflight-tests.lock}
    local dir name rc=0 targets others=()
    dir=$(mktemp -d)
    targets=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" in t["kind"]:
            print(("lane " if p["name"] == "preflight" else "rest ") + t["name"])')
    declare -A lane_pid
    lane() {
        local name=$1
        shift
        bash -c 'start=$SECONDS; rc=0; "$@" || rc=$?; echo "tools/test.sh: tests: $0 took $((SECONDS - start)) s (exit $rc)"; exit $rc' \
            "$name" "$@" > "$dir/$name" 2>&1 &
        lane_pid[$name]=$!
    }
    while read -r kind name; do
        case $kind in
            lane) lane "$name" cargo test --workspace --test "$name" ;;
            rest) others+=(--test "$name") ;;
        esac
    done <<< "$targets"
    lane rest flock --shared "$PREFLIGHT_TEST_LOCK" flock "$PREFLIGHT_TEST_LOCK.slot0" bash -c 'cargo test --workspace --lib --bins "$@" && cargo test --workspace --doc' _ "${others[@]}"
    for name in "${!lane_pid[@]}"; do
        wait "${lane_pid[$name]}" || rc=1
        cat "$dir/$name"
    done
    rm -rf "$dir"
    return "$rc"
}
# .ci/install is sourced, not run: it exports where the libraries and
# virtual environments are, and finds cargo.
phase install . .ci/install
phase release tools/release.sh
# One after the other: both builds keep the two CPUs busy, and side by
# side they took 233 s where one after the other takes about 225
# (bench/RESULTS.md).
phase tests-build cargo test --workspace --no-run --quiet
# Clippy and the fuzzing start once the tests are built: beside the tests'
# own build they slowed it by two minutes (bench/RESULTS.md), idle
# priority or not. Clippy: the lints Cargo.toml declares, every target,
# warnings as errors, in a target directory of its own, so that it never
# holds the lock the tests' build waits for.
beside clippy env CARGO_TARGET_DIR=target/clippy cargo clippy --workspace --all-targets --quiet -- -D warnings
beside fuzz bash -c 'bash fuzz/run.sh build && bash fuzz/run.sh "$0"' "${PREFLIGHT_FUZZ_SECONDS:-20}"
phase tests side_by_side
joined clippy
phase benches env BIN=dist/preflight bash bench/ci.sh
joined fuzz

#!/usr/bin/env bash
# Every test of the project, from a fresh clone, as root on a Debian
# machine: installs what the tests need (.ci/install: apt packages, the
# real collective libraries, ansible-core, zig, cargo-fuzz; what is there
# already is kept), builds the binary to ship (tools/release.sh, which
# tests/plain/release.rs checks), runs `cargo test --workspace` with
# clippy over the declared lints and the fuzz targets' build beside it,
# every bench script in a short mode, then every fuzz target for
# PREFLIGHT_FUZZ_SECONDS (default 20) each. This is the
# README's one test command and what CI runs (.ci/run reads it from the
# README).
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
# Work that only compiles (clippy, the fuzz targets' build) runs beside
# the tests, at idle priority (SCHED_IDLE): it takes only CPU no test
# wants, and most of the tests' time is waiting on a clock (hangs, time
# limits, Slurm), not computing. Each is joined before the benches, which
# time themselves and so run alone, as does the fuzzing.
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
# .ci/install is sourced, not run: it exports where the libraries and
# virtual environments are, and finds cargo.
phase install . .ci/install
phase release tools/release.sh
# The lints Cargo.toml declares, every target, warnings as errors; in a
# target directory of its own, so that it never holds the lock the tests'
# build waits for.
# Started once the tests are built: beside the tests' own build they
# slowed it by two minutes (bench/RESULTS.md), idle priority or not.
phase tests-build cargo test --workspace --no-run --quiet
beside clippy env CARGO_TARGET_DIR=target/clippy cargo clippy --workspace --all-targets --quiet -- -D warnings
beside fuzz-build bash fuzz/run.sh build
phase tests cargo test --workspace
joined clippy
joined fuzz-build
phase benches env BIN=dist/preflight bash bench/ci.sh
phase fuzz bash fuzz/run.sh "${PREFLIGHT_FUZZ_SECONDS:-20}"

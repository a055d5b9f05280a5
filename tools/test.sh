#!/usr/bin/env bash
# Every test of the project, from a fresh clone, as root on a Debian
# machine: installs what the tests need (.ci/install: apt packages, the
# real collective libraries, ansible-core, zig, cargo-fuzz; what is there
# already is kept), builds the binary to ship (tools/release.sh, which
# tests/plain/release.rs checks), runs every bench script in a short mode
# beside the tests' build, then every test of `cargo test --workspace`
# with rustfmt's check first, clippy over the declared lints and every fuzz target (built, then
# run for PREFLIGHT_FUZZ_SECONDS, default 10, each) beside the tests. This
# is the README's one test command and what CI runs (.ci/run reads it
# from the README).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase says how long it took and how busy the CPUs were (from
# /proc/stat), so that CI's time is measured where it goes
# (bench/RESULTS.md keeps the figures): a phase that kept them busy gains
# only from less work, one that left them idle from more side by side.
cpu_ticks() {
    local _ user nice system idle iowait irq softirq steal
    read -r _ user nice system idle iowait irq softirq steal _ < /proc/stat
    echo "$((user + nice + system + irq + softirq + steal)) $((idle + iowait))"
}
phase() {
    local name=$1 start=$SECONDS busy0 idle0 busy1 idle1
    shift
    read -r busy0 idle0 <<< "$(cpu_ticks)"
    "$@"
    read -r busy1 idle1 <<< "$(cpu_ticks)"
    local total=$((busy1 - busy0 + idle1 - idle0))
    echo "tools/test.sh: $name took $((SECONDS - start)) s (CPUs $((total > 0 ? 100 * (busy1 - busy0) / total : 0)) % busy)"
}
# Work that only compiles or fuzzes (clippy, the fuzz targets' build and
# run) runs beside the tests, at idle priority (SCHED_IDLE): it takes only
# CPU no test wants, and most of the tests' time is waiting on a clock
# (hangs, time limits, Slurm), not computing.
declare -A beside_pid
beside_logs=$(mktemp -d)
stop_beside() {
    local pid
    for pid in "${beside_pid[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
    rm -rf "$beside_logs"
}
trap stop_beside EXIT
# background PRIORITY NAME COMMAND...: its own process group (setsid),
# so that a failing phase stops the whole of it; its own time said at its
# end; joined by `joined NAME`.
background() {
    local priority=$1 name=$2
    shift 2
    setsid chrt "$priority" 0 bash -c 'start=$SECONDS; rc=0; "$@" || rc=$?; echo "took $((SECONDS - start)) s" >&2; exit $rc' \
        _ "$@" > "$beside_logs/$name" 2>&1 &
    beside_pid[$name]=$!
}
beside() { background --idle "$@"; }
alongside() { background --other "$@"; }
joined() {
    local name=$1 start=$SECONDS rc=0
    wait "${beside_pid[$name]}" || rc=$?
    unset "beside_pid[$name]"
    local took
    took=$(tail -1 "$beside_logs/$name")
    sed '$d' "$beside_logs/$name"
    echo "tools/test.sh: $name (in the background) $took, joined after $((SECONDS - start)) s more"
    return "$rc"
}
# The project's test targets, a line each: ORDER KIND NAME, KIND `own`
# for the project's integration-test binaries (tests/NAME/main.rs),
# `rest` for the -sys crates' tests. Read whole before any test runs: a
# test reading its standard input would take the rest of the list.
test_targets() {
    local order
    order=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
first = {"services": 0, "collective": 2}
for p in json.load(sys.stdin)["packages"]:
    for t in p["targets"]:
        if "test" in t["kind"]:
            mine = p["name"] == "preflight"
            print(first.get(t["name"], 1) if mine else 3, "own" if mine else "rest", t["name"])' | sort -n)
    mapfile -t targets <<< "$order"
}
# The test binaries one after another (they share the machine's
# namespaces, ports and clock, and their tests that run alone would not be
# alone side by side), `services` first, with the compiles beside it,
# and `collective` last, its tests that measure time kept off them. In CI
# (2026-11-29) `services` kept the CPUs 95-98 % busy with the compiles
# beside, `collective` 43-52 % with the fuzz runs' end beside it: what
# `collective` leaves idle is waiting on deadlines and a starved host.
# Inside a binary, the tests that measure time or load the machine run
# alone (tests/common: `serial`). In `services` the others are Ansible
# plays, launchers and packages, which wait on sshd, Python and dpkg with
# bounds of minutes: twelve tests at once (RUST_TEST_THREADS, when set,
# has the last word) take 309-321 s alone, one at a time 404 s, and in
# CI 360-433 s beside the compiles where one a core took 436-491 s
# (bench/RESULTS.md). The other binaries keep one a core: `network`'s
# shared tests include rendezvous runs held to a few seconds, nine of
# which missed their bounds twelve at a time beside the fuzz targets'
# build.
services_threads=${RUST_TEST_THREADS:-12}
tests_in_turn() {
    local targets line kind name
    test_targets
    for line in "${targets[@]}"; do
        read -r _ kind name <<< "$line"
        [[ $kind == own ]] || continue
        local threads=()
        [[ $name == services ]] && threads=(-- --test-threads="$services_threads")
        phase "tests: $name" cargo test --workspace --test "$name" "${threads[@]}" < /dev/null
    done
    return 0
}
# The rest: unit tests, the -sys crates' tests, doc tests.
the_rest() {
    local targets line kind name others=()
    test_targets
    for line in "${targets[@]}"; do
        read -r _ kind name <<< "$line"
        [[ $kind == rest ]] && others+=(--test "$name")
    done
    cargo test --workspace --lib --bins "${others[@]}" < /dev/null
    cargo test --workspace --doc < /dev/null
}
# A build from nothing (a fresh clone: CI) gains nothing from incremental
# compilation, which then only writes its state: 82 s for the tests' build
# without it, 90 s with (bench/RESULTS.md). A tree built before keeps it.
[[ -d target/debug/incremental ]] || export CARGO_INCREMENTAL=0
# .ci/install is sourced, not run: it exports where the libraries and
# virtual environments are, and finds cargo.
phase install . .ci/install
# The layout rustfmt gives is the house's: checked first, as it takes a
# second and a change that fails it fails the rest of review.
phase format cargo fmt --all --check
phase release tools/release.sh
# The benches need only dist/preflight (bench/slurm.sh also the tests'
# build, which cargo makes it wait for) and no test runs yet, so they run
# beside the tests' build: the short runs only show that each script
# still works (bench/ci.sh), and mostly wait on Slurm, Ansible and
# namespace hosts. Joined before the tests: they and the tests would
# share namespaces, Slurm and the clock.
alongside benches env BIN=dist/preflight bash bench/ci.sh
phase tests-build cargo test --workspace --no-run --quiet
# Clippy and the fuzzing start once the tests are built: beside the tests'
# own build they slowed it by two minutes (bench/RESULTS.md), idle
# priority or not. Clippy: the lints Cargo.toml declares, every target,
# warnings as errors, in a target directory of its own, so that it never
# holds the lock the tests' build waits for.
beside clippy env CARGO_TARGET_DIR=target/clippy cargo clippy --workspace --all-targets --quiet -- -D warnings
# Ten seconds a target: each run here is a smoke test of every parser
# against its seeds and what the fuzzer finds quickly (a crash, an input
# over 5 s). The search for deep inputs is `bash fuzz/run.sh [SECONDS]`
# by hand (60 s a target unless told). Idle priority does not make the
# runs free: tests that wait on sockets and processes ran slower beside
# busy loops at idle priority (noisy figures, bench/RESULTS.md).
beside fuzz bash -c 'bash fuzz/run.sh build && bash fuzz/run.sh "$0"' "${PREFLIGHT_FUZZ_SECONDS:-10}"
# The unit tests, the -sys crates' tests and the doc tests share no
# namespace, port or Slurm with a bench: they run while the benches end,
# and beside the compiles' start. Before the compiles they kept the CPUs
# only 35-39 % busy (21-24 s); beside them they take 28-31 s at 99 %, and
# the compiles end that much earlier, off `network` and `plain`
# (bench/RESULTS.md).
phase "tests: the rest" the_rest
joined benches
phase tests tests_in_turn
joined clippy
joined fuzz

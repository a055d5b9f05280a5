#!/usr/bin/env bash
# Every test of the project, from a fresh clone, as root on a Debian
# machine: installs what the tests need (.ci/install: apt packages, the
# real collective libraries, ansible-core, zig, cargo-fuzz; what is there
# already is kept), builds the binary to ship (tools/release.sh, which
# tests/plain/release.rs checks), runs clippy over the declared lints and
# `cargo test --workspace`, every bench script in a short mode, then every
# fuzz target for PREFLIGHT_FUZZ_SECONDS (default 20) each. This is the
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
# .ci/install is sourced, not run: it exports where the libraries and
# virtual environments are, and finds cargo.
phase install . .ci/install
phase release tools/release.sh
# The lints Cargo.toml declares, every target, warnings as errors.
phase clippy cargo clippy --workspace --all-targets --quiet -- -D warnings
phase tests cargo test --workspace
phase benches env BIN=dist/preflight bash bench/ci.sh
phase fuzz bash fuzz/run.sh "${PREFLIGHT_FUZZ_SECONDS:-20}"

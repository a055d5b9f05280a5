#!/usr/bin/env bash
# Every bench script once, in a short mode (one run, small sizes, the peers
# left out where they would need installing), so that a script that no
# longer runs fails CI instead of rotting until someone needs its figures.
# Each script fails loudly on a failed run (see bench/timing.sh and
# bench/rounds.sh). tests/plain/bench_scripts.rs holds that every script is here.
# The scripts measure BIN (no release build of their own) and PEERS=0
# leaves out the peers, which the full runs compare against. The three
# that need the tests' build (the rank simulator, the Slurm test) come
# last: tools/test.sh runs this beside that build.
# The figures printed are not results: bench/RESULTS.md names the full
# command behind each published figure.
#
#   BIN=dist/preflight bash bench/ci.sh     (tools/test.sh does this)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${BIN:?set BIN to the preflight binary to measure (dist/preflight from tools/release.sh)}"
export BIN
short() {
    local script=$1; shift
    echo "== bench/$script (short)"
    local start=$SECONDS
    "$@"
    echo "== bench/$script passed in $((SECONDS - start)) s"
}
short check-latency.sh        env RUNS=2 bash bench/check-latency.sh
short diagnose.sh            env RUNS=2 bash bench/diagnose.sh
short hardware-checks.sh      env RUNS=2 bash bench/hardware-checks.sh
short network-checks.sh       bash bench/network-checks.sh 2
short cluster-rendezvous.sh   env RUNS=1 PEERS=0 bash bench/cluster-rendezvous.sh
short node-share.sh           env RUNS=5 bash bench/node-share.sh
short collective-allreduce.sh env PEERS=0 bash bench/collective-allreduce.sh 1
short collective-netns.sh     env PEERS=0 bash bench/collective-netns.sh 1
short oneccl-allreduce.sh     bash bench/oneccl-allreduce.sh --runs 1 --ranks 2 --max-size 64KiB
short report.sh               env RUNS=1 SIZES=20 bash bench/report.sh
short resources.sh            env RUNS=1 bash bench/resources.sh
short slowness.sh             env ROUNDS_HEALTHY=2 ROUNDS_STARVED=2 bash bench/slowness.sh
short ansible-validate.sh     bash bench/ansible-validate.sh 1
short rendezvous-scale.sh     env TCPSTORE=0 bash bench/rendezvous-scale.sh 64 nodes:8
short rendezvous-slope.sh     bash bench/rendezvous-slope.sh 64 256
short slurm.sh                env PROFILE=dev RUNS=5 JOBS=2 bash bench/slurm.sh

#!/usr/bin/env bash
# Issue 16: the rendezvous at scale, beside PyTorch's TCPStore, in one run.
#
#   bench/rendezvous-scale.sh N [LAYOUT]     LAYOUT: flat (default) or nodes:K
#
# preflight: one real rank 0 (`preflight run`, release build, the shipped
# cluster checks) and N-1 ranks played by preflight-rank-sim (a test tool,
# built with the `rank-sim` feature): real handshakes, check-ins read from a
# GPU fixture tree, clock samples, the probe plan answered with real probes
# to one real listener per simulated node, the verdict. It prints one line
# per phase, then
#   ranks=N layout=... checkin_ms=A verdict_ms=B rank0_rss_mb=C rank0_bytes_sent=D
# checkin_ms: first rank connected to last check-in sent; verdict_ms: last
# check-in to last verdict received; rank0_bytes_sent: what the simulated
# ranks read from rank 0, handshakes included.
#
# TCPStore: Debian's python3-torch, its server in its own process, N client
# threads doing what torch's rendezvous does at init (add to a counter, wait
# for the last one's key, get one shared key); see tcpstore_rendezvous.py.
# Installs python3-torch when it is missing. TCPSTORE=0 leaves TCPStore out
# (its 16,384-client run does not finish within 600 s here).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:?usage: bench/rendezvous-scale.sh N [flat|nodes:K]}
layout=${2:-flat}
PY=/usr/bin/python3
if [[ ${TCPSTORE:-1} != 0 ]] && ! $PY -c 'import torch' 2>/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch >/dev/null
fi
# The simulator is a test tool (the rank-sim feature). With BIN set (CI's
# short run) rank 0 is that binary and the simulator a debug build.
if [[ -n ${BIN:-} ]]; then
    # The tests' build holds it (their dev-dependency turns rank-sim on):
    # no second debug build of the crate, which would also replace theirs.
    cargo test --workspace --no-run --quiet
    sim=target/debug/preflight-rank-sim
    rank0=$(realpath "$BIN")
else
    cargo build --release --quiet --features rank-sim --bins
    sim=target/release/preflight-rank-sim
    rank0=$PWD/target/release/preflight
fi
# Rank 0 holds a descriptor per connection; the simulator one per rank,
# per node's listener and per probe in flight (2,048 nodes probe about
# 24,000 pairs at once): as root, up to the kernel's fs.nr_open.
ulimit -Hn "$(cat /proc/sys/fs/nr_open)" 2>/dev/null || true
ulimit -n "$(ulimit -Hn)"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), open files $(ulimit -n), somaxconn $(cat /proc/sys/net/core/somaxconn)"
echo "== preflight (rank 0 + preflight-rank-sim), $n ranks, $layout"
"$sim" --preflight "$rank0" \
    --world "$n" --layout "$layout" --root fixtures/h100-ib-healthy/root --timeout "${TIMEOUT:-120s}"
if [[ ${TCPSTORE:-1} != 0 ]]; then
    echo "== PyTorch TCPStore ($($PY -c 'import torch; print(torch.__version__)')), $n client threads"
    $PY bench/tcpstore_rendezvous.py "$n"
fi

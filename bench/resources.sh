#!/usr/bin/env bash
# Issue 20: the tool's own resources. A healthy 4-rank `preflight run` on
# loopback (TCP backend, the short collective stage): each rank's peak RSS
# (/usr/bin/time) and its most open file descriptors, sampled from
# /proc/PID/fd every 5 ms; and one `check`. RUNS repetitions, the largest
# figure kept. Rank 0 at the scale issue's sizes is bench/rendezvous-scale.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-dist/preflight}
[[ -x $BIN ]] || BIN=target/release/preflight
RUNS=${RUNS:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), $(date -u +%Y-%m-%d); $($BIN --version)"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# The most descriptors PID holds until it exits.
watch_fds() {
    local pid=$1 most=0 n
    while [[ -d /proc/$pid ]]; do
        n=$(ls /proc/$pid/fd 2>/dev/null | wc -l)
        ((n > most)) && most=$n
        sleep 0.005
    done
    echo "$most"
}
rss_max=0; fds_max=0
for _ in $(seq "$RUNS"); do
    port=$(free_port)
    pids=()
    for r in 0 1 2 3; do
        RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r LOCAL_WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            PREFLIGHT_TOKEN=f0aab9ffaa53abefaef8672acc7a0148 \
            /usr/bin/time -f '%M' -o "$work/rss$r" "$BIN" run --backends tcp --format json >/dev/null 2>&1 &
        pids+=($!)
    done
    for r in 0 1 2 3; do
        # The preflight process under /usr/bin/time.
        child=""
        for _ in $(seq 200); do
            child=$(pgrep -P "${pids[$r]}" | head -1) && [[ -n $child ]] && break
            sleep 0.005
        done
        [[ -n $child ]] && watch_fds "$child" > "$work/fds$r" &
    done
    wait
    for r in 0 1 2 3; do
        # /usr/bin/time notes a non-zero exit: a verdict (1) is a fair
        # outcome here; a usage error or an incomplete run is not measured.
        if grep -Eq "non-zero status [^1]|non-zero status 1[0-9]|signal" "$work/rss$r"; then
            echo "failed: rank $r: $(head -1 "$work/rss$r")" >&2
            exit 1
        fi
        rss=$(tail -1 "$work/rss$r"); fds=$(cat "$work/fds$r" 2>/dev/null || echo 0)
        ((rss > rss_max)) && rss_max=$rss
        ((fds > fds_max)) && fds_max=$fds
    done
done
echo "4-rank run: peak RSS of any rank $((rss_max / 1024)) MiB ($rss_max KiB), most open descriptors of any rank $fds_max (over $RUNS runs)"
/usr/bin/time -f '%M' -o "$work/check" "$BIN" check --format json >/dev/null 2>&1 || [[ $? == 1 ]]
check_rss=$(tail -1 "$work/check")
echo "check (shipped checklist): peak RSS $((check_rss / 1024)) MiB ($check_rss KiB)"

#!/usr/bin/env bash
# Issue 50: one checklist per node. The CPU a node spends on `preflight
# run` (shipped checklist) with 1, 4 and 8 local ranks on one node
# (LOCAL_WORLD_SIZE), on loopback: user + system time of every rank and of
# the programs it ran (wait4's rusage), summed over the ranks, and the wall
# time to the last rank's exit. The node's checks run once, on local rank
# 0, so 4 ranks should cost little more than one.
# Measured twice: with `--collective off` (the checklist and the
# rendezvous: what this issue shares), and as `run` does by default (the
# short TCP collective stage added: its traffic grows with the ranks by
# nature, and a rank alone has none).
# RUNS (default 5) repetitions, the median kept. The guard, on the first:
# 4 ranks' CPU over 1 rank's must stay at most MAX_RATIO (default 2.5),
# else exit 1 (a ratio, not an absolute time: CI machines differ).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/binary.sh
bin=$(preflight_bin)
runs=${RUNS:-5}
max_ratio=${MAX_RATIO:-2.5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sys_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
median() { sort -n | awk '{t[NR]=$1} END {print (NR%2)?t[(NR+1)/2]:int((t[NR/2]+t[NR/2+1])/2)}'; }

# One job of $1 local ranks, collective mode $2: prints "wall_ms cpu_ms".
# Python starts the ranks and reaps each with wait4, whose rusage counts
# the rank and the programs it ran to the microsecond (/usr/bin/time
# prints hundredths of a second, too coarse for 20 ms ranks); the
# launcher's own start is not in either figure.
job() {
    python3 - "$bin" "$1" "$2" "$out" "$sys_path" <<'PY'
import os, socket, subprocess, sys, time
bin_, n, mode, out, path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
start = time.monotonic()
procs = []
for r in range(n):
    env = {"PATH": path, "RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r),
           "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "PREFLIGHT_TOKEN": "9a1c2f0e5b7d4c3a8e6f1b2d3c4a5e6f"}
    with open(f"{out}/rank.{r}", "w") as o, open(f"{out}/err.{r}", "w") as e:
        procs.append(subprocess.Popen(
            [bin_, "run", "--collective", mode, "--timeout", "60s", "--format", "json"],
            env=env, stdout=o, stderr=e, stdin=subprocess.DEVNULL))
cpu = 0.0
for r, p in enumerate(procs):
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    cpu += usage.ru_utime + usage.ru_stime
    # A verdict (0 ready, 1 not ready on this machine) is measured; a
    # usage error or an incomplete run is not.
    if p.returncode not in (0, 1):
        sys.stderr.write(f"failed: rank {r} of {n} exited {p.returncode}:\n")
        sys.stderr.write("".join(open(f"{out}/err.{r}").readlines()[-5:]))
        sys.exit(1)
wall = time.monotonic() - start
print(int(wall * 1000), int(cpu * 1000))
PY
}

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r), $(date -u +%Y-%m-%d)"
"$bin" check >/dev/null 2>&1 || true  # warm the page cache
declare -A wall cpu
for mode in off short; do
    for n in 1 4 8; do
        : >"$out/w"; : >"$out/c"
        for ((i = 0; i < runs; i++)); do
            read -r w c < <(job "$n" "$mode")
            echo "$w" >>"$out/w"; echo "$c" >>"$out/c"
        done
        wall[$mode.$n]=$(median <"$out/w"); cpu[$mode.$n]=$(median <"$out/c")
        shared=$(grep -o '"shared": true' "$out/rank.$((n - 1))" | wc -l || true)
        echo "--collective $mode, $n local rank(s), $runs runs: wall median ${wall[$mode.$n]} ms, CPU of all ranks median ${cpu[$mode.$n]} ms (the last rank's report: $shared findings shared by its leader)"
    done
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / (b > 0 ? b : 1)}'; }
cpu_ratio=$(ratio "${cpu[off.4]}" "${cpu[off.1]}")
echo "CPU of 4 local ranks / 1 rank, checklist and rendezvous (--collective off): ${cpu_ratio}x (guard: at most ${max_ratio}x; target 2x)"
echo "CPU of 4 local ranks / 1 rank, run's default (short collective stage): $(ratio "${cpu[short.4]}" "${cpu[short.1]}")x"
echo "wall of 8 local ranks / 4: --collective off $(ratio "${wall[off.8]}" "${wall[off.4]}")x, default $(ratio "${wall[short.8]}" "${wall[short.4]}")x (target 1.5x)"
if awk -v r="$cpu_ratio" -v m="$max_ratio" 'BEGIN {exit !(r > m)}'; then
    echo "failed: 4 local ranks cost ${cpu_ratio}x one rank's CPU, above ${max_ratio}x: the node's checks run on every rank again?" >&2
    exit 1
fi

# Shared by the bench scripts: wall time of a command, median of N runs.
# Usage: . bench/timing.sh; out=$(median_ms 20 CMD ARGS...)   ("median min max" in ms)
#
# A run that ends with an exit code outside BENCH_OK_EXIT (default "0";
# e.g. "0 1" where a not-ready verdict is a fair outcome) fails the
# measurement: it prints `failed: exit N: CMD` on stderr and returns 1, so
# that a broken command is never timed as if it had worked. Call it in a
# command substitution (`out=$(median_ms ...)`), whose failure `set -e`
# sees; a process substitution would hide it.

median_ms() {
    local runs=$1; shift
    local times=() i start end code
    for ((i = 0; i < runs; i++)); do
        start=$(date +%s%N)
        code=0
        "$@" >/dev/null 2>&1 || code=$?
        end=$(date +%s%N)
        if [[ " ${BENCH_OK_EXIT:-0} " != *" $code "* ]]; then
            echo "failed: exit $code: $*" >&2
            return 1
        fi
        times+=($(( (end - start) / 1000 )))
    done
    printf '%s\n' "${times[@]}" | sort -n | awk '
        { t[NR] = $1 }
        END {
            m = (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
            printf "%.1f %.1f %.1f\n", m / 1000, t[1] / 1000, t[NR] / 1000
        }'
}

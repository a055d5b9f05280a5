# Shared by the bench scripts: wall time of a command, median of N runs.
# Usage: . bench/timing.sh; median_ms 20 CMD ARGS...   (prints "median min max" in ms)

median_ms() {
    local runs=$1; shift
    local times=() i start end
    for ((i = 0; i < runs; i++)); do
        start=$(date +%s%N)
        "$@" >/dev/null 2>&1
        end=$(date +%s%N)
        times+=($(( (end - start) / 1000 )))
    done
    printf '%s\n' "${times[@]}" | sort -n | awk '
        { t[NR] = $1 }
        END {
            m = (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
            printf "%.1f %.1f %.1f\n", m / 1000, t[1] / 1000, t[NR] / 1000
        }'
}

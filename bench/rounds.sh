# Sourced by the collective benchmarks: runs rounds of contenders, each
# round running every contender once (so a busy minute on a shared machine
# weighs on all alike), then prints one row per contender with every round
# and the median.
#
#   labels=(NAME ...); runs=(COMMAND ...); rounds_table ROUNDS
# Each COMMAND prints one figure (or "failed", or a figure with a note).
# A round that failed is shown as such, never in a median, and makes
# rounds_table return 1 after the table (the script fails loudly).
# PEERS=0 keeps only the contenders whose label starts with "preflight"
# (CI's short run, where the peers may not be installed).

median() {
    printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g |
        awk '{ a[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

rounds_table() {
    local rounds=$1 k r failed=0
    local -a got
    for r in $(seq "$rounds"); do
        for k in "${!runs[@]}"; do
            [[ ${PEERS:-1} == 0 && ${labels[k]} != preflight* ]] && continue
            got[k]+=" $(${runs[k]} || echo failed)"
        done
        echo "round $r of $rounds done" >&2
    done
    for k in "${!labels[@]}"; do
        [[ -z ${got[k]:-} ]] && continue
        [[ ${got[k]} == *failed* ]] && failed=1
        # shellcheck disable=SC2086
        printf "%-36s %s   median %s\n" "${labels[k]}" "${got[k]}" "$(median ${got[k]})"
    done
    if ((failed)); then
        echo "FAILED: a round did not run (\"failed\" above)" >&2
        return 1
    fi
}

#!/usr/bin/env bash
# Prints the commands of the README's fenced ```sh blocks under the
# heading HEADING (up to the next heading of the same or a higher level),
# one block after another, comments and blank lines left out: what
# .ci/run runs verbatim, so that the README's commands cannot drift from
# what works. Exit 1 when the heading or its commands are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
heading=${1:?usage: tools/readme-commands.sh HEADING}
awk -v want="$heading" '
    !fence && /^#+ / {
        level = index($0, " ") - 1
        title = substr($0, level + 2)
        if (inside && level <= depth) { inside = 0 }
        if (title == want) { inside = 1; depth = level }
        next
    }
    inside && /^```sh$/ { fence = 1; next }
    inside && fence && /^```$/ { fence = 0; next }
    inside && fence {
        line = $0
        sub(/[ \t]+#.*$/, "", line)
        if (line ~ /^[ \t]*(#|$)/) { next }
        print line; found = 1
    }
    END { exit found ? 0 : 1 }
' README.md

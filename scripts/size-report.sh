#!/usr/bin/env bash
# The size report for the static binaries in a dist directory, also written to dist/SIZES.txt:
#   scripts/size-report.sh dist
# Budget: 8,000,000 bytes stripped per binary. Exit 1 if a binary is over it, so `make
# test-packaging` (in make test) fails rather than let the budget slip unnoticed.
set -euo pipefail
dist="${1:-dist}"
budget=8000000

report() {
    local over=0
    printf '%-22s %12s %9s %8s  %s\n' binary bytes MiB budget "last build"
    for f in "$dist"/twinlease-*; do
        [[ -f "$f" && -x "$f" ]] || continue
        local arch="${f##*/twinlease-}" bytes t
        bytes=$(stat -c %s "$f")
        if ((bytes > budget)); then over=1; fi
        t="$(cat "$dist/build-time-$arch.txt" 2>/dev/null || echo "-")"
        awk -v n="${f##*/}" -v b="$bytes" -v B="$budget" -v t="${t#*: }" \
            'BEGIN { printf "%-22s %12d %9.2f %7.0f%%  %s%s\n", n, b, b / 1048576, 100 * b / B, t, (b > B ? "  OVER BUDGET" : "") }'
    done
    echo "budget: $budget bytes per binary; profile: opt-level z (twinlease s; dhcproto, hashbrown 3; bundled SQLite -Os), fat LTO, codegen-units 1, panic abort, strip"
    if ((over)); then
        echo "size-report: a binary is over the budget of $budget bytes"
        return 1
    fi
}

report | tee "$dist/SIZES.txt"

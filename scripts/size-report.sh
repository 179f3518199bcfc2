#!/usr/bin/env bash
# A bench-style size report for the static binaries in a dist directory (not an assertion):
#   scripts/size-report.sh dist
# Budget: 8 MB (8,000,000 bytes) stripped per binary (issue 17; issue 4 had set 12 MB).
set -euo pipefail
dist="${1:-dist}"
budget=8000000
printf '%-22s %12s %9s %8s  %s\n' binary bytes MiB budget "last build"
for f in "$dist"/twinlease-*; do
    [[ -f "$f" && -x "$f" ]] || continue
    arch="${f##*/twinlease-}"
    bytes=$(stat -c %s "$f")
    t="$(cat "$dist/build-time-$arch.txt" 2>/dev/null || echo "-")"
    awk -v n="${f##*/}" -v b="$bytes" -v B="$budget" -v t="${t#*: }" \
        'BEGIN { printf "%-22s %12d %9.2f %7.0f%%  %s%s\n", n, b, b / 1048576, 100 * b / B, t, (b > B ? "  OVER BUDGET" : "") }'
done
echo "budget: $budget bytes per binary; profile: opt-level z (twinlease s; dhcproto, hashbrown 3; bundled SQLite -Os), fat LTO, codegen-units 1, panic abort, strip"

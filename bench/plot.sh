#!/usr/bin/env bash
# Renders a benchmark table as SVG with gnuplot (Debian's gnuplot-nox).
#   plot.sh ladder TSV SVG TITLE   a ladder table (bench/dhcp-ladder.sh, bench/pair-ladder.sh):
#                                  column 1 the offered rate, then per server four columns
#                                  NAME_leases NAME_drop NAME_lat NAME_cpu (header line "# ...")
#                                  → answered vs offered leases/s and CPU ms per 1,000 leases
#   plot.sh scale TSV SVG          the scaling table (bench/scale.sh) → start-up, reaper,
#                                  leases --json and catch-up times, and RSS, against leases
set -euo pipefail

kind=${1:?usage: plot.sh ladder|scale TSV SVG [TITLE]}
tsv=${2:?}
svg=${3:?}
title=${4:-}
command -v gnuplot >/dev/null || { echo "gnuplot missing (Debian package gnuplot-nox): no plot" >&2; exit 0; }

ladder() {
    local names n i plots_l="" plots_c=""
    mapfile -t names < <(head -1 "$tsv" | tr "\t" "\n" | sed -n "s/_leases$//p")
    n=${#names[@]}
    for ((i = 0; i < n; i++)); do
        local col=$((2 + 4 * i)) name=${names[$i]}
        plots_l+="'$tsv' using 1:$col with linespoints title '$name',"
        plots_c+="'$tsv' using 1:$((col + 3)) with linespoints title '$name',"
    done
    gnuplot <<GP
set terminal svg size 960,420 dynamic noenhanced font "sans,11" background "white"
set output "$svg"
set multiplot layout 1,2 title "$title"
set grid
set key top left
set xlabel "offered leases/s"
set ylabel "answered leases/s"
plot ${plots_l%,}, x with lines dashtype 2 lc "gray" title "offered"
set key top right
set ylabel "server CPU ms per 1,000 leases"
set yrange [0:*]
plot ${plots_c%,}
unset multiplot
GP
}

scale() {
    gnuplot <<GP
set terminal svg size 960,420 dynamic noenhanced font "sans,11" background "white"
set output "$svg"
set multiplot layout 1,2 title "twinlease: cost against the number of leases (make bench-scale)"
set grid
set logscale xy
set key top left
set xlabel "leases in the store (pool of the same size)"
set ylabel "seconds"
plot '$tsv' using 1:2 with linespoints title "start-up (open + load to READY)", \
     '$tsv' using 1:5 with linespoints title "leases --json", \
     x / 65536.0 with lines dashtype 2 lc "gray" title "linear (1 s at 65,536)"
set ylabel "MiB  /  microseconds"
plot '$tsv' using 1:3 with linespoints title "RSS after start-up (MiB)", \
     '$tsv' using 1:4 with linespoints title "reaper CPU per expired lease (µs)"
unset multiplot
GP
}

"$kind"
echo "plot: $svg"

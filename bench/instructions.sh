#!/usr/bin/env bash
# Instructions per lease: one twinlease under callgrind (valgrind) in a namespace, a slow
# bounded perfdhcp (relay mode) doing whole DORAs with new clients. A warm-up phase first
# (WARM leases: the store, the allocator's maps and the sockets are in use), then callgrind's
# counters are zeroed, MEASURE more leases are made, and the counters dumped:
#     instructions per lease = instructions executed by the whole process / ACKs received.
# At this rate every request is handled and committed on its own (no group commit forms), so the
# figure is repeatable to a few per cent, unlike wall-clock figures on a shared machine; it
# includes the fsync'd commit per lease and the idle ticks of the run (a fixed share at a fixed rate).
#
#   instructions.sh BIN [BASELINE_FILE]
# With a baseline file (one line: "instructions_per_lease N"), fails when the figure is above
# it by more than 10 %; UPDATE_BASELINE=1 writes the figure into the file instead.
# KEEP_DUMP=FILE keeps the callgrind profile of the measured phase (callgrind_annotate FILE).
set -euo pipefail

BIN=$(readlink -f "${1:?usage: instructions.sh path/to/twinlease [baseline-file]}")
BASELINE=${2:-}
WARM=${WARM:-200}
MEASURE=${MEASURE:-800}
RATE=${RATE:-40}
STEP_SECS=30
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[[ $(id -u) -eq 0 ]] || { echo "needs root (network namespaces)"; exit 1; }
command -v valgrind >/dev/null || { echo "valgrind missing (Debian package valgrind)"; exit 1; }
command -v perfdhcp >/dev/null || { echo "perfdhcp missing (Debian package kea-admin)"; exit 1; }

id=$$
SRV=tl-bins-s-$id
PERF=tl-bins-p-$id
VS=tli${id: -5}s
VP=tli${id: -5}p
WORK=$(mktemp -d /tmp/twinlease-instr.XXXXXX)
SERVER_PID=
cleanup() {
    [[ -n $SERVER_PID ]] && kill "$SERVER_PID" 2>/dev/null || true
    bench_drop_netns "$PERF" "$SRV"
    rm -rf "$WORK"
}
trap cleanup EXIT

bench_lan "$SRV" "$VS" "$PERF" "$VP"
bench_macs "$WORK/macs.txt"
head -n "$WARM" "$WORK/macs.txt" > "$WORK/warm.txt"
tail -n +"$((WARM + 1))" "$WORK/macs.txt" > "$WORK/measure.txt"

twinlease_conf "$WORK/twinlease.toml" bench "$WORK/state" "$VS" "warn"
ip netns exec "$SRV" env TWINLEASE_LOG_STDERR=1 valgrind --tool=callgrind --vgdb=yes \
    --callgrind-out-file="$WORK/callgrind.out" "$BIN" run --config "$WORK/twinlease.toml" > "$WORK/server.log" 2>&1 &
SERVER_PID=$!
# valgrind starts slowly: the port shows up within a minute.
for _ in $(seq 1 240); do
    ip netns exec "$SRV" ss -Hlun 'sport = :67' | grep -q . && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log"; exit 1; }
    sleep 0.25
done
ip netns exec "$SRV" ss -Hlun 'sport = :67' | grep -q . || { echo "twinlease did not start under valgrind"; cat "$WORK/server.log"; exit 1; }

phase() { # phase MACS COUNT OUT
    ip netns exec "$PERF" perfdhcp -4 -l "$BENCH_RELAY_IP" -r "$RATE" -n "$2" -M "$1" -W 2000000 "$BENCH_SERVER_IP" > "$3" 2>&1 || true
}
acks() { awk '/REQUEST-ACK/ { s = 1 } s && /received packets/ { split($0, a, ":"); print a[2] + 0; exit }' "$1"; }

phase "$WORK/warm.txt" "$WARM" "$WORK/warm.out"
callgrind_control -z "$SERVER_PID" > /dev/null 2>&1
phase "$WORK/measure.txt" "$MEASURE" "$WORK/measure.out"
callgrind_control -d "$SERVER_PID" > /dev/null 2>&1
kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=

n=$(acks "$WORK/measure.out")
dump=$(ls "$WORK"/callgrind.out.* 2>/dev/null | head -1)
[[ -n $dump ]] || { echo "no callgrind dump"; cat "$WORK/server.log"; exit 1; }
ir=$(awk '/^summary:/ { print $2; exit }' "$dump")
[[ -z ${KEEP_DUMP:-} ]] || cp "$dump" "$KEEP_DUMP"
(( n > MEASURE * 9 / 10 )) || { echo "only $n of $MEASURE DORAs completed under valgrind"; cat "$WORK/measure.out"; exit 1; }
per=$((ir / n))
echo "instructions per lease: $per ($ir instructions for $n leases at $RATE/s, $(basename "$BIN"), $(stat -c %s "$BIN") bytes)"

[[ -n $BASELINE ]] || exit 0
if [[ ${UPDATE_BASELINE:-0} == 1 || ! -f $BASELINE ]]; then
    echo "instructions_per_lease $per" > "$BASELINE"
    echo "baseline written: $BASELINE"
    exit 0
fi
base=$(awk '/^instructions_per_lease/ { print $2 }' "$BASELINE")
limit=$((base + base / 10))
echo "baseline $base (from $BASELINE), limit +10 % = $limit: $(ratio "$per" "$base")x the baseline"
(( per <= limit )) || { echo "REGRESSION: $per instructions per lease > $limit"; exit 1; }

#!/usr/bin/env bash
# Asserts that a binary is statically linked for the expected machine:
#   scripts/check-static.sh dist/twinlease-aarch64 aarch64
# `file` must say static (or static-pie) and name the machine; `ldd` must find no dynamic
# section; the test-only fault injection hooks must be absent. Prints one line with the size
# (the size budget is reported, not enforced here).
set -euo pipefail
bin="$1" machine="$2"
[[ -f "$bin" ]] || { echo "check-static: $bin does not exist"; exit 1; }
desc="$(file -b "$bin")"
case "$desc" in
    *"statically linked"*|*"static-pie linked"*) ;;
    *) echo "check-static: $bin is not static: $desc"; exit 1 ;;
esac
case "$desc" in
    *"$machine"*) ;;
    *) echo "check-static: $bin is not for $machine: $desc"; exit 1 ;;
esac
case "$desc" in
    *"not stripped"*) echo "check-static: $bin is not stripped: $desc"; exit 1 ;;
esac
# ldd exits 1 and says "not a dynamic executable" for static binaries of any machine.
lddout="$(ldd "$bin" 2>&1 || true)"
case "$lddout" in
    *"not a dynamic executable"*|*"statically linked"*) ;;
    *) echo "check-static: ldd finds dynamic dependencies in $bin:"; echo "$lddout"; exit 1 ;;
esac
# The test-only fault injection hooks (cargo feature fault-injection) must not ship.
if grep -q -a "fault injection: wedging" "$bin"; then
    echo "check-static: $bin was built with the fault-injection feature (tests only)"; exit 1
fi
bytes=$(stat -c %s "$bin")
echo "check-static: $bin OK: $machine, $(grep -o -E 'statically linked|static-pie linked' <<<"$desc"), stripped, $bytes bytes ($(awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 1048576 }') MiB)"

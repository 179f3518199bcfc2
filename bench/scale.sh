#!/usr/bin/env bash
# make bench-scale: how the daemon's costs grow with the number of leases. For each SIZES entry
# N: a pool of N addresses and a store of N rows written with SQL
# (bench/scale_store.py into a store the daemon created: 7 in 8 leased to distinct clients, every 8th released with its last
# client kept — the released history), then the shipped binary started on it (bench/ready.py):
#   start-up   exec → READY=1 (open + quick_check + load into the allocator + sockets)
#   RSS        VmRSS once the started box is idle
#   reaper     the same store with every lease expired ten seconds ago: the process CPU from
#              READY until it is idle again (the reaper frees and commits them all), minus the
#              same figure for the live store, per expired lease
#   leases --json   the CLI listing the whole store (stdout to /dev/null)
# The full catch-up of a pair is measured at 65,536 leases by `make bench-catch-up` (a standby
# with an empty store; tests/pair.rs), which `make bench-scale` runs after the table.
#
# The pools are configuration only (10.0.0.0/11 and below: 1,048,576 addresses do not fit in
# 198.18.0.0/15); no packet carries them. The box's one interface has 198.18.0.1/16.
#   scale.sh SHIPPED_BIN
set -euo pipefail

BIN=$(readlink -f "${1:?usage: scale.sh path/to/twinlease}")
SIZES=${SIZES:-"254 65536 1048576"}
OUT=${OUT:-bench/results}
HERE=$(dirname "${BASH_SOURCE[0]}")
[[ $(id -u) -eq 0 ]] || { echo "needs root (a network namespace)"; exit 1; }
CLK_TCK=$(getconf CLK_TCK)

NS=tl-bscale-$$
VETH=tls${$: -5}
WORK=$(mktemp -d /tmp/twinlease-scale.XXXXXX)
cleanup() {
    ip netns pids "$NS" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$NS" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" link add "$VETH" type veth peer name "${VETH}x"
ip -n "$NS" addr add 198.18.0.1/16 dev "$VETH"
ip -n "$NS" link set "${VETH}x" up
ip -n "$NS" link set "$VETH" up

# subnet N → "cidr last_address" of a pool of N addresses from 10.0.0.1
pool_of() {
    python3 -c '
import ipaddress, sys
n = int(sys.argv[1])
last = ipaddress.ip_address("10.0.0.1") + n - 1
prefix = 32 - (n + 1).bit_length()
print(f"10.0.0.0/{prefix}", last)' "$1"
}

conf() { # conf DIR N
    read -r cidr last < <(pool_of "$2")
    cat > "$1/twinlease.toml" <<EOT
[node]
name = "scale"
state_dir = "$1/state"
[dhcp]
interfaces = ["$VETH"]
ping_check = false
max_pool_addresses = 1048576
[[subnet]]
cidr = "$cidr"
pools = ["10.0.0.1-$last"]
lease_secs = 3600
[control]
runtime_dir = "$1/run"
[log]
filter = "warn"
EOT
}

# measure DIR → the ready.py line for the daemon on DIR's store
measure() {
    SERVER_LOG="$1/server.log" ip netns exec "$NS" env TWINLEASE_LOG_STDERR=1 python3 "$HERE/ready.py" \
        "$BIN" run --config "$1/twinlease.toml"
}

field() { sed -n "s/.*\b$1=\([0-9.]*\).*/\1/p" <<< "$2"; }

mkdir -p "$OUT"
tsv=$OUT/scale.tsv
echo "# leases	start_s	rss_mib	reaper_us_per_lease	leases_json_s" > "$tsv"
printf '%-10s | %-9s | %-9s | %-9s | %-22s | %s\n' leases "start s" "RSS MiB" "peak MiB" "reaper µs/expired lease" "leases --json s"
for n in $SIZES; do
    live=$WORK/live-$n expired=$WORK/expired-$n
    mkdir -p "$live/state" "$live/run" "$expired/state" "$expired/run"
    conf "$live" "$n"; conf "$expired" "$n"
    for d in "$live" "$expired"; do measure "$d" > /dev/null || { cat "$d/server.log"; exit 1; }; done
    python3 "$HERE/scale_store.py" "$live/state/leases.db" 10.0.0.1 "$n"
    python3 "$HERE/scale_store.py" "$expired/state/leases.db" 10.0.0.1 "$n" --expired
    a=$(measure "$live") || { cat "$live/server.log"; exit 1; }
    b=$(measure "$expired") || { cat "$expired/server.log"; exit 1; }
    t0=$(date +%s.%N)
    "$BIN" leases --config "$live/twinlease.toml" --json > /dev/null
    t1=$(date +%s.%N)
    reaped=$(( n - n / 8 ))
    read -r start rss hwm reaper json < <(awk -v a_ready="$(field ready_s "$a")" -v a_rss="$(field rss_kib "$a")" \
        -v a_hwm="$(field hwm_kib "$a")" -v a_t="$(field cpu_ticks "$a")" -v b_t="$(field cpu_ticks "$b")" \
        -v hz="$CLK_TCK" -v n="$reaped" -v t0="$t0" -v t1="$t1" 'BEGIN {
            r = (b_t - a_t) / hz * 1e6 / n; if (r < 0) r = 0
            printf "%.3f %.1f %.1f %.2f %.3f\n", a_ready, a_rss / 1024, a_hwm / 1024, r, t1 - t0 }')
    printf '%-10s | %9s | %9s | %9s | %22s | %s\n' "$n" "$start" "$rss" "$hwm" "$reaper" "$json"
    printf '%s\t%s\t%s\t%s\t%s\n' "$n" "$start" "$rss" "$reaper" "$json" >> "$tsv"
    rm -rf "$live" "$expired"
done
echo "(budgets: start ≤ 1 s at 65,536 leases and ≤ 10 s at 1,048,576; RSS ≤ 24 MiB at 65,536; table: $tsv)"

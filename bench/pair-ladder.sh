#!/usr/bin/env bash
# make bench-pair: the DHCP ladder against a *pair*, side by side in one run, at each offered rate:
#   pair     two twinlease boxes (active pinned `active:1`, standby pinned `standby`), lease sync
#            over a veth peer link, sync_mode = "before-ack": every DHCPACK waits until the
#            standby has the lease on its disk (or ack_timeout_ms, which the report flags)
#   single   one twinlease box, as in bench/dhcp-ladder.sh
#   kea-ha   two kea-dhcp4 (memfile, persist on, single-threaded) with the HA hook in hot-standby
#            mode; each partner reaches the other through its kea-ctrl-agent (Kea 2.2's own HA
#            listener needs a multi-threaded server); the primary parks each ACK until the
#            standby confirmed the lease update
#   kea_ha_mt the same pair multi-threaded (2 packet threads, still pinned to one core each)
#            with the HA hook's own HTTP listener instead of the control agents (KEA_HA_MT=0 skips it)
#   kea      one kea-dhcp4 (memfile), as in bench/dhcp-ladder.sh (KEA_SINGLE=0 skips it)
#
# Namespaces: A (the serving box: LAN 198.18.0.1/16 towards perfdhcp, peer link 198.19.0.1/30),
# B (the partner: peer link 198.19.0.2/30 and a "LAN" 198.18.0.1/16 that no client reaches),
# P (perfdhcp relaying from 198.18.0.2). All addresses are from 198.18.0.0/15.
# CPUs: the serving box (twinlease active, Kea primary and its control agent) on CPU 0 and the
# partner (twinlease standby, Kea standby and its control agent) on CPU 0 too; perfdhcp alone on
# CPU 1. A 2-core machine has no third core: with the partner beside perfdhcp (PARTNER_CPU=1)
# perfdhcp itself ran short of CPU above ~9,000/s and the pair's drops were the load
# generator's. On one core the pair gets less CPU than two real boxes have (conservative).
# Every step starts from empty state directories and loads only once the pair is ready:
# twinlease — the active logs "partner in sync" and the standby "catch-up with the partner
# complete"; Kea — both servers answer ha-heartbeat with state "hot-standby".
set -euo pipefail

BIN=$(readlink -f "${1:?usage: pair-ladder.sh path/to/twinlease}")
RATES=${RATES:-"2000 4000 6000 8000 10000 12000"}
STEP_SECS=${STEP_SECS:-10}
PARTNER_CPU=${PARTNER_CPU:-0}
ACK_TIMEOUT_MS=${ACK_TIMEOUT_MS:-200}
READY_SECS=${READY_SECS:-60}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_preflight

id=$$
sfx=${id: -5}
NS_A=tl-bpair-a-$id
NS_B=tl-bpair-b-$id
NS_P=tl-bpair-p-$id
LAN_A=tp${sfx}s
LAN_P=tp${sfx}p
LAN_B=tp${sfx}d
LINK_A=tp${sfx}k
LINK_B=tp${sfx}l
PEER_A=198.19.0.1
PEER_B=198.19.0.2
WORK=$(mktemp -d /tmp/twinlease-bench-pair.XXXXXX)

stop_servers() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    PIDS=()
}

cleanup() {
    stop_servers
    bench_drop_netns "$NS_P" "$NS_A" "$NS_B"
    bench_cgroup_remove
    if [[ ${KEEP:-0} == 1 ]]; then echo "logs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

bench_lan "$NS_A" "$LAN_A" "$NS_P" "$LAN_P"
ip netns add "$NS_B"
ip -n "$NS_B" link set lo up
# (a veth whose other end stays unused in B: the dummy driver is not available everywhere)
ip -n "$NS_B" link add "$LAN_B" type veth peer name "${LAN_B}x"
ip -n "$NS_B" addr add "$BENCH_SERVER_IP/16" dev "$LAN_B"
ip -n "$NS_B" link set "${LAN_B}x" up
ip -n "$NS_B" link set "$LAN_B" up
ip link add "$LINK_A" netns "$NS_A" type veth peer name "$LINK_B" netns "$NS_B"
ip -n "$NS_A" addr add "$PEER_A/30" dev "$LINK_A"
ip -n "$NS_B" addr add "$PEER_B/30" dev "$LINK_B"
ip -n "$NS_A" link set "$LINK_A" up
ip -n "$NS_B" link set "$LINK_B" up

bench_macs "$WORK/macs.txt"
head -c 32 /dev/urandom | base64 > "$WORK/peer.key"
chmod 600 "$WORK/peer.key"

# The process that serves perfdhcp and its partner(s), for the CPU accounting of a step.
SERVER=()
PARTNER=()

# ---- twinlease --------------------------------------------------------------------------

TL_FILTER="warn,twinlease::stats=info,twinlease::server::replication=info"

start_single() {
    start_twinlease_box "$BIN" "$NS_A" "$LAN_A" "$1" "$TL_FILTER"
    SERVER=("$LAUNCHED"); PARTNER=()
    wait_port_67 "$NS_A" "${SERVER[0]}"
}

# peer_toml ME OTHER: the [peer] section of a box listening on ME and dialling OTHER.
peer_toml() {
    printf '[peer]\nlisten = "%s:6767"\naddress = "%s:6767"\nkey_file = "%s"\nsync_mode = "before-ack"\nack_timeout_ms = %d\n' \
        "$1" "$2" "$WORK/peer.key" "$ACK_TIMEOUT_MS"
}

start_pair() {
    local dir=$1
    twinlease_conf "$dir/a.toml" box-a "$dir/a-state" "$LAN_A" "$TL_FILTER" "$(peer_toml "$PEER_A" "$PEER_B")"
    twinlease_conf "$dir/b.toml" box-b "$dir/b-state" "$LAN_B" "$TL_FILTER" "$(peer_toml "$PEER_B" "$PEER_A")"
    launch "$NS_A" 0 "$dir/server.log" env TWINLEASE_LOG_STDERR=1 "$BIN" run --pin-role active:1 --config "$dir/a.toml"
    SERVER=("$LAUNCHED")
    launch "$NS_B" "$PARTNER_CPU" "$dir/partner.log" env TWINLEASE_LOG_STDERR=1 "$BIN" run --pin-role standby --config "$dir/b.toml"
    PARTNER=("$LAUNCHED")
    wait_port_67 "$NS_A" "${SERVER[0]}" &&
        wait_file_text "$dir/server.log" "partner in sync" "$READY_SECS" "${SERVER[0]}" &&
        wait_file_text "$dir/partner.log" "catch-up with the partner complete" "$READY_SECS" "${PARTNER[0]}"
}

# What a pair step leaves to check: did the active stop waiting for the standby during the
# load (ack_timeout_ms ran out: then, until the next "partner in sync", its ACKs did not wait and
# that part of the step is not a before-ack figure), for how long, and how many leases each box
# holds right after the load.
check_pair() {
    local dir=$1 timeouts leased_a leased_b
    timeouts=$(awk '
        function secs(t) { split(substr(t, 12, 15), h, ":"); return h[1] * 3600 + h[2] * 60 + h[3] }
        /partner unreachable or behind/ { if (from == "") from = secs($1); n++ }
        /partner in sync/ && from != "" { lost += secs($1) - from; from = "" }
        END { if (from != "") lost += last - from; printf "%d (not waiting for %.2f s)", n, lost }
        { last = secs($1) }' "$dir/server.log")
    leased_a=$(leased_count "$dir/a.toml")
    leased_b=$(leased_count "$dir/b.toml")
    echo "ack-timeouts=$timeouts active-leases=$leased_a standby-leases=$leased_b"
}

leased_count() {
    "$BIN" leases --json --config "$1" 2>/dev/null |
        python3 -c 'import json, sys; print(sum(1 for r in json.load(sys.stdin) if r.get("state") == "leased"))' 2>/dev/null || echo "?"
}

# ---- Kea --------------------------------------------------------------------------------

hook_path() {
    local p
    p=$(dpkg -L kea-dhcp4-server kea-common 2>/dev/null | grep -m1 "/$1\$" || true)
    [[ -n $p && -e $p ]] || { echo "Kea hook $1 not found (dpkg -L kea-dhcp4-server)" >&2; return 1; }
    echo "$p"
}

start_kea() {
    start_kea_box "$NS_A" "$LAN_A" "$1"
    SERVER=("$LAUNCHED"); PARTNER=()
    wait_port_67 "$NS_A" "${SERVER[0]}"
}

# kea_ha_json NAME SOCKET MT: the HA members of one partner's Dhcp4 (hot-standby, Kea's default
# timers except a 1 s heartbeat so that a step becomes ready in seconds). MT=0: single-threaded,
# as in ISC's published HA figure, partners reached through their control agents; MT=1: Kea's
# multi-threaded mode (2 packet threads) with the HA hook's own HTTP listener (no control agent).
kea_ha_json() {
    local server_mt=false ha_mt=""
    if [[ $3 == 1 ]]; then
        server_mt=true
        ha_mt='"multi-threading": { "enable-multi-threading": true, "http-dedicated-listener": true, "http-listener-threads": 2, "http-client-threads": 2 },'
    fi
    cat <<EOF
"multi-threading": { "enable-multi-threading": $server_mt, "thread-pool-size": 2, "packet-queue-size": 64 },
"control-socket": { "socket-type": "unix", "socket-name": "$2" },
"hooks-libraries": [
  { "library": "$HOOK_LEASE_CMDS" },
  { "library": "$HOOK_HA", "parameters": { "high-availability": [ {
      "this-server-name": "$1",
      "mode": "hot-standby",
      "heartbeat-delay": 1000,
      "max-response-delay": 60000,
      "max-ack-delay": 10000,
      "max-unacked-clients": 10,
      $ha_mt
      "peers": [
        { "name": "kea-a", "url": "http://$PEER_A:8000/", "role": "primary", "auto-failover": true },
        { "name": "kea-b", "url": "http://$PEER_B:8000/", "role": "standby", "auto-failover": true }
      ] } ] } }
],
EOF
}

# ca_conf FILE ADDRESS SOCKET DIR: a control agent forwarding HTTP commands for dhcp4.
ca_conf() {
    cat > "$1" <<EOF
{ "Control-agent": {
    "http-host": "$2", "http-port": 8000,
    "control-sockets": { "dhcp4": { "socket-type": "unix", "socket-name": "$3" } },
    "loggers": [ { "name": "kea-ctrl-agent", "severity": "WARN", "output_options": [ { "output": "$4/ca.log" } ] } ]
} }
EOF
}

# kea_state SOCKET: the HA state a server reports over its control socket (empty if none).
kea_state() {
    printf '{ "command": "ha-heartbeat" }' | timeout 3 socat -t 2 - "UNIX-CONNECT:$1" 2>/dev/null |
        python3 -c 'import json, sys; print(json.load(sys.stdin).get("arguments", {}).get("state", ""))' 2>/dev/null || true
}

# wait_kea_ha DIR: until both partners report "hot-standby" (≤ READY_SECS), or one has died.
wait_kea_ha() {
    local dir=$1 deadline=$((SECONDS + READY_SECS)) sa sb pid
    while :; do
        sa=$(kea_state "$dir/a/kea4.sock"); sb=$(kea_state "$dir/b/kea4.sock")
        [[ $sa == hot-standby && $sb == hot-standby ]] && return 0
        for pid in "${SERVER[@]}" "${PARTNER[@]}"; do
            kill -0 "$pid" 2>/dev/null || { echo "a Kea HA process died (states: primary '$sa', standby '$sb')" >&2; return 1; }
        done
        (( SECONDS < deadline )) || { echo "Kea HA not in hot-standby after ${READY_SECS}s: primary '$sa', standby '$sb'" >&2; return 1; }
        sleep 0.1
    done
}

# start_kea_ha_with DIR MT: both partners (and, single-threaded, their control agents).
start_kea_ha_with() {
    local dir=$1 mt=$2 side ns cpu addr lan dhcp
    for side in a b; do
        mkdir -p "$dir/$side"
        if [[ $side == a ]]; then ns=$NS_A cpu=0 addr=$PEER_A lan=$LAN_A; else ns=$NS_B cpu=$PARTNER_CPU addr=$PEER_B lan=$LAN_B; fi
        kea_conf "$dir/$side/kea.json" "$lan" "$dir/$side" "$(kea_ha_json "kea-$side" "$dir/$side/kea4.sock" "$mt")"
        launch "$ns" "$cpu" "$dir/$side/server.log" env KEA_PIDFILE_DIR="$dir/$side" KEA_LOCKFILE_DIR="$dir/$side" kea-dhcp4 -c "$dir/$side/kea.json"
        dhcp=$LAUNCHED
        if [[ $mt == 0 ]]; then
            ca_conf "$dir/$side/ca.json" "$addr" "$dir/$side/kea4.sock" "$dir/$side"
            launch "$ns" "$cpu" "$dir/$side/ca.out" env KEA_PIDFILE_DIR="$dir/$side" KEA_LOCKFILE_DIR="$dir/$side" kea-ctrl-agent -c "$dir/$side/ca.json"
            dhcp="$dhcp $LAUNCHED"
        fi
        # shellcheck disable=SC2206  # one PID or two, split on purpose
        if [[ $side == a ]]; then SERVER=($dhcp); else PARTNER=($dhcp); fi
    done
    wait_port_67 "$NS_A" "${SERVER[0]}" && wait_kea_ha "$dir"
}
start_kea_ha() { start_kea_ha_with "$1" 0; }
start_kea_ha_mt() { start_kea_ha_with "$1" 1; }

# After the load: did the primary stay in hot-standby (else its ACKs stopped waiting)?
check_kea_ha() {
    echo "primary-state-after=$(kea_state "$1/a/kea4.sock") standby-state-after=$(kea_state "$1/b/kea4.sock")"
}

check_kea_ha_mt() { check_kea_ha "$@"; }
check_single() { echo "-"; }
check_kea() { echo "-"; }

# ---- one step -----------------------------------------------------------------------------

# run_step KIND RATE → "rate acks/s drop% lat cpu/1k partner-cpu/1k" on stdout; the step's
# readiness wait and notes go to $WORK/notes.
run_step() {
    local kind=$1 rate=$2 dir t0 t1 p0=0 p1=0 ready=${EPOCHREALTIME/./}
    dir=$(mktemp -d "$WORK/$kind-$rate.XXXX")
    if ! "start_$kind" "$dir"; then
        echo "$kind at $rate/s did not become ready; logs:" >&2
        tail -n 20 "$dir"/*.log "$dir"/*/*.log >&2 2>/dev/null || true
        stop_servers
        echo "$rate 0 100 0 0 0"
        echo "$kind $rate: NOT READY" >> "$WORK/notes"
        return 0
    fi
    ready=$(( (${EPOCHREALTIME/./} - ready) / 1000 ))
    t0=$(cpu_ticks "${SERVER[@]}")
    ((${#PARTNER[@]})) && p0=$(cpu_ticks "${PARTNER[@]}")
    perf_load "$NS_P" "$rate" "$WORK/macs.txt" "$dir/perf.txt"
    t1=$(cpu_ticks "${SERVER[@]}")
    ((${#PARTNER[@]})) && p1=$(cpu_ticks "${PARTNER[@]}")
    echo "$kind $rate: ready in ${ready} ms; $("check_$kind" "$dir")" >> "$WORK/notes"
    stop_servers
    perf_figures "$rate" $((t1 - t0)) "$dir/perf.txt" $((p1 - p0))
}

HOOK_HA=
HOOK_LEASE_CMDS=
kinds=(pair single)
if [[ ${KEA:-1} == 0 ]]; then :
elif ! command -v kea-dhcp4 >/dev/null; then echo "(kea-dhcp4 not installed: no Kea figures)"
else
    if command -v kea-ctrl-agent >/dev/null && HOOK_HA=$(hook_path libdhcp_ha.so) && HOOK_LEASE_CMDS=$(hook_path libdhcp_lease_cmds.so); then
        kinds+=(kea_ha)
        [[ ${KEA_HA_MT:-1} == 0 ]] || kinds+=(kea_ha_mt)
    else
        echo "(kea-ctrl-agent or the HA/lease_cmds hooks missing: no Kea HA figures)"
    fi
    [[ ${KEA_SINGLE:-1} == 0 ]] || kinds+=(kea)
fi
command -v socat >/dev/null || { [[ " ${kinds[*]} " != *" kea_ha "* ]] || { echo "socat is needed to poll Kea HA's state"; exit 1; }; }

run_ladder

# ---- report -------------------------------------------------------------------------------

has() { [[ " ${kinds[*]} " == *" $1 "* ]]; }
declare -A best=() peak=()
for kind in "${kinds[@]}"; do best[$kind]=0; peak[$kind]=0; done
declare -A title=([pair]="twinlease pair (before-ack)" [single]="twinlease single" [kea_ha]="Kea HA hot-standby" [kea_ha_mt]="Kea HA hot-standby, MT" [kea]="Kea memfile single")

echo
echo "perfdhcp relay mode, ${STEP_SECS}s per step, 50,000 random MACs; serving box on CPU 0, perfdhcp on CPU 1,"
echo "partner (standby + for Kea its control agent) on CPU $PARTNER_CPU; fresh empty state per step"
echo "twinlease: SQLite WAL synchronous=FULL, ACK after fsync; pair: ACK also after the standby's fsync"
echo "(ack_timeout_ms = $ACK_TIMEOUT_MS). Kea: memfile, persist on (no fsync), single-threaded except \"MT\"."
echo "columns: leases/s, drop %, mean REQUEST→ACK ms, server CPU ms per 1k leases [+ partner CPU ms per 1k]"
echo
for kind in "${kinds[@]}"; do
    echo "${title[$kind]}:"
    printf '  %-9s %9s %8s %9s %11s %13s\n' offered leases/s drop% lat-ms cpu/1k partner/1k
    for rate in $RATES; do
        read -r _ l d lat cpu pcpu <<< "${result[$kind,$rate]}"
        [[ $kind == pair || $kind == kea_ha* ]] || pcpu=-
        printf '  %-9s %9s %7s%% %9s %11s %13s\n' "$rate/s" "$l" "$d" "$lat" "$cpu" "$pcpu"
        if under_1pct "$d" && (( l > best[$kind] )); then best[$kind]=$l; fi
        if (( l > peak[$kind] )); then peak[$kind]=$l; fi
    done
done

echo
echo "ratios per step (leases/s):"
for rate in $RATES; do
    read -r _ pl _ <<< "${result[pair,$rate]}"
    read -r _ sl _ <<< "${result[single,$rate]}"
    line=$(printf '  %-9s pair/single %s' "$rate/s" "$(ratio "$pl" "$sl")")
    if has kea_ha; then
        read -r _ hl _ <<< "${result[kea_ha,$rate]}"
        line+=$(printf '   pair/kea-ha %s' "$(ratio "$pl" "$hl")")
    fi
    if has kea_ha_mt; then
        read -r _ ml _ <<< "${result[kea_ha_mt,$rate]}"
        line+=$(printf '   pair/kea-ha-mt %s' "$(ratio "$pl" "$ml")")
    fi
    echo "$line"
done

echo
echo "best rate with < 1% drops, and peak leases/s at any step (the ladder's top rate caps both):"
for kind in "${kinds[@]}"; do printf '  %-28s %6s leases/s < 1%% drops   peak %6s leases/s\n' "${title[$kind]}" "${best[$kind]}" "${peak[$kind]}"; done
# target_line NAME KIND TARGET: the ratio at < 1 % drops, or — when B never got under 1 % — of the peaks.
target_line() {
    local kind=$2
    if (( best[pair] > 0 && best[$kind] > 0 )); then
        echo "  $1: $(ratio "${best[pair]}" "${best[$kind]}")x at < 1% drops, $(ratio "${peak[pair]}" "${peak[$kind]}")x of the peaks (target ≥ $3)"
    else
        echo "  $1: n/a at < 1% drops (one side never got under 1%), $(ratio "${peak[pair]}" "${peak[$kind]}")x of the peaks (target ≥ $3)"
    fi
}
target_line pair/single single 0.8x
if has kea_ha; then target_line "pair/kea-ha (side by side)" kea_ha 2x; fi
if has kea_ha_mt; then target_line "pair/kea-ha-mt (side by side; not the target's reference)" kea_ha_mt 2x; fi
echo "  pair / Kea's published HA hot-standby figure (5,621 leases/s, ISC lab, 2.5% drops): $(ratio "${best[pair]}" 5621)x"
echo
echo "per-step notes (readiness wait; pair: ACKs that stopped waiting for the standby, leases on"
echo "each box right after the load; Kea HA: states after the load):"
sed 's/^/  /' "$WORK/notes"
echo
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

# The table for bench/plot.sh (the serving box's CPU per lease; the partner's is in the text).
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
{
    printf '# offered'
    for kind in "${kinds[@]}"; do printf '\t%s_leases\t%s_drop\t%s_lat\t%s_cpu' "$kind" "$kind" "$kind" "$kind"; done
    echo
    for rate in $RATES; do
        printf '%s' "$rate"
        for kind in "${kinds[@]}"; do
            read -r _ l d lat cpu _ <<< "${result[$kind,$rate]}"
            printf '\t%s\t%s\t%s\t%s' "$l" "$d" "$lat" "$cpu"
        done
        echo
    done
} > "$OUT/bench-pair.tsv"
echo "(table: $OUT/bench-pair.tsv)"

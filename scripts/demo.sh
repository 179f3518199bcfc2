#!/usr/bin/env bash
# make demo: a throwaway branch office in network namespaces. Two twinlease boxes share one
# client LAN (a bridge in a "switch" namespace), talk lease sync over a direct peer link, and
# elect the active box through a SQLite arbiter file that both processes share (the embedded
# default: no database server). A real DHCP client (busybox udhcpc) gets a lease; the active box
# is killed with SIGKILL; the other takes over within T + I and the client keeps its address;
# the dead box comes back with an empty disk and catches up. Exits non-zero if any step fails;
# everything (processes, namespaces, files) is removed on exit.
set -euo pipefail

BIN=${1:-target/release/twinlease}
BIN=$(readlink -f "$BIN")
[[ -x $BIN ]] || { echo "no twinlease binary at $BIN"; exit 1; }
[[ $(id -u) -eq 0 ]] || { echo "make demo needs root (it creates network namespaces)"; exit 1; }
for tool in ip udhcpc; do
    command -v "$tool" >/dev/null || { echo "make demo needs $tool (make deps installs it)"; exit 1; }
done

# Election timers: I = 500 ms, T = 2000 ms (the config requires T > 2I).
I_MS=500
T_MS=2000

id=$$
SW=tl-demo-sw-$id        # the LAN switch: a bridge
NS_a=tl-demo-a-$id       # box a: LAN 198.18.0.1, peer link 198.18.1.1
NS_b=tl-demo-b-$id       # box b: LAN 198.18.0.2, peer link 198.18.1.2
LAPTOP=tl-demo-laptop-$id
PRINTER=tl-demo-printer-$id
WORK=$(mktemp -d /tmp/twinlease-demo.XXXXXX)
declare -A PID=([a]= [b]=) LOG=() CFG=() LANIP=([a]=198.18.0.1 [b]=198.18.0.2) NAME=([a]=box-a [b]=box-b)
CLIENT_PID=
STEP=setup

cleanup() {
    local rc=$?
    trap - EXIT
    if [[ $rc -ne 0 ]]; then
        printf '\n\033[1;31m== FAILED during: %s (exit %s)\033[0m\n' "$STEP" "$rc"
        for x in a b; do
            for f in "$WORK"/$x/server*.log; do
                [[ -f $f ]] && { echo "---- $f (last 30 lines)"; tail -n 30 "$f"; }
            done
        done
        [[ -f $WORK/laptop.log ]] && { echo "---- udhcpc (laptop)"; cat "$WORK/laptop.log"; }
    fi
    exec 2>/dev/null   # bash would report each process killed below as "Killed"
    for p in "$CLIENT_PID" "${PID[a]}" "${PID[b]}"; do
        [[ -n $p ]] && kill -9 "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    for ns in "$LAPTOP" "$PRINTER" "$NS_a" "$NS_b" "$SW"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { STEP=$*; printf '\n\033[1m== %s\033[0m\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
indent() { sed 's/^/  /'; }

# CLOCK_MONOTONIC in ns, the clock twinlease stamps its "role change" lines with (mono_ns=).
# /proc/timer_list shows it ("now at N nsecs") to root; without it the failover is timed by the
# wall clock instead (the kill against the role change line's UTC stamp).
mono_now() { awk '/^now at/ { print $3; exit }' /proc/timer_list 2>/dev/null || true; }

# wait_until DESCRIPTION SECONDS COMMAND...: polls COMMAND every 50 ms, fails after SECONDS.
wait_until() {
    local what=$1 limit=$2; shift 2
    local deadline=$((SECONDS + limit))
    until "$@"; do
        ((SECONDS < deadline)) || fail "timed out after ${limit}s waiting for $what"
        sleep 0.05
    done
}

# Role changes to active in box $1's current log.
active_lines() { grep 'role change' "${LOG[$1]}" 2>/dev/null | grep 'role="active"' || true; }
is_active() { [[ -n $(active_lines "$1") ]] && [[ $(grep 'role change' "${LOG[$1]}" | tail -n1) == *'role="active"'* ]]; }
alive() { kill -0 "${PID[$1]}" 2>/dev/null || fail "${NAME[$1]} exited; its log:"$'\n'"$(cat "${LOG[$1]}")"; }
whois_names() { "$BIN" whois --config "${CFG[$1]}" | grep -q "primary ${NAME[$1]} at"; }
logged() { grep -q "$2" "${LOG[$1]}" 2>/dev/null; }

say "building the lab: LAN switch $SW, boxes $NS_a and $NS_b, a peer link between them"
ip netns add "$SW"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
for x in a b; do
    ns=NS_$x
    ip netns add "${!ns}"
    ip link add "lan-$x" netns "${!ns}" type veth peer name "port-$x" netns "$SW"
    ip -n "$SW" link set "port-$x" master br0 up
    ip -n "${!ns}" addr add "${LANIP[$x]}/24" dev "lan-$x"
    ip -n "${!ns}" link set "lan-$x" up
    ip -n "${!ns}" link set lo up
done
ip link add peer-a netns "$NS_a" type veth peer name peer-b netns "$NS_b"
ip -n "$NS_a" addr add 198.18.1.1/30 dev peer-a
ip -n "$NS_b" addr add 198.18.1.2/30 dev peer-b
ip -n "$NS_a" link set peer-a up
ip -n "$NS_b" link set peer-b up
for host in laptop printer; do
    ns=${host^^}
    ip netns add "${!ns}"
    ip link add "$host" netns "${!ns}" type veth peer name "port-$host" netns "$SW"
    ip -n "$SW" link set "port-$host" master br0 up
    ip -n "${!ns}" link set "$host" up
    ip -n "${!ns}" link set lo up
done
ip -n "$PRINTER" link set printer address 02:00:00:00:00:99
printf '  LAN 198.18.0.0/24: box-a 198.18.0.1, box-b 198.18.0.2, a laptop and a printer (DHCP clients)\n'
printf '  peer link: box-a 198.18.1.1/30 <-> box-b 198.18.1.2/30\n  arbiter: SQLite file %s\n' "$WORK/arbiter/arbiter.db"

# The shared secret of the peer link (the daemon refuses a key file not mode 0600).
mkdir -p "$WORK/arbiter"
head -c 32 /dev/urandom | base64 > "$WORK/peer.key"
chmod 600 "$WORK/peer.key"

for x in a b; do
    if [[ $x == a ]]; then me=1 other=2; else me=2 other=1; fi
    mkdir -p "$WORK/$x"
    CFG[$x]=$WORK/$x/twinlease.toml
    LOG[$x]=$WORK/$x/server.log
    cat > "${CFG[$x]}" <<EOF
# The demo's embedded default for ${NAME[$x]}: one LAN, one pool, a reservation, a ping check,
# lease sync with the partner (before-ack) and an election through a shared SQLite file.
[node]
name = "${NAME[$x]}"
state_dir = "$WORK/$x/state"

[control]
runtime_dir = "$WORK/$x/run"

[dhcp]
interfaces = ["lan-$x"]
ping_check = true

[[subnet]]
cidr = "198.18.0.0/24"
pools = ["198.18.0.100-198.18.0.199"]
lease_secs = 3600
routers = ["198.18.0.254"]
dns_servers = ["198.18.0.254"]
domain_name = "branch.example"
ntp_servers = ["198.18.0.254"]

[[reservation]]
name = "printer"
hw = ["02:00:00:00:00:99"]
ip = "198.18.0.50"

[peer]
listen = "198.18.1.$me:6767"
address = "198.18.1.$other:6767"
key_file = "$WORK/peer.key"
sync_mode = "before-ack"
ack_timeout_ms = 200

[arbiter]
url = "sqlite://$WORK/arbiter/arbiter.db"
utype = "demo/dhcp"
interval_ms = $I_MS
timeout_ms = $T_MS
endpoint = "${LANIP[$x]}"

[log]
filter = "info"
EOF
done

# start_box X: runs box X in its namespace, logging to ${LOG[X]}; no --pin-role, so the box
# catches up with its partner, then stands in the election.
start_box() {
    ip netns exec "$(eval echo "\$NS_$1")" env TWINLEASE_LOG_STDERR=1 RUST_LOG=info \
        "$BIN" run --config "${CFG[$1]}" 2> "${LOG[$1]}" &
    PID[$1]=$!
}

say "1. check-config on both boxes, start both: lease-sync catch-up, then the election"
"$BIN" check-config "${CFG[a]}" | indent
"$BIN" check-config "${CFG[b]}" | indent
"$BIN" arbiter init --config "${CFG[a]}" | indent
start_box a
start_box b
echo "  started box-a (pid ${PID[a]}) and box-b (pid ${PID[b]}); interval I = $I_MS ms, timeout T = $T_MS ms"
one_active() { alive a; alive b; is_active a || is_active b; }
wait_until "a box to become active" 20 one_active
if is_active a; then ACT=a SBY=b; else ACT=b SBY=a; fi
wait_until "whois to name ${NAME[$ACT]}" 5 whois_names "$ACT"
is_active "$SBY" && fail "both boxes are active"
echo "  ${NAME[$ACT]} is active; ${NAME[$SBY]} stands by"
for x in a b; do
    grep -E 'caught up with the partner|partner unreachable at startup|role change' "${LOG[$x]}" | sed "s/^/  ${NAME[$x]}: /"
done
echo "  \$ twinlease whois"
"$BIN" whois --config "${CFG[a]}" | indent

cat > "$WORK/hook.sh" <<EOF
#!/bin/sh
# udhcpc's event script: configure the interface, print what the server handed out, and note
# each lease in $WORK/\$interface.events for the demo to check.
case "\$1" in
deconfig)
    ip addr flush dev "\$interface" ;;
bound|renew)
    ip addr flush dev "\$interface"
    ip addr add "\$ip/\$mask" dev "\$interface"
    printf '  udhcpc %s: address %s/%s, router %s, dns %s, domain %s, ntp %s, lease %s s, from server %s\n' \\
        "\$1" "\$ip" "\$mask" "\$router" "\$dns" "\$domain" "\$ntpsrv" "\$lease" "\$serverid"
    echo "\$1 \$ip \$serverid" >> "$WORK/\$interface.events" ;;
esac
EOF
chmod +x "$WORK/hook.sh"
events() { cat "$WORK/laptop.events" 2>/dev/null | wc -l; }
client_alive() { kill -0 "$CLIENT_PID" 2>/dev/null || fail "udhcpc exited:"$'\n'"$(cat "$WORK/laptop.log")"; }
got_event() { client_alive; (($(events) > $1)); }

# lease_row X ADDRESS: the row for ADDRESS in box X's lease table (empty if none).
lease_row() { "$BIN" leases --config "${CFG[$1]}" | awk -v a="$2" '$1 == a'; }

say "2. a real DHCP client (busybox udhcpc) on the LAN gets a lease from the active box"
# It asks for .142 (RFC 2132 option 50), so the address it keeps is not simply the first free one.
ip netns exec "$LAPTOP" udhcpc -f -i laptop -s "$WORK/hook.sh" -t 5 -T 2 -n -x hostname:laptop -r 198.18.0.142 \
    > "$WORK/laptop.log" 2>&1 &
CLIENT_PID=$!
wait_until "the laptop's lease" 20 got_event 0
read -r _ ADDR SERVER < <(tail -n1 "$WORK/laptop.events")
grep '^  udhcpc' "$WORK/laptop.log"
[[ $SERVER == "${LANIP[$ACT]}" ]] || fail "the lease came from $SERVER, not the active box ${LANIP[$ACT]}"
echo "  the laptop's interface:"
ip -n "$LAPTOP" -4 -br addr show dev laptop | indent
echo "  the printer (hw 02:00:00:00:00:99) asks too and gets its reservation:"
ip netns exec "$PRINTER" udhcpc -f -q -n -t 5 -T 2 -i printer -s "$WORK/hook.sh" -x hostname:printer 2>&1 \
    | grep '^  udhcpc' | indent
grep -q '^bound 198.18.0.50 ' "$WORK/printer.events" 2>/dev/null || fail "the printer did not get its reserved 198.18.0.50"
for x in "$ACT" "$SBY"; do
    echo "  \$ twinlease leases   # on ${NAME[$x]} ($([[ $x == "$ACT" ]] && echo active || echo standby))"
    "$BIN" leases --config "${CFG[$x]}" | indent
done
# before-ack: the DHCPACK left only once the standby had the lease on its disk.
[[ -n $(lease_row "$SBY" "$ADDR") ]] || fail "the standby does not have the laptop's lease $ADDR"
# Address, state, client, expiry and term must match (VER is per box, REMAINING ticks).
cmp -s <(lease_row "$ACT" "$ADDR" | awk '{print $1, $2, $3, $6, $9}') <(lease_row "$SBY" "$ADDR" | awk '{print $1, $2, $3, $6, $9}') \
    || fail "the two boxes disagree about $ADDR"
# The ACKs waited for the standby: the active's last word on its partner is "in sync", not an
# ack timeout ("DHCPACKs no longer wait for it").
sync_state=$(grep -E 'partner in sync|no longer wait' "${LOG[$ACT]}" | tail -n1)
[[ $sync_state == *'partner in sync'* ]] || fail "the active did not hold its ACKs for the standby: ${sync_state:-no sync state logged}"
sed "s/^/  ${NAME[$ACT]}: /" <<<"$sync_state"
echo "  both boxes hold $ADDR for the laptop: the standby had it on disk before the ACK left (sync_mode = \"before-ack\")"

say "3. kill -9 the active box (${NAME[$ACT]}); the standby takes over once its last heartbeat is T old"
KILLED_MONO=$(mono_now)
KILLED_WALL_NS=${EPOCHREALTIME/./}000
# (stderr off around kill and wait: bash reports a job killed by a signal as "Killed")
{ kill -9 "${PID[$ACT]}"; wait "${PID[$ACT]}" || true; } 2>/dev/null
PID[$ACT]=
echo "  killed ${NAME[$ACT]} at CLOCK_MONOTONIC ${KILLED_MONO:-?} ns"
took_over() { alive "$SBY"; is_active "$SBY"; }
wait_until "${NAME[$SBY]} to become active" $(((T_MS + I_MS) / 1000 + 10)) took_over
PROMOTED_LINE=$(active_lines "$SBY" | tail -n1)
PROMOTED_MONO=$(sed -n 's/.* mono_ns=\([0-9]*\).*/\1/p' <<<"$PROMOTED_LINE")
if [[ -n $KILLED_MONO && -n $PROMOTED_MONO ]]; then
    TOOK_MS=$(((PROMOTED_MONO - KILLED_MONO) / 1000000))
else
    echo "  (no CLOCK_MONOTONIC reading: timing by the wall clock)"
    TOOK_MS=$((($(date -d "${PROMOTED_LINE%% *}" +%s%N) - KILLED_WALL_NS) / 1000000))
fi
BOUND_MS=$((T_MS + I_MS + 1000))
active_lines "$SBY" | tail -n1 | sed "s/^/  ${NAME[$SBY]}: /"
echo "  failover: ${NAME[$SBY]} active ${TOOK_MS} ms after the kill (T = $T_MS ms; bound T + I + 1 s = $BOUND_MS ms)"
((TOOK_MS >= 0 && TOOK_MS <= BOUND_MS)) || fail "failover took ${TOOK_MS} ms, over $BOUND_MS ms"
wait_until "whois to name ${NAME[$SBY]}" 5 whois_names "$SBY"
echo "  \$ twinlease whois"
"$BIN" whois --config "${CFG[$SBY]}" | indent

say "4. the laptop renews (udhcpc gets SIGUSR1) and keeps its address, now from ${NAME[$SBY]}"
N=$(events)
kill -USR1 "$CLIENT_PID"
# udhcpc first unicasts the renewal to the server it knows (the dead box), then broadcasts it
# (RFC 2131 REBINDING), which the new active answers.
wait_until "the laptop's renewal" 15 got_event "$N"
read -r _ ADDR2 SERVER2 < <(tail -n1 "$WORK/laptop.events")
sed -n '/sending renew\|broadcasting renew/p' "$WORK/laptop.log" | indent
tail -n1 "$WORK/laptop.log"
[[ $SERVER2 == "${LANIP[$SBY]}" ]] || fail "the renewal was answered by $SERVER2, not the new active ${LANIP[$SBY]}"
[[ $ADDR2 == "$ADDR" ]] || fail "the laptop had $ADDR and now has $ADDR2: address NOT kept"
echo "  same address kept: $ADDR, renewed by ${NAME[$SBY]} (${LANIP[$SBY]})"
grep 'lease granted' "${LOG[$SBY]}" | tail -n1 | sed "s/^/  ${NAME[$SBY]}: /"

say "5. ${NAME[$ACT]} comes back with an empty state dir (a reflash) and catches up from ${NAME[$SBY]}"
FIRST_LOG=${LOG[$ACT]}
rm -rf "$WORK/$ACT/state"
LOG[$ACT]=$WORK/$ACT/server-2.log
start_box "$ACT"
echo "  started ${NAME[$ACT]} again (pid ${PID[$ACT]}) on an empty $WORK/$ACT/state"
caught_up() { alive "$ACT"; logged "$ACT" 'catch-up with the partner complete' && logged "$ACT" 'eligible for election'; }
wait_until "${NAME[$ACT]} to catch up" 20 caught_up
grep -E 'lease store open|catch-up with the partner complete|caught up with the partner|election started' "${LOG[$ACT]}" | sed "s/^/  ${NAME[$ACT]}: /"
echo "  \$ twinlease leases   # on ${NAME[$ACT]}, back from a wipe"
"$BIN" leases --config "${CFG[$ACT]}" | indent
row_back=$(lease_row "$ACT" "$ADDR")
row_live=$(lease_row "$SBY" "$ADDR")
[[ -n $row_back ]] || fail "${NAME[$ACT]} did not get the laptop's lease back"
[[ $(awk '{print $1, $2, $3, $6, $9}' <<<"$row_back") == "$(awk '{print $1, $2, $3, $6, $9}' <<<"$row_live")" ]] \
    || fail "${NAME[$ACT]} and ${NAME[$SBY]} disagree: '$row_back' vs '$row_live'"
[[ -n $(lease_row "$ACT" 198.18.0.50) ]] || fail "${NAME[$ACT]} did not get the printer's lease back"
# It stands in the election as standby: the survivor's row is live. Watch it for T + I.
WATCH_UNTIL=$((SECONDS + (T_MS + I_MS + 999) / 1000))
while ((SECONDS < WATCH_UNTIL)); do
    alive "$ACT"; alive "$SBY"
    [[ -z $(active_lines "$ACT") ]] || fail "${NAME[$ACT]} became active on its return"
    sleep 0.1
done
whois_names "$SBY" || fail "whois no longer names ${NAME[$SBY]}"
echo "  ${NAME[$ACT]} has the laptop's lease (term and expiry as on ${NAME[$SBY]}) and stays standby:"
"$BIN" whois --config "${CFG[$ACT]}" | indent

say "6. summary"
cat <<EOF2
  election: SQLite arbiter shared by both processes, I = $I_MS ms, T = $T_MS ms
  first active: ${NAME[$ACT]}; after its kill -9, ${NAME[$SBY]} was active in ${TOOK_MS} ms (bound $BOUND_MS ms)
  laptop: $ADDR from ${LANIP[$ACT]}, renewed from ${LANIP[$SBY]}: same address kept
  printer: its reservation 198.18.0.50
  ${NAME[$ACT]} back from an empty disk: caught up, holds every lease, standby
EOF2
important='role change|catch-up with the partner|caught up with the partner|partner unreachable|partner in sync|election started|lease granted|handed the arbiter row'
for f in "$FIRST_LOG" "${LOG[$ACT]}" "${LOG[$SBY]}"; do
    x=$(basename "$(dirname "$f")")
    echo "  -- ${NAME[$x]}, $(basename "$f")$([[ $f == "$FIRST_LOG" ]] && echo ' (until kill -9)')"
    grep -E "$important" "$f" | indent
done
STEP=cleanup
say "done; the lab (processes, namespaces, $WORK) is removed"

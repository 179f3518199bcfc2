#!/usr/bin/env bash
# make demo: a throwaway lab. A "server" network namespace runs twinlease on an embedded default
# configuration; a "client" namespace runs a real DHCP client (busybox udhcpc) over a veth
# link. Prints the lease the client got and twinlease's lease table, then removes everything.
set -euo pipefail

BIN=${1:-target/release/twinlease}
BIN=$(readlink -f "$BIN")
[[ $(id -u) -eq 0 ]] || { echo "make demo needs root (it creates network namespaces)"; exit 1; }

id=$$
SRV=tl-demo-srv-$id
CLI=tl-demo-cli-$id
VS=tldem${id: -4}s
VC=tldem${id: -4}c
WORK=$(mktemp -d /tmp/twinlease-demo.XXXXXX)
SERVER_PID=

cleanup() {
    [[ -n $SERVER_PID ]] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
    for ns in "$CLI" "$SRV"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "building a lab: namespace $SRV (server, 198.18.0.1/24) <-veth-> $CLI (client)"
ip netns add "$SRV"
ip netns add "$CLI"
ip link add "$VS" netns "$SRV" type veth peer name "$VC" netns "$CLI"
ip -n "$SRV" addr add 198.18.0.1/24 dev "$VS"
ip -n "$SRV" link set "$VS" up
ip -n "$SRV" link set lo up
ip -n "$CLI" link set "$VC" up
ip -n "$CLI" link set lo up

cat > "$WORK/twinlease.toml" <<EOF
# The demo's embedded default: one LAN, one pool, a reservation, a ping check.
[node]
name = "demo-a"
state_dir = "$WORK/state"

[dhcp]
interfaces = ["$VS"]
ping_check = true

[[subnet]]
cidr = "198.18.0.0/24"
pools = ["198.18.0.100-198.18.0.199"]
lease_secs = 3600
routers = ["198.18.0.1"]
dns_servers = ["198.18.0.1"]
domain_name = "branch.example"
ntp_servers = ["198.18.0.1"]

[[reservation]]
name = "printer"
hw = ["02:00:00:00:00:99"]
ip = "198.18.0.50"
EOF

say "twinlease check-config"
"$BIN" check-config "$WORK/twinlease.toml"

say "starting twinlease in $SRV"
ip netns exec "$SRV" env TWINLEASE_LOG_STDERR=1 "$BIN" run --config "$WORK/twinlease.toml" 2> "$WORK/server.log" &
SERVER_PID=$!
# Ready once it logs that it listens (it binds its sockets before saying so).
for _ in $(seq 1 200); do
    grep -q "listening on port 67" "$WORK/server.log" 2>/dev/null && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log"; exit 1; }
    sleep 0.05
done
grep -q "listening on port 67" "$WORK/server.log" || { echo "twinlease did not start"; cat "$WORK/server.log"; exit 1; }

cat > "$WORK/hook.sh" <<'EOF'
#!/bin/sh
case "$1" in
bound|renew)
    ip addr flush dev "$interface"
    ip addr add "$ip/$mask" dev "$interface"
    printf '  address   %s/%s\n  router    %s\n  dns       %s\n  domain    %s\n  lease     %s s\n  server    %s\n' \
        "$ip" "$mask" "$router" "$dns" "$domain" "$lease" "$serverid" ;;
esac
EOF
chmod +x "$WORK/hook.sh"

say "a real DHCP client (busybox udhcpc) in $CLI asks for an address"
ip netns exec "$CLI" udhcpc -f -q -n -t 5 -T 2 -i "$VC" -s "$WORK/hook.sh" 2>&1 | sed 's/^/  /'

say "the client's interface now"
ip -n "$CLI" -4 addr show dev "$VC" | sed 's/^/  /'

say "twinlease leases (read-only view of the durable store, while the server runs)"
"$BIN" leases --config "$WORK/twinlease.toml"

say "stop the server: the lease stays on disk"
kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=
"$BIN" leases --config "$WORK/twinlease.toml"

say "server log"
sed 's/^/  /' "$WORK/server.log"
say "done; the lab is removed"

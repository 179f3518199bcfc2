#!/usr/bin/env bash
# Proof that the aarch64 binary runs: under qemu-aarch64-static (Debian's qemu-user-static),
#   scripts/test-cross.sh dist/twinlease-aarch64 [NATIVE_BINARY]
# 1. `version`;
# 2. `check-config` on every file in config/: valid ones exit 0 (with --skip-secret-files: the
#    key and password files they name live on the boxes), config/invalid/ ones exit 1 with
#    their "# expect:" text at their "# expect-line:" (and "# expect-column:" when given),
#    secret files read; a file may declare the host it
#    needs ("# local: lan0 198.18.0.120/24") and is then checked in a namespace with that
#    interface; output identical to the native binary's (default dist/twinlease-x86_64);
# 3. a DHCP exchange: the daemon under qemu in one network namespace (ping check on, so the raw
#    ICMP socket is exercised too), busybox udhcpc in another, the lease read back with
#    `leases --json`, then SIGTERM and a clean exit.
# Needs root (namespaces). Addresses from 198.18.0.0/15 only.
set -uo pipefail

bin="$(realpath "${1:?usage: scripts/test-cross.sh AARCH64_BINARY [NATIVE_BINARY]}")"
native="${2:-dist/twinlease-x86_64}"
here="$(cd "$(dirname "$0")/.." && pwd)"
qemu="$(command -v qemu-aarch64-static || true)"
[[ -n "$qemu" ]] || { echo "qemu-aarch64-static is missing (Debian package qemu-user-static)"; exit 1; }
passed=0 failed=0
ok() { echo "PASS $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }
arm() { "$qemu" "$bin" "$@"; }

id="x$$"
lns="tl-xl$id" srv="tl-xs$id" cli="tl-xc$id" a="xa$id" b="xb$id"
dir="$(mktemp -d)"
pid=""
cleanup() {
    [[ -n "$pid" ]] && kill -9 "$pid" 2>/dev/null
    for n in "$lns" "$srv" "$cli"; do
        ip netns pids "$n" 2>/dev/null | xargs -r kill -9
        ip netns del "$n" 2>/dev/null
    done
    rm -rf "$dir"
}
trap cleanup EXIT

# 1. version
v="$(arm version 2>&1)"
want_v="twinlease $(sed -n 's/^version = "\(.*\)"/\1/p' "$here/Cargo.toml" | head -1)"
if [[ "$v" == "$want_v" ]]; then ok "version: $v"; else bad "version: $v (expected $want_v)"; fi

# 2. check-config on every file in config/
lif=""
run_in() { if [[ -n "$lif" ]]; then ip netns exec "$lns" "$@" 2>&1; else "$@" 2>&1; fi; }
for f in "$here"/config/*.toml "$here"/config/*/*.toml; do
    rel="${f#"$here"/}"
    read -r lif lcidr <<<"$(sed -n 's/^# local: //p' "$f" | head -1)"
    if [[ -n "$lif" ]]; then
        ip netns add "$lns" && ip -n "$lns" link add "$lif" type veth peer name "${lif}p" &&
            ip -n "$lns" addr add "$lcidr" dev "$lif" && ip -n "$lns" link set "$lif" up ||
            { bad "check-config $rel: cannot set up $lif $lcidr"; continue; }
    fi
    case "$rel" in config/invalid/*) want=1 skip=() ;; *) want=0 skip=(--skip-secret-files) ;; esac
    out="$(run_in "$qemu" "$bin" check-config "${skip[@]}" "$f")"; rc=$?
    expect="$(sed -n 's/^# expect: //p' "$f" | head -1)"
    line="$(sed -n 's/^# expect-line: //p' "$f" | head -1)"
    column="$(sed -n 's/^# expect-column: //p' "$f" | head -1)"
    at="$f:$line:${column:+$column:}"
    if [[ $rc -ne $want ]]; then
        bad "check-config $rel: exit $rc, expected $want: $out"
    elif [[ $want -eq 1 && ( "$out" != *"$expect"* || "$out" != *"$at"* ) ]]; then
        bad "check-config $rel: expected \"$at ... $expect\", got: $out"
    elif [[ -x "$native" && "$out" != "$(run_in "$native" check-config "${skip[@]}" "$f")" ]]; then
        bad "check-config $rel: aarch64 and native output differ:"$'\n'"$out"$'\n'"---"$'\n'"$(run_in "$native" check-config "${skip[@]}" "$f")"
    else
        ok "check-config $rel (exit $rc)"
    fi
    [[ -n "$lif" ]] && ip netns del "$lns"
    lif=""
done

# 3. a DHCP exchange in network namespaces
if ip netns add "$srv" && ip netns add "$cli" &&
    ip link add "$a" netns "$srv" type veth peer name "$b" netns "$cli" &&
    ip -n "$srv" addr add 198.18.0.1/24 dev "$a" && ip -n "$srv" link set "$a" up && ip -n "$srv" link set lo up &&
    ip -n "$cli" link set "$b" up && ip -n "$cli" link set lo up; then
    cat > "$dir/twinlease.toml" <<EOF
[node]
name = "qemu-aarch64"
state_dir = "$dir/state"

[dhcp]
interfaces = ["$a"]
ping_check = true
ping_timeout_ms = 300

[[subnet]]
cidr = "198.18.0.0/24"
pools = ["198.18.0.100-198.18.0.150"]
routers = ["198.18.0.1"]
dns_servers = ["198.18.0.1"]
EOF
    ip netns exec "$srv" env TWINLEASE_LOG_STDERR=1 RUST_LOG=info "$qemu" "$bin" run --config "$dir/twinlease.toml" 2> "$dir/server.log" &
    pid=$!
    deadline=$((SECONDS + 60))
    until grep -q "listening on port 67" "$dir/server.log" 2>/dev/null; do
        if ! kill -0 "$pid" 2>/dev/null || ((SECONDS > deadline)); then break; fi
        sleep 0.2
    done
    if grep -q "listening on port 67" "$dir/server.log"; then
        ok "daemon under qemu: listening"
        printf '#!/bin/sh\n[ "$1" = bound ] && echo "$ip" > "%s/bound"\nexit 0\n' "$dir" > "$dir/hook.sh"
        chmod +x "$dir/hook.sh"
        if ip netns exec "$cli" udhcpc -f -q -n -t 5 -T 3 -i "$b" -s "$dir/hook.sh" > "$dir/udhcpc.log" 2>&1 && [[ -s "$dir/bound" ]]; then
            addr="$(cat "$dir/bound")"
            ok "udhcpc got $addr from the aarch64 daemon"
            leases="$(arm leases --config "$dir/twinlease.toml" --json 2>&1)"
            if grep -q "\"address\": \"$addr\"" <<<"$leases"; then ok "leases --json lists $addr"; else bad "leases --json does not list $addr: $leases"; fi
        else
            bad "no lease: $(cat "$dir/udhcpc.log")"$'\n'"$(cat "$dir/server.log")"
        fi
        kill -TERM "$pid"
        if wait "$pid"; then ok "clean exit after SIGTERM"; else bad "exit status $? after SIGTERM: $(tail -5 "$dir/server.log")"; fi
        pid=""
    else
        bad "daemon under qemu did not start: $(cat "$dir/server.log")"
    fi
else
    bad "namespace set-up for the DHCP exchange"
fi

echo "aarch64 under qemu: $passed passed, $failed failed"
[[ $failed -eq 0 ]]

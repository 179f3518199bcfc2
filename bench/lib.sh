# Shared by bench/dhcp-ladder.sh and bench/pair-ladder.sh (sourced, not run).
#
# The client LAN of every benchmark is 198.18.0.0/16: the server box is 198.18.0.1, perfdhcp
# relays from 198.18.0.2 (giaddr), the pool is 198.18.1.0–198.18.255.254. Method (README,
# "Benchmark: one box"): server on CPU 0, perfdhcp on CPU 1, fresh empty store per step.

BENCH_SERVER_IP=198.18.0.1
BENCH_RELAY_IP=198.18.0.2
CLK_TCK=$(getconf CLK_TCK)

# bench_preflight: the checks and the scheduling set-up every ladder needs.
bench_preflight() {
    (( STEP_SECS <= 30 )) || { echo "STEP_SECS must be ≤ 30"; exit 1; }
    [[ $(id -u) -eq 0 ]] || { echo "the benchmark needs root (network namespaces)"; exit 1; }
    command -v perfdhcp >/dev/null || { echo "perfdhcp missing (Debian package kea-admin)"; exit 1; }
    bench_cgroup_setup
    # No priority boost (nice/autogroup) for the servers: with the serving core saturated, a
    # boosted server starves the kernel work that completes its own disk writes, and twinlease's
    # fsyncs then stalled for 3-5 s at 10,000 offers/s (the store thread's watchdog fired and
    # the step collapsed to ~3,000 leases/s); without it the same step runs at 9,900/s.
}

# bench_lan SERVER_NS SERVER_IF PERF_NS PERF_IF: both namespaces and the veth between them.
bench_lan() {
    ip netns add "$1"
    ip netns add "$3"
    ip link add "$2" netns "$1" type veth peer name "$4" netns "$3"
    ip -n "$1" addr add "$BENCH_SERVER_IP/16" dev "$2"
    ip -n "$3" addr add "$BENCH_RELAY_IP/16" dev "$4"
    ip -n "$1" link set lo up
    ip -n "$3" link set lo up
    ip -n "$1" link set "$2" up
    ip -n "$3" link set "$4" up
}

# bench_drop_netns NS...: ends whatever still runs in each namespace, then deletes it.
bench_drop_netns() {
    local ns
    for ns in "$@"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
}

# bench_macs FILE: 50,000 distinct random locally administered MACs (fixed seed).
bench_macs() {
    python3 - "$1" <<'EOF'
import random, sys
r = random.Random(2026)
seen = set()
with open(sys.argv[1], "w") as f:
    while len(seen) < 50000:
        m = "02:" + ":".join(f"{r.randrange(256):02x}" for _ in range(5))
        if m not in seen:
            seen.add(m)
            f.write(m + "\n")
EOF
}

# cpu_ticks PID...: user + system clock ticks used so far by all the given processes.
cpu_ticks() {
    local pid sum=0 t
    for pid in "$@"; do
        t=$(awk '{print $14 + $15}' "/proc/$pid/stat")
        sum=$((sum + t))
    done
    echo "$sum"
}

# wait_port_67 NS PID: until something in NS listens on UDP 67 (≤ 10 s), or PID has died.
wait_port_67() {
    local _
    for _ in $(seq 1 400); do
        ip netns exec "$1" ss -Hlun 'sport = :67' | grep -q . && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.025
    done
    return 1
}

# wait_file_text FILE TEXT SECS PID: until FILE contains TEXT, bounded in time; fails early if
# PID (the process writing FILE) has died.
wait_file_text() {
    local deadline=$((SECONDS + $3))
    until grep -qF -- "$2" "$1" 2>/dev/null; do
        kill -0 "$4" 2>/dev/null || return 1
        (( SECONDS < deadline )) || return 1
        sleep 0.02
    done
}

# twinlease_conf FILE NAME STATE_DIR IFACE LOG_FILTER [EXTRA_TOML]: one box's configuration.
# Each box gets its own control socket directory (STATE_DIR-run): a second daemon refuses to
# start on the sockets of one already answering (the pair's two boxes, a system daemon).
twinlease_conf() {
    mkdir -p "$3-run"
    cat > "$1" <<EOF
[node]
name = "$2"
state_dir = "$3"
[dhcp]
interfaces = ["$4"]
ping_check = false
[[subnet]]
cidr = "198.18.0.0/16"
pools = ["198.18.1.0-198.18.255.254"]
lease_secs = 3600
routers = ["$BENCH_SERVER_IP"]
dns_servers = ["$BENCH_SERVER_IP"]
[control]
runtime_dir = "$3-run"
[log]
filter = "$5"
${6:-}
EOF
}

# kea_conf FILE IFACE DIR [EXTRA_JSON]: kea-dhcp4 with persistent memfile leases in DIR;
# EXTRA_JSON (members of "Dhcp4", each followed by a comma) adds hooks or a control socket.
kea_conf() {
    cat > "$1" <<EOF
{ "Dhcp4": {
    ${4:-}
    "interfaces-config": { "interfaces": [ "$2" ], "dhcp-socket-type": "udp" },
    "lease-database": { "type": "memfile", "persist": true, "name": "$3/kea-leases4.csv", "lfc-interval": 0 },
    "valid-lifetime": 3600,
    "subnet4": [ { "id": 1, "subnet": "198.18.0.0/16", "pools": [ { "pool": "198.18.1.0 - 198.18.255.254" } ],
                   "option-data": [ { "name": "routers", "data": "$BENCH_SERVER_IP" },
                                    { "name": "domain-name-servers", "data": "$BENCH_SERVER_IP" } ] } ],
    "loggers": [ { "name": "kea-dhcp4", "severity": "WARN", "output_options": [ { "output": "$3/kea.log" } ] } ]
} }
EOF
}

# launch NS CPU LOG CMD...: starts CMD pinned to CPU in namespace NS, stdout and stderr to LOG;
# its PID is LAUNCHED and is appended to PIDS.
PIDS=()
launch() {
    local ns=$1 cpu=$2 log=$3
    shift 3
    ip netns exec "$ns" taskset -c "$cpu" "$@" > "$log" 2>&1 &
    LAUNCHED=$!
    # Into the quota'd group at once (from here: `ip netns exec` hides /sys/fs/cgroup); the
    # pid execs its way to the server, and threads it starts later inherit the group.
    if [[ -n $BENCH_CGROUP && $cpu == 0 ]]; then echo "$LAUNCHED" > "$BENCH_CGROUP/cgroup.procs"; fi
    PIDS+=("$LAUNCHED")
}

# run_ladder: every kind in `kinds` at every rate in RATES, side by side, through the script's
# own `run_step KIND RATE`; the figures go to result[KIND,RATE].
run_ladder() {
    declare -gA result
    local rate kind
    for rate in $RATES; do
        for kind in "${kinds[@]}"; do
            result[$kind,$rate]=$(run_step "$kind" "$rate")
        done
    done
}

# CPU_QUOTA=P (percent of one core): the servers on CPU 0 share a CFS quota of P % (cgroup v1
# cpu controller, or v2). perfdhcp generates ~13,000 exchanges/s from one core, which caps what
# the ladder can offer; with the servers held to part of a core they reach their own limit
# first, so leases/s compares their capacity at an equal CPU budget.
BENCH_CGROUP=
bench_cgroup_setup() {
    [[ -n ${CPU_QUOTA:-} ]] || return 0
    (( CPU_QUOTA >= 5 && CPU_QUOTA <= 100 )) || { echo "CPU_QUOTA is a percentage, 5-100"; exit 1; }
    if [[ -d /sys/fs/cgroup/cpu && -w /sys/fs/cgroup/cpu ]]; then
        BENCH_CGROUP=/sys/fs/cgroup/cpu/twinlease-bench-$$
        mkdir "$BENCH_CGROUP"
        echo 100000 > "$BENCH_CGROUP/cpu.cfs_period_us"
        echo $((CPU_QUOTA * 1000)) > "$BENCH_CGROUP/cpu.cfs_quota_us"
    elif [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
        echo "+cpu" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
        BENCH_CGROUP=/sys/fs/cgroup/twinlease-bench-$$
        mkdir "$BENCH_CGROUP"
        echo "$((CPU_QUOTA * 1000)) 100000" > "$BENCH_CGROUP/cpu.max"
    else
        echo "CPU_QUOTA needs a cgroup cpu controller"; exit 1
    fi
    echo "servers held to ${CPU_QUOTA} % of one core (CFS quota, $BENCH_CGROUP)"
}

# Removes the quota'd group once its processes are gone.
bench_cgroup_remove() {
    [[ -n $BENCH_CGROUP ]] || return 0
    local _
    for _ in $(seq 1 100); do rmdir "$BENCH_CGROUP" 2>/dev/null && return 0; sleep 0.05; done
    echo "could not remove $BENCH_CGROUP" >&2
}

# start_twinlease_box BIN NS IFACE DIR LOG_FILTER: one standalone twinlease on CPU 0, state and
# log (server.log) in DIR; PID in LAUNCHED.
start_twinlease_box() {
    twinlease_conf "$4/twinlease.toml" bench "$4/state" "$3" "$5"
    launch "$2" 0 "$4/server.log" env TWINLEASE_LOG_STDERR=1 "$1" run --config "$4/twinlease.toml"
}

# start_kea_box NS IFACE DIR: one kea-dhcp4 (memfile) on CPU 0, files in DIR; PID in LAUNCHED.
start_kea_box() {
    kea_conf "$3/kea.json" "$2" "$3"
    launch "$1" 0 "$3/server.log" env KEA_PIDFILE_DIR="$3" KEA_LOCKFILE_DIR="$3" kea-dhcp4 -c "$3/kea.json"
}

# perf_load PERF_NS RATE MACS OUT: one bounded perfdhcp step (relay mode, STEP_SECS long).
perf_load() {
    ip netns exec "$1" taskset -c 1 perfdhcp -4 -l "$BENCH_RELAY_IP" -r "$2" -p "$STEP_SECS" -M "$3" -W 500000 "$BENCH_SERVER_IP" > "$4" 2>&1 || true
}

# perf_figures RATE SERVER_TICKS OUT [PARTNER_TICKS]
#   → "rate acks_per_s drop_pct latency_ms cpu_ms_per_1000 [partner_cpu_ms_per_1000]"
perf_figures() {
    awk -v rate="$1" -v secs="$STEP_SECS" -v ticks="$2" -v pticks="${4:-}" -v hz="$CLK_TCK" '
        /DISCOVER-OFFER/ { s = "do" } /REQUEST-ACK/ { s = "ra" }
        /sent packets/     { split($0, a, ":"); if (s == "do") disc = a[2] + 0; else req = a[2] + 0 }
        /received packets/ { split($0, a, ":"); if (s == "ra") ack = a[2] + 0 }
        /avg delay/        { split($0, a, ":"); if (s == "ra") { lat = a[2]; gsub(/[^0-9.]/, "", lat) } }
        END {
            drop = disc > 0 ? 100 * (1 - ack / disc) : 100
            cpu = ack > 0 ? (ticks / hz * 1000) / (ack / 1000) : 0
            printf "%d %.0f %.2f %.2f %.1f", rate, ack / secs, drop, lat, cpu
            if (pticks != "") printf " %.1f", (ack > 0 ? (pticks / hz * 1000) / (ack / 1000) : 0)
            printf "\n"
        }' "$3"
}

# under_1pct DROP_PCT: true when fewer than 1 % of the exchanges went unanswered.
under_1pct() { awk -v d="$1" 'BEGIN { exit !(d < 1) }'; }

# ratio A B → A / B with two decimals (0 when B is 0).
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }

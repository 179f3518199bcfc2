#!/usr/bin/env python3
"""make bench-scale: fills a lease store for the scaling benchmark with SQL.

    scale_store.py DB FIRST_ADDR COUNT [--expired]

DB must exist with the current schema (bench/scale.sh starts the daemon on an empty state
directory once to create it). COUNT consecutive addresses from FIRST_ADDR get a row each, as a
long-running box leaves them: seven in eight leased to a distinct client (hostname and hardware
address set), every eighth released (free, its last client kept for affinity: the released
history). Leases end an hour from now, or with --expired ten seconds ago (the reaper's work).
The columns and codes are those of src/store/mod.rs and src/lease.rs (state 2 leased, 0 free;
owner = tag 1 (hardware), htype 1, the MAC)."""
import ipaddress, sqlite3, sys, time

def rows(first, count, now, expired):
    for i in range(count):
        mac = bytes([0x02, 0x5C, (i >> 24) & 255, (i >> 16) & 255, (i >> 8) & 255, i & 255])
        released = i % 8 == 7
        expires = now - 600 if released else (now - 10 if expired else now + 3600)
        yield (first + i, 0 if released else 2, bytes([1, 1]) + mac, expires, now - 60, 1, 1, mac, f"host-{i}", 0, 1)

def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    db, first, count = args[0], int(ipaddress.ip_address(args[1])), int(args[2])
    expired = "--expired" in sys.argv
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA synchronous = OFF")
    gen = rows(first, count, int(time.time()), expired)
    while True:
        batch = [r for _, r in zip(range(16384), gen)]
        if not batch:
            break
        with conn:
            conn.executemany(
                "INSERT INTO lease (addr, state, owner, expires, cltt, version, term, hw, hostname, "
                "peer_synced_version, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", batch)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()

main()

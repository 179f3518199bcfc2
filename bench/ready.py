#!/usr/bin/env python3
"""Starts a command with NOTIFY_SOCKET pointing here and measures, for bench/scale.sh:
  ready_s    seconds from exec to READY=1 (store opened and loaded, sockets bound)
  settle_s   seconds from READY=1 until the process stops using CPU (0.5 s without a tick;
             the reaper of an expired store runs in this time), bounded by SETTLE_MAX_S
  cpu_ticks  clock ticks (user + system) used by then
  rss_kib    VmRSS then, hwm_kib VmHWM (the peak)
printed as one line of key=value, then stops the command (SIGTERM) and waits for it."""
import os, signal, socket, subprocess, sys, tempfile, time

def ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])

def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0

def main():
    cmd = sys.argv[1:]
    limit = float(os.environ.get("READY_MAX_S", "120"))
    settle_max = float(os.environ.get("SETTLE_MAX_S", "120"))
    path = os.path.join(tempfile.mkdtemp(prefix="tl-notify-"), "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.1)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=dict(os.environ, NOTIFY_SOCKET=path),
                            stdout=subprocess.DEVNULL, stderr=open(os.environ.get("SERVER_LOG", os.devnull), "w"))
    ready = None
    try:
        while ready is None and time.monotonic() - start < limit:
            if proc.poll() is not None:
                sys.exit(f"exited with {proc.returncode} before READY=1")
            try:
                if b"READY=1" in sock.recv(4096):
                    ready = time.monotonic() - start
            except socket.timeout:
                pass
        if ready is None:
            sys.exit(f"no READY=1 within {limit} s")
        t_ready = time.monotonic()
        last = ticks(proc.pid)
        while time.monotonic() - t_ready < settle_max:
            time.sleep(0.5)
            now = ticks(proc.pid)
            if now == last:
                break
            last = now
        settle = time.monotonic() - t_ready
        print(f"ready_s={ready:.3f} settle_s={settle:.1f} cpu_ticks={last} "
              f"rss_kib={status_kib(proc.pid, 'VmRSS')} hwm_kib={status_kib(proc.pid, 'VmHWM')}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(path)

main()

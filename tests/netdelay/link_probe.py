#!/usr/bin/python3
"""Measures a link between two emulated hosts (scripts/netns_hosts.sh): round trips as TCP connect times and the
goodput of one bulk TCP transfer. Used by tests/netns_hosts_test.sh and for docs/emulated_hosts.md's figures.

  link_probe.py serve [--port=5555] [--timeout_secs=30]        # on host 1: answers connects, sinks the bulk data
  link_probe.py probe HOST [--port=5555] [--connects=5] [--bulk_mb=20 | --bulk_secs=5] [--cpu_of=PID,...]

probe prints "connect ms: T1 T2 ...; min M; median D" and "bulk: B bytes in S s, G Mbit/s"; serve prints
"received B bytes in S s, G Mbit/s" for the bulk transfer, then exits. A connect is one round trip (SYN,
SYN-ACK), so with --latency=MS on every host it takes at least 2 x MS. --cpu_of: also prints the CPU those
processes (e.g. the hosts' dtrain_netdelay daemons) used during the bulk transfer, in cores. Both sides stop by
themselves:
serve after the bulk transfer or --timeout_secs, probe after its transfer (every socket has a timeout).
"""
import argparse
import os
import socket
import statistics
import sys
import time

CHUNK = 1 << 20


def serve(a):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", a.port))
    s.listen(64)
    deadline = time.monotonic() + a.timeout_secs
    while True:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            c, _ = s.accept()
        except socket.timeout:
            sys.exit("link_probe: no bulk transfer within %d s" % a.timeout_secs)
        c.settimeout(a.timeout_secs)
        first = c.recv(CHUNK)
        if not first:  # a connect of the round-trip part: closed at once
            c.close()
            continue
        n, t0 = len(first), time.perf_counter()
        while True:
            b = c.recv(CHUNK)
            if not b:
                break
            n += len(b)
        secs = time.perf_counter() - t0
        c.close()
        print("received %d bytes in %.2f s, %.0f Mbit/s" % (n, secs, n * 8 / max(secs, 1e-9) / 1e6), flush=True)
        return 0


def cpu_secs(pids):
    """User + system CPU seconds of the processes so far (/proc/PID/stat)."""
    total = 0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def probe(a):
    pids = [int(p) for p in a.cpu_of.split(",") if p]
    rtts = []
    for _ in range(a.connects):
        t0 = time.perf_counter()
        c = socket.create_connection((a.host, a.port), timeout=10)
        rtts.append((time.perf_counter() - t0) * 1e3)
        c.close()
        time.sleep(0.05)
    if rtts:
        print("connect ms: %s; min %.2f; median %.2f" % (" ".join("%.2f" % r for r in rtts), min(rtts),
                                                       statistics.median(rtts)), flush=True)
    c = socket.create_connection((a.host, a.port), timeout=10)
    c.settimeout(30)
    buf = b"x" * CHUNK
    cpu0 = cpu_secs(pids)
    n, t0 = 0, time.perf_counter()
    if a.bulk_secs > 0:
        end = t0 + a.bulk_secs
        while time.perf_counter() < end:
            c.sendall(buf)
            n += len(buf)
    else:
        for _ in range(a.bulk_mb):
            c.sendall(buf)
            n += len(buf)
    c.close()
    secs = time.perf_counter() - t0
    print("bulk: %d bytes in %.2f s, %.0f Mbit/s" % (n, secs, n * 8 / max(secs, 1e-9) / 1e6), flush=True)
    if pids:
        print("cpu of %s: %.3f cores during the bulk transfer" % (a.cpu_of, (cpu_secs(pids) - cpu0) / secs))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("serve", "probe"))
    ap.add_argument("host", nargs="?", help="probe: the serving host's address")
    ap.add_argument("--port", type=int, default=5555)
    ap.add_argument("--timeout_secs", type=int, default=30)
    ap.add_argument("--connects", type=int, default=5)
    ap.add_argument("--bulk_mb", type=int, default=20)
    ap.add_argument("--bulk_secs", type=float, default=0, help="send for this long instead of --bulk_mb")
    ap.add_argument("--cpu_of", default="", help="PID,...: their CPU during the bulk transfer")
    a = ap.parse_args()
    if not 0 < a.port < 65536 or a.connects < 0 or a.bulk_mb < 1 or a.bulk_secs < 0 or a.timeout_secs < 1:
        ap.error("--port 1..65535, --connects >= 0, --bulk_mb >= 1, --bulk_secs >= 0, --timeout_secs >= 1")
    if a.mode == "probe" and not a.host:
        ap.error("probe needs the serving host's address")
    if not all(p.isdigit() for p in a.cpu_of.split(",") if p):
        ap.error("--cpu_of takes process ids, comma-separated, got %r" % a.cpu_of)
    return serve(a) if a.mode == "serve" else probe(a)


if __name__ == "__main__":
    sys.exit(main())

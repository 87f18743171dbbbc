#!/usr/bin/env python3
"""Prints N free TCP ports on 127.0.0.1 (comma-separated). Usage: free_ports.py N"""
import socket
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
socks, ports = [], []
for _ in range(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    socks.append(s)
    ports.append(s.getsockname()[1])
for s in socks:
    s.close()
print(",".join(str(p) for p in ports))

"""Loopback TCP ports free now, for processes started later to listen on.

Drawn below the kernel's ephemeral range (ip_local_port_range), not bind(0)'s
picks from inside it: a port from that range can be taken, in between, as the
local port of any test's outgoing connection (CI saw an etcd member fail to
start so: "bind: address already in use"). tests/storage/etcd_fixture.hpp's
freeLoopbackPort() does the same for the C++ tests.

    python3 tests/free_ports.py N    prints N distinct ports, space-separated
"""
import random
import socket
import sys


def free_ports(n):
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    low, high = 20000, max(21000, ephemeral_low) - 1
    pick = random.SystemRandom()
    ports = []
    for _ in range(1000 * max(n, 1)):
        if len(ports) == n:
            break
        port = pick.randint(low, high)
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    if len(ports) < n:
        raise RuntimeError(f"no {n} free loopback ports between {low} and {high}")
    return ports


if __name__ == "__main__":
    print(*free_ports(int(sys.argv[1]) if len(sys.argv) > 1 else 1))

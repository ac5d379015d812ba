"""Loopback ports for the processes the tests, the benchmarks and the local cluster start: one home.

Ports are often chosen well before they are bound (vLLM binds minutes after planning, on a cold start of a
busy machine). A port from the kernel's ephemeral range (what ``bind(0)`` returns) can meanwhile become the
local end of any outgoing connection on the machine, and the later bind then fails (seen with NIXL's side
channel). So ports come from below that range, where the kernel never hands out ports by itself, and this
process never hands out the same one twice.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOCALHOST = "127.0.0.1"
LOW_PORTS = (10000, 32768)
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return LOW_PORTS[1]


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range when there is room, never handed out twice."""
    low, high = LOW_PORTS[0], min(LOW_PORTS[1], _ephemeral_low())
    for _ in range(200 if high - low > 1000 else 0):
        port = random.randrange(low, high)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((LOCALHOST, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:
        s.bind((LOCALHOST, 0))
        return int(s.getsockname()[1])

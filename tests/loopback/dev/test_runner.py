"""The local runner's tiers (dev/local/runner.py) die with the process that started them, also when it is
killed by SIGKILL and runs no clean-up: each tier's leader and the processes it forked."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dev.paths import REPO
from dev.ports import free_port
from tests.support.cluster import wait_for

pytestmark = pytest.mark.timeout(60)

# A stand-in tier: forks a worker (as vLLM forks its engine core), writes both pids to PORT.pids in its
# working directory, and answers /health.
TIER = """
import http.server, os, subprocess, sys
worker = subprocess.Popen(["sleep", "600"])
with open(sys.argv[1] + ".pids", "w") as f:
    f.write(f"{os.getpid()} {worker.pid}")
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""

# Starts an encoder and a router tier through LocalEPD.start(), says so, then waits to be killed.
OWNER = """
import sys, time
from pathlib import Path
from dev.local.plan import LocalPlan, LocalProcess
from dev.local.runner import LocalEPD
tier, workdir, ports = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
processes = [
    LocalProcess(role, role, [sys.executable, "-c", tier, port], {}, int(port))
    for role, port in zip(("encoder", "router"), ports)
]
LocalEPD(LocalPlan(processes, "E+PD", "m", {}), workdir, progress=lambda _: None).start(timeout_s=30)
print("started", flush=True)
time.sleep(60)
"""


def gone(pid: int) -> bool:
    """No such process, or a zombie (dead; reaped whenever init gets to it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_tiers_die_with_their_owner_killed_by_sigkill(tmp_path):
    ports = [str(free_port()), str(free_port())]
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, TIER, str(tmp_path), *ports], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    pids: list[int] = []
    try:
        assert owner.stdout is not None
        with owner.stdout:
            assert owner.stdout.readline() == "started\n"
        pids = [int(pid) for port in ports for pid in (tmp_path / f"{port}.pids").read_text().split()]
        assert not [pid for pid in pids if gone(pid)]
        owner.kill()
        owner.wait()
        wait_for(
            lambda: all(gone(pid) for pid in pids),
            timeout=10,
            message=lambda: f"left running after their owner was killed: {[p for p in pids if not gone(p)]}",
        )
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        for pid in [pid for pid in pids if not gone(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

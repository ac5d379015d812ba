"""The cache janitor sidecar as a process and a server: its metrics over HTTP, and SIGTERM ending it cleanly."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request

from dev.ports import free_port
from epd_operator import janitor
from tests.support.prom import sample_values


def test_metrics_are_served_over_http():
    metrics = janitor.Metrics()
    metrics.sweeps.inc()
    port = free_port()
    server = metrics.serve(port, addr="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            assert sample_values(response.read(), "epd_cache_janitor_sweeps_total") == [1]
    finally:
        server.shutdown()
        server.server_close()


def test_sigterm_ends_the_sidecar_cleanly(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "epd_operator.janitor",
            "--path",
            str(tmp_path),
            "--ttl-seconds",
            "600",
            "--interval",
            "3600",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    try:
        assert "watching" in proc.stderr.readline()
        assert "sweep:" in proc.stderr.readline()  # the first sweep ran; now it waits an hour
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert "stopping" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()

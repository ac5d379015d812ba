"""The load generator: wrk (compiled, one thread) pinned to the backends' core.

wrk keeps `concurrency` keep-alive connections busy, each sending the next request as
soon as the previous answer is complete (closed loop), and reports exact latency
percentiles through bench/loadgen.lua. Its own CPU time comes back from wait4(), so the
report can show that the generator was not the bottleneck.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .procs import isolate

LUA = Path(__file__).with_name("loadgen.lua")


class LoadgenMissing(RuntimeError):
    pass


def wrk_binary() -> str:
    path = shutil.which("wrk")
    if not path:
        raise LoadgenMissing("wrk not found: install it (Debian/Ubuntu: `apt-get install wrk`)")
    return path


@dataclass
class LoadResult:
    requests: int
    seconds: float
    errors: int
    non_2xx: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    loadgen_cpu_s: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def failed(self) -> int:
        return self.errors + self.non_2xx


def run_wrk(url: str, bodies: Path, concurrency: int, seconds: int, core: int | None) -> LoadResult:
    argv = [
        wrk_binary(),
        "-t1",
        f"-c{concurrency}",
        f"-d{seconds}s",
        "--timeout",
        "10s",
        "-s",
        str(LUA),
        url,
        "--",
        str(bodies),
    ]
    popen = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: isolate(core),
    )
    out = popen.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(popen.pid, 0)
    popen.returncode = os.waitstatus_to_exitcode(status)
    line = next((ln for ln in out.splitlines() if ln.startswith("WRK_RESULT ")), None)
    if popen.returncode or line is None:
        raise RuntimeError(f"wrk failed (exit {popen.returncode}):\n{out[-2000:]}")
    r = json.loads(line.removeprefix("WRK_RESULT "))
    return LoadResult(
        requests=r["requests"],
        seconds=r["duration_us"] / 1e6,
        errors=r["errors"],
        non_2xx=r["non_2xx"],
        p50_ms=r["p50_us"] / 1000,
        p90_ms=r["p90_us"] / 1000,
        p99_ms=r["p99_us"] / 1000,
        mean_ms=r["mean_us"] / 1000,
        loadgen_cpu_s=usage.ru_utime + usage.ru_stime,
    )

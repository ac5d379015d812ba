"""Processes the benchmarks start: pinned to a core, cleaned up, and measured from /proc.

CPU time and peak RSS are read from /proc for the whole process tree (a router may fork
workers), so a contender's numbers include everything it runs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dev.lifetimes import stop_groups
from dev.ports import free_port

CLK_TCK = os.sysconf("SC_CLK_TCK")
REPO_ROOT = Path(__file__).resolve().parents[1]
BENCH_NICE = -20


def cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def isolate(core: int | None) -> bool:
    """Pin the calling process to `core` and raise its priority when allowed.

    Other work on a shared machine would otherwise preempt the router or the load generator
    mid-request and show up as latency. With autogroup scheduling (the default on most
    distributions) a process's nice only counts inside its session's group, so the group's
    nice is raised too. Returns whether the priority was raised.
    """
    if core is not None:
        os.sched_setaffinity(0, {core})
    try:
        os.setpriority(os.PRIO_PROCESS, 0, BENCH_NICE)
    except PermissionError:
        return False
    with contextlib.suppress(OSError):
        Path("/proc/self/autogroup").write_text(str(BENCH_NICE))
    return True


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    task_dir = Path(f"/proc/{pid}/task")
    with contextlib.suppress(OSError):
        for task in task_dir.iterdir():
            with contextlib.suppress(OSError):
                kids += [int(c) for c in (task / "children").read_text().split()]
    return kids


def tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        todo += _children(p)
    return pids


def cpu_of(pids: Iterable[int]) -> float:
    """User + system CPU seconds of these processes (those that are gone count nothing)."""
    total = 0
    for p in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its live descendants."""
    return cpu_of(tree(pid))


def peak_rss_mib(pid: int) -> float:
    """Sum of each live process's high-water RSS (VmHWM) in the tree."""
    total_kib = 0
    for p in tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total_kib += int(line.split()[1])
    return total_kib / 1024


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        if not self.alive():
            return
        # Each process leads its own session, so this reaches its workers too.
        stop_groups([self.popen], 5)


def start(
    name: str, argv: list[str], core: int | None, log_dir: Path, env: dict | None = None, *, prioritise: bool = True
) -> Proc:
    """`prioritise=False`: pinned to `core` only, at normal priority (a run on a machine others share)."""
    log = log_dir / f"{name}.log"
    out = open(log, "wb")  # noqa: SIM115 - the child owns it for its lifetime

    def setup() -> None:
        if prioritise:
            isolate(core)
        elif core is not None:
            os.sched_setaffinity(0, {core})

    popen = subprocess.Popen(
        argv,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        preexec_fn=setup,
        start_new_session=True,
        env={**os.environ, **(env or {})},
        cwd=REPO_ROOT,
    )
    out.close()
    return Proc(name, popen, log)


def wait_http(proc: Proc, url: str, timeout: float = 60.0) -> None:
    """Until GET url answers at all (any status): the process is listening and serving."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{proc.name} did not answer {url} within {timeout:.0f}s:\n{proc.log_tail()}")


def start_server(
    name: str,
    argv_for_port,
    core: int | None,
    log_dir: Path,
    ready_path: str = "/health",
    timeout: float = 90.0,
    env: dict | None = None,
    attempts: int = 3,
) -> tuple[Proc, int]:
    """Start a server on a free port and wait until it answers; a port taken meanwhile
    (free_port() gives it back, and any outgoing connection may grab it) means another try."""
    for attempt in range(attempts):
        port = free_port()
        proc = start(name, argv_for_port(port), core, log_dir, env)
        try:
            wait_http(proc, f"http://127.0.0.1:{port}{ready_path}", timeout)
            return proc, port
        except RuntimeError:
            proc.stop()
            lost_port = "address already in use" in proc.log_tail(40).lower()
            if not lost_port or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def cpu_model() -> str:
    import platform

    return next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )


def commit() -> str:
    """The checked-out commit, marked when the tree has uncommitted changes (results name what ran)."""
    try:
        return (
            subprocess.run(
                ["git", "describe", "--always", "--dirty=+uncommitted-changes"],
                capture_output=True,
                text=True,
                cwd=REPO_ROOT,
            ).stdout.strip()
            or "?"
        )
    except OSError:
        return "?"

"""Run an EPDDeployment locally: real vLLM on CPU for each tier, plus `epd-router`.

    with run_local("examples/epd-shared-storage.yaml", workdir) as epd:
        epd.router_url  # -> http://127.0.0.1:PORT, speaks the OpenAI chat API

The spec goes through the same `render()` the operator uses; `plan` turns the rendered
Deployments into local command lines (see its docstring for the few substitutions). Every
process starts in its own process group, so stopping a tier also stops the engine and worker
processes vLLM forks; everything started is stopped on exit, on errors and on Ctrl-C, and killed
when the owning process is killed (``dev/lifetimes.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from dev.builds import tiny_model, venv
from dev.lifetimes import GroupReaper, stop_groups
from dev.local.plan import ROUTER, LocalPlan, LocalProcess, plan

# A cold start of three vLLM instances on 2 idle cores takes ~40 s; the bound leaves room for a loaded
# machine (`make test` runs the node tier's pods beside the e2e tier).
START_TIMEOUT_S = 600
STOP_GRACE_S = 15
# Environment of the dev venv that must not leak into the vLLM venv's interpreters.
FOREIGN_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTEST_CURRENT_TEST")


class LocalRunError(RuntimeError):
    """A local instance failed to start or died; the message carries its log's tail."""


def _progress(msg: str) -> None:
    print(f"[local] {msg}", file=sys.stderr, flush=True)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class LocalEPD:
    """The running processes of one local plan."""

    def __init__(self, plan: LocalPlan, workdir: Path, progress: Callable[[str], None] = _progress) -> None:
        self.plan = plan
        self.workdir = workdir
        self.progress = progress
        self.logs = workdir / "logs"
        self._procs: dict[str, subprocess.Popen] = {}  # by role
        self._reaper = GroupReaper()  # kills the tiers' groups if this process dies without stop()

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout_s: float = START_TIMEOUT_S) -> LocalEPD:
        """Start the vLLM tiers in parallel, wait until healthy, then the router; stop all on failure."""
        atexit.register(self.stop)
        try:
            for path in self.plan.volumes.values():
                path.mkdir(parents=True, exist_ok=True)
            self.logs.mkdir(parents=True, exist_ok=True)
            tiers = [p for p in self.plan.processes if p.role != ROUTER]
            started = time.monotonic()
            for process in tiers:
                self._spawn(process)
            self._wait_healthy(tiers, started + timeout_s)
            self.progress(f"vLLM tiers ready after {time.monotonic() - started:.0f} s")
            router = self.plan.one(ROUTER)
            self._spawn(router)
            self._wait_healthy([router], time.monotonic() + 30)
            self.progress(f"router ready at {router.url}")
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, process: LocalProcess) -> None:
        env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}
        env.update(process.env)
        self.progress(f"starting {process.role} ({process.name}) on :{process.port}")
        # The child keeps its own copy of the descriptor; ours closes once it is handed over.
        with open(self.logs / f"{process.role}.log", "ab") as log:
            self._procs[process.role] = subprocess.Popen(
                process.argv,
                env=env,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() reaches vLLM's children too
            )
        self._reaper.watch(self._procs[process.role].pid)

    def _wait_healthy(self, processes: list[LocalProcess], deadline: float) -> None:
        waiting = list(processes)
        while waiting:
            for process in list(waiting):
                code = self._procs[process.role].poll()
                if code is not None:
                    raise LocalRunError(
                        f"{process.role} ({process.name}) exited with code {code} before it was healthy; "
                        f"its log ({self.log_path(process.role)}) ends with:\n{log_tail(self.log_path(process.role))}"
                    )
                if _healthy(process.url):
                    waiting.remove(process)
            if waiting and time.monotonic() > deadline:
                names = ", ".join(p.role for p in waiting)
                raise LocalRunError(f"{names} not healthy in time; logs under {self.logs}")
            if waiting:
                time.sleep(0.5)

    def kill(self, role: str) -> None:
        """Stop one tier now (SIGKILL to its process group), as a crashed pod would."""
        proc = self._procs[role]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self._reaper.forget(proc.pid)

    def restart(self, role: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Replace one tier's process by a fresh one, as Kubernetes does after a failed liveness probe."""
        self.kill(role)
        process = self.plan.one(role)
        self._spawn(process)
        self._wait_healthy([process], time.monotonic() + timeout_s)

    def stop(self) -> None:
        """Stop everything started: SIGTERM to each process group, SIGKILL after a grace period (also when
        the leader is gone: vLLM's engine core may outlive its API server)."""
        procs = list(self._procs.values())
        stop_groups(procs, STOP_GRACE_S)
        for proc in procs:
            self._reaper.forget(proc.pid)
        self._procs.clear()
        self._reaper.close()

    def __enter__(self) -> LocalEPD:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- what tests and the demo look at ------------------------------------------------------

    @property
    def router_url(self) -> str:
        return self.plan.one(ROUTER).url

    def url(self, role: str) -> str:
        return self.plan.one(role).url

    def log_path(self, role: str) -> Path:
        return self.logs / f"{role}.log"

    def alive(self, role: str) -> bool:
        proc = self._procs.get(role)
        return proc is not None and proc.poll() is None

    def healthy(self, role: str) -> bool:
        """Running and answering /health (vLLM's API server outlives a dead engine, answering 503)."""
        return self.alive(role) and _healthy(self.url(role))


def router_command() -> list[str]:
    """`epd-router` from the interpreter running us (the dev venv), without relying on PATH."""
    script = Path(sys.executable).parent / "epd-router"
    return [str(script)] if script.exists() else [sys.executable, "-m", "epd_operator.router.main"]


def load_spec(source: str | Path | dict) -> dict:
    """The EPDDeployment of a file (an example may carry its namespace and volumes beside it)."""
    if isinstance(source, dict):
        return source
    docs = [d for d in yaml.safe_load_all(Path(source).read_text()) if d and d.get("kind") == "EPDDeployment"]
    if len(docs) != 1:
        raise ValueError(f"{source}: {len(docs)} EPDDeployments; expected one")
    return dict(docs[0])


def local_plan(source: str | Path | dict, workdir: Path) -> LocalPlan:
    """Parse and render an EPDDeployment exactly as the operator does, and plan it locally.

    Prepares the vLLM venv and the tiny model first (cached; minutes the first time).
    """
    from epd_operator.api import parse_epd
    from epd_operator.render import render

    objects = render(parse_epd(load_spec(source)))
    python = venv.ensure()
    return plan(
        objects,
        model_dir=tiny_model.ensure(),
        workdir=workdir,
        vllm=python.parent / "vllm",
        router=router_command(),
    )


@contextlib.contextmanager
def run_local(
    source: str | Path | dict,
    workdir: Path,
    progress: Callable[[str], None] = _progress,
    timeout_s: float = START_TIMEOUT_S,
) -> Iterator[LocalEPD]:
    """Run an EPDDeployment (a YAML path or a dict) locally until the block exits."""
    local = LocalEPD(local_plan(source, workdir), workdir, progress)
    with local:
        local.start(timeout_s)
        yield local

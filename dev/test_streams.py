"""``make test``'s test run, once its caches are built: three things side by side.

- **the tiers** (every tier but the node's) in one pytest run on the terminal;
- **the node tier's quick part** (``-m "node and not long"``) beside them, its output in
  ``build/test-node.log``, printed whole when it ends;
- **the late builds**, the two binaries only a few tests need (the oldest supported kube-apiserver for
  tests/integration/test_crd_install.py, prometheus-adapter for tests/integration/test_autoscaling_adapter.py),
  built in the background at the lowest CPU priority when absent; the tests marked ``late_build`` run once
  the tiers and those builds are done.

Why: the tiers keep about one of two cores busy on average (they mostly wait on servers, vLLM and the control
plane) and the node tier mostly waits on its pods, so side by side they take about as long as the longer
of the two; a cold build of the late binaries fills the cycles they leave idle instead of delaying every test.

Exit status: 0 when every part passed, else the first failing part's pytest status (2 when a late build failed).

    python -m dev.test_streams        # what `make test` runs after `make lint`
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from . import prometheus_adapter
from .k8s_binaries import CACHE, OLDEST, REPO

BUILD = REPO / "build"
NODE_LOG = BUILD / "test-node.log"
LATE_LOG = BUILD / "late-builds.log"
PYTEST = [sys.executable, "-m", "pytest"]


def late_builds() -> list[tuple[str, list[str]]]:
    """The late binaries still missing: (what, the command that builds it)."""
    missing = []
    if not os.access(CACHE / "k8s" / OLDEST / "kube-apiserver", os.X_OK):
        missing.append((f"kube-apiserver {OLDEST}", [sys.executable, "-m", "dev.cluster", "build", "--oldest"]))
    if not os.access(prometheus_adapter.BINARY, os.X_OK):
        missing.append(
            (f"prometheus-adapter {prometheus_adapter.VERSION}", [sys.executable, "-m", "dev.prometheus_adapter"])
        )
    return missing


def say(msg: str) -> None:
    print(f"[make test] {msg}", flush=True)


class Background:
    """A child in a session of its own (its whole group is signalled), output to a log file."""

    def __init__(self, argv: list[str], log: Path, *, nice: bool = False) -> None:
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            (["nice", "-n", "19"] if nice else []) + argv,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)

    def wait(self) -> int:
        try:
            return self.proc.wait()
        finally:
            self.log.close()


class LateBuilds(threading.Thread):
    """Builds the missing late binaries one after another at nice 19; ``failed`` names those that failed."""

    def __init__(self, todo: list[tuple[str, list[str]]]) -> None:
        super().__init__(daemon=True)
        self.todo = todo
        self.failed: list[str] = []
        self.current: Background | None = None
        self.stopped = False

    def run(self) -> None:
        for what, argv in self.todo:
            if self.stopped:
                self.failed.append(what)
                continue
            started = time.monotonic()
            self.current = Background(argv, LATE_LOG, nice=True)
            if self.current.wait() != 0:
                self.failed.append(what)
            else:
                say(f"late build: {what} built in {time.monotonic() - started:.0f} s")

    def stop(self) -> None:
        self.stopped = True
        if self.current is not None:
            self.current.stop()


def main() -> int:
    BUILD.mkdir(exist_ok=True)
    NODE_LOG.unlink(missing_ok=True)
    todo = late_builds()
    late = LateBuilds(todo)
    if todo:
        LATE_LOG.unlink(missing_ok=True)
        say(f"building {', '.join(w for w, _ in todo)} in the background at low priority ({LATE_LOG})")
    late.start()
    say(f"the node tier's quick part runs beside the other tiers; its output: {NODE_LOG}")
    # No cache provider: the tiers' run owns .pytest_cache.
    node = Background(PYTEST + ["-m", "node and not long", "-p", "no:cacheprovider"], NODE_LOG)

    def stop_all(signum: int, _frame: FrameType | None) -> None:
        late.stop()
        node.stop()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop_all)
    try:
        tiers = subprocess.run(PYTEST + ["-m", "not node and not late_build"], cwd=REPO).returncode
        if late.is_alive():
            say("the tiers are done; waiting for the late builds")
        late.join()
        if late.failed:
            say(f"late build failed: {', '.join(late.failed)} (its output: {LATE_LOG})")
            if LATE_LOG.exists():
                sys.stdout.write(LATE_LOG.read_text(errors="replace")[-4000:])
            late_status = 2
        else:
            late_status = subprocess.run(
                PYTEST + ["-m", "late_build and not node", "-p", "no:cacheprovider"], cwd=REPO
            ).returncode
        if node.proc.poll() is None:
            say(f"waiting for the node tier ({NODE_LOG})")
        node_status = node.wait()
    except KeyboardInterrupt:
        late.stop()
        node.stop()
        node.wait()
        return 130
    say("the node tier's quick part:")
    sys.stdout.write(NODE_LOG.read_text(errors="replace"))
    statuses = {"the tiers": tiers, "the late-build tests": late_status, "the node tier": node_status}
    failed = {part: status for part, status in statuses.items() if status != 0}
    if failed:
        say("failed: " + ", ".join(f"{part} (exit {status})" for part, status in failed.items()))
        return next(iter(failed.values()))
    say("passed: the tiers, the late-build tests and the node tier's quick part")
    return 0


if __name__ == "__main__":
    sys.exit(main())

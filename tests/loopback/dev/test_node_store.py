"""The image store's slot locks (dev/node/store.py) across processes: a node's process that dies,
even by SIGKILL, frees its slot; the programs it starts do not keep it; the one it hands the lock to
(the node's reaper) keeps the slot until it exits."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dev.node.store import in_use
from dev.paths import REPO
from tests.support.cluster import wait_for

pytestmark = pytest.mark.timeout(60)

# Takes the store's only slot, starts a program the way the cluster starts its components (nothing
# passed) and, with "reaper", one the way the node starts its reaper (the lock passed, stdin a pipe
# only this process holds; it lingers 3 s after the pipe closes), prints their pids, then waits.
HOLDER = """
import subprocess, sys, time
from pathlib import Path
from dev.node.store import take
slot = take(Path(sys.argv[1]), slots=1, owner="holder")
assert slot is not None
component = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
reaper = None
if sys.argv[2] == "reaper":
    reaper = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.stdin.read(); time.sleep(3)"],
        stdin=subprocess.PIPE, pass_fds=(slot.fd,), start_new_session=True,
    )
print(component.pid, reaper.pid if reaper else 0, flush=True)
time.sleep(60)
"""


@contextmanager
def holder(store: Path, mode: str) -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(store), mode], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    component = reaper = 0
    try:
        assert proc.stdout is not None
        component, reaper = map(int, proc.stdout.readline().split())
        yield proc, component, reaper
    finally:
        for pid in (component, reaper):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def test_a_sigkilled_holder_frees_its_slot_and_the_programs_it_started_do_not_keep_it(tmp_path: Path):
    lock = tmp_path / "slot-0.lock"
    with holder(tmp_path, "plain") as (proc, component, _):
        assert in_use(lock)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert _alive(component)  # still running, and holding nothing
        assert not in_use(lock)


def test_the_reaper_handed_the_lock_keeps_the_slot_until_it_exits(tmp_path: Path):
    lock = tmp_path / "slot-0.lock"
    with holder(tmp_path, "reaper") as (proc, _, reaper):
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert _alive(reaper) and in_use(lock)  # cleaning up: no other node may take the slot yet
        wait_for(lambda: not _alive(reaper), 20, "the reaper did not exit")
        assert not in_use(lock)

"""Process groups that die with their owner, however it ends (the local runner's tiers, `dev/runner.py`).

The runner starts each tier in a session of its own, so that stopping it reaches the processes vLLM forks
(its engine core and workers). That also puts them out of reach of whatever ends the owner: killed by a
signal (a test run's SIGKILL, a crash), the owner runs no clean-up, and its tiers would run on, reparented
to init. `GroupReaper` starts a watcher, in a session of its own too, whose stdin is a pipe only the owner
holds (the owner's later children do not inherit it: a pipe's ends are close-on-exec). The owner tells it
each group it starts and each group it has stopped itself. When the pipe closes, because the owner closed
it or because the owner died (the kernel closes a dead process's descriptors, also after SIGKILL), the
watcher SIGKILLs every group still on its list, then exits.

A parent-death signal (``prctl(PR_SET_PDEATHSIG)``) would not do: it reaches only the group's leader, not
the processes the leader forks, and it fires when the thread that started the child exits, not the process.

The watcher is this file run as a script (the standard library only), reading lines ``+PGID`` (watch)
and ``-PGID`` (forget) from stdin.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys


class GroupReaper:
    """The owner's end: the watcher starts with the first group watched, and ends on `close()`."""

    def __init__(self) -> None:
        self._watcher: subprocess.Popen[bytes] | None = None

    def watch(self, pgid: int) -> None:
        """Kill group `pgid` when this process ends, unless `forget` comes first."""
        if self._watcher is None:
            self._watcher = subprocess.Popen(
                [sys.executable, "-I", __file__], stdin=subprocess.PIPE, start_new_session=True
            )
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        """Group `pgid` was stopped by its owner: its id may be reused, the watcher must not kill it."""
        if self._watcher is not None:
            self._send(f"-{pgid}")

    def close(self) -> None:
        """End the watcher; groups still watched are killed."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                watcher.stdin.close()
            watcher.wait()

    def _send(self, line: str) -> None:
        assert self._watcher is not None and self._watcher.stdin is not None
        self._watcher.stdin.write(f"{line}\n".encode())
        self._watcher.stdin.flush()


def watch_stdin() -> None:
    """The watcher: track the groups named on stdin; at its end, SIGKILL those still tracked."""
    groups: set[int] = set()
    for line in sys.stdin:
        pgid = int(line)
        if pgid > 0:
            groups.add(pgid)
        else:
            groups.discard(-pgid)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


if __name__ == "__main__":
    watch_stdin()

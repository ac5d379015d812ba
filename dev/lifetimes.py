"""Processes that die with their owner, however it ends: one home for every "die with the owner" of the
development tools (the local cluster's components, the runner's tiers, ``make test``'s node run, the real node).

Three ways, by what has to die:

- **one process** started by this one (a control-plane component, a test's helper): :func:`die_with_parent`
  as its ``preexec_fn``, a parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``); the kernel kills it
  when the thread that started it ends, even after a SIGKILL of the owner;
- **process groups** (a runner tier and what vLLM forks; a pytest run and its servers): a parent-death
  signal reaches only the group's leader, so :class:`GroupReaper` starts a watcher in a session of its own
  whose stdin is a pipe only the owner holds (the owner's later children do not inherit it: a pipe's ends
  are close-on-exec). The owner tells it each group it starts (``+PGID``) and each it has stopped itself
  (``-PGID``). When the pipe closes, because the owner closed it or died (the kernel closes a dead
  process's descriptors, also after SIGKILL), the watcher SIGKILLs every group still on its list. An owner
  stops its groups itself with :func:`stop_groups` (SIGTERM, a grace period, SIGKILL);
- **a real node** (``dev/node/real_node.py``): containerd's shims and the containers leave every process tree,
  so the node's watcher (``node``), started the same way, kills what is left in the node's cgroup, removes
  the node's cgroups in every hierarchy (``dev/node/cgroups.py``), then the node's folder and its egress socket.
  It inherits the lock of the node's image-store slot (``dev/node/store.py``) and never touches it: the
  kernel drops the lock when the watcher exits, so no other node takes that containerd root while this
  node's processes may still write to it. Mounts and network namespaces need nothing: they vanish with
  their last process.

    python -m dev.lifetimes groups < pipe        # the group watcher (GroupReaper starts it)
    python -m dev.lifetimes node --cgroup /PATH/IN/EVERY/HIERARCHY [--parent /PATH]... [--remove PATH]... < pipe
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dev.node import cgroups
from dev.paths import REPO

_PR_SET_PDEATHSIG = 1
# Loaded here, not in the child: a client library's thread may be running when we fork, and a dlopen in
# the child could wait forever on a lock that thread held at the fork.
_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)


def kill_with_parent() -> None:
    """A ``preexec_fn`` (between fork and exec): SIGKILL when the thread that started the child ends."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def die_with_parent() -> None:
    """:func:`kill_with_parent`, in a process group of its own: a Ctrl-C in the terminal reaches the
    owner, which stops its children in order."""
    kill_with_parent()
    os.setpgrp()


def watcher_argv(*args: str) -> list[str]:
    """The command line of a watcher (run from the repository, like every ``python -m dev...``)."""
    return [sys.executable, "-m", "dev.lifetimes", *args]


def stop_groups(leaders: Sequence[subprocess.Popen[bytes]], grace: float) -> None:
    """Stop the process groups these processes lead (each started with ``start_new_session=True``): SIGTERM to
    every group, up to `grace` seconds in all for the leaders to exit, then SIGKILL to every group, also when its
    leader is gone (what it forked, vLLM's engine core, may outlive it), and the leaders reaped. A
    :class:`GroupReaper` watching them is told with :meth:`GroupReaper.forget` afterwards."""
    for leader in leaders:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for leader in leaders:
        with contextlib.suppress(subprocess.TimeoutExpired):
            leader.wait(timeout=max(0.1, deadline - time.monotonic()))
    for leader in leaders:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


class GroupReaper:
    """The owner's end: the watcher starts with the first group watched, and ends on `close()`."""

    def __init__(self) -> None:
        self._watcher: subprocess.Popen[bytes] | None = None

    def watch(self, pgid: int) -> None:
        """Kill group `pgid` when this process ends, unless `forget` comes first."""
        if self._watcher is None:
            self._watcher = subprocess.Popen(
                watcher_argv("groups"), stdin=subprocess.PIPE, start_new_session=True, cwd=REPO
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


def watch_groups() -> int:
    """The group watcher: track the groups named on stdin; at its end, SIGKILL those still tracked."""
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
    return 0


def reap_node(
    cgroup: str, parents: list[str], remove: list[str], v2_here: str | None = None, v2_enabled: Sequence[str] = ()
) -> int:
    """The node's clean-up: its cgroups emptied and removed, the parents it created removed when empty,
    with cgroup v2 the own cgroup's preparation undone (:func:`dev.node.cgroups.v2_restore`), then ``remove``."""
    mounts = cgroups.hierarchies()
    roots = [m / cgroup.lstrip("/") for m in mounts]
    survivors = cgroups.kill_all(roots)
    stuck = cgroups.remove_cgroups(roots)
    # Parents this node created in hierarchies where they did not exist: removed when empty (another
    # node of this machine may still use them; then rmdir fails and they stay for it).
    for parent in sorted(parents, key=len, reverse=True):
        for m in mounts:
            with contextlib.suppress(OSError):
                (m / parent.lstrip("/")).rmdir()
    if v2_here is not None:
        cgroups.v2_restore(Path(v2_here), list(v2_enabled))
    for path in remove:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    if survivors or stuck:
        print(f"node watcher: processes {sorted(survivors)} and cgroups {stuck} remain", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.lifetimes", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("groups", help="SIGKILL the process groups named on stdin (+PGID, -PGID) when stdin closes")
    node = sub.add_parser("node", help="clean up a real node when stdin closes")
    node.add_argument("--cgroup", required=True, help="the node's cgroup path, the same in every hierarchy")
    node.add_argument("--parent", action="append", default=[], help="a parent cgroup to remove when empty")
    node.add_argument("--remove", action="append", default=[], help="a file or folder to delete once nothing runs")
    node.add_argument("--v2-here", help="cgroup v2: the own cgroup prepared for the node (dev/node/cgroups.py)")
    node.add_argument("--v2-enabled", action="append", default=[], help="cgroup v2: a controller it enabled")
    node.add_argument("--now", action="store_true", help="clean up at once instead of waiting for stdin to close")
    args = parser.parse_args(argv)
    if args.command == "groups":
        return watch_groups()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if not args.now:
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
    return reap_node(args.cgroup, args.parent, args.remove, args.v2_here, args.v2_enabled)


if __name__ == "__main__":
    sys.exit(main())

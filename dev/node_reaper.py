"""The real node's clean-up (``dev/real_node.py``), however its cluster ends.

Started in a session of its own (no parent-death signal), it blocks reading its stdin, a pipe whose
writing end only the cluster's supervising process holds. When that end closes, because the cluster
stops or because its process died (even by SIGKILL), it kills every process left in the node's
cgroup (containerd's shims and the containers have left the supervisor's process tree), removes
the node's cgroups in every hierarchy, then the node's folder and its egress socket. The node's mounts and network
namespaces need nothing: they live in namespaces that vanish with their last process.

It inherits the lock of the node's image-store slot (``dev/node_store.py``) and never touches it: the
kernel drops the lock when the reaper exits, so no other node takes that containerd root while this
node's processes may still write to it.

    python -m dev.node_reaper --cgroup /PATH/IN/EVERY/HIERARCHY [--parent /PATH]... [--remove PATH]... < pipe
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")


def hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, the named systemd one, the unified one)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ", 1)
        if len(fields) == 2 and fields[1].split()[0] in ("cgroup", "cgroup2"):
            found.append(Path(fields[0].split()[4]))
    return found


def subtree(root: Path) -> list[Path]:
    """Every cgroup under ``root`` (itself included), deepest first."""
    if not root.is_dir():
        return []
    dirs = [Path(d) for d, _, _ in os.walk(root)]
    return sorted(dirs, key=lambda d: len(d.parts), reverse=True)


def pids(roots: list[Path]) -> set[int]:
    found: set[int] = set()
    for root in roots:
        for cg in subtree(root):
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (cg / "cgroup.procs").read_text().split())
    return found


def kill_all(roots: list[Path], timeout: float = 30.0) -> set[int]:
    """SIGKILL every process in the cgroups until none is left; returns those still there at the end."""
    freezer = next((r for r in roots if r.parts[:5] == CGROUP_FS.parts + ("freezer",)), None)
    deadline = time.monotonic() + timeout
    while (left := pids(roots) - {os.getpid()}) and time.monotonic() < deadline:
        # Frozen, nothing forks between the listing and the kill; the kill lands when thawed.
        if freezer is not None:
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("FROZEN")
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if freezer is not None:
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("THAWED")
        time.sleep(0.1)
    return pids(roots) - {os.getpid()}


def remove_cgroups(roots: list[Path], timeout: float = 10.0) -> list[Path]:
    """rmdir every cgroup under the roots, deepest first (a dead task may take a moment to leave)."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for root in roots:
            for cg in subtree(root):
                try:
                    cg.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(cg)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def reap(cgroup: str, parents: list[str], remove: list[str]) -> int:
    mounts = hierarchies()
    roots = [m / cgroup.lstrip("/") for m in mounts]
    survivors = kill_all(roots)
    stuck = remove_cgroups(roots)
    # Parents this node created in hierarchies where they did not exist: removed when empty (another
    # node of this machine may still use them; then rmdir fails and they stay for it).
    for parent in sorted(parents, key=len, reverse=True):
        for m in mounts:
            with contextlib.suppress(OSError):
                (m / parent.lstrip("/")).rmdir()
    for path in remove:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    if survivors or stuck:
        print(f"node_reaper: processes {sorted(survivors)} and cgroups {stuck} remain", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.node_reaper", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cgroup", required=True, help="the node's cgroup path, the same in every hierarchy")
    parser.add_argument("--parent", action="append", default=[], help="a parent cgroup to remove when empty")
    parser.add_argument("--remove", action="append", default=[], help="a file or folder to delete once nothing runs")
    parser.add_argument("--now", action="store_true", help="clean up at once instead of waiting for stdin to close")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if not args.now:
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
    return reap(args.cgroup, args.parent, args.remove)


if __name__ == "__main__":
    sys.exit(main())

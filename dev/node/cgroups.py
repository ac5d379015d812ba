"""cgroups for the real node (``dev/node/real_node.py``) and its clean-up (``dev/lifetimes.py``): one home for
reading this machine's cgroup layout, placing the node's cgroup, and emptying and removing it.

Two layouts:

- **cgroup v1 or hybrid** (v1 controllers, maybe the unified hierarchy beside them): the node's cgroup is
  one path, the same in every hierarchy, nested under this process's own cgroup in each (the kubelet's
  ``cgroupRoot`` is one path); possible when this process's own paths form a chain;
- **cgroup v2 only** (one ``cgroup2`` mount, most current distributions): the node's cgroup is a child of
  this process's own cgroup, with every controller the own cgroup has enabled for it and below it (the
  kubelet wants them all, hugetlb included). cgroup v2 lets a cgroup hand controllers to its children
  only while no process sits in it (but the root), so, as kind's node image does with the root cgroup at
  start, the processes of this process's own cgroup first move into a leaf, ``epd-supervisor``; the node's
  reaper moves them back and removes the leaf when the last node of the cgroup is gone.

:func:`v2_refusal` says up front, before anything starts, why a v2 layout cannot host a node, and what to do.
Parsing takes the files' text, so the layouts are tested from fixtures (tests/unit/dev/test_cgroups.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")
SUPERVISOR_LEAF = "epd-supervisor"
# What the kubelet needs from a cgroup v2 hierarchy (it refuses to start without cpu, memory and pids).
V2_NEEDED = ("cpu", "memory", "pids")


@dataclasses.dataclass(frozen=True)
class Mount:
    """A mounted cgroup hierarchy: where, which kind (``cgroup`` v1 or ``cgroup2``), read-only or not."""

    path: Path
    fstype: str
    read_only: bool


def mounts(mountinfo: str | None = None) -> list[Mount]:
    """Every mounted cgroup hierarchy (v1 controllers, the named systemd one, the unified one), from
    ``/proc/self/mountinfo`` (or its text)."""
    text = Path("/proc/self/mountinfo").read_text() if mountinfo is None else mountinfo
    found = []
    for line in text.splitlines():
        pre, sep, post = line.partition(" - ")
        if not sep:
            continue
        fstype = post.split()[0]
        if fstype in ("cgroup", "cgroup2"):
            fields = pre.split()
            found.append(Mount(Path(fields[4]), fstype, "ro" in fields[5].split(",")))
    return found


def hierarchies(mountinfo: str | None = None) -> list[Path]:
    return [m.path for m in mounts(mountinfo)]


def unified_only(found: list[Mount]) -> bool:
    """cgroup v2 only: one ``cgroup2`` hierarchy and no v1 one."""
    return len(found) == 1 and found[0].fstype == "cgroup2"


def own_cgroups(found: list[Mount], proc_self_cgroup: str | None = None) -> dict[str, str]:
    """This process's cgroup path per hierarchy, keyed by the hierarchy's mount point."""
    text = Path("/proc/self/cgroup").read_text() if proc_self_cgroup is None else proc_self_cgroup
    by_controllers: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        by_controllers[controllers] = path
    own = {}
    for mount in found:
        name = mount.path.name
        key = next(
            (
                c
                for c in by_controllers
                if name in c.split(",")
                or c == f"name={name}"
                or (c == "" and (name == "unified" or mount.fstype == "cgroup2"))
            ),
            None,
        )
        own[str(mount.path)] = by_controllers.get(key, "/") if key is not None else "/"
    return own


def node_cgroup_path(own: dict[str, str], name: str) -> str:
    """One path for the node, the same in every hierarchy and nested under this process's own cgroup
    in each. Possible when the own paths form a chain (v1: the memory hierarchy places us deep, the
    others at the root; v2: one path)."""
    deepest = max(own.values(), key=len)
    for mount, path in own.items():
        if not (deepest + "/").startswith(path.rstrip("/") + "/"):
            raise ValueError(
                f"cannot nest a node's cgroup under this process's own: it is {path} in {mount} but {deepest} elsewhere"
            )
    return deepest.rstrip("/") + "/" + name


def v2_refusal(mount: Mount, own: str, *, root: Path | None = None) -> str | None:
    """Why a real node cannot nest under ``own`` in this cgroup v2 hierarchy, with what to do; None when it can."""
    base = root if root is not None else mount.path
    here = base / own.lstrip("/")
    delegate = (
        "run it in a cgroup of its own with the controllers delegated: "
        "`systemd-run --scope -p Delegate=yes --quiet <the make or pytest command>`"
    )
    if mount.read_only:
        return f"the cgroup v2 hierarchy at {mount.path} is mounted read-only (a container without its own cgroup namespace?): {delegate}, or give the container a writable cgroup namespace"
    try:
        controllers = (here / "cgroup.controllers").read_text().split()
    except OSError as exc:
        return f"cannot read {here / 'cgroup.controllers'} ({exc.strerror}): {delegate}"
    missing = [c for c in V2_NEEDED if c not in controllers]
    if missing:
        return f"this process's cgroup {own} has no {', '.join(missing)} controller (its parent does not delegate them): {delegate}"
    if not os.access(here, os.W_OK):
        return f"cannot create cgroups under {here}: {delegate}"
    return None


def v2_prepare(here: Path, *, is_root: bool) -> list[str]:
    """Make ``here`` (this process's cgroup) able to hand its controllers to a child: its processes move into
    the leaf ``epd-supervisor`` (the root cgroup may keep them), then every controller it has is enabled for
    its children. Returns the controllers this enabled (the reaper disables them again, :func:`v2_restore`)."""
    controllers = (here / "cgroup.controllers").read_text().split()
    enabled = set((here / "cgroup.subtree_control").read_text().split())
    wanted = [c for c in controllers if c not in enabled]
    if not wanted:
        return []
    if not is_root and _procs(here):
        leaf = here / SUPERVISOR_LEAF
        leaf.mkdir(exist_ok=True)
        for pid in _procs(here):
            with contextlib.suppress(OSError):  # gone meanwhile, or a kernel thread
                (leaf / "cgroup.procs").write_text(str(pid))
    (here / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
    return wanted


def v2_enable_all(cgroup: Path) -> None:
    """Every controller ``cgroup`` has, enabled for its children (the kubelet's pods cgroups)."""
    controllers = (cgroup / "cgroup.controllers").read_text().split()
    if controllers:
        (cgroup / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in controllers))


def v2_restore(here: Path, enabled: list[str]) -> None:
    """Undo :func:`v2_prepare` once ``here`` has no child but the supervisor's leaf: the controllers it
    enabled off, the leaf's processes back in ``here``, the leaf removed. Left as is while another node
    (another child) still uses them."""
    leaf = here / SUPERVISOR_LEAF
    others = [d for d in here.iterdir() if d.is_dir() and d.name != SUPERVISOR_LEAF] if here.is_dir() else []
    if others:
        return
    with contextlib.suppress(OSError):
        if enabled:
            (here / "cgroup.subtree_control").write_text(" ".join(f"-{c}" for c in enabled))
        if leaf.is_dir():
            for pid in _procs(leaf):
                with contextlib.suppress(OSError):
                    (here / "cgroup.procs").write_text(str(pid))
            leaf.rmdir()


def _procs(cgroup: Path) -> list[int]:
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except OSError:
        return []


# ------------------------------------------------------------------ emptying and removing


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
            found.update(_procs(cg))
    return found


def kill_all(roots: list[Path], timeout: float = 30.0) -> set[int]:
    """SIGKILL every process in the cgroups until none is left; returns those still there at the end.
    cgroup v2's ``cgroup.kill`` kills a whole subtree at once; on v1 the freezer, when mounted, stops
    forks between the listing and the kill."""
    freezer = next((r for r in roots if r.parts[:5] == CGROUP_FS.parts + ("freezer",)), None)
    deadline = time.monotonic() + timeout
    while (left := pids(roots) - {os.getpid()}) and time.monotonic() < deadline:
        for root in roots:
            if (root / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (root / "cgroup.kill").write_text("1")
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

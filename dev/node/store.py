"""The real node's image store: containerd roots that outlive a cluster, so that an image imported
once (the CPU vLLM image takes minutes) is still there for the next cluster (``dev/node/real_node.py``).

The store is ``~/.cache/epd-operator/node/containerd/`` (``EPD_CACHE`` moves it), in **slots**:
``slot-<n>/`` is one containerd root (content, unpacked snapshots, metadata) and ``slot-<n>.lock``
the file whose ``flock`` a node holds for its whole life. A node takes the first slot whose lock it
gets without waiting, so two clusters never share a containerd root; when every slot is taken, the
node keeps its root in its own folder, removed with it.

The lock belongs to an open file description: the kernel drops it when the last process holding it
ends, however it ends (SIGKILL included). The cluster's process takes it and hands it to the node's
watcher (``dev/lifetimes.py``), so the slot stays taken until the node's last process is gone; no
other child inherits it (Python opens files close-on-exec, and ``subprocess`` closes the rest).

Each slot costs the disk its images take twice (the archives' blobs and their unpacked snapshots).

    python -m dev.node.store          # the slots: free or in use (and by whom), and their size
    python -m dev.node.store clear    # remove every slot's images; refused while any slot is in use
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import os
import shutil
import sys
from pathlib import Path

from dev.paths import CACHE

STORE = CACHE / "node" / "containerd"
SLOTS = 2


class StoreInUse(RuntimeError):
    """A slot's lock is held: a running cluster's node uses that root."""


@dataclasses.dataclass
class Slot:
    """A slot this process holds: ``fd`` is the locked lock file, ``root`` the containerd root."""

    index: int
    root: Path
    lock: Path
    fd: int

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1


def _lock_path(store: Path, index: int) -> Path:
    return store / f"slot-{index}.lock"


def _try_lock(lock: Path) -> int | None:
    """The fd of ``lock`` locked exclusively, or None when another open file holds it. A lock file
    removed or replaced after it was opened (the store cleared by hand) locks nothing: it is opened
    again."""
    for _ in range(10):
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise StoreInUse(f"{lock} keeps being replaced while it is taken")


def take(store: Path = STORE, slots: int = SLOTS, owner: str = "") -> Slot | None:
    """The first free slot, locked for this process (and whoever it hands the fd to), or None when
    every slot is in use. ``owner`` is written into the lock file, for :func:`holder`'s messages."""
    store.mkdir(parents=True, exist_ok=True)
    for index in range(slots):
        lock = _lock_path(store, index)
        fd = _try_lock(lock)
        if fd is None:
            continue
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{owner or f'pid {os.getpid()}'}\n".encode(), 0)
        root = store / f"slot-{index}"
        root.mkdir(exist_ok=True)
        return Slot(index, root, lock, fd)
    return None


def holder(lock: Path) -> str:
    """Who took ``lock`` last, as it wrote itself there."""
    try:
        return lock.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def in_use(lock: Path) -> bool:
    if not lock.exists():
        return False
    fd = _try_lock(lock)
    if fd is None:
        return True
    os.close(fd)
    return False


def _slot_indexes(store: Path) -> list[int]:
    found = set()
    for path in store.glob("slot-*"):
        number = path.name.removeprefix("slot-").removesuffix(".lock")
        if number.isdigit():
            found.add(int(number))
    return sorted(found)


def clear(store: Path = STORE) -> list[Path]:
    """Remove every slot's root (its images and snapshots), each while holding its lock, and return
    what was removed. Raises :class:`StoreInUse`, removing nothing, when any slot is in use. The lock
    files stay: a node that opened one before the removal still locks the file the next one opens."""
    if not store.is_dir():
        return []
    held: list[int] = []
    busy: list[str] = []
    try:
        for index in _slot_indexes(store):
            lock = _lock_path(store, index)
            fd = _try_lock(lock)
            if fd is None:
                busy.append(f"slot-{index} ({holder(lock)})")
            else:
                held.append(fd)
        if busy:
            raise StoreInUse(
                f"the node's image store {store} is in use by a running cluster: {', '.join(busy)}; "
                "stop it first (make cluster-down)"
            )
        removed = []
        for index in _slot_indexes(store):
            root = store / f"slot-{index}"
            if root.is_dir():
                shutil.rmtree(root)
                removed.append(root)
        return removed
    finally:
        for fd in held:
            os.close(fd)


def size(path: Path) -> int:
    """Bytes on disk under ``path`` (hard links once)."""
    total, seen = 0, set()
    for dirpath, _, files in os.walk(path):
        for name in [".", *files]:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


def describe(store: Path = STORE) -> list[str]:
    lines = []
    for index in _slot_indexes(store):
        lock, root = _lock_path(store, index), store / f"slot-{index}"
        state = f"in use by {holder(lock)}" if in_use(lock) else "free"
        if not root.is_dir():
            lines.append(f"{root}: empty, {state}")
            continue
        used = size(root)
        lines.append(
            f"{root}: {used / 2**30:.1f} GiB, {state}" if used >= 2**30 else f"{root}: {used / 2**20:.0f} MiB, {state}"
        )
    return lines or [f"{store}: empty"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.node.store", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=("status", "clear"), default="status")
    args = parser.parse_args(argv)
    if args.command == "status":
        print("\n".join(describe()))
        return 0
    try:
        removed = clear()
    except StoreInUse as exc:
        print(f"not cleared: {exc}", file=sys.stderr)
        return 1
    print(f"removed {', '.join(map(str, removed))}" if removed else f"{STORE}: nothing to remove", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

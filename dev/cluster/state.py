"""What a running ``make cluster`` (``dev/cluster/cli.py``) leaves for other commands, under
``~/.cache/epd-operator/cluster``: its supervisor's pid, its kubeconfig, its real node's namespaces and
containerd socket; and loading images into that node (``make images``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from dev.cluster.api import ClusterError
from dev.node.containerd import import_archive
from dev.paths import CACHE

STATE_DIR = CACHE / "cluster"
REAL_NODE_STATE = STATE_DIR / "real-node.json"


def running_pid() -> int | None:
    try:
        pid = int((STATE_DIR / "pid").read_text())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    return pid


def load_images(archives: list[Path]) -> int:
    """Import image archives into the running local cluster's real node (``make images``)."""
    if running_pid() is None or not REAL_NODE_STATE.exists():
        print("no local cluster with a real node is running: images built, not loaded (make cluster)", file=sys.stderr)
        return 0
    state = json.loads(REAL_NODE_STATE.read_text())
    try:
        for archive in archives:
            if import_archive(state["enter"], Path(state["socket"]), archive):
                print(f"loaded {archive.name} into {state['name']}", file=sys.stderr)
            else:
                print(f"{archive.name}: already in {state['name']}", file=sys.stderr)
    except ClusterError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0

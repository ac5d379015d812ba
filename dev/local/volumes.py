"""Pod volumes on this machine: which storage a volume names, and container paths under its mount
rewritten to the volume's local directory (in plain arguments and inside JSON arguments)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

JSON = dict[str, Any]


def volume_key(deployment: str, volume: JSON) -> str | None:
    """What identifies the storage behind a volume: pods naming the same claim share it."""
    if "persistentVolumeClaim" in volume:
        return f"pvc/{volume['persistentVolumeClaim']['claimName']}"
    if "hostPath" in volume:
        return "hostpath/" + volume["hostPath"]["path"].strip("/").replace("/", "_")
    if "emptyDir" in volume:
        return f"emptydir/{deployment}/{volume['name']}"
    return None  # configMap/secret/projected: nothing the vLLM command line points into


class PathMap:
    """Container paths under a volume mount -> the volume's local directory."""

    def __init__(self, mounts: dict[str, Path]) -> None:
        # Longest mount first, so /models/x is not taken for /models.
        self.mounts = sorted(mounts.items(), key=lambda kv: len(kv[0]), reverse=True)

    def path(self, value: str) -> str:
        for mount, local in self.mounts:
            if value == mount or value.startswith(mount.rstrip("/") + "/"):
                return str(local) + value[len(mount.rstrip("/")) :]
        return value

    def json(self, node: Any) -> Any:
        if isinstance(node, str):
            return self.path(node)
        if isinstance(node, dict):
            return {k: self.json(v) for k, v in node.items()}
        if isinstance(node, list):
            return [self.json(v) for v in node]
        return node

    def arg(self, arg: str) -> str:
        if arg.startswith("{"):
            try:
                parsed = json.loads(arg)
            except ValueError:
                return arg
            mapped = self.json(parsed)
            return arg if mapped == parsed else json.dumps(mapped, separators=(",", ":"))
        if arg.startswith("--") and "=" in arg:
            name, value = arg.split("=", 1)
            return f"{name}={self.arg(value)}"
        return self.path(arg)

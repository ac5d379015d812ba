"""Fake GPU nodes: kwok keeps them Ready; pods are scheduled onto them for real and run nothing."""

from __future__ import annotations

import dataclasses
from typing import Any

FAKE_NODE_LABEL = "epd.dev/fake-node"
GPU = "nvidia.com/gpu"


@dataclasses.dataclass(frozen=True)
class FakeNode:
    """A kwok node: capacity and placement a test can choose."""

    name: str
    gpus: int = 16
    cpu: str = "64"
    memory: str = "512Gi"
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()

    def manifest(self) -> dict[str, Any]:
        capacity = {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": "110",
            GPU: str(self.gpus),
            "ephemeral-storage": "1Ti",
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    FAKE_NODE_LABEL: "true",
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    **self.labels,
                },
            },
            "spec": {"taints": [dict(t) for t in self.taints]},
            "status": {"allocatable": capacity, "capacity": capacity},
        }


DEFAULT_NODES = (FakeNode("gpu-node-1"), FakeNode("gpu-node-2"))

"""Workload objects as their controllers report them, for the status tests."""

from __future__ import annotations

from typing import Any


def settled_deployment(n: int = 2, ready: int | None = None, generation: int = 3, **status: Any) -> dict[str, Any]:
    """A Deployment whose controller has seen its latest spec: `n` replicas, all updated, `ready` of them
    ready and available (default: all), plus any other `status` fields."""
    ready = n if ready is None else ready
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": n},
        "status": {
            "observedGeneration": generation,
            "replicas": n,
            "updatedReplicas": n,
            "readyReplicas": ready,
            "availableReplicas": ready,
            **status,
        },
    }

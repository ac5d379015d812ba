"""Small EPDDeployment documents for unit tests: the minimal valid one and changes to it by path."""

from __future__ import annotations

import copy
from typing import Any

from epd_operator.api import EPDDeployment, parse_epd


def minimal() -> dict[str, Any]:
    """The smallest valid spec: E+PD over shared storage."""
    return {
        "apiVersion": "serving.epd.dev/v1alpha1",
        "kind": "EPDDeployment",
        "metadata": {"name": "qwen-vl", "namespace": "ns"},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-VL-3B-Instruct"},
            "encoder": {},
            "decode": {},
            "ecTransfer": {"connector": "SharedStorage", "sharedStorage": {"claimName": "ec-cache"}},
        },
    }


def spec(**changes: Any) -> dict[str, Any]:
    """`minimal()` with changes given as `path__to__field=value` (None deletes the field)."""
    doc = copy.deepcopy(minimal())
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return doc


def epd(**changes: Any) -> EPDDeployment:
    return parse_epd(spec(**changes))

"""kube-router (github.com/cloudnativelabs/kube-router), the local cluster's NetworkPolicy engine, built
once from the Go module proxy into ``~/.cache/epd-operator/kube-router/<version>/kube-router``.

Only its firewall runs (``--run-firewall``; no router, no service proxy): it turns NetworkPolicies into
iptables chains and ipsets inside the real node's network namespace (dev/parts/network_policy_engine.py).
It is built static, as its own release build is, against the release's go.mod and go.sum
(``dev/builds/go_module.py``) by ``make k8s-node``, with the node's other parts.

    python -m dev.parts.kube_router      # build (or find) it and print its path
"""

from __future__ import annotations

from pathlib import Path

from dev.builds import go_module

KUBE_ROUTER = go_module.GoBinary(
    "kube-router", "github.com/cloudnativelabs/kube-router/v2", "v2.1.0", "./cmd/kube-router", "kube-router"
)


def ensure() -> Path:
    """The kube-router binary, built when absent."""
    return go_module.ensure(KUBE_ROUTER)


if __name__ == "__main__":
    print(ensure())

"""kube-router (github.com/cloudnativelabs/kube-router), the local cluster's NetworkPolicy engine, built
once from the Go module proxy into ``~/.cache/epd-operator/kube-router/<version>/kube-router``.

Only its firewall runs (``--run-firewall``; no router, no service proxy): it turns NetworkPolicies into
iptables chains and ipsets inside the real node's network namespace (dev/network_policy_engine.py).
It is built static (``CGO_ENABLED=0``, as its own release build does) against the release's go.mod and
go.sum (``dev/go_module.py``). A lock file serialises concurrent builds of the cache.

    python -m dev.kube_router      # build (or find) it and print its path
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from dev import go_module
from dev.k8s_binaries import CACHE

MODULE = "github.com/cloudnativelabs/kube-router/v2"
VERSION = "v2.1.0"
BINARY = CACHE / "kube-router" / VERSION / "kube-router"


def log(msg: str) -> None:
    print(f"[kube-router] {msg}", file=sys.stderr, flush=True)


def ensure() -> Path:
    """The kube-router binary, built when absent."""
    if os.access(BINARY, os.X_OK):
        return BINARY
    go = go_module.require_go("kube-router")
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    with (BINARY.parent / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another build of it finishes first
        if os.access(BINARY, os.X_OK):
            return BINARY
        go_module.build(
            go,
            MODULE,
            VERSION,
            "./cmd/kube-router",
            BINARY,
            log,
            flags=["-trimpath", "-ldflags=-s -w"],
            env={"CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"},
        )
    return BINARY


if __name__ == "__main__":
    print(ensure())

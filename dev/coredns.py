"""CoreDNS (github.com/coredns/coredns), the local cluster's DNS, built once from the Go module proxy
into ``~/.cache/epd-operator/coredns/<version>/``.

The release's own ``main`` compiles in every plugin (cloud DNS providers' SDKs included). The binary
built here is CoreDNS's ``coremain`` with the plugins the cluster's Corefile uses (``PLUGINS``): a
``main`` package importing those plugins, built static (``CGO_ENABLED=0``) in the release's module
against its own go.mod and go.sum (``dev/go_module.py``). A lock file serialises concurrent builds of
the cache. Cold (empty Go build cache, dependencies downloaded): 21.5 minutes on a 2-core machine at a
load average of 14-20, 5.7 CPU-minutes.

    python -m dev.coredns      # build (or find) it and print its path
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
from pathlib import Path
from typing import IO

from dev import go_module
from dev.k8s_binaries import CACHE

MODULE = "github.com/coredns/coredns"
VERSION = "v1.15.0"
# The plugins dev/cluster_dns.py's Corefile names; the rest of CoreDNS's directives stay known to the
# Corefile parser but are not compiled in.
PLUGINS = ("errors", "health", "ready", "kubernetes", "cache", "template")
# Keyed by the version and the plugin set.
BINARY = CACHE / "coredns" / VERSION / f"coredns-{hashlib.sha256(' '.join(PLUGINS).encode()).hexdigest()[:8]}"

_MAIN = """package main

import (
	"github.com/coredns/coredns/coremain"
{imports}
)

func main() {{
	coremain.Run()
}}
"""


def log(msg: str) -> None:
    print(f"[coredns] {msg}", file=sys.stderr, flush=True)


def ensure() -> Path:
    """The CoreDNS binary, built when absent."""
    if os.access(BINARY, os.X_OK):
        return BINARY
    go = go_module.require_go("CoreDNS")
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    with (BINARY.parent / ".build.lock").open("w") as lock:
        if not _try_lock(lock):
            log("waiting for another build of CoreDNS to finish")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(BINARY, os.X_OK):
            return BINARY
        _build(go)
    return BINARY


def _try_lock(lock: IO[str]) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _build(go: str) -> None:
    imports = "\n".join(f'\t_ "{MODULE}/plugin/{p}"' for p in PLUGINS)
    go_module.build(
        go,
        MODULE,
        VERSION,
        "./cmd/epd-coredns",
        BINARY,
        log,
        files={"cmd/epd-coredns/main.go": _MAIN.format(imports=imports)},
        flags=["-trimpath", "-ldflags=-s -w"],
        env={"CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"},
    )


if __name__ == "__main__":
    print(ensure())

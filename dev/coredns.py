"""CoreDNS (github.com/coredns/coredns), the local cluster's DNS, built once from the Go module proxy
into ``~/.cache/epd-operator/coredns/<version>/``.

The release's own ``main`` compiles in every plugin (cloud DNS providers' SDKs included). The binary
built here is CoreDNS's ``coremain`` with the plugins the cluster's Corefile uses (``PLUGINS``): the
module's source is downloaded (``go mod download``), copied (the module cache is read-only) and a
``main`` package importing those plugins is built in it, static (``CGO_ENABLED=0``), against the
release's own go.mod and go.sum. A lock file serialises concurrent builds of the cache. Cold (empty Go
build cache, dependencies downloaded): 21.5 minutes on a 2-core machine at a load average of 14-20,
5.7 CPU-minutes.

    python -m dev.coredns      # build (or find) it and print its path
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

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
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("building CoreDNS needs Go (https://go.dev/dl)")
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
    log(f"building {MODULE}@{VERSION} from the Go module proxy (once; cached in {BINARY.parent})")
    started = time.monotonic()
    download = subprocess.run(
        [go, "mod", "download", "-json", f"{MODULE}@{VERSION}"], capture_output=True, text=True, check=True
    )
    source = Path(json.loads(download.stdout)["Dir"])
    with tempfile.TemporaryDirectory(prefix="coredns-", dir=BINARY.parent) as work:
        tree = Path(work) / "src"
        shutil.copytree(source, tree)
        for path in tree.rglob("*"):
            path.chmod(path.stat().st_mode | 0o200)
        main = tree / "cmd" / "epd-coredns"
        main.mkdir(parents=True)
        imports = "\n".join(f'\t_ "{MODULE}/plugin/{p}"' for p in PLUGINS)
        (main / "main.go").write_text(_MAIN.format(imports=imports))
        partial = Path(work) / "coredns"
        subprocess.run(
            [go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(partial), "./cmd/epd-coredns"],
            cwd=tree,
            check=True,
            env={**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"},
        )
        partial.replace(BINARY)
    log(f"built in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    print(ensure())

"""prometheus-adapter (sigs.k8s.io/prometheus-adapter), built once from the Go module proxy into
``~/.cache/epd-operator/prometheus-adapter/<version>/adapter``, for the tests that serve the custom
metrics API on the local control plane with the operator chart's adapter rules.

`go install module@version` needs the module's version list, which the proxy does not serve for this
module, so the pinned version's source is downloaded (`go mod download`) and built in a copy with its
own go.mod and go.sum. Cold: about 35 minutes on 2 busy cores, most of it compiling k8s.io/apiserver.

    python -m dev.prometheus_adapter      # build (or find) it and print its path
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dev.k8s_binaries import CACHE

MODULE = "sigs.k8s.io/prometheus-adapter"
VERSION = "v0.12.0"
BINARY = CACHE / "prometheus-adapter" / VERSION / "adapter"


def log(msg: str) -> None:
    print(f"[prometheus-adapter] {msg}", file=sys.stderr, flush=True)


def ensure() -> Path:
    """The adapter binary, built when absent."""
    if os.access(BINARY, os.X_OK):
        return BINARY
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("building prometheus-adapter needs Go (https://go.dev/dl)")
    log(f"building {MODULE}@{VERSION} from the Go module proxy (once; cached in {BINARY.parent})")
    started = time.monotonic()
    download = subprocess.run(
        [go, "mod", "download", "-json", f"{MODULE}@{VERSION}"], capture_output=True, text=True, check=True
    )
    source = Path(json.loads(download.stdout)["Dir"])
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="prometheus-adapter-", dir=BINARY.parent) as work:
        tree = Path(work) / "src"
        shutil.copytree(source, tree)  # the module cache is read-only; go build writes nothing there
        for path in tree.rglob("*"):
            path.chmod(path.stat().st_mode | 0o200)
        partial = Path(work) / "adapter"
        subprocess.run([go, "build", "-o", str(partial), "./cmd/adapter"], cwd=tree, check=True)
        partial.replace(BINARY)  # atomic: a concurrent build either wins or finds it built
    log(f"built in {time.monotonic() - started:.0f} s")
    return BINARY


if __name__ == "__main__":
    print(ensure())

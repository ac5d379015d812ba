"""KEDA (github.com/kedacore/keda/v2) as its Go module ships it: the one pinned release the operator
renders ScaledObjects for, its CRDs, and its operator and metrics server built from it.

The module is fetched with ``go mod download`` from the Go module proxy into Go's module cache (read-only,
shared, fetched once), as the LeaderWorkerSet and Gateway API CRDs are. Its ScaledObject CRD is where
`dev/generate/kube_schemas.py` takes the schemas of the KEDA types an EPDDeployment passes through
(triggers, fallback), and what the integration tests install and check rendered ScaledObjects against.

KEDA's operator (``./cmd/operator``) and metrics server (``./cmd/adapter``) build once from the module,
against its own go.mod and go.sum (``dev/go_module.py``), into ``~/.cache/epd-operator/keda/<version>/``;
run the build at ``nice -n 10`` beside other work: it compiles client-go, controller-runtime and every
scaler's SDK (about 9 CPU-minutes).

    python -m dev.keda             # print where the module's source lies
    python -m dev.keda build       # build (or find) the operator and the metrics server; print their paths
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from dev import go_module
from dev.go_module import require_go
from epd_operator.api.kube_schemas import KEDA_VERSION

MODULE = "github.com/kedacore/keda/v2"
VERSION = KEDA_VERSION  # the release the operator renders ScaledObjects for
SCALED_OBJECTS_CRD = "config/crd/bases/keda.sh_scaledobjects.yaml"
# KEDA's operator and metrics server, named as KEDA's Makefile names them, with its version stamped in
_FLAGS = ("-trimpath", f"-ldflags=-s -w -X={MODULE}/version.Version={VERSION}")
BINARIES = {
    name: go_module.GoBinary("keda", MODULE, VERSION, package, name, flags=_FLAGS)
    for name, package in (("keda", "./cmd/operator"), ("keda-adapter", "./cmd/adapter"))
}


def cached_source() -> Path | None:
    """The release's source where Go's module cache keeps it, without running `go`; None when absent.
    (GOMODCACHE, else the first GOPATH entry's pkg/mod, else ~/go/pkg/mod; the module path has no
    upper-case letters, so it needs no escaping.)"""
    cache_dir = os.environ.get("GOMODCACHE")
    if not cache_dir:
        gopath = os.environ.get("GOPATH", "").split(os.pathsep)[0] or str(Path.home() / "go")
        cache_dir = str(Path(gopath) / "pkg" / "mod")
    path = Path(cache_dir) / f"{MODULE}@{VERSION}"
    return path if (path / SCALED_OBJECTS_CRD).is_file() else None


@cache
def source() -> Path:
    """The release's source in Go's module cache (downloaded when absent)."""
    cached = cached_source()
    if cached is not None:
        return cached
    go = require_go("KEDA's CRDs")
    out = subprocess.run(
        [go, "mod", "download", "-json", f"{MODULE}@{VERSION}"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
        cwd=tempfile.gettempdir(),  # outside any Go module of ours
        timeout=600,
    )
    return Path(json.loads(out.stdout)["Dir"])


def crd(path: str = SCALED_OBJECTS_CRD) -> dict[str, Any]:
    """One of KEDA's CRDs (by its path in the module), as the release ships it."""
    return dict(yaml.safe_load((source() / path).read_text(encoding="utf-8")))


def binaries() -> dict[str, Path]:
    """KEDA's operator and metrics server, each built when absent."""
    return {name: go_module.ensure(binary) for name, binary in BINARIES.items()}


if __name__ == "__main__":
    if sys.argv[1:] == ["build"]:
        for path in binaries().values():
            print(path)
    else:
        print(source())

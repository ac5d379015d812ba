"""The control-plane binaries and the Kubernetes versions the project is tested on (pinned here only:
tests/unit/dev/test_versions.py holds every other mention to these), built once into
``~/.cache/epd-operator/k8s/<version>/``, or taken from ``KUBEBUILDER_ASSETS`` (the envtest convention)
for what that folder holds.

The Kubernetes components come from ``dev/builds/k8s-binaries.sh`` (one ``go build`` of ``k8s.io/kubernetes``
through a wrapper module that re-pins its staging modules); etcd and kwok are components of
``dev/builds/go_module.py``, like every other Go program of the local cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dev import paths
from dev.builds import go_module
from dev.paths import REPO

BUILD_SCRIPT = REPO / "dev" / "builds" / "k8s-binaries.sh"
# The newest minor is what the tests run on; the oldest minor the CRD claims is checked by installing
# the CRD into its apiserver (tests/integration/test_crd_install.py).
NEWEST = "v1.37.2"
OLDEST = "v1.34.4"
ETCD_VERSION = "v3.6.5"
KWOK_VERSION = "v0.7.0"
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")
# What a real node adds (dev/node/real_node.py); built by the same `go build` as the control plane when both are missing.
NODE = ("kubelet", "kube-proxy")


def log(msg: str) -> None:
    """A progress line of the local control plane (builds take minutes), on stderr."""
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


def minor(version: str) -> str:
    """``v1.37.2`` -> ``1.37``."""
    return ".".join(version.lstrip("v").split(".")[:2])


def folder(version: str) -> Path:
    """Where the binaries of a Kubernetes version live."""
    return paths.CACHE / "k8s" / version


def built(version: str, names: tuple[str, ...]) -> bool:
    """Whether the cache holds these binaries of this version."""
    return all(os.access(folder(version) / b, os.X_OK) for b in names)


_ETCD_MAIN = """package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
"""


def etcd() -> go_module.GoBinary:
    """etcd's server: its go.mod points its sibling modules at local folders, so it builds in a wrapper."""
    return go_module.GoBinary(
        "etcd",
        "go.etcd.io/etcd/server/v3",
        ETCD_VERSION,
        ".",
        "etcd",
        files={"main.go": _ETCD_MAIN},
        wrapper=True,
        at=paths.CACHE / "k8s" / f"etcd-{ETCD_VERSION}",
    )


def kwok() -> go_module.GoBinary:
    """kwok, SIG Scheduling's fake kubelet (the fake GPU nodes)."""
    return go_module.GoBinary(
        "kwok", "sigs.k8s.io/kwok", KWOK_VERSION, "./cmd/kwok", "kwok", at=paths.CACHE / "k8s" / f"kwok-{KWOK_VERSION}"
    )


def binaries(version: str = NEWEST, *, apiserver_only: bool = False, node: bool = False) -> Path:
    """The folder holding the control-plane binaries (with ``node``: the kubelet and kube-proxy too),
    built once when absent.

    ``KUBEBUILDER_ASSETS`` (the envtest convention) wins when set and it holds the binaries asked for;
    envtest's asset folders hold etcd, kube-apiserver and kubectl only, so the rest come from our cache.
    """
    needed = ("etcd", "kube-apiserver") if apiserver_only else CONTROL_PLANE + (NODE if node else ())
    env_assets = os.environ.get("KUBEBUILDER_ASSETS")
    assets = Path(env_assets) if env_assets and version == NEWEST else None
    from_assets = {b for b in needed if assets is not None and (assets / b).exists()}
    if assets is not None and from_assets == set(needed):
        return assets
    out = folder(version)
    if not built(version, tuple(b for b in needed if b not in from_assets)):
        kube = [b for b in needed if b not in ("etcd", "kwok")]
        if not built(version, tuple(kube)):
            what = "apiserver-only" if apiserver_only else "node" if node else "all"
            log(f"building the Kubernetes {version} control plane from the official Go modules (once; cached in {out})")
            go_module.require_go(f"the Kubernetes {version} control plane")
            subprocess.run(["bash", str(BUILD_SCRIPT), version, what], check=True, stdout=subprocess.DEVNULL)
        for component in (etcd(), kwok()):
            if component.name in needed:
                _link(out / component.name, go_module.ensure(component))
    if not from_assets:
        return out
    # A mix: envtest's etcd/apiserver/kubectl, our controllers, scheduler and kwok.
    mixed = paths.CACHE / "k8s" / "assets-mix"
    mixed.mkdir(parents=True, exist_ok=True)
    for b in needed:
        link = mixed / b
        link.unlink(missing_ok=True)
        link.symlink_to((assets if assets is not None and b in from_assets else out) / b)
    return mixed


def _link(link: Path, target: Path) -> None:
    """``link`` -> ``target``, relative (the cache may move with ``EPD_CACHE``)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    relative = os.path.relpath(target, link.parent)
    if link.is_symlink() and os.readlink(link) == relative:
        return
    link.unlink(missing_ok=True)
    link.symlink_to(relative)

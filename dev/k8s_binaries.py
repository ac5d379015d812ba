"""The control-plane binaries: pinned versions, built once from the official Go modules by
``dev/k8s-binaries.sh`` into ``~/.cache/epd-operator/k8s/<version>/``, or taken from
``KUBEBUILDER_ASSETS`` (the envtest convention) for what that folder holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CACHE = Path(os.environ.get("EPD_CACHE", Path.home() / ".cache" / "epd-operator"))
REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "dev" / "k8s-binaries.sh"
# The newest minor is what the tests run on; the oldest minor the CRD claims is checked by installing
# the CRD into its apiserver (tests/integration/test_crd_install.py).
NEWEST = "v1.37.2"
OLDEST = "v1.34.4"
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")
# What a real node adds (dev/real_node.py); built by the same `go build` as the control plane when both are missing.
NODE = ("kubelet", "kube-proxy")


def log(msg: str) -> None:
    """A progress line of the local control plane (builds take minutes), on stderr."""
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


def built(version: str, names: tuple[str, ...]) -> bool:
    """Whether the cache holds these binaries of this version."""
    return all(os.access(CACHE / "k8s" / version / b, os.X_OK) for b in names)


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
    folder = CACHE / "k8s" / version
    if not built(version, tuple(b for b in needed if b not in from_assets)):
        what = "apiserver-only" if apiserver_only else "node" if node else "all"
        log(f"building the Kubernetes {version} control plane from the official Go modules (once; cached in {folder})")
        subprocess.run(["bash", str(BUILD_SCRIPT), version, what], check=True, stdout=subprocess.DEVNULL)
    if not from_assets:
        return folder
    # A mix: envtest's etcd/apiserver/kubectl, our controllers, scheduler and kwok.
    mixed = CACHE / "k8s" / "assets-mix"
    mixed.mkdir(parents=True, exist_ok=True)
    for b in needed:
        link = mixed / b
        link.unlink(missing_ok=True)
        link.symlink_to((assets if assets is not None and b in from_assets else folder) / b)
    return mixed

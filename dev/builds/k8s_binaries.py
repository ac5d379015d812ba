"""The control-plane binaries and the Kubernetes versions the project is tested on (pinned here only:
tests/unit/dev/test_versions.py holds every other mention to these), built once into
``~/.cache/epd-operator/k8s/<version>/``, or taken from ``KUBEBUILDER_ASSETS`` (the envtest convention)
for what that folder holds.

The Kubernetes components (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl; for a real node also
the kubelet and kube-proxy) come from one ``go build`` of ``k8s.io/kubernetes`` (:func:`build_kubernetes`), so that
the packages they share compile once and their links run in parallel. ``k8s.io/kubernetes`` is not consumable as a
module (its go.mod points the staging modules at ./staging with replace lines a dependent ignores), so a wrapper
module re-pins each staging module to its published ``v0.<minor>.<patch>`` tag (kubernetes issue 79384):
:func:`wrapper_go_mod`. etcd and kwok are :class:`~dev.builds.go_module.GoBinary` components. Every build goes
through ``dev/builds/go_module.py``, the one Go build path."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dev import paths
from dev.builds import go_module

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


# The wrapper module's one package: it names every component, so `go mod tidy` resolves them all.
_TOOLS_GO = """//go:build tools

package tools

import (
\t_ "k8s.io/kubernetes/cmd/kube-apiserver"
\t_ "k8s.io/kubernetes/cmd/kube-controller-manager"
\t_ "k8s.io/kubernetes/cmd/kube-scheduler"
\t_ "k8s.io/kubernetes/cmd/kubelet"
\t_ "k8s.io/kubernetes/cmd/kube-proxy"
\t_ "k8s.io/kubectl/pkg/cmd"
)
"""
_STAGING = re.compile(r"^\s*(k8s\.io/[a-z0-9-]+) => \./staging/src/", re.M)


def wrapper_go_mod(version: str, kubernetes_go_mod: str) -> str:
    """The wrapper module's go.mod: ``k8s.io/kubernetes@version`` required, and each staging module its go.mod
    points at ./staging re-pinned to the published tag of the same minor and patch (``v1.37.2`` -> ``v0.37.2``)."""
    staging = "v0." + version.removeprefix("v1.")
    replaces = [f"replace {module} => {module} {staging}\n" for module in _STAGING.findall(kubernetes_go_mod)]
    return f"module epd.local/k8s-wrapper\n\ngo 1.24\n\nrequire k8s.io/kubernetes {version}\n\n" + "".join(replaces)


def build_kubernetes(version: str, components: Sequence[str]) -> None:
    """Those of `components` (names of ``k8s.io/kubernetes/cmd/...``) missing from :func:`folder`, built by one
    ``go build`` in the wrapper module (kept in ``k8s/build/<version>``, so a later build resolves nothing anew),
    one build per cache at a time. Cold: tens of minutes on 2 cores."""
    out, work = folder(version), paths.CACHE / "k8s" / "build" / version

    def say(msg: str) -> None:
        print(f"[k8s {version}] {msg}", file=sys.stderr, flush=True)

    go = go_module.require_go(f"the Kubernetes {version} control plane")
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": os.environ.get("GOFLAGS") or "-buildvcs=false"}
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    with go_module.build_lock(paths.CACHE / "k8s" / ".build.lock", say):
        missing = [c for c in components if not os.access(out / c, os.X_OK)]
        if not missing:
            return
        say(f"building {' '.join(missing)} from k8s.io/kubernetes@{version} (cold: tens of minutes on 2 cores)")
        go_mod = Path(go_module.download(go, f"k8s.io/kubernetes@{version}", env, work)["GoMod"]).read_text()
        (work / "go.mod").write_text(wrapper_go_mod(version, go_mod))
        (work / "tools.go").write_text(_TOOLS_GO)
        say("resolving modules")
        tidy = subprocess.run(
            [go, "mod", "tidy", "-e"],
            cwd=work,
            env={**env, "GOFLAGS": f"{env['GOFLAGS']} -mod=mod"},
            capture_output=True,
            text=True,
        )
        (work / "tidy.log").write_text(tidy.stderr)
        if tidy.returncode != 0:
            print(tidy.stderr, file=sys.stderr)
            raise subprocess.CalledProcessError(tidy.returncode, tidy.args, tidy.stdout, tidy.stderr)
        partial = out / ".building"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        stamp = f"-s -w -X k8s.io/component-base/version.gitVersion={version} -X k8s.io/client-go/pkg/version.gitVersion={version}"
        say(f"go build {' '.join(missing)}")
        started = time.monotonic()
        packages = [f"k8s.io/kubernetes/cmd/{c}" for c in missing]
        go_module.go_build(go, work, packages, partial, ("-trimpath", f"-ldflags={stamp}"), env, nice=0, say=say)
        for c in missing:
            (partial / c).replace(out / c)
        partial.rmdir()
        say(f"{' '.join(missing)} built in {time.monotonic() - started:.0f} s")


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
            log(f"building the Kubernetes {version} control plane from the official Go modules (once; cached in {out})")
            build_kubernetes(version, kube)
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

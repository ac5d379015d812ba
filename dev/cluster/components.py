"""The processes a local cluster runs, and what a cluster part may use of the cluster it runs on.

- :class:`Component`: one process of the cluster (etcd, kube-apiserver, a part's controller...), its output
  in a log of its own, SIGKILLed when the supervising process dies (``dev/lifetimes.py``);
- :class:`ClusterComponents`: a cluster whose components are processes of this one, as the parts
  (``dev/parts/part.py``) see it: its API as the admin (``dev/cluster/api.py``), its folder, CA and admin
  kubeconfig, its real nodes, and :meth:`~ClusterComponents.start_component`, which ties a process to the
  cluster's lifetime. :class:`dev.cluster.local.LocalCluster` is the one there is.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dev.cluster.api import ClusterApi, ClusterError
from dev.lifetimes import die_with_parent

if TYPE_CHECKING:
    from dev.node.real_node import RealNode


@dataclasses.dataclass
class Component:
    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        out = self.log.open("ab")
        self.process = subprocess.Popen(
            self.argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
            env=env,
        )
        out.close()

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise ClusterError(f"{self.name} exited with status {self.process.returncode}; its log ends:\n{tail}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def components_network(real_nodes: Sequence[RealNode]) -> list[str]:
    """The prefix that runs a cluster-side component (one the API server calls as an aggregated API, or
    one that reads what pods serve) where it must listen: inside the real node's network namespace when
    the cluster has one, since the API server dials aggregated APIs there (its egress goes through the
    node bridge) and pod and Service IPs answer only there; else nothing (the host's loopback)."""
    return real_nodes[0].netns_argv() if real_nodes else []


class ClusterComponents(ClusterApi):
    """A cluster whose components are processes of this one: its folder (``dir``: every component's log
    lies there), its CA and keys (``pki``), the admin kubeconfig, its real nodes, and the components started
    so far, stopped in reverse order with the cluster."""

    def __init__(self, server: str, workdir: Path, admin_token: str):
        self.dir = workdir
        self.pki = workdir / "pki"
        super().__init__(server, self.pki / "ca.crt", admin_token)
        self.kubeconfig_path = workdir / "kubeconfig"
        self.components: list[Component] = []
        self.real_nodes: list[RealNode] = []

    def start_component(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Component:
        """Start `argv` as the cluster's component `name` (its log: ``<dir>/<name>.log``); it stops with the
        cluster, or earlier by :meth:`stop_component`."""
        component = Component(name, argv, self.dir / f"{name}.log")
        component.start(env)
        self.components.append(component)
        return component

    def stop_component(self, component: Component) -> None:
        component.stop()
        self.components.remove(component)

    def components_network(self) -> list[str]:
        """:func:`components_network` of this cluster's real nodes."""
        return components_network(self.real_nodes)

    def real_node(self, name: str | None = None) -> RealNode:
        """The real node (by name when there could be several)."""
        for node in self.real_nodes:
            if name is None or node.name == name:
                return node
        raise ClusterError(f"no real node {name or ''} in this cluster")

"""The one shape of a cluster part: what runs beside the local control plane and its real node (the cluster's
DNS, its NetworkPolicy engine, the LeaderWorkerSet controller, KEDA, a Gateway API gateway...).

A part is a :class:`Part` subclass in a module of its own under ``dev/parts/``, listed once in
``dev/parts/registry.py``; ``make cluster PARTS=...``, ``python -m dev.cluster.cli up --part NAME``,
``python -m dev.parts build NAME`` and the tests' ``LocalCluster(parts=...)`` / ``cluster.start_part(NAME)``
all find it there. Its life, in the order :meth:`dev.cluster.local.LocalCluster.start_part` calls it:

- :meth:`Part.build`: its binaries into the cache (``dev/builds/``), once; :meth:`Part.built` says whether
  they are there without building. A part built from a Go module is a :class:`GoPart`: its ``BINARIES``
  (:class:`dev.builds.go_module.GoBinary`) are its whole build;
- :meth:`Part.unavailable`: why it cannot run on this cluster (no real node, not built where building is not
  wanted), or None;
- :meth:`Part.configure`: what must be in place before its processes start: CRDs, namespaces, certificates
  signed by the cluster's CA, configuration files, images loaded into the node;
- :meth:`Part.start`: its processes, as the cluster's components (:meth:`ClusterComponents.start_component`:
  they die with the cluster) or the node's (:meth:`RealNode.start_in_node`), in the order they need each
  other, or its objects when it runs as pods;
- :meth:`Part.ready`: until it serves what the cluster's users call (its APIService Available, its webhooks
  judging a dry run, a name resolving, its readiness probe answering);
- :meth:`Part.stop`: before the cluster stops (or earlier): its components, in reverse order;
  :meth:`Part.running` says, meanwhile, what it serves and where (``make cluster``'s message).

When a part runs is its :attr:`Part.starts`: :data:`WITH_REAL_NODE`, configured before each real node's kubelet
starts and started once the node is Ready (the cluster's DNS, the NetworkPolicy engine); :data:`WHEN_ASKED`, once
per cluster, at its start or later on a cluster already running (a test that needs one, on a shared cluster);
:data:`BY_TESTS`, never by the cluster itself: the tests that use it run it from its build (prometheus-adapter,
which reads a Prometheus that only a test with load has).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from dev.builds import go_module
from dev.cluster.components import ClusterComponents, Component

WITH_REAL_NODE, WHEN_ASKED, BY_TESTS = "with every real node", "when asked for", "by the tests that use it"


class Part:
    """One part of the local cluster; an instance lives as long as the part runs on one cluster. Subclasses set
    :attr:`name` and :attr:`summary` and override what they need; the defaults do nothing."""

    name: ClassVar[str]  # the registry's key, `make cluster PARTS=`'s and `--part`'s word
    summary: ClassVar[str]  # one line: what it serves (the command lines' help)
    starts: ClassVar[str] = WHEN_ASKED  # WITH_REAL_NODE, WHEN_ASKED or BY_TESTS (above)
    needs_real_node: ClassVar[bool] = False  # it runs where pods do: in the real node's network namespace
    # The images (dev/builds/images.py's names) its pods run, loaded into the real node before it is configured
    # (for a part WITH_REAL_NODE: before the node's kubelet starts).
    images: ClassVar[tuple[str, ...]] = ()
    timeout: ClassVar[float] = 60.0  # seconds `ready` waits by default

    def __init__(self) -> None:
        self.components: list[Component] = []

    # -------------------------------------------------------------- build

    def built(self) -> bool:
        """Whether what :meth:`build` makes is in the cache (nothing is built)."""
        return True

    def build(self) -> list[Path]:
        """Its binaries, built (or fetched) into the cache when absent; their paths."""
        return []

    # -------------------------------------------------------------- on a cluster

    def unavailable(self, cluster: ClusterComponents) -> str | None:
        """Why it cannot run on `cluster`, with what to do; None when it can."""
        if self.needs_real_node and not cluster.real_nodes:
            return f"{self.name} runs where pods do: it needs a real node (--real-node)"
        return None

    def configure(self, cluster: ClusterComponents) -> None:
        """What must be in place before its processes start."""

    def start(self, cluster: ClusterComponents) -> None:
        """Its processes (through :meth:`start_component`) or objects."""

    def ready(self, cluster: ClusterComponents, timeout: float) -> None:
        """Until it serves."""

    def running(self, cluster: ClusterComponents) -> str:
        """One line for the person who started the cluster: what it serves now, and where."""
        return self.summary

    def stop(self, cluster: ClusterComponents) -> None:
        """Its components, last started first (a node's processes stop with the node)."""
        for component in reversed(self.components):
            cluster.stop_component(component)
        self.components.clear()

    def start_component(
        self, cluster: ClusterComponents, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> Component:
        """One of its processes as a component of `cluster` (:meth:`stop` stops it)."""
        component = cluster.start_component(name, argv, env)
        self.components.append(component)
        return component


class GoPart(Part):
    """A part whose build is its Go binaries (``BINARIES``), each from a pinned module release through the one
    Go build path (``dev/builds/go_module.py``)."""

    BINARIES: ClassVar[tuple[go_module.GoBinary, ...]]

    def built(self) -> bool:
        return all(binary.built() for binary in self.BINARIES)

    def build(self) -> list[Path]:
        return [go_module.ensure(binary) for binary in self.BINARIES]

"""A real worker node for the local cluster: containerd + runc + CNI + kubelet + kube-proxy, on this
machine, without changing it.

Everything the node does happens in namespaces and cgroups it creates for itself:

- a **network namespace** holding the pod bridge (``cni0``, the node's address), the pods' veths and
  kube-proxy's iptables rules; nothing is added to the machine's own namespace. Tests reach pods
  only from inside it (:meth:`RealNode.netns_argv`, i.e. ``nsenter --net=...``). The API server and
  the node talk through ``dev/node/bridge.py``;
- a **mount namespace** (a slave of the machine's) with private ``/run``, ``/var/lib`` and ``/var/log``
  (containerd 1.6, the CNI plugins and the kubelet's container-log links write there whatever their
  config says) and, bound read-only over the
  ``/proc/sys`` entries the kubelet checks, files that already hold the values it wants: with
  ``protectKernelDefaults`` it only reads them, so no kernel setting of the machine changes;
- one **cgroup**, nested under this process's own (the kubelet's ``cgroupRoot``, cgroupfs driver; on
  cgroup v1 the same path in every hierarchy, on cgroup v2 a child with every controller delegated:
  ``dev/node/cgroups.py``); containerd, its shims and every container live in it.

The node's processes die with the supervising process, and the node's watcher (``dev/lifetimes.py``),
which outlives it, kills what is left in the node's cgroup (shims, containers), removes the cgroups and
the node's folder; the namespaces vanish with their last process. Nothing remains after a stop or a
crash but the image store, a cache like the image archives. What stops a node from starting here (root,
the runtime packages, a cgroup layout it cannot nest in) is said before anything starts (:func:`unavailable`).

Its seams: containerd's and the pod network's configuration, and image imports, are
``dev/node/containerd.py``'s; the kubelet's and kube-proxy's configuration ``dev/node/kube_config.py``'s;
this module starts, watches and stops the node.

**Image store**: containerd's root (images, their unpacked snapshots, its metadata) lives in a slot of
``~/.cache/epd-operator/node/containerd/`` (``dev/node/store.py``), so an image imported once is there
for the next cluster, and :meth:`RealNode.load_image` skips an archive whose image the node already
holds under its name. The node holds the slot's ``flock`` for its lifetime (its watcher too, until it
is done), so two clusters never share a root; with every slot taken, the root lives in the node's
folder for this cluster only. containerd's state (sockets, task bundles) stays private to the
cluster. A slot an earlier cluster used, even one that crashed, may still hold its containers: before
the kubelet starts, containerd runs once without its CRI plugin, every container in ``k8s.io`` is
deleted with its snapshot, leases of unfinished imports go, and the CRI plugin's and the runtime's
per-container folders are removed, so the CRI plugin and the kubelet start with no pod of the past.
``make node-store-clean`` empties the store (refused while a slot is in use).

"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from dev import lifetimes
from dev.builds.k8s_binaries import log
from dev.cluster.api import ClusterError
from dev.node import cgroups, containerd, kube_config
from dev.node import store as image_store
from dev.node.containerd import CNI_BIN, CNI_PLUGINS, PER_CONTAINER_DIRS, ctr, import_archive
from dev.node.kube_config import KUBELET_SYSCTLS, REAL_NODE_LABEL, SERVICE_CIDR
from dev.paths import CACHE, REPO

# The runtime and CNI binaries: Debian's packages (runc, containerd, containernetworking-plugins).
RUNTIME_BINARIES = (
    "containerd",
    "containerd-shim-runc-v2",
    "runc",
    "ctr",
    "nsenter",
    "unshare",
    "ip",
    "iptables",
    "ipset",  # the NetworkPolicy engine's sets (dev/parts/kube_router.py)
)
APT_PACKAGES = "runc containerd containernetworking-plugins ipset"
# The node's directory for local volumes (examples/epd-local-cpu.yaml's hostPath volumes): `models`
# is the machine's model cache (read-only; `make images` builds the tiny model into it), `ec-cache`
# the encoder cache the tiers share. Both live in the node's private /var/lib and vanish with it.
LOCAL_VOLUMES = Path("/var/lib/epd-local")
MODEL_CACHE = CACHE / "models"


@dataclasses.dataclass(frozen=True)
class RealNodeSpec:
    """What a real node is called and which pod addresses it hands out (its bridge takes the first)."""

    name: str = "cpu-node-1"
    pod_subnet: str = "10.245.0.0/24"
    labels: tuple[tuple[str, str], ...] = ()
    # KubeletConfiguration fields set over this module's (e.g. maxPods).
    kubelet_config: tuple[tuple[str, Any], ...] = ()
    # The image store whose slots keep containerd's root between clusters (dev/node/store.py); None:
    # a root in the node's folder, gone with it.
    store: Path | None = image_store.STORE

    @property
    def node_ip(self) -> str:
        base, _, _ = self.pod_subnet.partition("/")
        a, b, c, _ = base.split(".")
        return f"{a}.{b}.{c}.1"


def missing_runtime() -> list[str]:
    """The runtime pieces this machine lacks (empty when a real node can start)."""
    missing = [b for b in RUNTIME_BINARIES if shutil.which(b) is None]
    missing += [f"{CNI_BIN}/{p}" for p in CNI_PLUGINS if not (CNI_BIN / p).exists()]
    return missing


def cgroup_refusal() -> str | None:
    """Why this machine's cgroup layout cannot host a real node, with what to do; None when it can
    (``dev/node/cgroups.py``). Checked before anything starts, so a node never fails midway for it."""
    found = cgroups.mounts()
    if not found:
        return "no cgroup hierarchy is mounted (/sys/fs/cgroup): a real node needs cgroups"
    own = cgroups.own_cgroups(found)
    if cgroups.unified_only(found):
        return cgroups.v2_refusal(found[0], own[str(found[0].path)])
    try:
        cgroups.node_cgroup_path(own, "probe")
    except ValueError as exc:
        return f"{exc}; run it from a shell whose cgroups are the same path in every hierarchy"
    return None


def unavailable() -> str | None:
    """Why a real node cannot start on this machine (root, the runtime packages, the cgroup layout), or None."""
    if os.geteuid() != 0:
        return "a real node needs root (namespaces, cgroups, mounts)"
    if missing := missing_runtime():
        return f"a real node needs {', '.join(missing)}: apt-get install -y {APT_PACKAGES} (Debian/Ubuntu)"
    return cgroup_refusal()


class RealNode:
    """One real node of a :class:`dev.cluster.local.LocalCluster`; started and stopped by it."""

    def __init__(
        self,
        spec: RealNodeSpec,
        *,
        workdir: Path,
        api_port: int,
        ca_path: Path,
        admin_token: str,
        bin_dir: Path,
        start_component: Callable[[str, list[str]], Any],
    ):
        self.spec = spec
        self.dir = workdir
        self.api_port = api_port
        self.ca_path = ca_path
        self.admin_token = admin_token
        self.bin = bin_dir
        self._start_component = start_component
        self.cgroup = ""
        self._created_parents: list[str] = []
        # cgroup v2: this process's cgroup, prepared to hand its controllers to the node's, and what was enabled.
        self._v2_here: Path | None = None
        self._v2_enabled: list[str] = []
        self._reaper: subprocess.Popen[bytes] | None = None
        self._holder: Any = None
        self.components: list[Any] = []
        # containerd's root: a slot of the image store when one is free, else in the node's folder.
        self.slot: image_store.Slot | None = None
        self.containerd_root = workdir / "containerd" / "root"
        # The containers an earlier cluster left in the slot, removed before containerd's CRI started.
        self.cleared: list[str] = []
        self._egress_socket = Path(tempfile.gettempdir()) / f"epd-egress-{secrets.token_hex(4)}.sock"

    # -------------------------------------------------------------- paths

    @property
    def name(self) -> str:
        return self.spec.name

    # Unix socket paths are limited to about 100 bytes, and the node's folder may be deep (a test's
    # tmp_path): containerd's sockets live in the node's private /run, the egress socket in /tmp.
    containerd_socket = containerd.SOCKET

    @property
    def egress_socket(self) -> Path:
        return self._egress_socket

    @property
    def netns(self) -> str:
        """The node's network namespace, as a path ``nsenter --net=`` takes."""
        return f"/proc/{self._holder.process.pid}/ns/net"

    def netns_argv(self, *argv: str) -> list[str]:
        """A command line that runs ``argv`` inside the node's network namespace (how this machine's
        tests reach pods and Service IPs)."""
        return ["nsenter", f"--net={self.netns}", "--", *argv]

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        if (why := unavailable()) is not None:
            raise ClusterError(why)
        started = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._take_slot()
        self._make_cgroups()
        self._start_reaper()
        self._start_holder()
        self.components.append(self._start_component("node-bridge-" + self.name, self._bridge_argv()))
        self._wait(lambda: self.egress_socket.exists(), 30, "the node bridge did not start")
        self._start_containerd()
        log(f"real node {self.name}: containerd ready in {time.monotonic() - started:.1f} s")

    def start_kubelet(self) -> None:
        """The kubelet and kube-proxy, once the sandbox image is loaded and the API server answers."""
        self.components.append(self._start_component("kubelet-" + self.name, self._in_node(self._kubelet_argv())))
        self.components.append(self._start_component("kube-proxy-" + self.name, self._in_node(self._kube_proxy_argv())))

    def start_in_node(self, name: str, argv: list[str]) -> None:
        """Start a node-level process (a DaemonSet's, run as a process) in the node's cgroup and
        namespaces; it stops with the node."""
        self.components.append(self._start_component(name, self._in_node(argv)))

    def restart_kubelet(self) -> None:
        """Stop the kubelet (SIGTERM, as a service manager would) and start it again with the same
        flags; the node's containers keep running meanwhile and the new kubelet adopts them."""
        [kubelet] = [c for c in self.components if c.name == "kubelet-" + self.name]
        kubelet.stop()
        kubelet.start()

    def kubelet_log_errors(self, lines: int = 15) -> str:
        """The kubelet's own last error lines (klog's `E` lines), or its log's tail when it has none."""
        path = self.dir.parent / f"kubelet-{self.name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        errors = [line for line in text.splitlines() if line.startswith(("E", "F"))]
        return "\n".join(errors[-lines:] if errors else text.splitlines()[-lines:])

    def stop(self) -> None:
        """The kubelet and kube-proxy first (nothing restarts a container then), then the reaper kills
        the rest of the node at once (containerd, shims, containers, the namespaces' holder)."""
        for component in reversed(self.components):
            if component.name.startswith(("kubelet-", "kube-proxy-")):
                component.stop(timeout=5)
        if self._reaper is not None:
            assert self._reaper.stdin is not None
            self._reaper.stdin.close()
            try:
                self._reaper.wait(90)
            except subprocess.TimeoutExpired:
                log(f"real node {self.name}: its clean-up is still running (pid {self._reaper.pid})")
            self._reaper = None
        for component in reversed(self.components):
            component.stop()
        self.components.clear()
        if self.slot is not None:
            self.slot.release()  # the reaper's copy keeps it until the node's last process is gone
            self.slot = None

    def check_alive(self) -> None:
        for component in self.components:
            component.check_alive()

    # -------------------------------------------------------------- cgroups

    def _make_cgroups(self) -> None:
        found = cgroups.mounts()
        own = cgroups.own_cgroups(found)
        self.cgroup = cgroups.node_cgroup_path(own, f"epd-node-{self.name}-{secrets.token_hex(3)}")
        if cgroups.unified_only(found):
            self._make_v2_cgroup(found[0].path, own[str(found[0].path)])
            return
        parents: set[str] = set()
        for mount in own:
            path = Path(mount)
            for part in Path(self.cgroup).parts[1:]:
                parent, path = path, path / part
                if path.exists():
                    continue
                path.mkdir()
                rel = "/" + str(path.relative_to(mount))
                if rel != self.cgroup:
                    parents.add(rel)
                # A new v1 cpuset cgroup starts with no CPUs and no memory nodes: nothing could join it.
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if (parent / f).exists():
                        (path / f).write_text((parent / f).read_text())
        self._created_parents = sorted(parents)
        self._procs_files = [str(Path(m) / self.cgroup.lstrip("/") / "cgroup.procs") for m in own]

    def _make_v2_cgroup(self, mount: Path, own: str) -> None:
        """cgroup v2 only: the node's cgroup a child of this process's, every controller enabled for it
        and below it (``dev/node/cgroups.py``; the node's watcher undoes the preparation)."""
        here = mount / own.lstrip("/")
        self._v2_here = here
        self._v2_enabled = cgroups.v2_prepare(here, is_root=own == "/")
        node = mount / self.cgroup.lstrip("/")
        node.mkdir()
        cgroups.v2_enable_all(node)
        self._procs_files = [str(node / "cgroup.procs")]

    def _take_slot(self) -> None:
        store = self.spec.store
        if store is None:
            return
        self.slot = image_store.take(store, owner=f"pid {os.getpid()}, node {self.name} in {self.dir}")
        if self.slot is None:
            log(
                f"real node {self.name}: every slot of the image store {store} is in use (other clusters); "
                f"its images live in {self.containerd_root} for this cluster only"
            )
            return
        self.containerd_root = self.slot.root
        log(
            f"real node {self.name}: containerd's root is {self.containerd_root} (slot {self.slot.index} of the image store)"
        )

    def _start_reaper(self) -> None:
        argv = lifetimes.watcher_argv("node", "--cgroup", self.cgroup)
        argv += ["--remove", str(self.dir), "--remove", str(self.egress_socket)]
        for parent in self._created_parents:
            argv += ["--parent", parent]
        if self._v2_here is not None:
            argv += ["--v2-here", str(self._v2_here), *(f"--v2-enabled={c}" for c in self._v2_enabled)]
        # The reaper holds the slot's lock too (it never reads it): the slot is free only once it is done.
        slot_fd = () if self.slot is None else (self.slot.fd,)
        with (self.dir.parent / f"{self.name}-reaper.log").open("ab") as out:
            self._reaper = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=REPO,
                pass_fds=slot_fd,
            )

    def enter_argv(self) -> list[str]:
        """The prefix that runs a command in the node's network and mount namespaces."""
        pid = self._holder.process.pid
        return ["nsenter", f"--net=/proc/{pid}/ns/net", f"--mount=/proc/{pid}/ns/mnt", "--"]

    def _in_node(self, argv: Sequence[str], *, namespaces: bool = True) -> list[str]:
        """``argv`` run in the node's cgroup (and its namespaces)."""
        place = 'for f; do [ "$f" = -- ] && break; echo $$ > "$f"; shift; done; shift; exec "$@"'
        if not namespaces:
            return ["sh", "-c", place, "sh", *self._procs_files, "--", *argv]
        return ["sh", "-c", place, "sh", *self._procs_files, "--", *self.enter_argv(), *argv]

    # -------------------------------------------------------------- namespaces

    def _start_holder(self) -> None:
        MODEL_CACHE.mkdir(parents=True, exist_ok=True)
        masks = self.dir / "sysctl"
        masks.mkdir(exist_ok=True)
        lines = [
            "set -e",
            # Private /run, /var/lib and /var/log: containerd 1.6 keeps shim sockets under /run/containerd,
            # the CNI plugins their cache under /var/lib/cni whatever the config says, and the kubelet links
            # every container's log into /var/log/containers.
            "mount -n -t tmpfs -o mode=755 epd-node-run /run",
            "mount -n -t tmpfs -o mode=755 epd-node-varlib /var/lib",
            "mount -n -t tmpfs -o mode=755 epd-node-varlog /var/log",
            f"mkdir -p {LOCAL_VOLUMES}/models {LOCAL_VOLUMES}/ec-cache",
            f"mount -n --bind {MODEL_CACHE} {LOCAL_VOLUMES}/models",
            f"mount -n -o remount,bind,ro {LOCAL_VOLUMES}/models",
        ]
        for key, value in KUBELET_SYSCTLS.items():
            mask = masks / key.replace("/", ".")
            mask.write_text(value + "\n")
            lines += [
                f"mount -n --bind {mask} /proc/sys/{key}",
                f"mount -n -o remount,bind,ro /proc/sys/{key}",
            ]
        lines += [
            "ip link set lo up",
            "ip link add cni0 type bridge",
            f"ip addr add {self.spec.node_ip}/{self.spec.pod_subnet.partition('/')[2]} dev cni0",
            "ip link set cni0 up",
            # Service IPs are only DNATed by kube-proxy's rules: the node itself needs a route to them.
            f"ip route add {SERVICE_CIDR} dev cni0 src {self.spec.node_ip}",
            f"touch {self.dir / 'holder.ready'}",
            "exec sleep infinity",
        ]
        script = "\n".join(lines)
        self._holder = self._start_component(
            "node-ns-" + self.name,
            self._in_node(
                ["unshare", "--net", "--mount", "--propagation", "slave", "sh", "-c", script], namespaces=False
            ),
        )
        self.components.append(self._holder)
        self._wait(lambda: (self.dir / "holder.ready").exists(), 30, "the node's namespaces were not set up")

    def _bridge_argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "dev.node.bridge",
            "--netns",
            self.netns,
            "--api-port",
            str(self.api_port),
            "--connect-socket",
            str(self.egress_socket),
        ]

    # -------------------------------------------------------------- containerd

    def _containerd_config(self, *, cri: bool = True) -> Path:
        """containerd's config (``dev/node/containerd.py``) and the pod network's, written into the node's folder."""
        folder = self.dir / "containerd"
        cni_conf = self.dir / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        conflist = containerd.cni_conflist(
            pod_subnet=self.spec.pod_subnet, node_ip=self.spec.node_ip, ipam_dir=self.dir / "cni" / "ipam"
        )
        (cni_conf / "10-epd-node.conflist").write_text(json.dumps(conflist, indent=2))
        config = containerd.containerd_config(
            root=self.containerd_root, state=folder / "state", cni_conf=cni_conf, cri=cri
        )
        path = folder / ("config.toml" if cri else "config-without-cri.toml")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config)
        return path

    def _start_containerd(self) -> None:
        if self.slot is not None and (self.containerd_root / "io.containerd.metadata.v1.bolt").exists():
            self._clear_earlier_cluster()
        config = self._containerd_config()
        self.components.append(
            self._start_component("containerd-" + self.name, self._in_node(["containerd", "--config", str(config)]))
        )
        self._wait(lambda: self.ctr("version", check=False).returncode == 0, 60, "containerd did not start")

    def _clear_earlier_cluster(self) -> None:
        """Remove what an earlier cluster (stopped or crashed) left in this slot besides images: its
        containers with their writable snapshots, leases of unfinished imports, and the per-container
        folders; images and their unpacked snapshots stay. containerd runs for it once without the CRI
        plugin, which would otherwise load those containers and hand them to the kubelet as the node's."""
        started = time.monotonic()
        config = self._containerd_config(cri=False)
        cleaner = self._start_component(
            "containerd-clear-" + self.name, self._in_node(["containerd", "--config", str(config)])
        )
        self.components.append(cleaner)
        try:
            self._wait(lambda: self.ctr("version", check=False).returncode == 0, 60, "containerd did not start")
            containers = self.ctr("containers", "list", "--quiet").stdout.split()
            if containers:
                self.ctr("containers", "delete", *containers)  # each with its snapshot
            leases = self.ctr("leases", "list", "--quiet").stdout.split()
            # A lease deleted with --sync makes containerd collect at once, before it stops, what
            # the deletions left unreferenced (the containers' snapshots, content of unfinished imports).
            gc = self.ctr("leases", "create", "--expires", "1m").stdout.strip()
            self.ctr("leases", "delete", "--sync", *leases, gc)
        except ClusterError as exc:
            raise ClusterError(
                f"real node {self.name}: could not clear the image store's slot {self.containerd_root}: {exc}; "
                "with no cluster running, `make node-store-clean` empties the store"
            ) from exc
        finally:
            cleaner.stop(timeout=30)
            self.components.remove(cleaner)
        for folder in PER_CONTAINER_DIRS:
            for path in (self.containerd_root / folder).glob("*"):
                shutil.rmtree(path)
        self.cleared = containers
        log(
            f"real node {self.name}: removed {len(containers)} containers and {len(leases)} leases an earlier "
            f"cluster left in {self.containerd_root}, in {time.monotonic() - started:.1f} s"
        )

    def ctr(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """``ctr`` against the node's containerd (see :func:`ctr`)."""
        return ctr(self.enter_argv(), self.containerd_socket, *args, check=check, timeout=timeout)

    def load_image(self, archive: Path) -> bool:
        """Import an OCI archive into the node's containerd under the name it carries, unless that
        name already points at the archive's image (see :func:`import_archive`)."""
        return import_archive(self.enter_argv(), self.containerd_socket, archive)

    def images(self) -> list[str]:
        return self.ctr("images", "list", "--quiet").stdout.split()

    # -------------------------------------------------------------- kubelet and kube-proxy

    def _kubelet_argv(self) -> list[str]:
        root = self.dir / "kubelet"
        root.mkdir(parents=True, exist_ok=True)
        # Pods with dnsPolicy Default (CoreDNS itself) get this: no upstream is reachable from the node.
        (self.dir / "resolv.conf").write_text("options ndots:1\n")
        config = kube_config.kubelet_config(
            cgroup_root=self.cgroup,
            runtime_socket=self.containerd_socket,
            pod_logs=self.dir / "pod-logs",
            resolv_conf=self.dir / "resolv.conf",
            overrides=dict(self.spec.kubelet_config),
        )
        path = self.dir / "kubelet-config.yaml"
        path.write_text(yaml.safe_dump(config))
        labels = ",".join(f"{k}={v}" for k, v in ((REAL_NODE_LABEL, "true"), *self.spec.labels))
        return [
            str(self.bin / "kubelet"),
            "--config",
            str(path),
            "--kubeconfig",
            str(self.kubeconfig()),
            "--hostname-override",
            self.name,
            "--node-ip",
            self.spec.node_ip,
            "--root-dir",
            str(root),
            "--cert-dir",
            str(root / "pki"),
            "--node-labels",
            labels,
            "-v",
            "1",
        ]

    def _kube_proxy_argv(self) -> list[str]:
        config = kube_config.kube_proxy_config(
            kubeconfig=self.kubeconfig(), node_name=self.name, pod_subnet=self.spec.pod_subnet
        )
        path = self.dir / "kube-proxy-config.yaml"
        path.write_text(yaml.safe_dump(config))
        return [str(self.bin / "kube-proxy"), "--config", str(path), "-v", "1"]

    def api_endpoint_slice(self) -> dict[str, Any]:
        """The `kubernetes` Service's endpoints as pods on this node reach them (``dev/node/kube_config.py``)."""
        return kube_config.api_endpoint_slice(node_ip=self.spec.node_ip, api_port=self.api_port)

    def egress_config(self) -> dict[str, Any]:
        """The API server's egress selector: kubelets (logs, exec, port-forward) through the bridge."""
        return kube_config.egress_config(self.egress_socket)

    # -------------------------------------------------------------- helpers

    def _wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            self.check_alive()
            if time.monotonic() > deadline:
                raise ClusterError(f"real node {self.name}: {what} in {timeout:.0f} s")
            time.sleep(0.2)

    def kubeconfig(self) -> Path:
        """What the kubelet and kube-proxy log in with: the API server as the node namespace reaches it."""
        path = self.dir / "kubeconfig"
        config = kube_config.node_kubeconfig(api_port=self.api_port, ca_path=self.ca_path, token=self.admin_token)
        path.write_text(yaml.safe_dump(config))
        return path

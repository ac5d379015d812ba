"""A real worker node for the local cluster: containerd + runc + CNI + kubelet + kube-proxy, on this
machine, without changing it.

Everything the node does happens in namespaces and cgroups it creates for itself:

- a **network namespace** holding the pod bridge (``cni0``, the node's address), the pods' veths and
  kube-proxy's iptables rules; nothing is added to the machine's own namespace. Tests reach pods
  only from inside it (:meth:`RealNode.netns_argv`, i.e. ``nsenter --net=...``). The API server and
  the node talk through ``dev/node_bridge.py``;
- a **mount namespace** (a slave of the machine's) with private ``/run``, ``/var/lib`` and ``/var/log``
  (containerd 1.6, the CNI plugins and the kubelet's container-log links write there whatever their
  config says) and, bound read-only over the
  ``/proc/sys`` entries the kubelet checks, files that already hold the values it wants: with
  ``protectKernelDefaults`` it only reads them, so no kernel setting of the machine changes;
- one **cgroup**, the same path in every hierarchy, nested under this process's own cgroups (the
  kubelet's ``cgroupRoot``, cgroupfs driver); containerd, its shims and every container live in it.

The node's processes die with the supervising process (``PR_SET_PDEATHSIG``), and ``dev/node_reaper.py``,
which outlives it, kills what is left in the node's cgroup (shims, containers), removes the cgroups and
the node's folder; the namespaces vanish with their last process. Nothing remains after a stop or a
crash but the image store, a cache like the image archives.

**Image store**: containerd's root (images, their unpacked snapshots, its metadata) lives in a slot of
``~/.cache/epd-operator/node/containerd/`` (``dev/node_store.py``), so an image imported once is there
for the next cluster, and :meth:`RealNode.load_image` skips an archive whose image the node already
holds under its name. The node holds the slot's ``flock`` for its lifetime (the reaper too, until it
is done), so two clusters never share a root; with every slot taken, the root lives in the node's
folder for this cluster only. containerd's state (sockets, task bundles) stays private to the
cluster. A slot an earlier cluster used, even one that crashed, may still hold its containers: before
the kubelet starts, containerd runs once without its CRI plugin, every container in ``k8s.io`` is
deleted with its snapshot, leases of unfinished imports go, and the CRI plugin's and the runtime's
per-container folders are removed, so the CRI plugin and the kubelet start with no pod of the past.
``make node-store-clean`` empties the store (refused while a slot is in use).

Facts this relies on (cgroup v1 here): runc (crun refuses the hybrid cgroup layout); containerd's
``restrict_oom_score_adj`` (CAP_SYS_RESOURCE is missing, so a negative oom_score_adj is refused);
the kubelet's ``failCgroupV1: false`` (from 1.35 it refuses cgroup v1 otherwise).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from . import node_store
from .cluster_api import ClusterError
from .k8s_binaries import CACHE, log

CGROUP_FS = Path("/sys/fs/cgroup")
REAL_NODE_LABEL = "epd.dev/real-node"
# What the kubelet checks (and, unprotected, writes) in /proc/sys: its wanted values.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
# The runtime and CNI binaries: Debian's packages (runc, containerd, containernetworking-plugins).
RUNTIME_BINARIES = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "nsenter", "unshare", "ip", "iptables")
CNI_BIN = Path("/usr/lib/cni")
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
# In the node's mount namespace only (a tmpfs over /run there).
NODE_RUN = Path("/run/epd-node")
# The API server's --service-cluster-ip-range (dev/cluster.py).
SERVICE_CIDR = "10.96.0.0/16"
# The node's directory for local volumes (examples/epd-local-cpu.yaml's hostPath volumes): `models`
# is the machine's model cache (read-only; `make images` builds the tiny model into it), `ec-cache`
# the encoder cache the tiers share. Both live in the node's private /var/lib and vanish with it.
LOCAL_VOLUMES = Path("/var/lib/epd-local")
MODEL_CACHE = CACHE / "models"
# The cluster's DNS (dev/cluster_dns.py): the `kube-dns` Service's ClusterIP, in SERVICE_CIDR.
CLUSTER_DNS_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
APT_PACKAGES = "runc containerd containernetworking-plugins"
CRI_PLUGIN = "io.containerd.grpc.v1.cri"
# What containerd 1.6 keeps per container under its root: the CRI plugin's container and sandbox
# folders (the plugin removes those of containers it does not know when it starts) and the v2 runtime's
# per-task work folders (the runtime removes those only in namespaces its state folder holds, and each
# cluster's state folder starts empty). A reused slot has them removed before containerd starts.
PER_CONTAINER_DIRS = (f"{CRI_PLUGIN}/containers", f"{CRI_PLUGIN}/sandboxes", "io.containerd.runtime.v2.task")


@dataclasses.dataclass(frozen=True)
class RealNodeSpec:
    """What a real node is called and which pod addresses it hands out (its bridge takes the first)."""

    name: str = "cpu-node-1"
    pod_subnet: str = "10.245.0.0/24"
    labels: tuple[tuple[str, str], ...] = ()
    # KubeletConfiguration fields set over this module's (e.g. maxPods).
    kubelet_config: tuple[tuple[str, Any], ...] = ()
    # The image store whose slots keep containerd's root between clusters (dev/node_store.py); None:
    # a root in the node's folder, gone with it.
    store: Path | None = node_store.STORE

    @property
    def node_ip(self) -> str:
        base, _, _ = self.pod_subnet.partition("/")
        a, b, c, _ = base.split(".")
        return f"{a}.{b}.{c}.1"


def missing_runtime() -> list[str]:
    """The runtime pieces this machine lacks (empty when a real node can start)."""
    missing = [b for b in RUNTIME_BINARIES if shutil.which(b) is None]
    missing += [f"{CNI_BIN}/{p}" for p in ("bridge", "host-local", "loopback", "portmap") if not (CNI_BIN / p).exists()]
    return missing


def own_cgroups() -> dict[str, str]:
    """This process's cgroup path per hierarchy, keyed by the hierarchy's mount point name."""
    by_controllers: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        by_controllers[controllers] = path
    own = {}
    for mount in _hierarchy_mounts():
        name = mount.name
        key = next(
            (
                c
                for c in by_controllers
                if name in c.split(",") or c == f"name={name}" or (c == "" and name == "unified")
            ),
            None,
        )
        own[str(mount)] = by_controllers.get(key, "/") if key is not None else "/"
    return own


def _hierarchy_mounts() -> list[Path]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.split()[0] in ("cgroup", "cgroup2"):
            found.append(Path(pre.split()[4]))
    return found


def node_cgroup_path(own: dict[str, str], name: str) -> str:
    """One path for the node, the same in every hierarchy and nested under this process's own cgroup
    in each (the kubelet's ``cgroupRoot`` is one path). Possible when the own paths form a chain, as
    here (the memory hierarchy places us deep, the others at the root)."""
    deepest = max(own.values(), key=len)
    for mount, path in own.items():
        if not (deepest + "/").startswith(path.rstrip("/") + "/"):
            raise ClusterError(
                f"cannot nest a node's cgroup under this process's own: it is {path} in {mount} but {deepest} elsewhere"
            )
    return deepest.rstrip("/") + "/" + name


class RealNode:
    """One real node of a :class:`dev.cluster.LocalCluster`; started and stopped by it."""

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
        self._reaper: subprocess.Popen[bytes] | None = None
        self._holder: Any = None
        self.components: list[Any] = []
        # containerd's root: a slot of the image store when one is free, else in the node's folder.
        self.slot: node_store.Slot | None = None
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
    containerd_socket = NODE_RUN / "containerd.sock"

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
        missing = missing_runtime()
        if missing:
            raise ClusterError(
                f"a real node needs {', '.join(missing)}: apt-get install -y {APT_PACKAGES} (Debian/Ubuntu)"
            )
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
        own = own_cgroups()
        self.cgroup = node_cgroup_path(own, f"epd-node-{self.name}-{secrets.token_hex(3)}")
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
                # A new cpuset cgroup starts with no CPUs and no memory nodes: nothing could join it.
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if (parent / f).exists():
                        (path / f).write_text((parent / f).read_text())
        self._created_parents = sorted(parents)
        self._procs_files = [str(Path(m) / self.cgroup.lstrip("/") / "cgroup.procs") for m in own]

    def _take_slot(self) -> None:
        store = self.spec.store
        if store is None:
            return
        self.slot = node_store.take(store, owner=f"pid {os.getpid()}, node {self.name} in {self.dir}")
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
        argv = [sys.executable, "-m", "dev.node_reaper", "--cgroup", self.cgroup]
        argv += ["--remove", str(self.dir), "--remove", str(self.egress_socket)]
        for parent in self._created_parents:
            argv += ["--parent", parent]
        # The reaper holds the slot's lock too (it never reads it): the slot is free only once it is done.
        slot_fd = () if self.slot is None else (self.slot.fd,)
        with (self.dir.parent / f"{self.name}-reaper.log").open("ab") as out:
            self._reaper = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=Path(__file__).resolve().parents[1],
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
            "dev.node_bridge",
            "--netns",
            self.netns,
            "--api-port",
            str(self.api_port),
            "--connect-socket",
            str(self.egress_socket),
        ]

    # -------------------------------------------------------------- containerd

    def _containerd_config(self, *, cri: bool = True) -> Path:
        """containerd's config: root in :attr:`containerd_root`, state and sockets private to this
        cluster; without ``cri``, the CRI plugin disabled (the clean-up of an earlier cluster's slot)."""
        folder = self.dir / "containerd"
        cni_conf = self.dir / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-epd-node.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "epd-node",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "cni0",
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": self.spec.pod_subnet, "gateway": self.spec.node_ip}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(self.dir / "cni" / "ipam"),
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                },
                indent=2,
            )
        )
        disabled = [
            "io.containerd.snapshotter.v1.aufs",
            "io.containerd.snapshotter.v1.btrfs",
            "io.containerd.snapshotter.v1.devmapper",
            "io.containerd.snapshotter.v1.zfs",
            "io.containerd.tracing.processor.v1.otlp",
            *(() if cri else (CRI_PLUGIN,)),
        ]
        config = f"""version = 2
root = "{self.containerd_root}"
state = "{folder / "state"}"
disabled_plugins = {json.dumps(disabled)}

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{NODE_RUN / "containerd.sock.ttrpc"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # CAP_SYS_RESOURCE is missing here: a negative oom_score_adj would fail every sandbox.
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{shutil.which("runc")}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
"""
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
        sock = f"unix://{self.containerd_socket}"
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # cgroup v1 here; from 1.35 the kubelet refuses it unless told otherwise.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup,
            # Only check the kernel settings (they read as wanted inside the node's mount namespace).
            "protectKernelDefaults": True,
            "containerRuntimeEndpoint": sock,
            "imageServiceEndpoint": sock,
            "address": "0.0.0.0",
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            # Reached only inside the node's network namespace (the API server comes through the bridge).
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": str(self.dir / "pod-logs"),
            "resolvConf": str(self.dir / "resolv.conf"),
            # ClusterFirst pods: nameserver CLUSTER_DNS_IP, search <ns>.svc.<domain> svc.<domain> <domain>, ndots:5.
            "clusterDNS": [CLUSTER_DNS_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "failSwapOn": False,
            # No registry can give an image back: never collect one, never evict for the shared disk.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "serializeImagePulls": False,
            "maxPods": 110,
        }
        config.update(self.spec.kubelet_config)
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
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig())},
            "mode": "iptables",
            "hostnameOverride": self.name,
            "clusterCIDR": self.spec.pod_subnet,
            "bindAddress": "0.0.0.0",
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            # Every Service hop is masqueraded: a pod answering a pod on the same bridge then answers
            # through the node, where the DNAT is undone. No route_localnet (no localhost NodePorts).
            "iptables": {"masqueradeAll": True, "localhostNodePorts": False},
            # Leave the (machine-wide) conntrack table size and timeouts alone.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }
        path = self.dir / "kube-proxy-config.yaml"
        path.write_text(yaml.safe_dump(config))
        return [str(self.bin / "kube-proxy"), "--config", str(path), "-v", "1"]

    def api_endpoint_slice(self) -> dict[str, Any]:
        """The `kubernetes` Service's endpoints as pods on this node reach them: the bridge's listener
        at the node's address (the API server's own endpoint reconciler is off: it refuses loopback)."""
        return {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "kubernetes",
                "namespace": "default",
                "labels": {
                    "kubernetes.io/service-name": "kubernetes",
                    "endpointslice.kubernetes.io/managed-by": "epd-local-cluster",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.spec.node_ip], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": self.api_port, "protocol": "TCP"}],
        }

    def egress_config(self) -> dict[str, Any]:
        """The API server's egress selector: kubelets (logs, exec, port-forward) through the bridge."""
        return {
            "apiVersion": "apiserver.k8s.io/v1beta1",
            "kind": "EgressSelectorConfiguration",
            "egressSelections": [
                {
                    "name": "cluster",
                    "connection": {
                        "proxyProtocol": "HTTPConnect",
                        "transport": {"uds": {"udsName": str(self.egress_socket)}},
                    },
                }
            ],
        }

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
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "local",
                            "cluster": {
                                "server": f"https://127.0.0.1:{self.api_port}",
                                "certificate-authority": str(self.ca_path),
                            },
                        }
                    ],
                    "users": [{"name": "node", "user": {"token": self.admin_token}}],
                    "contexts": [{"name": "local", "context": {"cluster": "local", "user": "node"}}],
                    "current-context": "local",
                }
            )
        )
        return path


def ctr(
    enter: Sequence[str], socket: Path, *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``ctr`` against a node's containerd, in the namespace the CRI uses (k8s.io), run inside the
    node's namespaces (``enter``: its fifos live in the node's private /run)."""
    result = subprocess.run(
        [*enter, "ctr", "--address", str(socket), "--namespace", "k8s.io", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise ClusterError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def archive_images(archive: Path) -> dict[str, str]:
    """The images an OCI archive holds, by the name ``ctr images import`` gives each, with the digest
    of the manifest it points at (from the archive's ``index.json``, as ``dev/oci.py`` and buildah
    write it). Empty when the archive names none that way (a name ``ctr`` would prefix with the
    date, a Docker archive): such an archive is always imported."""
    try:
        with tarfile.open(archive) as tar:
            member = tar.extractfile("index.json")
            index = json.load(member) if member is not None else {}
    except (KeyError, OSError, tarfile.TarError, ValueError):
        return {}
    found = {}
    for manifest in index.get("manifests") or []:
        annotations = manifest.get("annotations") or {}
        name = annotations.get("io.containerd.image.name") or annotations.get("org.opencontainers.image.ref.name")
        if not name or not any(c in name for c in "/:@") or not manifest.get("digest"):
            return {}
        found[name] = manifest["digest"]
    return found


def ready_images(check_output: str) -> dict[str, str]:
    """From ``ctr images check``'s table (REF TYPE DIGEST STATUS SIZE UNPACKED): the images whose
    content is complete and whose layers are unpacked, by name, with their target digest."""
    ready = {}
    for line in check_output.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 6 and fields[3] == "complete" and fields[-1] == "true":
            ready[fields[0]] = fields[2]
    return ready


def import_archive(enter: Sequence[str], socket: Path, archive: Path) -> bool:
    """Import an OCI archive into a node's containerd under the name it carries; skipped (False)
    when every name in it already points at its manifest, complete and unpacked. A name that points
    elsewhere is moved to the archive's image; containerd collects what the old one held alone."""
    if not archive.is_file():
        raise ClusterError(f"no image archive at {archive}: build it with `make images`")
    wanted = archive_images(archive)
    if wanted:
        have = ready_images(ctr(enter, socket, "images", "check", check=False).stdout)
        if all(have.get(name) == digest for name, digest in wanted.items()):
            log(f"{', '.join(sorted(wanted))} already present ({archive.name}), not imported")
            return False
    started = time.monotonic()
    # The vLLM image (7 GB, unpacked as it is imported) took over 10 minutes on 2 cores shared with
    # other clusters (load average 30); 4-5 minutes on quieter ones.
    ctr(enter, socket, "images", "import", "--all-platforms", str(archive), timeout=1800)
    log(f"imported {archive.name} ({', '.join(sorted(wanted)) or 'its images'}) in {time.monotonic() - started:.1f} s")
    return True


def read_sysctls() -> dict[str, str]:
    """The machine's values of the kernel settings the kubelet cares about (to show they never change)."""
    out = {}
    for key in KUBELET_SYSCTLS:
        with contextlib.suppress(OSError):
            out[key] = Path("/proc/sys", key).read_text().strip()
    return out

"""containerd on the real node (``dev/node/real_node.py``): its configuration, the pod network's CNI
configuration, ``ctr`` against it, and importing image archives into it (``make images``, the tests).

Facts this relies on: containerd 1.6 from Debian, runc (crun refuses the hybrid cgroup layout), the
cgroupfs driver (the kubelet's ``cgroupRoot`` is a path this process made), and ``restrict_oom_score_adj``
(CAP_SYS_RESOURCE may be missing, so a negative oom_score_adj would be refused).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dev.builds.k8s_binaries import log
from dev.cluster.api import ClusterError

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
CNI_BIN = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
# In the node's mount namespace only (a tmpfs over /run there). Unix socket paths are limited to about
# 100 bytes and the node's folder may be deep (a test's tmp_path): containerd's sockets live here.
NODE_RUN = Path("/run/epd-node")
SOCKET = NODE_RUN / "containerd.sock"
CRI_PLUGIN = "io.containerd.grpc.v1.cri"
# What containerd 1.6 keeps per container under its root: the CRI plugin's container and sandbox
# folders (the plugin removes those of containers it does not know when it starts) and the v2 runtime's
# per-task work folders (the runtime removes those only in namespaces its state folder holds, and each
# cluster's state folder starts empty). A reused slot has them removed before containerd starts.
PER_CONTAINER_DIRS = (f"{CRI_PLUGIN}/containers", f"{CRI_PLUGIN}/sandboxes", "io.containerd.runtime.v2.task")
_DISABLED = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.tracing.processor.v1.otlp",
)


def cni_conflist(*, pod_subnet: str, node_ip: str, ipam_dir: Path) -> dict[str, Any]:
    """The pod network: one bridge (``cni0``, the node's address its gateway), host-local addresses."""
    return {
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
                    "ranges": [[{"subnet": pod_subnet, "gateway": node_ip}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def containerd_config(*, root: Path, state: Path, cni_conf: Path, cri: bool = True) -> str:
    """containerd's config: images in ``root``, sockets and task state private to one cluster; without
    ``cri``, the CRI plugin disabled (the clean-up of an earlier cluster's image-store slot)."""
    disabled = [*_DISABLED, *(() if cri else (CRI_PLUGIN,))]
    return f"""version = 2
root = "{root}"
state = "{state}"
disabled_plugins = {json.dumps(disabled)}

[grpc]
  address = "{SOCKET}"

[ttrpc]
  address = "{NODE_RUN / "containerd.sock.ttrpc"}"

[plugins."{CRI_PLUGIN}"]
  sandbox_image = "{PAUSE_IMAGE}"
  # CAP_SYS_RESOURCE may be missing: a negative oom_score_adj would fail every sandbox.
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  [plugins."{CRI_PLUGIN}".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."{CRI_PLUGIN}".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."{CRI_PLUGIN}".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{shutil.which("runc")}"
  [plugins."{CRI_PLUGIN}".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
"""


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
    of the manifest it points at (from the archive's ``index.json``, as ``dev/builds/oci.py`` and buildah
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

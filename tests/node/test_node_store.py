"""The real node's image store across clusters (dev/node/store.py, dev/node/real_node.py): an image one
cluster imported is found present by the next, which imports nothing; the pod of a cluster killed by
SIGKILL is gone from containerd before the next cluster's kubelet starts, and a pod of the same name
runs there; with every slot taken, a node keeps its images in its own folder, gone with it.

Each test uses a store of its own (under its tmp folder): what other clusters of this machine hold in
the shared store changes nothing here.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.builds.images import ECHO_IMAGE, build_echo
from dev.cluster.local import LocalCluster, RealNodeSpec
from dev.node.containerd import CRI_PLUGIN, PAUSE_IMAGE
from dev.node.real_node import RealNode
from dev.node.store import in_use, take
from tests.support.cluster import wait_for
from tests.support.real_node import unavailable

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(unavailable() is not None, reason=unavailable() or ""),
]


@pytest.fixture
def folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A short folder (the kubelet's Unix sockets live under a cluster's folder) for the store and the clusters."""
    path = tmp_path_factory.mktemp("st")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def store(folder: Path) -> Path:
    return folder / "store"


def run_echo(cluster: LocalCluster, name: str = "echo", timeout: float = 120) -> None:
    cluster.kubectl(
        "run",
        name,
        "--image",
        ECHO_IMAGE,
        "--image-pull-policy",
        "Never",
        "--overrides",
        '{"spec": {"nodeSelector": {"epd.dev/real-node": "true"}}}',
    )
    wait_for(
        lambda: cluster.kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}", check=False).stdout == "Running",
        timeout,
        lambda: f"{name} is not running: {cluster.kubectl('get', 'pod', name, '-o', 'yaml', check=False).stdout}",
        interval=0.5,
    )


def test_a_second_cluster_finds_the_image_the_first_imported_and_imports_nothing(
    store: Path, folder: Path, capfd: pytest.CaptureFixture[str]
):
    archive = build_echo()
    spec = RealNodeSpec(store=store)
    with LocalCluster(folder / "1", real_nodes=(spec,), nodes=()) as first:
        node = first.real_node()
        root = node.containerd_root
        assert node.slot is not None and root == store / "slot-0"
        started = time.monotonic()
        assert node.load_image(archive)  # a new store: imported
        cold = time.monotonic() - started
    assert not in_use(store / "slot-0.lock")
    capfd.readouterr()
    with LocalCluster(folder / "2", real_nodes=(spec,), nodes=()) as second:
        node = second.real_node()
        assert node.containerd_root == root
        started = time.monotonic()
        assert not node.load_image(archive)
        present = time.monotonic() - started
        log = capfd.readouterr().err
        assert f"{PAUSE_IMAGE} already present" in log  # the sandbox image, at the node's start
        assert f"{ECHO_IMAGE} already present" in log
        assert "imported" not in log.replace("not imported", "")
        run_echo(second)  # the kept image runs: its layers are unpacked in the slot
    with capfd.disabled():
        print(
            f"\n{archive.name}: imported in {cold:.2f} s by the first cluster, found present in {present:.2f} s by the second"
        )


# A cluster on the given store and folder with an echo pod running; prints what the test needs, then waits.
STARTER = """
import json, sys, time
from pathlib import Path
from dev.cluster.local import LocalCluster, RealNodeSpec
from dev.builds.images import build_echo
c = LocalCluster(Path(sys.argv[2]), real_nodes=(RealNodeSpec(store=Path(sys.argv[1])),), nodes=())
c.start()
node = c.real_node()
node.load_image(build_echo())
c.kubectl("run", "echo", "--image", "localhost/epd-echo:dev", "--image-pull-policy", "Never",
          "--overrides", '{"spec": {"nodeSelector": {"epd.dev/real-node": "true"}}}')
while "Running" not in c.kubectl("get", "pod", "echo", "-o", "jsonpath={.status.phase}", check=False).stdout:
    time.sleep(0.5)
print(json.dumps({"root": str(node.containerd_root), "lock": str(node.slot.lock),
                  "containers": node.ctr("containers", "list", "--quiet").stdout.split()}), flush=True)
time.sleep(600)
"""


def test_the_pod_of_a_killed_cluster_is_gone_before_the_next_kubelet_starts(store: Path, folder: Path):
    owner = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(store), str(folder / "1")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    try:
        line = owner.stdout.readline()  # type: ignore[union-attr]
        assert line, "the first cluster did not start"
        killed = json.loads(line)
        old = set(killed["containers"])
        assert len(old) >= 2  # the pod's sandbox and its container
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()  # type: ignore[union-attr]
    wait_for(lambda: not in_use(Path(killed["lock"])), 90, "the killed node's reaper still holds its slot")

    with LocalCluster(folder / "2", real_nodes=(RealNodeSpec(store=store),), nodes=()) as cluster:
        node = cluster.real_node()
        root = node.containerd_root
        assert root == Path(killed["root"])
        # Removed while containerd ran without its CRI plugin, before the kubelet started.
        assert set(node.cleared) == old
        assert not old & set(node.ctr("containers", "list", "--quiet").stdout.split())
        snapshots = {line.split()[0] for line in node.ctr("snapshots", "list").stdout.splitlines()[1:]}
        assert not old & snapshots  # each container's writable layer went with it
        for kept in (f"{CRI_PLUGIN}/containers", f"{CRI_PLUGIN}/sandboxes", "io.containerd.runtime.v2.task/k8s.io"):
            assert not old & {p.name for p in (root / kept).glob("*")}, kept
        # The kubelet never heard of them, and a pod of the same name runs.
        run_echo(cluster)
        kubelet_log = (cluster.dir / f"kubelet-{node.name}.log").read_text(errors="replace")
        mentions = [line for line in kubelet_log.splitlines() if any(c in line for c in old)]
        assert not mentions, mentions[:5]
        assert ECHO_IMAGE in node.images()


def test_with_every_slot_taken_a_node_keeps_its_images_in_its_own_folder(
    store: Path, folder: Path, capfd: pytest.CaptureFixture[str]
):
    taken = [take(store, owner="this test") for _ in range(2)]
    assert all(taken) and take(store) is None
    try:
        with LocalCluster(folder / "1", real_nodes=(RealNodeSpec(store=store),), nodes=()) as cluster:
            node: RealNode = cluster.real_node()
            assert node.slot is None
            assert node.containerd_root.is_relative_to(node.dir)
            assert f"every slot of the image store {store} is in use" in capfd.readouterr().err
            assert node.load_image(build_echo())
            assert ECHO_IMAGE in node.images()
        wait_for(lambda: not node.dir.exists(), 30, f"{node.dir} is left behind")
        assert not [p for p in store.glob("slot-*/*")]  # nothing written into the taken slots
    finally:
        for slot in taken:
            assert slot is not None
            slot.release()

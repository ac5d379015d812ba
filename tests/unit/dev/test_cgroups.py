"""dev/node/cgroups.py from recorded layouts: this machine's kind (cgroup v1 with the unified hierarchy beside it)
and a cgroup v2-only host (most current distributions), whose ``/sys/fs/cgroup`` is played by a folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.node import cgroups

# /proc/self/mountinfo's cgroup lines (other mounts are ignored) of a hybrid v1 machine...
HYBRID_MOUNTINFO = """\
22 1 0:21 / / rw,relatime - overlay overlay rw
30 22 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw
32 30 0:28 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,xattr,name=systemd
35 30 0:31 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory
36 30 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu,cpuacct
37 30 0:33 / /sys/fs/cgroup/freezer rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,freezer
"""
HYBRID_SELF = """\
12:freezer:/
4:cpu,cpuacct:/
3:memory:/user.slice/session-1.scope
1:name=systemd:/
0::/
"""
# ... and of a cgroup v2-only host.
V2_MOUNTINFO = """\
22 1 0:21 / / rw,relatime - ext4 /dev/sda1 rw
26 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
"""
V2_SELF = "0::/user.slice/user-0.slice/session-3.scope\n"


def test_a_hybrid_v1_layout_nests_the_node_one_path_deep_in_every_hierarchy():
    found = cgroups.mounts(HYBRID_MOUNTINFO)
    assert [str(m.path) for m in found] == [
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup/systemd",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/cpu,cpuacct",
        "/sys/fs/cgroup/freezer",
    ]
    assert not cgroups.unified_only(found)
    own = cgroups.own_cgroups(found, HYBRID_SELF)
    assert own["/sys/fs/cgroup/memory"] == "/user.slice/session-1.scope"
    assert own["/sys/fs/cgroup/cpu,cpuacct"] == own["/sys/fs/cgroup/unified"] == "/"
    assert cgroups.node_cgroup_path(own, "n") == "/user.slice/session-1.scope/n"


def test_own_paths_that_do_not_form_a_chain_are_refused():
    own = {"/sys/fs/cgroup/memory": "/a/b", "/sys/fs/cgroup/cpu": "/c"}
    with pytest.raises(ValueError, match="cannot nest a node's cgroup"):
        cgroups.node_cgroup_path(own, "n")


def test_a_v2_only_layout_is_one_unified_hierarchy():
    found = cgroups.mounts(V2_MOUNTINFO)
    assert found == [cgroups.Mount(Path("/sys/fs/cgroup"), "cgroup2", False)]
    assert cgroups.unified_only(found)
    own = cgroups.own_cgroups(found, V2_SELF)
    assert own == {"/sys/fs/cgroup": "/user.slice/user-0.slice/session-3.scope"}
    assert cgroups.node_cgroup_path(own, "n") == "/user.slice/user-0.slice/session-3.scope/n"


def _v2_cgroup(path: Path, controllers: str, procs: str = "", subtree: str = "") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.subtree_control").write_text(subtree + "\n")
    (path / "cgroup.procs").write_text(procs)
    return path


SCOPE = "/user.slice/session-3.scope"


def test_v2_refusals_name_the_cause_and_the_way_out(tmp_path: Path):
    mount = cgroups.Mount(tmp_path, "cgroup2", False)
    assert "cannot read" in (cgroups.v2_refusal(mount, SCOPE) or "")
    _v2_cgroup(tmp_path / SCOPE.lstrip("/"), "cpu pids")
    refusal = cgroups.v2_refusal(mount, SCOPE) or ""
    assert "no memory controller" in refusal and "systemd-run --scope -p Delegate=yes" in refusal
    _v2_cgroup(tmp_path / SCOPE.lstrip("/"), "cpuset cpu io memory hugetlb pids")
    assert cgroups.v2_refusal(mount, SCOPE) is None
    read_only = cgroups.v2_refusal(cgroups.Mount(tmp_path, "cgroup2", True), SCOPE) or ""
    assert "read-only" in read_only and "Delegate=yes" in read_only


def test_v2_preparation_moves_the_own_processes_into_a_leaf_enables_the_controllers_and_is_undone(tmp_path: Path):
    """What the kernel would do with the writes is the kernel's; this checks which writes are made: the
    processes into the leaf (one pid a write), the controllers enabled, then all of it undone."""
    here = _v2_cgroup(tmp_path / "scope", "cpu memory pids", procs="11\n12\n")
    enabled = cgroups.v2_prepare(here, is_root=False)
    assert enabled == ["cpu", "memory", "pids"]
    assert (here / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    leaf = here / cgroups.SUPERVISOR_LEAF
    assert (leaf / "cgroup.procs").read_text() == "12"  # each pid written in turn (a plain file keeps the last)

    node = _v2_cgroup(here / "epd-node-x", "cpu memory pids")
    cgroups.v2_enable_all(node)
    assert (node / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    cgroups.v2_restore(here, enabled)
    assert leaf.exists(), "another node (a child besides the leaf) still uses the preparation"

    for f in node.iterdir():
        f.unlink()
    node.rmdir()
    (leaf / "cgroup.procs").unlink()
    cgroups.v2_restore(here, enabled)
    assert (here / "cgroup.subtree_control").read_text() == "-cpu -memory -pids"
    assert not leaf.exists()


def test_v2_preparation_leaves_a_root_cgroup_s_processes_and_enabled_controllers_alone(tmp_path: Path):
    root = _v2_cgroup(tmp_path / "root", "cpu memory pids", procs="1\n")
    assert cgroups.v2_prepare(root, is_root=True) == ["cpu", "memory", "pids"]
    assert not (root / cgroups.SUPERVISOR_LEAF).exists()
    ready = _v2_cgroup(tmp_path / "ready", "cpu memory", procs="5\n", subtree="cpu memory")
    assert cgroups.v2_prepare(ready, is_root=False) == []
    assert not (ready / cgroups.SUPERVISOR_LEAF).exists()


def test_subtree_lists_the_deepest_cgroups_first(tmp_path: Path):
    (tmp_path / "n" / "a" / "b").mkdir(parents=True)
    assert cgroups.subtree(tmp_path / "n") == [tmp_path / "n/a/b", tmp_path / "n/a", tmp_path / "n"]
    assert cgroups.subtree(tmp_path / "missing") == []


def test_a_real_node_on_a_v2_host_that_cannot_delegate_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """dev/node/real_node.py's up-front check (LocalCluster.start and the node tier ask it first) on a recorded
    v2 layout whose own cgroup lacks the memory controller, then once it has every needed controller."""
    from dev.node import real_node

    mount = cgroups.Mount(tmp_path, "cgroup2", False)
    monkeypatch.setattr(cgroups, "mounts", lambda mountinfo=None: [mount])
    monkeypatch.setattr(cgroups, "own_cgroups", lambda found, proc_self_cgroup=None: {str(tmp_path): SCOPE})
    _v2_cgroup(tmp_path / SCOPE.lstrip("/"), "cpu pids")
    refusal = real_node.cgroup_refusal() or ""
    assert "no memory controller" in refusal and "Delegate=yes" in refusal
    _v2_cgroup(tmp_path / SCOPE.lstrip("/"), "cpuset cpu io memory pids")
    assert real_node.cgroup_refusal() is None
    monkeypatch.setattr(cgroups, "mounts", lambda mountinfo=None: [])
    assert "no cgroup hierarchy is mounted" in (real_node.cgroup_refusal() or "")

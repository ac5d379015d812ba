"""The cluster parts' one shape (dev/parts/part.py) and their one list (dev/parts/registry.py): a part is one
module and one registry line, and the local cluster runs every part the same way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dev.cluster import local
from dev.cluster.api import ClusterError
from dev.cluster.cli import main as cluster_cli
from dev.cluster.components import ClusterComponents
from dev.parts import registry
from dev.parts.part import BY_TESTS, WHEN_ASKED, WITH_REAL_NODE, GoPart, Part
from dev.paths import REPO

PARTS_DIR = REPO / "dev" / "parts"
NOT_PARTS = {"__init__.py", "__main__.py", "part.py", "registry.py"}


def part_classes(path: Path) -> list[str]:
    """The classes a module defines that derive from Part or GoPart."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef) and {ast.unparse(base) for base in node.bases} & {"Part", "GoPart"}
    ]


def test_every_part_module_holds_one_part_and_the_registry_lists_it_once():
    modules = sorted(p for p in PARTS_DIR.glob("*.py") if p.name not in NOT_PARTS)
    found = {}
    for module in modules:
        (name,) = part_classes(module)  # one part a module
        found[f"dev.parts.{module.stem}.{name}"] = module
    registered = {f"{kind.__module__}.{kind.__qualname__}" for kind in registry.PARTS.values()}
    assert registered == set(found)
    assert len(registry.PARTS) == len(found)


@pytest.mark.parametrize("name", list(registry.PARTS))
def test_each_part_says_what_it_is_and_when_it_runs(name: str):
    kind = registry.PARTS[name]
    assert kind.name == name and name.replace("-", "").isalnum() and name == name.lower()
    assert kind.summary and "\n" not in kind.summary
    assert kind.starts in (WITH_REAL_NODE, WHEN_ASKED, BY_TESTS)
    assert kind.__doc__ is None or kind.__doc__.strip(), name
    assert (PARTS_DIR / f"{kind.__module__.rsplit('.', 1)[1]}.py").read_text().startswith('"""'), "a module docstring"
    if issubclass(kind, GoPart):
        assert kind.BINARIES, name


def test_the_node_parts_start_in_registry_order_the_policy_engine_before_the_dns():
    assert [p.name for p in registry.with_real_node()] == ["kube-router", "coredns"]
    assert {p.name for p in registry.on_request()} == {"lws", "keda", "gateway"}


def test_an_unknown_part_names_the_registered_ones():
    with pytest.raises(KeyError, match="lws"):
        registry.part("no-such-part")


def test_make_cluster_offers_the_parts_asked_for(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        cluster_cli(["up", "--help"])
    help_text = capsys.readouterr().out
    for part in registry.on_request():
        assert part.name in help_text
    with pytest.raises(SystemExit):
        cluster_cli(["up", "--part", "prometheus-adapter"])  # built for the tests, never started by the cluster
    assert "invalid choice" in capsys.readouterr().err


class Recording(Part):
    name = "recording"
    summary = "records what the cluster asks of it"

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def build(self) -> list[Path]:
        self.calls.append("build")
        return []

    def configure(self, cluster: ClusterComponents) -> None:
        self.calls.append("configure")

    def start(self, cluster: ClusterComponents) -> None:
        self.calls.append("start")

    def ready(self, cluster: ClusterComponents, timeout: float) -> None:
        self.calls.append(f"ready {timeout:.0f}")

    def stop(self, cluster: ClusterComponents) -> None:
        self.calls.append("stop")
        super().stop(cluster)


class NeedsNode(Recording):
    name = "needs-node"
    needs_real_node = True


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> local.LocalCluster:
    monkeypatch.setattr(local, "free_port", lambda: 1)
    monkeypatch.setitem(registry.PARTS, Recording.name, Recording)
    monkeypatch.setitem(registry.PARTS, NeedsNode.name, NeedsNode)
    return local.LocalCluster(tmp_path)


def test_a_part_is_built_configured_started_and_waited_for_once_and_stopped_with_the_cluster(cluster):
    part = cluster.start_part("recording")
    assert isinstance(part, Recording)
    assert part.calls == ["build", "configure", "start", "ready 60"]
    assert cluster.start_part("recording", timeout=5) is part  # once per cluster
    assert part.calls == ["build", "configure", "start", "ready 60"]
    cluster.stop()
    assert part.calls[-1] == "stop"


def test_a_part_that_cannot_run_here_says_why_before_anything_runs(cluster):
    with pytest.raises(ClusterError, match="needs a real node"):
        cluster.start_part("needs-node")
    assert cluster.parts == {}


def test_the_parts_asked_for_at_the_start_are_checked_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(local, "free_port", lambda: 1)
    assert local.LocalCluster(tmp_path, parts=("lws", "keda")).part_names == ("lws", "keda")
    with pytest.raises(KeyError, match="no cluster part 'kedaa'"):
        local.LocalCluster(tmp_path, parts=("kedaa",))


def test_the_policy_engine_unbuilt_is_skipped_with_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from dev import paths
    from dev.parts import kube_router

    monkeypatch.setattr(paths, "CACHE", tmp_path)  # nothing built there
    why = kube_router.KubeRouter().unavailable(None)  # type: ignore[arg-type]
    assert why is not None and "not enforced" in why and "python -m dev.parts build kube-router" in why


def test_the_development_page_says_where_every_part_lives():
    page = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    for kind in registry.PARTS.values():
        module = kind.__module__.replace(".", "/") + ".py"
        assert f"(`{kind.name}`) | `{module}` |" in page, kind.name

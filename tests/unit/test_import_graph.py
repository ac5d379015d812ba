"""No import circles in dev/, bench/, the tests' support code or the package: the static import graph, read from
the source (function-local imports and ``if TYPE_CHECKING:`` imports included, since a circle held apart by
an import inside a function is still a circle), has no cycle. Without circles, ``python -m dev.X`` also
never loads its own module twice (as ``__main__`` and again through an import of itself)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dev.paths import REPO

# The packages whose modules import each other: folder -> the folder their import names are relative to.
ROOTS = {
    REPO / "dev": REPO,
    REPO / "bench": REPO,
    REPO / "tests": REPO,
    REPO / "operator" / "epd_operator": REPO / "operator",
}


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    found = {}
    for root, base in ROOTS.items():
        for path in root.rglob("*.py"):
            if ".venv" not in path.parts and "__pycache__" not in path.parts:
                found[module_name(path, base)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules ``name`` imports anywhere in its source (a ``from pkg import mod`` names ``pkg.mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join([*base, *([node.module] if node.module else [])])
            else:
                prefix = node.module or ""
            for alias in node.names:
                candidate = f"{prefix}.{alias.name}"
                targets.add(candidate if candidate in known else prefix)
    found = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_back_through_others():
    edges = graph()
    assert len(edges) > 100 and "dev.cluster.local" in edges and "epd_operator.controller.status" in edges
    circles = cycles(edges)
    assert not circles, "import circles (break each by moving what both sides need into a module of its own):\n" + (
        "\n".join(" <-> ".join(c) for c in circles)
    )


@pytest.mark.parametrize(
    "sources, circle",
    [
        ({"a": "from . import b", "b": "def f():\n    from .a import x"}, ["pkg.a", "pkg.b"]),
        (
            {"a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B", "b": "import pkg.a"},
            ["pkg.a", "pkg.b"],
        ),
        ({"a": "from .b import c", "b": "x = 1", "c": "from .a import y"}, None),
    ],
)
def test_the_graph_sees_function_local_and_type_checking_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sources: dict[str, str], circle: list[str] | None
):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in sources.items():
        (package / f"{name}.py").write_text(text + "\n")
    monkeypatch.setattr(f"{__name__}.ROOTS", {package: tmp_path})
    # `from .b import c`: c is no name of b, so the edge goes to pkg.b (b imports nothing: no circle).
    assert cycles(graph()) == ([circle] if circle else [])

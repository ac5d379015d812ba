"""The renderer and the API depend on the router's interface (router/contract.py), never on its runtime."""

from __future__ import annotations

import ast
from pathlib import Path

import epd_operator.api
import epd_operator.render

RENDER = Path(epd_operator.render.__file__).parent
API = Path(epd_operator.api.__file__).parent


def router_modules(path: Path) -> set[str]:
    """The modules of epd_operator.router that `path` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module == "router":
            found.update(f"router.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 2 and (node.module or "").startswith("router."):
            found.add(node.module or "")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("epd_operator.router"):
            found.add((node.module or "").removeprefix("epd_operator."))
        elif isinstance(node, ast.Import):
            found.update(
                a.name.removeprefix("epd_operator.") for a in node.names if a.name.startswith("epd_operator.router")
            )
    return found


def test_render_imports_nothing_of_the_router_but_its_contract():
    imports = {path.name: router_modules(path) for path in sorted(RENDER.glob("*.py"))}
    assert {name: found for name, found in imports.items() if found - {"router.contract"}} == {}
    assert {name for name, found in imports.items() if found} == {
        "autoscaling.py",
        "keda.py",
        "router_args.py",
        "tracing.py",
        "transfer.py",
    }


def test_the_api_imports_nothing_of_the_router_but_its_contract():
    imports = {path.name: router_modules(path) for path in sorted(API.glob("*.py"))}
    assert {name: found for name, found in imports.items() if found} == {"router.py": {"router.contract"}}

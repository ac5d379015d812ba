"""What the operator renders for every example, committed as YAML under tests/golden/render/.

A change to the renderer shows its effect on every shipped example as a diff of these files, and a
refactor that must change nothing for users shows none: `tests/unit/render/test_golden.py` compares
the committed files with `render()`'s output now. `make generate` rewrites them after an intended
change.
"""

from __future__ import annotations

from pathlib import Path

from dev.local.runner import load_spec
from epd_operator.api import parse_epd
from epd_operator.cli import dump_yaml
from epd_operator.render import render

GOLDEN = "tests/golden/render"


def render_example(example: Path) -> str:
    """What the operator renders for the example file, as the golden file holds it."""
    return dump_yaml(render(parse_epd(load_spec(example))))


def files(root: Path) -> dict[str, str]:
    """Each example's rendered objects, by the golden file's path relative to `root`."""
    return {
        f"{GOLDEN}/{example.name}": render_example(example) for example in sorted((root / "examples").glob("*.yaml"))
    }

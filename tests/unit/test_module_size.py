"""Product modules stay small enough to read whole: a module past the bound is split by subject
(as api/spec.py was into tiers, autoscaling, transfer, router and network)."""

from __future__ import annotations

from pathlib import Path

import epd_operator

PACKAGE = Path(epd_operator.__file__).parent
MAX_LINES = 650


def test_every_product_module_is_at_most_650_lines():
    sizes = {
        str(p.relative_to(PACKAGE)): len(p.read_text(encoding="utf-8").splitlines()) for p in PACKAGE.rglob("*.py")
    }
    assert {path: lines for path, lines in sizes.items() if lines > MAX_LINES} == {}

"""Every example renders exactly as committed in tests/golden/render/ (`make generate` rewrites them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.generate import render_golden

REPO = Path(__file__).resolve().parents[3]
EXPECTED = render_golden.files(REPO)


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_the_example_renders_as_committed(path):
    committed = REPO / path
    assert committed.is_file(), f"{path} is missing: run `make generate` and commit it"
    assert committed.read_text(encoding="utf-8") == EXPECTED[path], (
        f"render() changed what {Path(path).name} makes: if that is intended, run `make generate` and commit "
        f"the diff of {path}"
    )


def test_no_golden_file_outlives_its_example():
    committed = {str(p.relative_to(REPO)) for p in (REPO / render_golden.GOLDEN).glob("*.yaml")}
    assert committed - set(EXPECTED) == set()

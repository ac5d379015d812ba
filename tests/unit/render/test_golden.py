"""Every example renders exactly as committed in tests/golden/render/ (`make generate` rewrites them).

Rendered inside each test, not at import: a mutation run switches a mutant on before the test runs, so
this comparison of every rendered field catches what the targeted tests do not look at."""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.generate import render_golden

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_example_renders_as_committed(example):
    path = f"{render_golden.GOLDEN}/{example}"
    rendered = render_golden.render_example(REPO / "examples" / example)
    committed = REPO / path
    assert committed.is_file(), f"{path} is missing: run `make generate` and commit it"
    assert committed.read_text(encoding="utf-8") == rendered, (
        f"render() changed what {example} makes: if that is intended, run `make generate` and commit the diff of {path}"
    )


def test_no_golden_file_outlives_its_example():
    committed = {p.name for p in (REPO / render_golden.GOLDEN).glob("*.yaml")}
    assert committed - set(EXAMPLES) == set()

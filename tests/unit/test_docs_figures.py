"""docs/ states contracts; measured figures come from bench/results (`dev/generate/bench_figures.py`).

A run's figures in prose go stale the day the code changes, and a commit hash in prose says which run a page
narrates. Outside the generated figures blocks, no page of docs/ names a commit or a run's load average;
inside them, the report's own line names its run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dev.generate.bench_figures import END, MARKER

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted((REPO / "docs").glob("*.md"))
COMMIT = re.compile(r"(?<![\w/-])`?\b[0-9a-f]{7,40}\b`?(?![\w/-])")
NARRATIVE = re.compile(r"load average", re.I)


def prose(page: str) -> str:
    """The page without its generated figures blocks and without code blocks."""
    out, rest = [], page
    while (match := MARKER.search(rest)) is not None:
        out.append(rest[: match.start()])
        rest = rest[rest.index(END, match.end()) + len(END) :]
    out.append(rest)
    return re.sub(r"^```.*?^```", "", "".join(out), flags=re.S | re.M)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_narrates_a_run(page):
    text = prose(page.read_text(encoding="utf-8"))
    commits = [
        m.group(0) for m in COMMIT.finditer(text) if re.search(r"[a-f]", m.group(0)) and re.search(r"\d", m.group(0))
    ]
    assert commits == [], (
        f"{page.name} names commits {commits}: figures belong in bench/results, shown by a figures block"
    )
    assert not NARRATIVE.search(text), f"{page.name} narrates a run's load: put its figures in bench/results"

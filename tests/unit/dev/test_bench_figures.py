"""Figures in docs/ come from the reports in bench/results (`dev/generate/bench_figures.py`)."""

from __future__ import annotations

import pytest

from dev.generate import bench_figures
from dev.generate.bench_figures import END, FiguresError, with_figures

REPORT = """# A bench (`make bench-x`)

Run 2026-12-01 10:00 UTC, commit `abc1234`, AMD EPYC (x86_64),
load average 1.0 at the end.

Setup: words.

## Figures

Some words first.

| | measured |
|---|---|
| step -> serving | 120 s |

After the table.

| another | table |
|---|---|

## Other

| x |
|---|
"""


@pytest.fixture
def root(tmp_path):
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "x.md").write_text(REPORT)
    return tmp_path


def test_a_block_gets_the_run_line_and_the_first_table_under_its_heading(root):
    page = f"intro\n<!-- figures: bench/results/x.md#Figures -->\nstale text\n{END}\noutro\n"
    assert with_figures(page, root) == (
        "intro\n<!-- figures: bench/results/x.md#Figures -->\n"
        "From [`bench/results/x.md`](../bench/results/x.md): Run 2026-12-01 10:00 UTC, commit `abc1234`, "
        "AMD EPYC (x86_64), load average 1.0 at the end.\n\n"
        "| | measured |\n|---|---|\n| step -> serving | 120 s |\n"
        f"{END}\noutro\n"
    )


def test_filling_twice_changes_nothing_and_several_blocks_fill_in_order(root):
    page = f"<!-- figures: bench/results/x.md#Figures -->\n{END}\n<!-- figures: bench/results/x.md#Other -->\n{END}\n"
    once = with_figures(page, root)
    assert with_figures(once, root) == once
    assert once.index("| step -> serving |") < once.index("| x |")


def test_a_page_without_blocks_is_unchanged(root):
    assert with_figures("no figures here\n", root) == "no figures here\n"


@pytest.mark.parametrize(
    ("page", "message"),
    [
        ("<!-- figures: bench/results/x.md#Figures -->\nno end\n", "has no <!-- end of figures -->"),
        (f"<!-- figures: bench/results/x.md#Missing -->\n{END}\n", "bench/results/x.md: no heading 'Missing'"),
        (f"<!-- figures: bench/results/gone.md#Figures -->\n{END}\n", "gone.md"),
    ],
)
def test_a_wrong_block_is_refused_with_the_report_and_reason(root, page, message):
    with pytest.raises(FiguresError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        with_figures(page, root)


def test_a_heading_without_a_table_or_a_report_without_its_run_is_refused(root):
    (root / "bench" / "results" / "x.md").write_text("# A bench\n\nRun today.\n\n## Figures\n\nno table\n")
    with pytest.raises(FiguresError, match="no table under the heading 'Figures'"):
        with_figures(f"<!-- figures: bench/results/x.md#Figures -->\n{END}\n", root)
    (root / "bench" / "results" / "x.md").write_text("# A bench\n\n## Figures\n\n| a |\n|---|\n")
    with pytest.raises(FiguresError, match="no line starting with 'Run '"):
        with_figures(f"<!-- figures: bench/results/x.md#Figures -->\n{END}\n", root)


def test_every_page_with_figures_is_generated():
    from dev import generate

    assert set(bench_figures.PAGES) <= set(generate.files())

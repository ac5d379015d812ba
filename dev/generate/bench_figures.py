"""Measured figures in docs/, copied from the benchmark reports in bench/results by `make generate`.

A page asks for a table with a pair of markers naming a report and one of its headings:

    <!-- figures: bench/results/autoscale.md#Both runs -->
    <!-- end of figures -->

and gets, between them, a line naming the report and the run it describes (the report's own line that
starts with "Run " or "Written by"), then the first table under that heading, as the report has it. The
figures thus have one home, the report a benchmark wrote; a page cannot hold a figure the report no longer
has, since the freshness test (tests/unit/dev/test_generate.py) compares the pages with this output.
"""

from __future__ import annotations

import re
from pathlib import Path

PAGES = ("docs/benchmarks.md", "docs/faults.md", "docs/autoscaling.md", "docs/development.md")
MARKER = re.compile(r"<!-- figures: (?P<report>bench/results/[\w.-]+\.md)#(?P<heading>[^>]+?) -->")
END = "<!-- end of figures -->"


class FiguresError(ValueError):
    """A page names a report or heading that does not exist, or a block is not closed."""


def run_line(report: str) -> str:
    """The report's line that says which run it describes (date, commit, machine), joined if wrapped."""
    paragraphs = re.split(r"\n\s*\n", report)
    for paragraph in paragraphs:
        text = " ".join(paragraph.split())
        if text.startswith(("Run ", "Written by")):
            return text
    raise FiguresError("the report has no line starting with 'Run ' or 'Written by' naming its run")


def table_under(report: str, heading: str) -> str:
    """The first Markdown table after the heading whose text is `heading` (any level)."""
    lines = report.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("#") and line.lstrip("#").strip() == heading]
    if not starts:
        raise FiguresError(f"no heading {heading!r}")
    table: list[str] = []
    for line in lines[starts[0] + 1 :]:
        if line.startswith("|"):
            table.append(line)
        elif table or line.startswith("#"):
            break
    if not table:
        raise FiguresError(f"no table under the heading {heading!r}")
    return "\n".join(table)


def with_figures(page: str, root: Path) -> str:
    """`page` with every figures block filled from the report it names (paths relative to `root`)."""
    out: list[str] = []
    rest = page
    while (match := MARKER.search(rest)) is not None:
        end = rest.find(END, match.end())
        if end < 0:
            raise FiguresError(f"{match.group(0)} has no {END}")
        report_path, heading = match.group("report"), match.group("heading")
        try:
            report = (root / report_path).read_text(encoding="utf-8")
        except OSError as error:
            raise FiguresError(f"{match.group(0)}: {error}") from error
        try:
            figures = f"From [`{report_path}`](../{report_path}): {run_line(report)}\n\n{table_under(report, heading)}"
        except FiguresError as error:
            raise FiguresError(f"{report_path}: {error}") from error
        out.append(rest[: match.end()] + "\n" + figures + "\n")
        rest = rest[end:]
    out.append(rest)
    return "".join(out)


def pages(root: Path) -> dict[str, str]:
    """Every page with figures blocks, filled."""
    return {path: with_figures((root / path).read_text(encoding="utf-8"), root) for path in PAGES}

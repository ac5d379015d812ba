"""Markdown for the results file: tables, and targets with PASS / MISS."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Target:
    section: str
    name: str
    goal: str
    measured: str
    passed: bool | None  # None: not measured

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "MISS", None: "NOT MEASURED"}[self.passed]


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return "–"
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}"
    return str(v)


def targets_table(targets: list[Target]) -> str:
    return table(
        ["section", "target", "goal", "measured", "verdict"],
        [[t.section, t.name, t.goal, t.measured, f"**{t.verdict}**"] for t in targets],
    )

"""The Makefile's own contracts: `make help` lists every target, and the pre-commit hooks run exactly what
`make lint` runs."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
MAKEFILE = (REPO / "Makefile").read_text(encoding="utf-8")


def recipe(target: str) -> list[str]:
    """The commands of `target`'s recipe, with $(BIN) spelled out as the venv's bin folder."""
    lines = MAKEFILE.split("\n")
    (start,) = [i for i, line in enumerate(lines) if re.match(rf"{re.escape(target)}:(\s|$)", line)]
    commands = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        commands.append(line.strip().replace("$(BIN)/", ".venv/bin/"))
    return commands


def test_every_phony_target_has_a_help_line():
    (phony,) = re.findall(r"^\.PHONY:(.*)$", MAKEFILE, re.MULTILINE)
    described = set(re.findall(r"^([a-z][a-z0-9-]*):.*## \S", MAKEFILE, re.MULTILINE))
    assert set(phony.split()) == described


def test_the_pre_commit_hooks_run_what_make_lint_runs():
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    (local,) = config["repos"]
    assert local["repo"] == "local"
    hooks = local["hooks"]
    assert [hook["entry"] for hook in hooks] == recipe("lint")
    assert all(hook["language"] == "system" and hook["pass_filenames"] is False for hook in hooks)

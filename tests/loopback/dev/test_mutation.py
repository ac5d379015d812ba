"""dev/testing/mutation.py's stale rows read from a real git repository: a row is stale once a module it measured changed
since its commit (committed or not), and not before."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from dev.testing import mutation


def git(repo: Path, *args: str) -> str:
    identity = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    cmd = ["git", "-c", "commit.gpgsign=false", *args]
    done = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, check=True, env={**os.environ, **identity})
    return done.stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "--short", "HEAD")


def group_run(group: str, commit: str) -> mutation.GroupRun:
    modules = {m: mutation.ModuleResult(m) for m in mutation.GROUPS[group][0]}
    return mutation.GroupRun(group, {"commit": commit, "dirty": False}, modules)


def test_a_row_is_stale_once_a_module_it_measured_changes_since_its_commit(tmp_path):
    package = tmp_path / mutation.PACKAGE_DIR
    (package / "router").mkdir(parents=True)
    for module in ["cli.py", *mutation.GROUPS["router"][0]]:
        (package / module).write_text("def f():\n    return 1\n")
    git(tmp_path, "init", "-q")
    measured = commit_all(tmp_path, "measured")
    changed = functools.partial(mutation.changed_since, root=tmp_path)
    runs = {"cli": group_run("cli", measured), "router": group_run("router", measured)}
    assert mutation.stale_rows(runs, changed) == {}

    (package / "cli.py").write_text("def f():\n    return 2\n")  # uncommitted: the figures no longer describe it
    assert mutation.stale_rows(runs, changed) == {"cli": f"changed since {measured}: cli.py"}
    commit_all(tmp_path, "cli changed")
    (tmp_path / "README").write_text("not a module of any row")
    commit_all(tmp_path, "elsewhere")
    assert mutation.stale_rows(runs, changed) == {"cli": f"changed since {measured}: cli.py"}

    runs["cli"] = group_run("cli", git(tmp_path, "rev-parse", "--short", "HEAD"))  # measured again
    assert mutation.stale_rows(runs, changed) == {}
    runs["router"] = group_run("router", "0123abc")
    assert mutation.stale_rows(runs, changed) == {"router": "this repository does not hold its commit 0123abc"}

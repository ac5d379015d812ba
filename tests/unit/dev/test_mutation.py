"""dev/mutation.py's matching of surviving mutants to their recorded explanations (the mutation run
itself is `make mutation`, not part of the test suite)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from dev import mutation

ROOT = Path(__file__).resolve().parents[3]

DIFF = """--- src/epd_operator/router/reuse.py
+++ src/epd_operator/router/reuse.py
@@ -4,4 +4,4 @@
     while len(self._entries) > self.max_items:
-        self._entries.popitem(last=False)
+        self._entries.popitem(last=None)
"""


def test_function_names_from_mutant_names():
    assert mutation.function_of("epd_operator.router.reuse.xǁReuseCacheǁremember__mutmut_8") == "ReuseCache.remember"
    assert mutation.function_of("epd_operator.render.vllm.x_model_path__mutmut_12") == "model_path"


def test_a_survivor_matches_by_the_line_it_mutates_or_the_line_it_writes():
    name = "epd_operator.router.reuse.xǁReuseCacheǁremember__mutmut_8"
    by_line = {
        "module": "router/reuse.py",
        "function": "ReuseCache.remember",
        "line": "self._entries.popitem(last=False)",
    }
    by_mutant = {
        "module": "router/reuse.py",
        "function": "ReuseCache.remember",
        "mutated": "self._entries.popitem(last=None)",
    }
    assert mutation.explain("router/reuse.py", name, DIFF, [by_line]) is by_line
    assert mutation.explain("router/reuse.py", name, DIFF, [by_mutant]) is by_mutant
    other_function = {**by_line, "function": "ReuseCache.recall"}
    other_line = {**by_mutant, "mutated": "self._entries.popitem(last=True)"}
    assert mutation.explain("router/reuse.py", name, DIFF, [other_function, other_line]) is None


def test_every_recorded_explanation_is_complete_and_names_a_module_of_a_group():
    modules = {m for mods, _ in mutation.GROUPS.values() for m in mods}
    entries = tomllib.loads((ROOT / "dev" / "mutation_survivors.toml").read_text())["survivor"]
    for entry in entries:
        assert entry["module"] in modules, entry
        assert entry["kind"] in ("equivalent", "gap"), entry
        assert entry["why"].strip() and ("line" in entry) != ("mutated" in entry), entry


def test_every_group_test_file_exists():
    for _, tests in mutation.GROUPS.values():
        for test in tests:
            assert (ROOT / test).is_file(), test

"""README.md, docs/ and the charts' READMEs name only what exists in the repository.

Checked, in every page: relative links (the file, and the heading a `#anchor` points at), repository paths
written in backticks or in code blocks (`tests/...`, `dev/...`, `charts/...`, and paths inside the package
such as `router/upstream.py`), the modules of `python -m ...` and the targets of `make ...`; and the README
links every page of docs/. Pure: it reads files and runs nothing.

Paths under the folders commands write (``build/``, ``dist/``: .gitignore's top-level outputs) are outputs a page
may name (``build/test-node.log``): never checked, and the verdict is the same whether a run left them or not.
Which names count as the repository's top level ignores such leftovers too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "epd_operator"
PAGES = sorted(
    [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "charts").rglob("README.md")],
    key=lambda p: p.relative_to(REPO).as_posix(),
)

# A written path is checked when its first component is one of these: the repository's top-level entries,
# the package and its subpackages (`render/vllm.py`), and folder names a reader might expect from elsewhere
# but which this repository does not have.
ABSENT_ROOTS = {"hack", "reference"}
# What commands write into the tree (never committed): a page names them as outputs.
OUTPUT_ROOTS = {"build", "dist"}
MODULE_ROOTS = {"dev", "tests", "bench", "epd_operator"}
_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_CODE_SPAN = re.compile(r"`([^`]+)`")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_PATH = re.compile(r"^[\w.@-]+(/[\w.*@-]+)*/?$")
_MODULE = re.compile(r"(?:^|[\s/])python3?\s+-m\s+([\w.]+)")
_MAKE = re.compile(r"(?:^|[\s`(;])make\s+([a-z][\w-]*)\b(?!\s*=)")
_SKIP = ("<", ">", "{", "}", "$", "…", "...", "~", "=")


def _roots() -> set[str]:
    top = {p.name for p in REPO.iterdir() if not p.name.startswith(".") and not p.name.endswith(".egg-info")}
    top = (top - OUTPUT_ROOTS) | {".ci"}
    subpackages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_")}
    return top | subpackages | {"epd_operator"} | ABSENT_ROOTS


def _make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return {t for line in re.findall(r"^([\w][\w .-]*):(?!=)", text, re.M) for t in line.split()}


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def split_page(text: str) -> tuple[list[str], list[str]]:
    """The page's prose lines and the lines of its fenced code blocks."""
    prose: list[str] = []
    code: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        (code if fenced else prose).append(line)
    return prose, code


def anchors(text: str) -> set[str]:
    prose, _ = split_page(text)
    return {slug(m.group(2)) for line in prose if (m := _HEADING.match(line))}


def _repo_path(word: str, roots: set[str]) -> Path | None:
    """Where a written path points in the repository, or None when the word is not a repository path."""
    word = word.strip("`'\"()[],;:.")
    if "/" not in word or any(s in word for s in _SKIP) or not _PATH.match(word):
        return None
    first = word.split("/", 1)[0]
    if first not in roots:
        return None
    if first == "epd_operator":
        return REPO / "operator" / word
    if (PACKAGE / first).is_dir() and not (REPO / first).exists():
        return PACKAGE / word
    return REPO / word


def _exists(path: Path) -> bool:
    if "*" in path.name or any("*" in part for part in path.parts):
        relative = path.relative_to(REPO).as_posix()
        return any(REPO.glob(relative))
    return path.exists()


def _module_exists(module: str) -> bool:
    parts = module.split(".")
    base = REPO / "operator" if parts[0] == "epd_operator" else REPO
    target = base.joinpath(*parts)
    return target.with_suffix(".py").is_file() or (target / "__main__.py").is_file()


def problems(page: Path, text: str) -> list[str]:
    """Everything `text` (the Markdown of `page`) names that the repository does not have."""
    roots = _roots()
    targets = _make_targets()
    name = page.relative_to(REPO).as_posix()
    found: list[str] = []
    prose, code = split_page(text)
    for line in prose:
        for target in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            if not file_part:
                if anchor not in anchors(text):
                    found.append(f"{name}: link to {target}: no heading with that anchor")
                continue
            linked = (page.parent / file_part).resolve()
            if not linked.exists():
                found.append(f"{name}: link to {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text(encoding="utf-8")):
                found.append(f"{name}: link to {target}: no heading with that anchor")
    words = [w for line in prose for span in _CODE_SPAN.findall(line) for w in span.split()]
    words += [w for line in code for w in line.split()]
    for word in words:
        path = _repo_path(word, roots)
        if path is not None and not _exists(path):
            found.append(f"{name}: `{word}`: no such path in the repository")
    commands = [" ".join(span for line in prose for span in _CODE_SPAN.findall(line)), "\n".join(code)]
    for command in commands:
        for module in _MODULE.findall(command):
            if module.split(".")[0] in MODULE_ROOTS and not _module_exists(module):
                found.append(f"{name}: python -m {module}: no such module")
        for target in _MAKE.findall(command):
            if target not in targets:
                found.append(f"{name}: make {target}: no such target in the Makefile")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_link_and_path_exists(page: Path):
    assert problems(page, page.read_text(encoding="utf-8")) == []


def test_the_readme_links_every_docs_page():
    linked = set(_LINK.findall((REPO / "README.md").read_text(encoding="utf-8")))
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages - {target.partition("#")[0] for target in linked} == set()


def test_the_pages_are_found():
    names = {p.relative_to(REPO).as_posix() for p in PAGES}
    assert {"README.md", "docs/api.md", "charts/epd-operator/README.md"} <= names


def test_the_checker_notices_what_does_not_exist():
    page = REPO / "docs" / "example.md"
    text = "\n".join(
        [
            "# A page",
            "[ok](../README.md) [gone](gone.md) [anchor](install.md#no-such-heading) [self](#a-page)",
            "`tests/support/apiserver.py`, `hack/run.sh`, `reference/vllm-epd.md`, `router/nowhere.py`",
            "`tests/unit/test_nothing*.py` and `epd_operator/local` and `make no-such-target`",
            "kept: `serving.epd.dev/role`, `core/v1 Affinity`, `~/.cache/epd-operator`, `dev/local/plan.py`, `router/pickers.py`",
            # outputs a command writes: the same verdict with or without a build/ left in the tree
            "kept: `build/test-node.log`, `build/mutation/mutation.md`, `dist/epd_operator-0.1.0.whl`",
            "```bash",
            "python tests/support/gone.py && python -m dev.no_such && python -m dev.local.demo && make demo",
            "```",
        ]
    )
    assert problems(page, text) == [
        "docs/example.md: link to gone.md: no such file",
        "docs/example.md: link to install.md#no-such-heading: no heading with that anchor",
        "docs/example.md: `tests/support/apiserver.py`: no such path in the repository",
        "docs/example.md: `hack/run.sh`: no such path in the repository",
        "docs/example.md: `reference/vllm-epd.md`: no such path in the repository",
        "docs/example.md: `router/nowhere.py`: no such path in the repository",
        "docs/example.md: `tests/unit/test_nothing*.py`: no such path in the repository",
        "docs/example.md: `epd_operator/local`: no such path in the repository",
        "docs/example.md: `tests/support/gone.py`: no such path in the repository",
        "docs/example.md: make no-such-target: no such target in the Makefile",
        "docs/example.md: python -m dev.no_such: no such module",
    ]


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("The operator (`epd-operator`)", "the-operator-epd-operator"),
        (
            "Facing untrusted clients: limits, timeouts and the trust model",
            "facing-untrusted-clients-limits-timeouts-and-the-trust-model",
        ),
        ("E/P/D and the KV connector", "epd-and-the-kv-connector"),
    ],
)
def test_anchors_are_githubs(heading, anchor):
    assert slug(heading) == anchor

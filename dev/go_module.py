"""A Go program built from one release of a Go module, fetched from the Go module proxy, against the
release's own go.mod and go.sum (dev/coredns.py, dev/prometheus_adapter.py).

`build` downloads the release's source (``go mod download``), copies it (the module cache is
read-only), writes any extra files into the copy (a ``main`` package of the caller's), builds the
package into a temporary file next to the binary and moves it onto the binary's path: atomic, so a
concurrent build either wins or finds it built. Where the binary lives (the cache key) is the caller's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path


def require_go(what: str) -> str:
    """The `go` command, or why `what` cannot be built."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(f"building {what} needs Go (https://go.dev/dl)")
    return go


def build(
    go: str,
    module: str,
    version: str,
    package: str,
    binary: Path,
    log: Callable[[str], None],
    *,
    files: dict[str, str] | None = None,
    flags: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> None:
    """Build `package` (``./cmd/...``) of `module`@`version` into `binary`, with `files` (path in the
    module: content) added, `flags` before ``-o`` and `env` added to this process's environment."""
    log(f"building {module}@{version} from the Go module proxy (once; cached in {binary.parent})")
    started = time.monotonic()
    download = subprocess.run(
        [go, "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True, check=True
    )
    source = Path(json.loads(download.stdout)["Dir"])
    binary.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{module.rsplit('/', 1)[-1]}-", dir=binary.parent) as work:
        tree = Path(work) / "src"
        shutil.copytree(source, tree)
        for path in tree.rglob("*"):
            path.chmod(path.stat().st_mode | 0o200)
        for name, content in (files or {}).items():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_text(content)
        partial = Path(work) / binary.name
        subprocess.run(
            [go, "build", *flags, "-o", str(partial), package],
            cwd=tree,
            check=True,
            env={**os.environ, **(env or {})},
        )
        partial.replace(binary)
    log(f"built in {time.monotonic() - started:.0f} s")

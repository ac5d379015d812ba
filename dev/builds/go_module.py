"""Go programs built from one pinned release of a Go module, fetched from the Go module proxy, into the cache:
the one home for how a Go program of the local cluster is built (the Kubernetes components, etcd, kwok, every
part's binaries under ``dev/parts/``, the images' small programs).

A component is a :class:`GoBinary` (module, version, package, where the binary lives) and :func:`ensure`
builds it once, returning the cached binary on every later call::

    ADAPTER = GoBinary("prometheus-adapter", "sigs.k8s.io/prometheus-adapter", "v0.12.0", "./cmd/adapter", "adapter")
    path = go_module.ensure(ADAPTER)

Two ways to build, by what the module's go.mod allows:

- **its own go.mod** (the default): the release's source is downloaded (``go mod download``), copied (the
  module cache is read-only), the extra ``files`` written into the copy (a ``main`` package of ours), and
  ``package`` built against the release's own go.mod and go.sum: exactly the dependency versions it was
  released with. ``go install module@version`` is not used: it needs the module's version list, which the
  proxy does not serve for every module;
- **a wrapper module** (``wrapper=True``), for a module whose go.mod points its siblings at local folders
  (``replace ... => ../api``, as etcd's server does), which only its own repository can build: a module of
  ours (``go mod init``) requiring ``module@version`` (``go get``), holding the ``files``, its other
  requirements resolved by ``go mod tidy``.

The build runs at nice 10 (the machine's other work comes first), into a temporary file next to the binary,
moved onto the binary's path: atomic, and a lock file serialises concurrent builds of one binary, so a second
caller waits and finds it built. :func:`build_local` builds this repository's own small Go programs the same
way (the images' ``dev/builds/pause`` and ``dev/builds/echo``).

Every build goes through :func:`go_build` (static, the flags and environment above, a line every minute while
a long build is silent) under :func:`build_lock`. The Kubernetes components use those two directly
(``dev/builds/k8s_binaries.py``): ``k8s.io/kubernetes`` is consumable as a module only through a wrapper that
re-pins its staging modules, and all of them come from one ``go build`` so that their shared packages compile
once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from dev import paths

# What every build here uses unless a component says otherwise: static, reproducible paths, no VCS stamping
# (the source is a module download, not a checkout).
DEFAULT_FLAGS = ("-trimpath", "-ldflags=-s -w")
DEFAULT_ENV = {"CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}


class GoMissing(RuntimeError):
    """No ``go`` command: the message says what needed it and where Go comes from."""


@dataclasses.dataclass(frozen=True)
class GoBinary:
    """One binary built from ``module``@``version``: its ``package`` (``./cmd/...``, in the module or, with
    ``wrapper``, in our wrapper module), cached at :attr:`path` (``<cache>/<name>/<version>/<binary>``
    unless ``at`` says otherwise)."""

    name: str
    module: str
    version: str
    package: str
    binary: str
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    flags: tuple[str, ...] = DEFAULT_FLAGS
    env: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(DEFAULT_ENV))
    wrapper: bool = False
    at: Path | None = None

    @property
    def path(self) -> Path:
        return self.at if self.at is not None else paths.CACHE / self.name / self.version / self.binary

    def built(self) -> bool:
        return os.access(self.path, os.X_OK)


def require_go(what: str) -> str:
    """The `go` command, or why `what` cannot be built."""
    go = shutil.which("go")
    if go is None:
        raise GoMissing(f"building {what} needs Go (https://go.dev/dl); install it and run this again")
    return go


@contextlib.contextmanager
def build_lock(path: Path, say: Callable[[str], None]) -> Iterator[None]:
    """Hold the build lock file `path` (created with its folder): one build at a time; a second caller says
    that it waits, then finds what the first one built."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("waiting for another build of it to finish")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure(component: GoBinary) -> Path:
    """The component's binary, built once when absent (see the module's doc)."""
    if component.built():
        return component.path
    go = require_go(f"{component.name} {component.version}")
    binary = component.path
    with build_lock(binary.parent / f".{binary.name}.build.lock", lambda msg: _log(component, msg)):
        if not component.built():
            _build(go, component)
    return binary


def _build(go: str, c: GoBinary) -> None:
    how = "in a wrapper module" if c.wrapper else "against its own go.mod"
    _log(c, f"building {c.module}@{c.version} from the Go module proxy, {how} (once; cached in {c.path.parent})")
    started = time.monotonic()
    env = {**os.environ, **c.env}
    with tempfile.TemporaryDirectory(prefix=f"{c.name}-", dir=c.path.parent) as work:
        tree = Path(work) / "src"
        if c.wrapper:
            tree.mkdir()
            subprocess.run(
                [go, "mod", "init", f"epd.local/{c.name}"], cwd=tree, check=True, env=env, capture_output=True
            )
            subprocess.run([go, "get", f"{c.module}@{c.version}"], cwd=tree, check=True, env=env, capture_output=True)
        else:
            shutil.copytree(Path(download(go, f"{c.module}@{c.version}", env)["Dir"]), tree)
            for path in tree.rglob("*"):
                path.chmod(path.stat().st_mode | 0o200)
        for name, content in c.files.items():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_text(content)
        if c.wrapper:
            tidy_env = {**env, "GOFLAGS": f"{env.get('GOFLAGS', '')} -mod=mod".strip()}
            subprocess.run(["nice", "-n", "10", go, "mod", "tidy"], cwd=tree, check=True, env=tidy_env)
        partial = Path(work) / c.path.name
        go_build(go, tree, [c.package], partial, c.flags, env, say=lambda msg: _log(c, msg))
        partial.replace(c.path)
    _log(c, f"built in {time.monotonic() - started:.0f} s: {c.path}")


def download(
    go: str, module_at_version: str, env: Mapping[str, str], cwd: Path | None = None, timeout: float | None = None
) -> dict[str, str]:
    """``go mod download -json`` of one module release into Go's module cache (once): what it says of it, among
    which ``Dir`` (its source, read-only) and ``GoMod`` (its go.mod)."""
    out = subprocess.run(
        [go, "mod", "download", "-json", module_at_version],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )
    return dict(json.loads(out.stdout))


def module_source(module_at_version: str, what: str, timeout: float = 600) -> Path:
    """A module release's source in Go's module cache (`go mod download`, once), e.g. to read its CRDs."""
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    # Outside any Go module of ours.
    return Path(download(require_go(what), module_at_version, env, Path(tempfile.gettempdir()), timeout)["Dir"])


def build_local(source: Path, binary: Path) -> None:
    """A ``main`` package of this repository (``dev/builds/pause``, ``dev/builds/echo``: their own go.mod, no dependency)
    built into ``binary`` the way every component is: static, at nice 10. Caching is the caller's (the images
    key their archives by the source and :func:`go_version`)."""
    go = require_go(f"{source.name} (Go source in {source})")
    go_build(go, source, ["."], binary, DEFAULT_FLAGS, {**os.environ, **DEFAULT_ENV})


def go_version() -> str:
    """The Go toolchain's version (``go1.24.1``), or ``no go`` when there is none (no cache key matches it)."""
    go = shutil.which("go")
    if go is None:
        return "no go"
    return subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()


def go_build(
    go: str,
    tree: Path,
    packages: Sequence[str],
    out: Path,
    flags: Sequence[str],
    env: Mapping[str, str],
    *,
    nice: int = 10,
    say: Callable[[str], None] | None = None,
) -> None:
    """``go build`` of `packages` in `tree` into `out` (a file; with several packages, a folder that ends with a
    separator: one binary each), at `nice`; `say` hears, every minute, that a build is still going."""
    argv = [go, "build", *flags, "-o", str(out) + (os.sep if len(packages) > 1 else ""), *packages]
    started = time.monotonic()
    with subprocess.Popen(["nice", "-n", str(nice), *argv] if nice else argv, cwd=tree, env=env) as build:
        while True:
            try:
                status = build.wait(60)
                break
            except subprocess.TimeoutExpired:
                if say is not None:  # a cold build is many minutes of silence
                    say(f"  still building ({time.monotonic() - started:.0f} s)")
            except BaseException:
                build.kill()
                raise
    if status != 0:
        raise subprocess.CalledProcessError(status, argv)


def _log(c: GoBinary, msg: str) -> None:
    print(f"[{c.name}] {msg}", file=sys.stderr, flush=True)

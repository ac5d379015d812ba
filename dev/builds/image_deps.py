#!/usr/bin/env python3
"""Do the packages images/vllm-epd pins resolve together with the vLLM of its base image?

The vLLM worker image (`images/vllm-epd/Dockerfile`) is the upstream vLLM image plus pinned transfer
engines (NIXL, the Mooncake transfer engine). No Docker here, so this asks pip instead: a dry-run
install of ``vllm==<the base image's tag>`` with those pins, for the image's Python and platform
(Linux x86-64, manylinux), wheels only, nothing installed. pip's resolver fails when any of them
conflict, exactly as `pip install` in the image build would. Needs PyPI (about 2 minutes, metadata
only); `make image-deps` runs it.

Usage: ``python -m dev.builds.image_deps`` -- prints the resolved versions of the pinned packages and torch.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[2] / "images" / "vllm-epd" / "Dockerfile"
# The upstream vllm/vllm-openai images run Python 3.12 on glibc >= 2.35 (Ubuntu 22.04 and later).
IMAGE_PYTHON = "3.12"
IMAGE_PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(17, 40)] + ["manylinux2014_x86_64", "linux_x86_64"]


def dockerfile_args(text: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))


def image_requirements(text: str) -> list[str]:
    """`vllm==<tag>` of the base image, and the packages the Dockerfile installs on top, as pinned."""
    args = dockerfile_args(text)
    tag = args["VLLM_IMAGE"].rsplit(":", 1)[1].removeprefix("v")
    installs = re.findall(r'"([A-Za-z0-9${}_.-]+==[A-Za-z0-9${}_.-]+)"', text)
    if not installs:
        raise ValueError(f"{DOCKERFILE}: no pinned pip install found")
    expanded = [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], spec) for spec in installs]
    return [f"vllm=={tag}", *expanded]


def resolve(requirements: list[str]) -> dict[str, str]:
    """pip's resolution (name -> version) of `requirements` for the image; raises with pip's reason."""
    platforms = [arg for platform in IMAGE_PLATFORMS for arg in ("--platform", platform)]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
            + ["--python-version", IMAGE_PYTHON, *platforms, "--only-binary=:all:", "--report", str(report)]
            + requirements,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(requirements)} do not resolve together:\n{done.stderr.strip()}")
        installs = json.loads(report.read_text())["install"]
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in installs}


def main() -> int:
    requirements = image_requirements(DOCKERFILE.read_text())
    print(f"resolving {' '.join(requirements)} for Python {IMAGE_PYTHON} on Linux x86-64 (pip --dry-run) ...")
    try:
        resolved = resolve(requirements)
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    names = [spec.split("==")[0].lower() for spec in requirements] + ["torch"]
    print(f"they resolve together ({len(resolved)} packages): " + ", ".join(f"{n} {resolved[n]}" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())

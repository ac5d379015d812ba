"""The real kubectl as tests run it: async (an operator run in-process shares the test's event loop),
failing with kubectl's own error text."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest

needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


async def kubectl(kube_env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    process = await asyncio.create_subprocess_exec(
        "kubectl",
        *args,
        env=kube_env,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await process.communicate(stdin.encode() if stdin is not None else None)
    assert process.returncode == 0, f"kubectl {' '.join(args)} failed: {err.decode()}"
    return out.decode()

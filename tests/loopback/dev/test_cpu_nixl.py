"""The local runner's NIXL adaptations (`dev/builds/cpu_vllm/sitecustomize.py`) against stand-in modules.

The stand-ins have the shape of the two hook points (vLLM's `CpuPlatform.discover_numa_topology`,
NIXL's `_api` creating an agent through `nixlBind.nixlAgent` after setting `pthrDelay = 0`); the
e2e E/P/D test sees the same log lines from real vLLM and NIXL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from dev.local.plan import CPU_VLLM_DIR

STAND_INS = {
    "vllm/__init__.py": "",
    "vllm/platforms/__init__.py": "",
    "vllm/platforms/cpu.py": """
        class CpuPlatform:
            @classmethod
            def discover_numa_topology(cls):
                return [[0, 1]]
    """,
    "nixl_cu13/__init__.py": "",
    "nixl_cu13/_bindings.py": """
        class nixlAgentConfig:
            pthrDelay = None
        DRAM_SEG = "dram"
        def nixlAgent(name, config):
            return (name, config.pthrDelay)
    """,
    "nixl_cu13/_api.py": """
        from . import _bindings as nixlBind
        def nixl_agent(name):
            config = nixlBind.nixlAgentConfig()
            config.pthrDelay = 0
            return nixlBind.nixlAgent(name, config)
    """,
}
PROBE = """
import json
from vllm.platforms.cpu import CpuPlatform
from nixl_cu13 import _api
print(json.dumps([CpuPlatform.discover_numa_topology(), _api.nixl_agent("a"), _api.nixlBind.DRAM_SEG]))
"""


def run_probe(tmp_path: Path, **env: str) -> tuple[list, str]:
    for name, text in STAND_INS.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EPD_LOCAL_NIXL_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**clean, "PYTHONPATH": f"{CPU_VLLM_DIR}{os.pathsep}{tmp_path}", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout), done.stderr


def test_both_adaptations_apply_when_asked(tmp_path):
    (numa, agent, seg), log = run_probe(
        tmp_path, EPD_LOCAL_NIXL_NO_CORE_RESERVATION="1", EPD_LOCAL_NIXL_PROGRESS_DELAY_US="1000"
    )
    assert numa == []  # no core to reserve: nothing is pinned
    assert agent == ["a", 1000]  # the agent was created with the delay, not 0
    assert seg == "dram"  # the rest of the bindings unchanged
    assert "core reservation off" in log and "progress-thread delay 1000 us" in log


def test_nothing_changes_without_the_variables(tmp_path):
    (numa, agent, _), log = run_probe(tmp_path)
    assert numa == [[0, 1]]
    assert agent == ["a", 0]
    assert log == ""

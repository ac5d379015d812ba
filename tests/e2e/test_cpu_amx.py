"""The vLLM CPU venv asks for the AMX tile state in every process it starts (`dev/builds/cpu_vllm/amx.py`).

On an Intel CPU with AMX, vLLM 0.32's CPU attention kernel runs AMX instructions in the engine's
worker without asking Linux for the tile state first, and the kernel kills the worker with SIGILL
(the E/P/D NIXL tests' decode worker, on its first step after a KV load). The venv's
``epd_cpu_amx.pth`` asks at interpreter start; these tests check that it ran in the venv's
interpreter and in a process started the way vLLM starts its engine core (multiprocessing's spawn),
and, on a CPU with AMX, that the permission is held there.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from dev.builds import venv

pytestmark = pytest.mark.usefixtures("vllm_ready")

PROBE = """
import json, multiprocessing, sys

def report():
    module = sys.modules.get("epd_cpu_amx")
    if module is None:
        return {"loaded": False}
    return {"loaded": True, "state": module.STATE, "granted": module.granted()}

def child(queue):
    queue.put(report())

if __name__ == "__main__":
    spawn = multiprocessing.get_context("spawn")
    queue = spawn.Queue()
    worker = spawn.Process(target=child, args=(queue,))
    worker.start()
    spawned = queue.get(timeout=60)
    worker.join(timeout=60)
    print(json.dumps({"main": report(), "spawned": spawned}))
"""


def _cpu_has_amx() -> bool:
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("flags"):
                return "amx_tile" in line.split(":", 1)[1].split()
    return False


@pytest.fixture(scope="module")
def processes(tmp_path_factory) -> dict[str, dict]:
    script = tmp_path_factory.mktemp("amx") / "probe.py"
    script.write_text(PROBE)
    out = subprocess.run([str(venv.python()), str(script)], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def test_every_process_of_the_venv_runs_the_request(processes):
    expected = "granted" if _cpu_has_amx() else "no AMX"
    for name, report in processes.items():
        assert report["loaded"], f"{name}: epd_cpu_amx was not imported at start (the venv's .pth is missing)"
        assert report["state"] == expected, f"{name}: {report}"


def test_vllm_processes_hold_the_amx_permission(processes):
    if not _cpu_has_amx():
        pytest.skip(
            "this CPU has no AMX (no amx_tile in /proc/cpuinfo): there is no tile state to ask for, and "
            "vLLM's CPU kernels take no AMX path here; the request is checked on Intel CPUs with AMX"
        )
    for name, report in processes.items():
        assert report["granted"], (
            f"{name}: ARCH_GET_XCOMP_PERM lacks XTILEDATA: vLLM's AMX kernels would die with SIGILL"
        )

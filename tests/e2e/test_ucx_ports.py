"""UCX, as the vLLM image's NIXL ships it, listens only on the TCP ports the NetworkPolicies admit.

Two NIXL agents with the UCX backend are created in one process of the vLLM CPU venv, with the UCX
settings a rendered NIXL pod gets (`UCX_TLS`, `UCX_TCP_PORT_RANGE`, read from the rendered E/P/D
example, so a changed range is what is checked); every TCP socket the process then listens on lies in
that range, which `{name}-prefill-transfer` and `{name}-decode-transfer` admit
(tests/unit/render/test_network_policy.py checks the policies against the same env). Without the range
UCX listens wherever the kernel puts it, and no policy could name the port.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from dev.builds import venv
from epd_operator.render import render
from tests.support.render_examples import LOCAL_CPU_NIXL, example

pytestmark = [pytest.mark.usefixtures("vllm_ready"), pytest.mark.timeout(300)]

_AGENTS = """
import json, os
from nixl._api import nixl_agent, nixl_agent_config
agents = [nixl_agent(name, nixl_agent_config(backends=["UCX"])) for name in ("prefill", "decode")]
inodes = set()
for fd in os.listdir("/proc/self/fd"):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
    if target.startswith("socket:["):
        inodes.add(target[8:-1])
ports = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN, one of this process's sockets
            ports.append(int(fields[1].rsplit(":", 1)[1], 16))
print(json.dumps(ports), flush=True)
os._exit(0)  # NIXL's teardown at interpreter exit crashes on CPU; the answer is out
"""


def _rendered_ucx_env() -> dict[str, str]:
    for obj in render(example(LOCAL_CPU_NIXL)):
        if obj["kind"] == "Deployment" and obj["metadata"]["name"].endswith("-prefill"):
            env = obj["spec"]["template"]["spec"]["containers"][0]["env"]
            return {e["name"]: e["value"] for e in env if e["name"].startswith("UCX_")}
    raise AssertionError("no prefill Deployment")


def _listening(env: dict[str, str]) -> list[int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    out = subprocess.run(
        [str(venv.ensure()), "-c", _AGENTS], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def test_nixl_ucx_listens_only_in_the_rendered_range():
    env = _rendered_ucx_env()
    first, last = (int(p) for p in env["UCX_TCP_PORT_RANGE"].split("-"))
    ports = _listening(env)
    assert ports, "UCX's TCP transport listened on nothing: the check would prove nothing"
    assert all(first <= port <= last for port in ports), (ports, env["UCX_TCP_PORT_RANGE"])


def test_without_the_range_ucx_listens_where_the_kernel_puts_it():
    env = {k: v for k, v in _rendered_ucx_env().items() if k != "UCX_TCP_PORT_RANGE"}
    first, last = (int(p) for p in _rendered_ucx_env()["UCX_TCP_PORT_RANGE"].split("-"))
    ports = _listening(env)
    assert ports and any(not first <= port <= last for port in ports), ports

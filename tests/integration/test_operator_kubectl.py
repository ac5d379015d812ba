"""What a user sees with kubectl: `kubectl get epd` columns and `kubectl describe epd` conditions and
events, against the API emulator with the real CRD and the operator running."""
from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest
import yaml

from tests.support.apiserver import StrictKubernetesEmulator
from tests.support.kubectl import kubectl, needs_kubectl
from tests.support.operator_run import NS, epd_crd, epd_doc, observed, operator_in_process, phase, posted, set_deployment_ready
from tests.support.render_examples import NIXL_AUTOSCALED

pytestmark = needs_kubectl


@pytest.fixture
async def cluster(apiserver: StrictKubernetesEmulator, apiserver_url: str) -> AsyncIterator[StrictKubernetesEmulator]:
    apiserver.create_object(epd_crd())
    async with operator_in_process(apiserver_url, "--namespace", NS, "--no-leader-election"):
        yield apiserver


async def test_kubectl_get_shows_topology_tiers_and_phase(cluster, apiserver_url, kube_env):
    out = await kubectl(kube_env, "apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump(epd_doc(NIXL_AUTOSCALED)))
    assert "epddeployment.serving.epd.dev/vl created" in out
    await observed(cluster, 1)

    header, row = (await kubectl(kube_env, "get", "epd")).splitlines()[:2]
    assert header.split() == ["NAME", "TOPOLOGY", "ENCODER", "PREFILL", "DECODE", "PHASE", "AGE"]
    assert row.split()[:6] == ["vl", "E/P/D", "0/1", "0/2", "0/2", "Progressing"]
    assert re.fullmatch(r"\d+[smhd]", row.split()[6])  # the CRD's own Age column, as an age

    for name in ("vl-encoder", "vl-prefill", "vl-decode", "vl-router"):
        await set_deployment_ready(apiserver_url, NS, name)
    await phase(cluster, "Ready")
    wide = (await kubectl(kube_env, "get", "epd", "-o", "wide")).splitlines()
    assert wide[0].split()[:8] == ["NAME", "TOPOLOGY", "ENCODER", "PREFILL", "DECODE", "PHASE", "ENDPOINT", "MODEL"]
    assert wide[1].split()[:8] == ["vl", "E/P/D", "1/1", "2/2", "2/2", "Ready", "http://vl.default.svc",
                                   "Qwen/Qwen2.5-VL-7B-Instruct"]


async def test_kubectl_describe_shows_conditions_and_events(cluster, apiserver_url, kube_env):
    await kubectl(kube_env, "apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump(epd_doc()))
    await observed(cluster, 1)
    await posted(cluster, "Normal", "Applied")
    text = await kubectl(kube_env, "describe", "epd", "vl")
    conditions = text[text.index("Conditions:"):]
    for field, value in (("Type", "Ready"), ("Type", "Progressing"), ("Type", "Degraded"), ("Type", "SpecValid"),
                         ("Reason", "RollingOut"), ("Message", "rolling out: encoder 0/1")):
        assert re.search(rf"{field}:\s+{value}", conditions), (field, value)
    events = text[text.index("Events:"):]
    assert re.search(r"Normal\s+Applied\s+\S+\s+epd-operator\s+.*Deployment vl-encoder created", events), events

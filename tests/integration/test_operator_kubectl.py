"""What a user sees with the real kubectl against the real API server, the operator running:
`kubectl get epd` columns (the CRD's printer columns, as the server's Table), `kubectl get epd -w`,
and `kubectl describe epd` conditions and events."""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import AsyncIterator

import pytest
import yaml

from tests.support.cluster import KubeView, volumes
from tests.support.operator_run import epd_doc, observed, operator_in_process, phase, posted, wait_until
from tests.support.render_examples import NIXL_AUTOSCALED


@pytest.fixture
async def ns(kube: KubeView) -> AsyncIterator[KubeView]:
    volumes(kube, "ec-cache", "models")
    async with operator_in_process(kube, "--namespace", kube.ns, "--no-leader-election", "--resync-seconds", "0.5"):
        yield kube


async def test_kubectl_get_shows_topology_tiers_and_phase(ns):
    out = ns.kubectl("apply", "-f", "-", input=yaml.safe_dump(epd_doc(NIXL_AUTOSCALED))).stdout
    assert "epddeployment.serving.epd.dev/vl created" in out
    await observed(ns, 1)

    header = ns.kubectl("get", "epd").stdout.splitlines()[0]
    assert header.split() == ["NAME", "TOPOLOGY", "ENCODER", "PREFILL", "DECODE", "PHASE", "AGE"]
    # Every tier ready, but this cluster serves no custom metrics API: the encoder HPA cannot read its
    # load, so the phase is Degraded (test_autoscaling_status.py).
    await phase(ns, "Degraded", timeout=60)
    await wait_until(
        lambda: ns.kubectl("get", "epd").stdout.splitlines()[1].split()[1:5] == ["E/P/D", "2/2", "2/2", "2/2"], 60
    )
    row = ns.kubectl("get", "epd").stdout.splitlines()[1].split()
    assert row[:6] == ["vl", "E/P/D", "2/2", "2/2", "2/2", "Degraded"]
    assert re.fullmatch(r"\d+[smhd]", row[6])  # the CRD's own Age column, as an age
    wide = ns.kubectl("get", "epd", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[:8] == ["NAME", "TOPOLOGY", "ENCODER", "PREFILL", "DECODE", "PHASE", "ENDPOINT", "MODEL"]
    assert wide[1].split()[:8] == [
        "vl",
        "E/P/D",
        "2/2",
        "2/2",
        "2/2",
        "Degraded",
        f"http://vl.{ns.ns}.svc",
        "Qwen/Qwen2.5-VL-7B-Instruct",
    ]


async def test_kubectl_get_watch_goes_progressing_to_ready(ns):
    argv = [
        str(ns.cluster.kubectl_path),
        "--kubeconfig",
        str(ns.kubeconfig),
        "get",
        "epd",
        "-w",
        "--output-watch-events",
        "--request-timeout=60s",
    ]
    watch = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(watch.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        ns.kubectl("apply", "-f", "-", input=yaml.safe_dump(epd_doc()))
        await phase(ns, "Ready", timeout=60)
        # kubectl prints the Ready event a moment after the API server serves it: read until it has.
        await wait_until(lambda: any("Ready" in line.split() for line in list(lines)), 30, lambda: "".join(lines))
    finally:
        watch.terminate()
        watch.wait(timeout=10)
        reader.join(timeout=10)
        watch.stdout.close()  # type: ignore[union-attr]
    out = "".join(lines)
    known = {"Pending", "Progressing", "Ready", "Degraded", "Failed"}
    phases = [
        word for line in out.splitlines() if line.split()[1:2] == ["vl"] for word in line.split() if word in known
    ]
    assert "Progressing" in phases and phases[-1] == "Ready", out
    assert phases.index("Progressing") < phases.index("Ready"), out


async def test_kubectl_describe_shows_conditions_and_events(ns):
    ns.kubectl("apply", "-f", "-", input=yaml.safe_dump(epd_doc()))
    await observed(ns, 1)
    await posted(ns, "Normal", "Applied")
    await phase(ns, "Ready", timeout=60)
    await posted(ns, "Normal", "Ready")
    text = ns.kubectl("describe", "epd", "vl").stdout
    conditions = text[text.index("Conditions:") :]
    for field, value in (
        ("Type", "Ready"),
        ("Type", "Progressing"),
        ("Type", "Degraded"),
        ("Type", "SpecValid"),
        ("Reason", "AllTiersReady"),
        ("Message", "every tier has its pods ready"),
    ):
        assert re.search(rf"{field}:\s+{value}", conditions), (field, value, conditions)
    events = text[text.index("Events:") :]
    assert re.search(r"Normal\s+Applied\s+\S+\s+epd-operator\s+.*Deployment vl-encoder created", events), events
    assert re.search(r"Normal\s+Ready\s+\S+\s+epd-operator\s+every tier has its pods ready", events), events


async def test_kubectl_apply_of_a_bad_spec_names_the_field(ns):
    doc = epd_doc()
    doc["spec"]["kvTransfer"] = {"connector": "Nixl"}
    result = ns.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert result.returncode == 1
    assert (
        'The EPDDeployment "vl" is invalid: spec.kvTransfer: Forbidden: kvTransfer moves KV from prefill to decode'
        in result.stderr
    ), result.stderr
    await wait_until(lambda: ns.kubectl("get", "epd", "-o", "name").stdout == "", 5)

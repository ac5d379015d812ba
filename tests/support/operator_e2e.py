"""The operator's lifecycle on a cluster, as a user drives it with kubectl: an example applied, its
tiers owned and reported in status, then deleted and collected. One body for every cluster provider:
kind (tests/e2e/kind) and the local cluster's real node (tests/node/test_operator_on_real_node.py).

vLLM pods cannot become ready without GPUs and model weights there, so the checks stop at what the
operator controls: objects, owner references, status and events.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "epd-nixl-autoscaled.yaml"
NAMESPACE = "epd-e2e"


def sh(*cmd: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout: float = 600) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, input=stdin, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def get_json(env: dict[str, str], *args: str) -> dict:
    return json.loads(sh("kubectl", "get", *args, "-n", NAMESPACE, "-o", "json", env=env))


def wait_for(check, timeout: float = 180, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(2)


def an_example_becomes_owned_tiers_with_status_and_is_collected_on_delete(env: dict[str, str]) -> None:
    """`env`: the environment kubectl runs in (KUBECONFIG; kubectl on PATH), the operator installed
    and the namespace NAMESPACE created."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = NAMESPACE
    sh("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(doc), env=env)
    name = doc["metadata"]["name"]

    def status() -> dict:
        return get_json(env, "epd", name).get("status", {})

    wait_for(lambda: status().get("observedGeneration") == 1, what="the operator to reconcile the example")
    epd = get_json(env, "epd", name)
    assert status()["topology"] == "E/P/D"
    # AutoscalingActive: the example autoscales its encoders
    assert {c["type"] for c in status()["conditions"]} == {
        "Ready",
        "Progressing",
        "Degraded",
        "SpecValid",
        "AutoscalingActive",
    }

    deployments = get_json(env, "deployments", "-l", f"app.kubernetes.io/instance={name}")["items"]
    assert {d["metadata"]["name"] for d in deployments} == {
        f"{name}-{t}" for t in ("encoder", "prefill", "decode", "router")
    }
    for dep in deployments:
        assert dep["metadata"]["ownerReferences"][0]["uid"] == epd["metadata"]["uid"]
    hpa = get_json(env, "hpa", f"{name}-encoder")
    assert hpa["spec"]["minReplicas"] == 2
    table = sh("kubectl", "get", "epd", "-n", NAMESPACE, env=env)
    assert table.split()[:6] == ["NAME", "TOPOLOGY", "ENCODER", "PREFILL", "DECODE", "PHASE"]

    sh("kubectl", "delete", "epd", name, "-n", NAMESPACE, "--wait=true", env=env)
    wait_for(
        lambda: not get_json(env, "deployments", "-l", f"app.kubernetes.io/instance={name}")["items"],
        what="garbage collection of the tiers",
    )

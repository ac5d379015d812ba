"""The local runner's plan: rendered Deployments -> local command lines, changed only where documented.

No processes are started here; the e2e tests run these plans on real vLLM.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from dev.local.cpu_sizing import fit_to_cpu
from dev.local.plan import (
    CPU_KV_BLOCK_SIZE,
    CPU_NIXL_ENV,
    LocalPlan,
    PlanError,
    expand_vars,
    flag_value,
    plan,
)
from dev.local.runner import load_spec
from epd_operator.api import parse_epd
from epd_operator.render import render

EXAMPLES = Path(__file__).parents[3] / "examples"
MODEL = Path("/cache/tiny-model")
WORKDIR = Path("/work/run")
# Flags whose values the plan substitutes; every other rendered flag must reach vLLM unchanged.
SUBSTITUTED = {"--port", "--ec-transfer-config", "--tensor-parallel-size"}


def local_plan(example: str) -> LocalPlan:
    ports = itertools.count(41000)
    objects = render(parse_epd(load_spec(EXAMPLES / example)))
    return plan(
        objects,
        model_dir=MODEL,
        workdir=WORKDIR,
        vllm=Path("/venv/bin/vllm"),
        router=["epd-router"],
        pick_port=lambda: next(ports),
    )


def flags(argv: list[str]) -> list[tuple[str, str | None]]:
    """(flag, value) pairs in order; a flag followed by another flag has no value."""
    pairs = []
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            pairs.append((arg, None if nxt is None or nxt.startswith("--") else nxt))
    return pairs


@pytest.fixture(scope="module")
def e_pd() -> LocalPlan:
    return local_plan("epd-shared-storage.yaml")


@pytest.fixture(scope="module")
def e_p_d() -> LocalPlan:
    return local_plan("epd-nixl-autoscaled.yaml")


@pytest.mark.parametrize("example", ["epd-shared-storage.yaml", "epd-nixl-autoscaled.yaml"])
def test_vllm_flags_reach_vllm_as_rendered(example):
    for process in local_plan(example).processes:
        if process.role == "router":
            continue
        rendered = [(f, v) for f, v in flags(process.rendered_argv) if f not in SUBSTITUTED]
        local = [(f, v) for f, v in flags(process.argv) if f not in SUBSTITUTED]
        assert local[: len(rendered)] == rendered, process.role
        assert process.argv[:3] == ["/venv/bin/vllm", "serve", str(MODEL)]


def test_e_pd_shares_one_local_store_between_encoder_and_pd(e_pd):
    assert e_pd.topology == "E+PD"
    assert [p.role for p in e_pd.processes] == ["encoder", "decode", "router"]
    configs = {p.role: json.loads(flag_value(p.argv, "--ec-transfer-config") or "null") for p in e_pd.processes[:2]}
    store = str(WORKDIR / "volumes" / "pvc" / "ec-cache")
    assert {role: c["ec_connector_extra_config"]["shared_storage_path"] for role, c in configs.items()} == {
        "encoder": store,
        "decode": store,
    }
    assert {role: c["ec_role"] for role, c in configs.items()} == {"encoder": "ec_producer", "decode": "ec_consumer"}
    assert e_pd.volume("pvc/ec-cache") == Path(store)


def test_every_process_gets_its_own_loopback_port(e_pd):
    ports = [p.port for p in e_pd.processes]
    assert len(set(ports)) == len(ports)
    for p in e_pd.processes:
        assert flag_value(p.argv, "--port") == str(p.port)
        assert p.url == f"http://127.0.0.1:{p.port}"


def test_router_gets_static_urls_instead_of_discovery(e_pd):
    router = e_pd.one("router")
    assert flag_value(router.argv, "--encode-servers-urls") == e_pd.one("encoder").url
    assert flag_value(router.argv, "--decode-servers-urls") == e_pd.one("decode").url
    assert flag_value(router.argv, "--prefill-servers-urls") == "disable"
    assert flag_value(router.argv, "--host") == "127.0.0.1"
    assert not {"--discovery", "--encoder-selector", "--decode-selector", "--namespace"} & set(router.argv)
    # Routing behaviour stays as rendered.
    for flag in ("--encoder-policy", "--pd-policy", "--reuse-ttl", "--rewrite"):
        assert flag_value(router.argv, flag) == flag_value(router.rendered_argv, flag)


def test_e_p_d_moves_kv_over_the_rendered_nixl_connector(e_p_d):
    assert e_p_d.topology == "E/P/D"
    for role in ("prefill", "decode"):
        process = e_p_d.one(role)
        rendered = flag_value(process.rendered_argv, "--kv-transfer-config")
        assert rendered is not None and json.loads(rendered)["kv_connector"] == "NixlConnector"
        assert flag_value(process.argv, "--kv-transfer-config") == rendered
        assert flag_value(process.argv, "--block-size") == str(CPU_KV_BLOCK_SIZE)
    assert flag_value(e_p_d.one("decode").argv, "--tensor-parallel-size") == "1"


def test_nixl_tiers_get_the_cpu_adaptations_and_only_locally(e_p_d):
    """The two adaptations reach the NIXL tiers' environment (a recorded deviation) and nothing else."""
    for role in ("prefill", "decode"):
        process = e_p_d.one(role)
        assert {k: process.env[k] for k in CPU_NIXL_ENV} == CPU_NIXL_ENV
        assert (Path(process.env["PYTHONPATH"]) / "sitecustomize.py").is_file()
        assert any("progress-thread delay" in note and "not pinned" in note for note in process.deviations)
    assert not set(CPU_NIXL_ENV) & set(e_p_d.one("encoder").env)
    rendered_env = {
        var["name"]
        for obj in render(parse_epd(load_spec(EXAMPLES / "epd-nixl-autoscaled.yaml")))
        if obj["kind"] == "Deployment"
        for c in obj["spec"]["template"]["spec"]["containers"]
        for var in c.get("env", [])
    }
    assert not set(CPU_NIXL_ENV) & rendered_env


def test_pod_ip_and_side_channel_ports_become_local(e_p_d):
    envs = {role: e_p_d.one(role).env for role in ("prefill", "decode")}
    assert {env["VLLM_NIXL_SIDE_CHANNEL_HOST"] for env in envs.values()} == {"127.0.0.1"}
    ports = [env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for env in envs.values()]
    assert len(set(ports)) == 2 and "5600" not in ports


def test_cpu_environment_is_set_on_vllm_tiers(e_pd):
    for role in ("encoder", "decode"):
        env = e_pd.one(role).env
        assert env["OMP_NUM_THREADS"] == "1" and env["HF_HUB_OFFLINE"] == "1"


def test_connectors_that_cannot_run_here_are_refused():
    with pytest.raises(PlanError, match="cannot run"):
        local_plan("epd-mooncake.yaml")


def test_a_multi_node_tier_is_refused_with_what_to_change():
    with pytest.raises(PlanError, match=r"qwen-vl-72b-decode spans several nodes .* nodesPerReplica: 1"):
        local_plan("epd-multi-node.yaml")


def test_kubelet_variable_expansion():
    env = {"POD_IP": "127.0.0.1"}
    assert expand_vars("$(POD_IP):5600", env) == "127.0.0.1:5600"
    assert expand_vars("$$(POD_IP)", env) == "$(POD_IP)"
    assert expand_vars("$(UNSET)", env) == "$(UNSET)"


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_cpu_sizing_keeps_every_example_valid(example):
    spec, changes = fit_to_cpu(load_spec(EXAMPLES / example))
    parse_epd(spec)
    assert any("--enforce-eager" in change for change in changes)

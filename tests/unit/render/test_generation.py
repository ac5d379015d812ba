"""The compatibility generation: which changes make old and new pods unable to exchange embeddings or
KV (so every vLLM tier rolls and the router keeps requests within one generation), and which do not;
and the drain every vLLM pod gets on its way out."""

from __future__ import annotations

import hashlib
import json

import pytest

from epd_operator.render import render
from epd_operator.render.generation import compatibility_generation
from tests.support.render_examples import MOONCAKE, NIXL_AUTOSCALED, SHARED_STORAGE, example

GENERATION = "serving.epd.dev/compat-generation"


def pod_generations(objects: list[dict]) -> dict[str, str | None]:
    return {
        obj["metadata"]["labels"]["serving.epd.dev/role"]: obj["spec"]["template"]["metadata"]["labels"].get(GENERATION)
        for obj in objects
        if obj["kind"] == "Deployment"
    }


def test_every_vllm_pod_carries_one_generation_and_the_router_none():
    generations = pod_generations(render(example(NIXL_AUTOSCALED)))
    assert generations["router"] is None
    vllm = {generations[role] for role in ("encoder", "prefill", "decode")}
    assert len(vllm) == 1
    (value,) = vllm
    assert value is not None and len(value) == 10 and all(c in "0123456789abcdef" for c in value)


def test_the_generation_is_a_digest_of_model_images_and_connectors_only():
    # Worked by hand from the shared-storage example: the model, each tier's image (none set per tier),
    # the EC connector with the janitor's settings left out, no KV connector (E+PD).
    inputs = {
        "model": "Qwen/Qwen2.5-VL-7B-Instruct",
        "source": None,
        "images": {"encoder": "vllm/vllm-openai:v0.33.0", "decode": "vllm/vllm-openai:v0.33.0"},
        "ecTransfer": {"connector": "SharedStorage", "sharedStorage": {"claimName": "ec-cache", "path": "/ec-cache"}},
        "kvTransfer": None,
    }
    expected = hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:10]
    assert compatibility_generation(example(SHARED_STORAGE)) == expected


@pytest.mark.parametrize(
    ("changes", "new_generation"),
    [
        ({"spec.image": "vllm/vllm-openai:v0.33.1"}, True),
        ({"spec.encoder.image": "registry.local/vllm:patched"}, True),
        ({"spec.model.name": "Qwen/Qwen2.5-VL-3B-Instruct"}, True),
        ({"spec.kvTransfer.nixl.ucxTls": "rc,cuda_copy"}, True),
        ({"spec.kvTransfer.nixl.bufferDevice": "cpu"}, True),
        ({"spec.ecTransfer.sharedStorage.path": "/cache"}, True),
        # the decode learns the prefill's side-channel port from each request's kv_transfer_params
        ({"spec.kvTransfer.nixl.sideChannelPort": 5700}, False),
        # the janitor's bounds: producers and consumers read and write the same files either way
        ({"spec.ecTransfer.sharedStorage.ttlSeconds": 1200}, False),
        ({"spec.ecTransfer.sharedStorage.maxSize": "100Gi"}, False),
        ({"spec.decode.replicas": 7}, False),
        ({"spec.decode.gpuMemoryUtilization": 0.8}, False),
        ({"spec.model.maxModelLen": 8192}, False),
        ({"spec.router.replicas": 3}, False),
        ({"spec.drainSeconds": 30}, False),
    ],
)
def test_which_changes_start_a_new_generation(changes, new_generation):
    before = compatibility_generation(example(NIXL_AUTOSCALED))
    after = compatibility_generation(example(NIXL_AUTOSCALED, **changes))
    assert (before != after) is new_generation, changes


def test_the_mooncake_masters_placement_is_not_part_of_the_handshake():
    before = compatibility_generation(example(MOONCAKE))
    moved = example(MOONCAKE, **{"spec.ecTransfer.mooncake.master": {"nodeSelector": {"pool": "cpu"}}})
    assert compatibility_generation(moved) == before
    assert compatibility_generation(example(MOONCAKE, **{"spec.ecTransfer.mooncake.protocol": "rdma"})) != before


def test_users_cannot_set_the_generation_label_themselves():
    from epd_operator.api.validation import SpecError, parse_epd
    from tests.support.render_examples import example_document

    doc = example_document(SHARED_STORAGE)
    doc["spec"]["encoder"]["podLabels"] = {GENERATION: "old"}
    with pytest.raises(SpecError) as refused:
        parse_epd(doc)
    assert "podLabels" in str(refused.value) and GENERATION in str(refused.value)


def test_vllm_pods_drain_before_they_go():
    objects = render(example(SHARED_STORAGE, **{"spec.drainSeconds": 45}))
    for obj in objects:
        if obj["kind"] != "Deployment":
            continue
        pod = obj["spec"]["template"]["spec"]
        role = obj["metadata"]["labels"]["serving.epd.dev/role"]
        vllm = pod["containers"][0]
        if role == "router":  # its own drain (test_manifests.py), whatever the vLLM tiers' drainSeconds
            assert pod["terminationGracePeriodSeconds"] == 40
            continue
        assert vllm["lifecycle"] == {"preStop": {"sleep": {"seconds": 10}}}
        args = vllm["args"]
        assert args[args.index("--shutdown-timeout") + 1] == "45"
        # 10 s for the routers to see the pod terminating, 45 s of drain, 30 s to exit
        assert pod["terminationGracePeriodSeconds"] == 85


def test_drain_zero_aborts_in_flight_work_as_vllm_does_by_default():
    objects = render(example(SHARED_STORAGE, **{"spec.drainSeconds": 0}))
    decode = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "qwen-vl-decode")
    assert "--shutdown-timeout" not in decode["spec"]["template"]["spec"]["containers"][0]["args"]
    assert decode["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 40

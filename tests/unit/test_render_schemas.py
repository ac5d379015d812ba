"""Every object rendered from every example is valid Kubernetes, in strict mode (unknown fields refused),
for the oldest Kubernetes we support and the newest `kubernetes-validate` ships."""
from __future__ import annotations

import functools

import kubernetes_validate
import kubernetes_validate.utils
import pytest
from kubernetes_validate.utils import latest_version

from epd_operator.api import parse_epd
from epd_operator.render import render
from tests.support.render_examples import (MOONCAKE, NIXL_AUTOSCALED, SHARED_STORAGE, example, example_document,
                                           example_files)

OLDEST_SUPPORTED = "1.30"
NEWEST = latest_version()

# Specs that reach the branches the examples leave out.
VARIANTS = {
    "mooncake-rdma-no-store": lambda: example(MOONCAKE, **{"spec.ecTransfer.mooncake": {"protocol": "rdma"}}),
    "everything-autoscaled": lambda: example(NIXL_AUTOSCALED, **{
        "spec.prefill.autoscaling": {"maxReplicas": 4},
        "spec.decode.autoscaling": {"minReplicas": 2, "maxReplicas": 6},
        "spec.router.autoscaling": {"maxReplicas": 3},
        "spec.router.env": [{"name": "LOG", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}],
    }),
    "placement": lambda: example(SHARED_STORAGE, **{
        "spec.decode.tolerations": [{"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoExecute",
                                     "tolerationSeconds": 60}],
        "spec.decode.affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}},
        "spec.imagePullSecrets": ["regcred"],
        "spec.router.service": {"type": "NodePort", "port": 30080, "annotations": {"x": "y"}},
    }),
}


@pytest.fixture(autouse=True, scope="module")
def _schemas_read_once():
    # kubernetes-validate re-reads its multi-megabyte definitions file for every object; the
    # files never change, so read each once.
    original = kubernetes_validate.utils.schema_contents
    kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(original)
    yield
    kubernetes_validate.utils.schema_contents = original


def _cases():
    cases = [(path.name, lambda name=path.name: parse_epd(example_document(name))) for path in example_files()]
    return cases + list(VARIANTS.items())


@pytest.mark.parametrize("version", [OLDEST_SUPPORTED, NEWEST])
@pytest.mark.parametrize(("case", "build"), _cases(), ids=[name for name, _ in _cases()])
def test_rendered_objects_are_strictly_valid(case, build, version):
    problems = []
    for obj in render(build()):
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            problems.append(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {exc.message}")
    assert not problems, "\n".join(problems)


def test_newest_schemas_are_at_least_1_37():
    assert tuple(map(int, NEWEST.split(".")[:2])) >= (1, 37)


def test_strict_mode_refuses_an_unknown_field():
    deployment = next(obj for obj in render(example(SHARED_STORAGE)) if obj["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["argz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, NEWEST, strict=True)

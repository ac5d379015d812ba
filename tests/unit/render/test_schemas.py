"""Every object rendered from every example is valid Kubernetes, in strict mode (unknown fields refused),
for the oldest Kubernetes we support and the newest `kubernetes-validate` ships. A LeaderWorkerSet's pod
templates are checked here; the LeaderWorkerSet itself against its project's CRD needs that CRD from its Go
module (tests/integration/test_lws_schema.py), as a KEDA ScaledObject against KEDA's
(tests/integration/test_keda_schema.py)."""

from __future__ import annotations

import functools

import kubernetes_validate
import kubernetes_validate.utils
import pytest
from kubernetes_validate.utils import latest_version

from dev.builds.k8s_binaries import OLDEST, minor
from epd_operator.api import EPDDeployment, parse_epd
from epd_operator.render import render
from tests.support.render_examples import SHARED_STORAGE, example, example_document, example_files, variants

OLDEST_SUPPORTED = minor(OLDEST)  # the pinned oldest Kubernetes (dev/builds/k8s_binaries.py)
NEWEST = latest_version()


@pytest.fixture(autouse=True, scope="module")
def _schemas_read_once():
    # kubernetes-validate re-reads its multi-megabyte definitions file for every object; the
    # files never change, so read each once.
    original = kubernetes_validate.utils.schema_contents
    kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(original)
    yield
    kubernetes_validate.utils.schema_contents = original


def _specs() -> dict[str, EPDDeployment]:
    return {**{path.name: parse_epd(example_document(path.name)) for path in example_files()}, **variants()}


SPECS = _specs()


def _as_builtin(obj: dict) -> list[dict]:
    """What kubernetes-validate can check: the object itself, or for a LeaderWorkerSet (a custom
    resource it has no schema for) each of its pod templates inside a Deployment."""
    if obj["kind"] == "ScaledObject":
        return []  # KEDA's: checked against KEDA's own CRD (tests/integration/test_keda_schema.py)
    if obj["kind"] == "HTTPRoute":
        return []  # Gateway API's: checked by the API server against its CRDs (tests/integration/test_operator.py)
    if obj["kind"] != "LeaderWorkerSet":
        return [obj]
    lws = obj["spec"]["leaderWorkerTemplate"]
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {**obj["metadata"], "name": f"{obj['metadata']['name']}-{node}"},
            "spec": {"selector": {"matchLabels": template["metadata"]["labels"]}, "template": template},
        }
        for node, template in (("leader", lws["leaderTemplate"]), ("worker", lws["workerTemplate"]))
    ]


@pytest.mark.parametrize("version", [OLDEST_SUPPORTED, NEWEST])
@pytest.mark.parametrize("case", sorted(SPECS))
def test_rendered_objects_are_strictly_valid(case, version):
    problems = []
    for rendered in render(SPECS[case]):
        for obj in _as_builtin(rendered):
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

"""Every object rendered from every example is valid Kubernetes, in strict mode (unknown fields refused),
for the oldest Kubernetes we support and the newest `kubernetes-validate` ships."""

from __future__ import annotations

import functools

import kubernetes_validate
import kubernetes_validate.utils
import pytest
from kubernetes_validate.utils import latest_version

from epd_operator.api import EPDDeployment, parse_epd
from epd_operator.render import render
from tests.support.cluster import lws_crd
from tests.support.crd_schema import validate_custom_object
from tests.support.render_examples import SHARED_STORAGE, example, example_document, example_files, variants

OLDEST_SUPPORTED = "1.34"
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


@functools.lru_cache(maxsize=1)
def _lws_crd() -> dict:
    return lws_crd()


def _as_builtin(obj: dict) -> list[dict]:
    """What kubernetes-validate can check: the object itself, or for a LeaderWorkerSet (a custom
    resource it has no schema for) each of its pod templates inside a Deployment."""
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
        if rendered["kind"] == "LeaderWorkerSet":
            problems += [
                f"LeaderWorkerSet/{rendered['metadata']['name']}: {error}"
                for error in validate_custom_object(_lws_crd(), rendered)
            ]
        for obj in _as_builtin(rendered):
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                problems.append(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {exc.message}")
    assert not problems, "\n".join(problems)


def test_the_lws_schema_check_would_notice_a_bad_field():
    lws = next(obj for obj in render(SPECS["nixl-multi-node-decode-tp4-pp2"]) if obj["kind"] == "LeaderWorkerSet")
    lws["spec"]["startupPolicy"] = "WhenReady"
    lws["spec"]["leaderWorkerTemplate"]["size"] = "two"
    errors = validate_custom_object(_lws_crd(), lws)
    assert any("startupPolicy" in e for e in errors) and any("size" in e for e in errors), errors


def test_newest_schemas_are_at_least_1_37():
    assert tuple(map(int, NEWEST.split(".")[:2])) >= (1, 37)


def test_strict_mode_refuses_an_unknown_field():
    deployment = next(obj for obj in render(example(SHARED_STORAGE)) if obj["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["argz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, NEWEST, strict=True)

"""Every LeaderWorkerSet rendered from every example is valid against the CRD the LeaderWorkerSet project
ships in its Go module (fetched with `go mod download`, as the control plane build fetches its modules)."""

from __future__ import annotations

import functools

import pytest

from epd_operator.api import EPDDeployment, parse_epd
from epd_operator.render import render
from tests.support.cluster import lws_crd
from tests.support.crd_schema import validate_custom_object
from tests.support.render_examples import example_document, example_files, variants


def _specs() -> dict[str, EPDDeployment]:
    return {**{path.name: parse_epd(example_document(path.name)) for path in example_files()}, **variants()}


SPECS = _specs()
WITH_LWS = sorted(name for name, epd in SPECS.items() if any(o["kind"] == "LeaderWorkerSet" for o in render(epd)))


@functools.lru_cache(maxsize=1)
def _lws_crd() -> dict:
    return lws_crd()


def test_some_examples_render_a_leader_worker_set():
    assert WITH_LWS


@pytest.mark.parametrize("case", WITH_LWS)
def test_rendered_leader_worker_sets_are_valid(case):
    problems = [
        f"LeaderWorkerSet/{rendered['metadata']['name']}: {error}"
        for rendered in render(SPECS[case])
        if rendered["kind"] == "LeaderWorkerSet"
        for error in validate_custom_object(_lws_crd(), rendered)
    ]
    assert not problems, "\n".join(problems)


def test_the_lws_schema_check_would_notice_a_bad_field():
    lws = next(obj for obj in render(SPECS["nixl-multi-node-decode-tp4-pp2"]) if obj["kind"] == "LeaderWorkerSet")
    lws["spec"]["startupPolicy"] = "WhenReady"
    lws["spec"]["leaderWorkerTemplate"]["size"] = "two"
    errors = validate_custom_object(_lws_crd(), lws)
    assert any("startupPolicy" in e for e in errors) and any("size" in e for e in errors), errors

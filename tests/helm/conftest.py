"""Fixtures for the chart tests: a real helm of each supported major version."""

from __future__ import annotations

import pytest

from tests.support.helm import HelmUnavailable, ensure_helm

from .charts import Helm

HELM_MAJORS = (3, 4)


@pytest.fixture(scope="session", params=HELM_MAJORS, ids=[f"helm{m}" for m in HELM_MAJORS])
def helm(request: pytest.FixtureRequest) -> Helm:
    try:
        return Helm(ensure_helm(request.param))
    except HelmUnavailable as exc:
        pytest.skip(f"helm {request.param} unavailable: {exc}")

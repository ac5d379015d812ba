"""Which optional kinds the API server serves, and the wait for one that was missing (controller/served_kinds.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from epd_operator.controller import served_kinds
from epd_operator.kube import ApiError

LWS = next(r for r in served_kinds.OPTIONAL if r.kind == "LeaderWorkerSet")
SCALED_OBJECT = next(r for r in served_kinds.OPTIONAL if r.kind == "ScaledObject")


class Answers:
    """A stand-in Kube whose discovery of a group version answers from a script: the resource names it
    serves, an HTTP status, or an error."""

    def __init__(self, **scripts: list[Any]):
        self.scripts = scripts
        self.asked: list[str] = []
        self.error: Exception | None = None

    async def served_resources(self, api_version: str) -> set[str]:
        self.asked.append(api_version)
        kind = next(r.kind for r in served_kinds.OPTIONAL if r.api_version == api_version)
        script = self.scripts[kind]
        answer = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(answer, int):
            self.error = ApiError(answer, {"code": answer}, f"GET {api_version}")
            raise self.error
        if isinstance(answer, Exception):
            self.error = answer
            raise answer
        return set(answer)


def test_the_optional_kinds_are_the_ones_a_cluster_may_lack():
    assert {r.kind for r in served_kinds.OPTIONAL} == {"LeaderWorkerSet", "ScaledObject", "HTTPRoute"}


@pytest.mark.parametrize(
    ("answer", "verdict"),
    [
        (["leaderworkersets", "leaderworkersets/status"], True),
        (["leaderworkersets/status"], False),  # the group version serves other resources, not this one
        ([], False),
        (404, False),
        (403, None),
        (503, None),
        (OSError("refused"), None),
    ],
)
async def test_a_kind_is_served_when_discovery_of_its_group_version_names_it(answer, verdict, caplog):
    kube = Answers(LeaderWorkerSet=[answer])
    with caplog.at_level(logging.DEBUG, logger=served_kinds.__name__):
        assert await served_kinds.served(kube, LWS) is verdict  # type: ignore[arg-type]
    assert kube.asked == [LWS.api_version]  # discovery of its group version, nothing else
    said = [r.getMessage() for r in caplog.records]
    if verdict is None:  # why it could not tell, at debug level
        assert said == [f"cannot tell whether LeaderWorkerSet is served: {kube.error}"]
    else:
        assert said == []


async def test_missing_counts_only_the_kinds_the_server_says_it_does_not_serve():
    kube = Answers(LeaderWorkerSet=[404], ScaledObject=[["scaledobjects"]], HTTPRoute=[503])
    assert await served_kinds.missing(kube) == [LWS]  # type: ignore[arg-type]
    assert sorted(kube.asked) == sorted(r.api_version for r in served_kinds.OPTIONAL)


async def test_the_wait_returns_the_kinds_that_appeared_once_they_are_served():
    kube = Answers(LeaderWorkerSet=[404, [], 503, ["leaderworkersets"]], ScaledObject=[404])
    appeared = await asyncio.wait_for(
        served_kinds.first_served(kube, [LWS, SCALED_OBJECT], interval=0),  # type: ignore[arg-type]
        5,
    )
    assert appeared == [LWS]
    # Asked until the fourth answer, never counting the 503 as served.
    assert kube.asked.count(LWS.api_version) == 4


async def test_the_wait_never_returns_when_nothing_was_missing():
    kube = Answers(HTTPRoute=[["httproutes"]])
    waiting = asyncio.ensure_future(served_kinds.first_served(kube, [], interval=0))  # type: ignore[arg-type]
    done, _ = await asyncio.wait({waiting}, timeout=0.2)
    assert not done and kube.asked == []
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)

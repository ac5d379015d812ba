"""Which optional kinds the API server serves, and the wait for one that was missing (controller/served_kinds.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from epd_operator.controller import served_kinds
from epd_operator.kube import ApiError, Resource

LWS = next(r for r in served_kinds.OPTIONAL if r.kind == "LeaderWorkerSet")
SCALED_OBJECT = next(r for r in served_kinds.OPTIONAL if r.kind == "ScaledObject")


class Answers:
    """A stand-in Kube whose list of a kind answers from a script: a list body, an HTTP status, or an error."""

    def __init__(self, **scripts: list[Any]):
        self.scripts = scripts
        self.asked: list[tuple[str, str | None, dict[str, str] | None]] = []
        self.error: Exception | None = None

    async def request(
        self, method: str, resource: Resource, *, namespace: str | None = None, query: dict[str, str] | None = None
    ) -> Any:
        assert method == "GET"  # a read: asking costs no write
        self.asked.append((resource.kind, namespace, query))
        script = self.scripts[resource.kind]
        answer = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(answer, int):
            self.error = ApiError(answer, {"code": answer}, f"{method} {resource.plural}")
            raise self.error
        if isinstance(answer, Exception):
            self.error = answer
            raise answer
        return answer


def test_the_optional_kinds_are_the_ones_a_cluster_may_lack():
    assert {r.kind for r in served_kinds.OPTIONAL} == {"LeaderWorkerSet", "ScaledObject", "HTTPRoute"}


@pytest.mark.parametrize(
    ("answer", "verdict"),
    [({"items": []}, True), (404, False), (403, None), (503, None), (OSError("refused"), None)],
)
async def test_a_kind_is_served_when_its_list_answers_and_missing_only_on_404(answer, verdict, caplog):
    kube = Answers(LeaderWorkerSet=[answer])
    with caplog.at_level(logging.DEBUG, logger=served_kinds.__name__):
        assert await served_kinds.served(kube, LWS, "team-a") is verdict  # type: ignore[arg-type]
    # One cheap list in the watched namespace.
    assert kube.asked == [("LeaderWorkerSet", "team-a", {"limit": "1"})]
    said = [r.getMessage() for r in caplog.records]
    if verdict is None:  # why it could not tell, at debug level
        assert said == [f"cannot tell whether LeaderWorkerSet is served: {kube.error}"]
    else:
        assert said == []


async def test_missing_counts_only_the_kinds_the_server_says_it_does_not_serve():
    kube = Answers(LeaderWorkerSet=[404], ScaledObject=[{"items": []}], HTTPRoute=[403])
    assert await served_kinds.missing(kube, "team-a") == [LWS]  # type: ignore[arg-type]
    assert {ns for _, ns, _ in kube.asked} == {"team-a"}


async def test_the_wait_returns_the_kinds_that_appeared_once_they_are_served():
    kube = Answers(LeaderWorkerSet=[404, 404, 503, {"items": []}], ScaledObject=[404])
    appeared = await asyncio.wait_for(
        served_kinds.first_served(kube, [LWS, SCALED_OBJECT], "ns", interval=0),  # type: ignore[arg-type]
        5,
    )
    assert appeared == [LWS]
    # Asked until the fourth answer, never counting the 503 as served, always in the watched namespace.
    assert [k for k, _, _ in kube.asked].count("LeaderWorkerSet") == 4
    assert {ns for _, ns, _ in kube.asked} == {"ns"}


async def test_the_wait_never_returns_when_nothing_was_missing():
    kube = Answers(HTTPRoute=[{"items": []}])
    waiting = asyncio.ensure_future(served_kinds.first_served(kube, [], "ns", interval=0))  # type: ignore[arg-type]
    done, _ = await asyncio.wait({waiting}, timeout=0.2)
    assert not done and kube.asked == []
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)

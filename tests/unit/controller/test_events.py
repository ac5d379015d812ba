"""controller/events: the Event the operator posts about an EPDDeployment, field by field, and posting it as best
effort (a refused Event never fails the reconcile that caused it)."""

from __future__ import annotations

import datetime
import logging
import re
import typing
from typing import Any

import pytest

from epd_operator.controller import events
from epd_operator.kube import EVENT, ApiError, Kube

EPD = {
    "apiVersion": "serving.epd.dev/v1alpha1",
    "kind": "EPDDeployment",
    "metadata": {"name": "qwen-vl", "namespace": "serving", "uid": "u-1", "resourceVersion": "42"},
}
NOW = "2026-01-02T03:04:05Z"


def test_an_event_names_its_object_reason_and_reporter():
    event = events.event_for(EPD, "Warning", "ReconcileFailed", "the spec is refused", instance="op-1", now=NOW)
    name = event["metadata"].pop("name")
    assert re.fullmatch(r"qwen-vl\.[0-9a-f]{16}", name), name
    assert event == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"namespace": "serving"},
        "involvedObject": {
            "apiVersion": "serving.epd.dev/v1alpha1",
            "kind": "EPDDeployment",
            "name": "qwen-vl",
            "namespace": "serving",
            "uid": "u-1",
            "resourceVersion": "42",
        },
        "type": "Warning",
        "reason": "ReconcileFailed",
        "message": "the spec is refused",
        "firstTimestamp": NOW,
        "lastTimestamp": NOW,
        "count": 1,
        "source": {"component": "epd-operator"},
        "reportingComponent": "epd-operator",
        "reportingInstance": "op-1",
    }


def test_each_event_has_a_name_of_its_own():
    names = {events.event_for(EPD, "Normal", "Applied", "x", instance="i", now=NOW)["metadata"]["name"] for _ in "ab"}
    assert len(names) == 2


def test_an_object_without_uid_or_version_yet_is_named_without_them():
    fresh = {**EPD, "metadata": {"name": "qwen-vl", "namespace": "serving"}}
    involved = events.event_for(fresh, "Normal", "Applied", "x", instance="i", now=NOW)["involvedObject"]
    assert involved["uid"] is None and involved["resourceVersion"] is None


def test_a_message_longer_than_the_api_server_takes_is_cut_with_an_ellipsis():
    fits = "m" * events.MAX_MESSAGE
    assert events.event_for(EPD, "Normal", "Applied", fits, instance="i", now=NOW)["message"] == fits
    cut = events.event_for(EPD, "Normal", "Applied", fits + "m", instance="i", now=NOW)["message"]
    assert cut == "m" * (events.MAX_MESSAGE - 1) + "…" and len(cut) == events.MAX_MESSAGE == 1024


def test_the_time_is_utc_to_the_second_in_the_api_servers_format():
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    now = events.utcnow()
    after = datetime.datetime.now(datetime.UTC)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", now), now
    parsed = datetime.datetime.strptime(now, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    assert before <= parsed <= after


def test_the_time_is_utc_whatever_the_machines_zone(monkeypatch):
    import time

    monkeypatch.setenv("TZ", "JST-9")  # POSIX: UTC+9, no daylight saving, no tz database needed
    time.tzset()
    try:
        parsed = datetime.datetime.strptime(events.utcnow(), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
        assert abs((datetime.datetime.now(datetime.UTC) - parsed).total_seconds()) < 5
    finally:
        monkeypatch.undo()
        time.tzset()


class Recorder:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.created: list[tuple[Any, str, dict[str, Any]]] = []

    async def create(self, resource: Any, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        self.created.append((resource, namespace, obj))
        return obj


async def test_an_event_is_created_in_its_objects_namespace():
    kube = Recorder()
    await events.post_event(typing.cast(Kube, kube), EPD, "Normal", "Applied", "3 objects", instance="op-1")
    [(resource, namespace, event)] = kube.created
    assert resource is EVENT and namespace == "serving"
    assert (event["reason"], event["message"], event["reportingInstance"]) == ("Applied", "3 objects", "op-1")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", event["firstTimestamp"])


@pytest.mark.parametrize("error", [ApiError(403, {"message": "forbidden"}, "create event"), OSError("reset")])
async def test_an_event_the_server_refuses_is_logged_and_the_reconcile_goes_on(error, caplog):
    caplog.set_level(logging.WARNING, logger=events.log.name)
    await events.post_event(typing.cast(Kube, Recorder(error)), EPD, "Warning", "Degraded", "why", instance="i")
    [record] = caplog.records
    assert record.getMessage().startswith("could not post event Degraded/why: ")
    assert str(error) in record.getMessage()

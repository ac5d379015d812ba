"""Kubernetes Events about an EPDDeployment (what `kubectl describe epd` shows under Events).

Posted by the operator itself rather than through kopf's poster, so that exactly the meaningful
transitions become Events and nothing is posted in steady state.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from typing import Any

from ..kube import EVENT, REQUEST_ERRORS, Kube

log = logging.getLogger(__name__)

COMPONENT = "epd-operator"
MAX_MESSAGE = 1024  # the API server refuses longer event messages


def utcnow() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_for(obj: dict[str, Any], type_: str, reason: str, message: str, *, instance: str, now: str) -> dict[str, Any]:
    meta = obj["metadata"]
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "type": type_,
        "reason": reason,
        "message": message,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
    }


async def post_event(kube: Kube, obj: dict[str, Any], type_: str, reason: str, message: str, *, instance: str) -> None:
    """Best effort: an Event that cannot be posted must not fail the reconcile that caused it."""
    event = event_for(obj, type_, reason, message, instance=instance, now=utcnow())
    try:
        await kube.create(EVENT, event["metadata"]["namespace"], event)
    except REQUEST_ERRORS as exc:
        log.warning("could not post event %s/%s: %s", reason, message, exc)

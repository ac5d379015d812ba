"""The optional kinds the cluster did not serve when the operator started, and the moment one appears.

kopf chooses the kinds it watches when it starts (its resource scanning is off: a namespaced install
may not list CRDs). An optional kind (LeaderWorkerSet, KEDA's ScaledObject, Gateway API's HTTPRoute)
whose CRDs are installed after that would be applied but never watched, so what its controller says
(KEDA's verdict, LWS's ready groups) would never reach the EPDDeployment's status. The operator
therefore notes the optional kinds missing at its start, asks for them every `POLL_SECONDS`, and
stops once one is served, so that Kubernetes starts it again, watching that kind too.

A kind counts as served when API discovery of its group version names it (what kubectl asks; every
authenticated client may read it, and it lists no objects); a 404 for the group version, or a group
version without it, means not served. Any other answer (a 5xx, no connection) says nothing either
way: such a kind is not counted missing at the start, nor found while polling.
"""

from __future__ import annotations

import asyncio
import logging

from ..kube import CHILD_RESOURCES, REQUEST_ERRORS, ApiError, Kube, Resource

log = logging.getLogger(__name__)

OPTIONAL = tuple(r for r in CHILD_RESOURCES.values() if r.optional)
POLL_SECONDS = 30.0


async def served(kube: Kube, resource: Resource) -> bool | None:
    """True when the API server serves `resource`, False when it does not, None when it cannot tell."""
    try:
        names = await kube.served_resources(resource.api_version)
    except REQUEST_ERRORS as exc:
        if isinstance(exc, ApiError) and exc.status == 404:
            return False
        log.debug("cannot tell whether %s is served: %s", resource.kind, exc)
        return None
    return resource.plural in names


async def missing(kube: Kube, kinds: tuple[Resource, ...] = OPTIONAL) -> list[Resource]:
    """The kinds of `kinds` that the API server does not serve now."""
    return [r for r in kinds if await served(kube, r) is False]


async def first_served(kube: Kube, kinds: list[Resource], interval: float = POLL_SECONDS) -> list[Resource]:
    """Wait until one of `kinds` is served; return those that are. Never returns for no kinds."""
    if not kinds:
        await asyncio.Event().wait()
    while True:
        await asyncio.sleep(interval)
        appeared = [r for r in kinds if await served(kube, r) is True]
        if appeared:
            return appeared

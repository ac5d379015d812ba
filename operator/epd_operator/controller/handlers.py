"""kopf registrations: thin glue from watch events to the reconciler's queue.

Only `@kopf.on.event` handlers are used, on purpose. kopf's change handlers (create/update/resume)
persist their progress and a diff-base in annotations of the EPDDeployment, i.e. they write to it
on every change and again on every operator restart; its timers and daemons add a finalizer. The
reconciler is level-triggered and keeps its bookkeeping in memory, so a restart causes no writes
and deletion needs no finalizer (owner references collect the children).

The events also fill the reconciler's cache (controller/cache.py), which is all a pass reads. For
that, every kind a pass reads is watched: each child kind, and the tiers' pods. Each also has a
`@kopf.index` handler, for kopf's guarantee that no other handler runs before every indexed kind's
initial listing is in: the first pass after a start, queued by an EPDDeployment's first event,
already sees all its children, instead of planning to create what exists.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import Callable
from typing import Any

import kopf

from ..api.labels import MANAGED_BY, MANAGED_BY_LABEL
from ..api.spec import GROUP, PLURAL, VERSION
from ..kube import CHILD_RESOURCES, POD, Kube, Resource, connection_info
from .reconciler import Reconciler


def _selector(resource: Resource) -> tuple[str, str, str]:
    group, _, version = resource.api_version.rpartition("/")
    return group, version, resource.plural


# Every child kind (HTTPRoute included: kopf serves it where its CRD exists when the operator starts,
# and skips it with a warning elsewhere; routes created later are known from our own writes).
CHILDREN_WATCHED = tuple(_selector(r) for r in CHILD_RESOURCES.values())
PODS_WATCHED = _selector(POD)


def _body(event: kopf.RawEvent) -> dict[str, Any]:
    # kopf types the object as a TypedDict of the few fields it reads itself; it is the whole object.
    return typing.cast(dict[str, Any], event["object"])


def build_registry(reconciler: Reconciler, kube: Kube) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        # kopf's watches and our requests log in the same way (exec plugins included). kopf calls this
        # at its start and again when its credentials are refused (401) or expire: log in afresh.
        return connection_info(await kube.relogin())

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def epd_changed(event: kopf.RawEvent, **_: Any) -> None:
        reconciler.epd_event(event.get("type"), _body(event))

    for selector in CHILDREN_WATCHED:
        _watch(registry, reconciler, selector, reconciler.child_event)
    _watch(registry, reconciler, PODS_WATCHED, reconciler.pod_event)
    return registry


def _watch(
    registry: kopf.OperatorRegistry,
    reconciler: Reconciler,
    selector: tuple[str, str, str],
    on_event: Callable[[str | None, dict[str, Any]], None],
) -> None:
    labels = {MANAGED_BY_LABEL: MANAGED_BY}
    plural = selector[2]

    @kopf.index(*selector, labels=labels, id=f"{plural}-cached", registry=registry)
    def cached(body: kopf.Body, **_: Any) -> None:
        # Returns nothing, so kopf keeps no index of its own: the cache holds the objects. Deletions
        # reach it through the event handler.
        reconciler.cache.record(dict(body))

    @kopf.on.event(*selector, labels=labels, id=f"{plural}-changed", registry=registry)
    async def changed(event: kopf.RawEvent, **_: Any) -> None:
        on_event(event.get("type"), _body(event))


def build_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # The reconciler posts Events for meaningful transitions itself; kopf would post one per
    # handler call, i.e. writes in steady state.
    settings.posting.enabled = False
    # Were a change handler ever added, keep kopf's state out of .status (the CRD's status schema
    # is strict and would prune it) and under our own prefix.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.serving.epd.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="kopf.serving.epd.dev")
    # Leader election is ours (a Lease); kopf's peering would need its own CRD.
    settings.peering.standalone = True
    # The namespaces and resources are given on the command line: no cluster-wide scans of
    # namespaces and CRDs, which a namespaced install is not allowed to make.
    settings.scanning.disabled = True
    # Watches are re-established regularly so a silently dropped connection heals.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # Children are filtered by the API server, not in kopf: the operator then never receives (nor
    # caches) the cluster's other Deployments and HPAs.
    for selector in (*CHILDREN_WATCHED, PODS_WATCHED):
        settings.watching.label_selectors[selector] = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
    settings.networking.request_timeout = 60
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # per-event chatter
    return settings

"""kopf registrations: thin glue from watch events to the reconciler's queue.

Only `@kopf.on.event` handlers are used, on purpose. kopf's change handlers (create/update/resume)
persist their progress and a diff-base in annotations of the EPDDeployment, i.e. they write to it
on every change and again on every operator restart; its timers and daemons add a finalizer. The
reconciler is level-triggered and keeps its bookkeeping in memory, so a restart causes no writes
and deletion needs no finalizer (owner references collect the children).
"""
from __future__ import annotations

import logging
from typing import Any

import kopf

from ..api.spec import GROUP, PLURAL, VERSION
from .apply import MANAGED_BY, MANAGED_BY_LABEL
from ..kube import Kube, connection_info
from .reconciler import Reconciler

CHILDREN_WATCHED = (("apps", "v1", "deployments"), ("autoscaling", "v2", "horizontalpodautoscalers"))


def build_registry(reconciler: Reconciler, kube: Kube) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        # kopf's watches and our requests log in the same way (exec plugins included). kopf calls this
        # at its start and again when its credentials are refused (401) or expire: log in afresh.
        return connection_info(await kube.relogin())

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def epd_changed(event: dict[str, Any], **_: Any) -> None:
        reconciler.epd_event(event.get("type"), event["object"])

    for group, version, plural in CHILDREN_WATCHED:
        @kopf.on.event(group, version, plural, labels={MANAGED_BY_LABEL: MANAGED_BY}, id=f"{plural}-changed",
                       registry=registry)
        async def child_changed(event: dict[str, Any], **_: Any) -> None:
            reconciler.child_event(event.get("type"), event["object"])

    return registry


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
    for group, _version, plural in CHILDREN_WATCHED:
        settings.watching.label_selectors[group, plural] = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
    settings.networking.request_timeout = 60
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # per-event chatter
    return settings

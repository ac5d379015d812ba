"""The router's objects: its ServiceAccount and RBAC (it watches EndpointSlices), its Deployment with
a read-only root filesystem and a scratch emptyDir, its Service, and the HTTPRoute to it when asked for.

What the router is started with (its command line) is `router_args`; this module puts it into a pod.
"""

from __future__ import annotations

from ..api.spec import EPDDeployment
from ..api.tiers import Placement
from .naming import ROUTER, object_name, router_service_name, selector_labels
from .pods import (
    JSON,
    RUNTIME_DEFAULT_SECCOMP,
    Workload,
    meta,
    overlay_container,
    placement_env,
    pod_spec,
    resources,
    workload,
)
from .router_args import (
    ROUTER_HEALTH_PATH,
    ROUTER_LIVENESS_PATH,
    ROUTER_METRICS_PORT,
    ROUTER_PRE_STOP_SECONDS,
    router_args,
    router_termination_grace_seconds,
)
from .templating import render_documents, render_one

NONROOT_UID = 65532
# The router's writable scratch (its root filesystem is read-only): TMPDIR, and the directory its
# worker processes share their metrics through (prometheus_client's multiprocess mode).
ROUTER_SCRATCH_VOLUME = "tmp"
ROUTER_SCRATCH_PATH = "/tmp"
ROUTER_SCRATCH_ENV = {
    "TMPDIR": ROUTER_SCRATCH_PATH,
    "PROMETHEUS_MULTIPROC_DIR": ROUTER_SCRATCH_PATH + "/epd-router-metrics",
}


def router_rbac(epd: EPDDeployment) -> list[JSON]:
    """The router's ServiceAccount, Role and RoleBinding."""
    return render_documents("router-rbac.yaml.j2", **meta(epd, object_name(epd, ROUTER), ROUTER))


def router_workload(epd: EPDDeployment, router_image: str) -> Workload:
    router = epd.spec.router
    container = overlay_container(
        render_one(
            "router-container.yaml.j2",
            image=router_image,
            args=router_args(epd),
            resources=resources(router),
            env=_router_env(router),
            health_path=ROUTER_HEALTH_PATH,
            liveness_path=ROUTER_LIVENESS_PATH,
            metrics_port=ROUTER_METRICS_PORT,
            scratch_volume=ROUTER_SCRATCH_VOLUME,
            scratch_path=ROUTER_SCRATCH_PATH,
            pre_stop_seconds=ROUTER_PRE_STOP_SECONDS,
        ),
        router,
    )  # envFrom, volumeMounts, securityContext (its env, already in, is replaced in place)
    security = {"runAsNonRoot": True, "runAsUser": NONROOT_UID, "runAsGroup": NONROOT_UID, **RUNTIME_DEFAULT_SECCOMP}
    scratch = {"name": ROUTER_SCRATCH_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}}
    pod = pod_spec(
        router,
        [container],
        [scratch],
        epd.spec.imagePullSecrets,
        security,
        service_account=object_name(epd, ROUTER),
        termination_grace_seconds=router_termination_grace_seconds(epd),
    )
    service = render_one(
        "service.yaml.j2",
        **meta(epd, router_service_name(epd), ROUTER),
        annotations=router.service.annotations,
        type=router.service.type,
        selector=selector_labels(epd, ROUTER),
        ports=[{"name": "http", "port": router.service.port, "targetPort": "http", "protocol": "TCP"}],
    )
    return workload(epd, ROUTER, router, pod, {}, service)


def _router_env(router: Placement) -> list[JSON]:
    """The scratch variables, unless the spec sets them itself, then the spec's env."""
    own = placement_env(router)
    names = {var["name"] for var in own}
    return [{"name": k, "value": v} for k, v in ROUTER_SCRATCH_ENV.items() if k not in names] + own


def router_route(epd: EPDDeployment) -> list[JSON]:
    """The HTTPRoute from the user's Gateways to the router Service, when asked for."""
    gateway = epd.spec.router.gateway
    if gateway is None:
        return []
    parents = [
        {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": p.name,
            **({"namespace": p.namespace} if p.namespace else {}),
            **({"sectionName": p.sectionName} if p.sectionName else {}),
        }
        for p in gateway.parentRefs
    ]
    matches = [{"path": {"type": "PathPrefix", "value": prefix}} for prefix in gateway.pathPrefixes]
    return [
        render_one(
            "httproute.yaml.j2",
            **meta(epd, router_service_name(epd), ROUTER),
            parent_refs=parents,
            hostnames=gateway.hostnames,
            matches=matches,
            service=router_service_name(epd),
            port=epd.spec.router.service.port,
        )
    ]

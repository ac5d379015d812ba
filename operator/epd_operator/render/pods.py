"""The shapes every workload shares: a Deployment with its Service, HPA and PDB, a pod spec, the
tier's overlay on its main container, and the config hash that rolls pods when what they run changes.

Pure, like the rest of `render`: the vLLM tiers (`vllm_tiers`), the router (`router_workload`) and
the Mooncake master (`manifests`) are built from these.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ..api.autoscaling import Autoscaling
from ..api.spec import EPDDeployment
from ..api.tiers import Placement
from ..api.transfer import MooncakeMaster
from .autoscaling import hpa_metrics
from .keda import uses_keda
from .naming import CONFIG_HASH_ANNOTATION, labels, object_name, selector_labels
from .templating import render_one

JSON = dict[str, Any]

RUNTIME_DEFAULT_SECCOMP = {"seccompProfile": {"type": "RuntimeDefault"}}


@dataclass
class Workload:
    """One Deployment and what belongs to it."""

    deployment: JSON
    service: JSON
    hpa: JSON | None
    pdb: JSON | None


def meta(epd: EPDDeployment, name: str, role: str) -> JSON:
    return {"name": name, "namespace": epd.namespace, "labels": labels(epd, role)}


# One spelling of a JSON document, whatever order its keys were built in: what config_hash digests.
_canonical_json = functools.partial(json.dumps, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def config_hash(pod_labels: dict[str, str], pod_spec: JSON, config: dict[str, str]) -> str:
    """A digest of everything a tier's pods run with: their template and the ConfigMap keys they mount."""
    payload = _canonical_json({"labels": pod_labels, "spec": pod_spec, "config": config})
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def workload(
    epd: EPDDeployment,
    role: str,
    placement: Placement,
    pod: JSON,
    config: dict[str, str],
    service: JSON,
    pdb: bool = True,
    own_pod_labels: dict[str, str] | None = None,
    progress_deadline: int | None = None,
) -> Workload:
    name = object_name(epd, role)
    metadata = meta(epd, name, role)
    autoscaling = placement.autoscaling
    # The user's pod labels and annotations beside ours (the API refuses keys that would replace ours).
    pod_labels = {**placement.podLabels, **metadata["labels"], **(own_pod_labels or {})}
    pod_annotations = dict(placement.podAnnotations)
    pod_annotations[CONFIG_HASH_ANNOTATION] = config_hash(pod_labels, {"annotations": pod_annotations, **pod}, config)
    deployment = render_one(
        "deployment.yaml.j2",
        **metadata,
        replicas=None if autoscaling else placement.replicas,  # the autoscaler owns replicas when present
        progress_deadline=progress_deadline,
        selector=selector_labels(epd, role),
        pod_labels=pod_labels,
        annotations=pod_annotations,
        pod=pod,
    )
    return Workload(
        deployment=deployment,
        service=service,
        # engine KEDA: no HPA of ours; render() adds the tier's ScaledObject (KEDA creates its own HPA)
        hpa=_hpa(metadata, epd.name, role, autoscaling) if autoscaling and not uses_keda(autoscaling) else None,
        pdb=render_one("pdb.yaml.j2", **metadata, selector=selector_labels(epd, role)) if pdb else None,
    )


def _hpa(metadata: JSON, deployment: str, role: str, autoscaling: Autoscaling) -> JSON:
    return render_one(
        "hpa.yaml.j2",
        **metadata,
        min_replicas=autoscaling.minReplicas,
        max_replicas=autoscaling.maxReplicas,
        metrics=hpa_metrics(deployment, role, autoscaling),
        behavior=autoscaling.behavior,
    )


def pod_spec(
    placement: Placement | MooncakeMaster,
    containers: list[JSON],
    volumes: list[JSON],
    image_pull_secrets: list[str],
    security_context: JSON,
    service_account: str | None = None,
    termination_grace_seconds: int | None = None,
) -> JSON:
    """A pod spec: our containers and volumes, then the tier's placement and overlay fields."""
    user_security = getattr(placement, "podSecurityContext", None) or {}
    return render_one(
        "pod.yaml.j2",
        service_account=service_account,
        security_context={**security_context, **user_security},  # the user's fields replace ours one by one
        termination_grace_seconds=termination_grace_seconds,
        containers=containers,
        volumes=volumes + list(getattr(placement, "volumes", [])),
        node_selector=placement.nodeSelector,
        tolerations=placement.tolerations,
        affinity=placement.affinity,
        topology_spread_constraints=list(getattr(placement, "topologySpreadConstraints", [])),
        priority_class_name=placement.priorityClassName,
        runtime_class_name=getattr(placement, "runtimeClassName", None),
        scheduler_name=getattr(placement, "schedulerName", None),
        image_pull_secrets=[{"name": secret} for secret in image_pull_secrets],
    )


def overlay_container(container: JSON, placement: Placement) -> JSON:
    """The tier's env, envFrom, volumeMounts and securityContext on its main container (vLLM or router).

    A user env var named like one of ours replaces ours in place: server-side apply refuses a list
    with two entries of one name. Volume names and mount paths cannot collide (the API refuses them).
    """
    env = list(container.get("env", []))
    index = {var["name"]: i for i, var in enumerate(env)}
    for var in placement_env(placement):
        if var["name"] in index:
            env[index[var["name"]]] = var
        else:
            index[var["name"]] = len(env)
            env.append(var)
    if env:
        container["env"] = env
    if placement.envFrom:
        container["envFrom"] = list(placement.envFrom)
    if placement.volumeMounts:
        container["volumeMounts"] = [*container.get("volumeMounts", []), *placement.volumeMounts]
    if placement.securityContext:
        container["securityContext"] = {**container.get("securityContext", {}), **placement.securityContext}
    return container


def resources(placement: Placement | MooncakeMaster) -> JSON:
    return {key: value for key, value in placement.resources.json_data().items() if value}


def placement_env(placement: Placement) -> list[JSON]:
    return [var.json_data(exclude_none=True) for var in placement.env]


def bytes_quantity(size: int) -> str:
    for suffix, factor in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if size % factor == 0:
            return f"{size // factor}{suffix}"
    return str(size)

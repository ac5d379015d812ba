"""Names, labels and selectors of everything one EPDDeployment becomes.

The router discovers its backends by these labels and the controller finds its children by these
names, so they are a contract: change them only together with both.
"""

from __future__ import annotations

from typing import Final, Literal

from ..api.labels import (
    APP_NAME,
    COMPONENT_LABEL,
    CONFIG_HASH_ANNOTATION,  # noqa: F401  (re-exported: the renderer's callers name it here)
    INSTANCE_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    ROLE_LABEL,
)
from ..api.spec import EPDDeployment
from ..api.tiers import Tier

VllmRole = Literal["encoder", "prefill", "decode"]  # the tiers that run vLLM
ENCODER: Final = "encoder"
PREFILL: Final = "prefill"
DECODE: Final = "decode"
ROUTER, MOONCAKE_MASTER = "router", "mooncake-master"
# The role label of the `{name}-transfer` ConfigMap, which serves every tier and belongs to none.
TRANSFER = "transfer"


def vllm_roles(epd: EPDDeployment) -> list[VllmRole]:
    """The vLLM tiers in pipeline order: encoder, prefill (E/P/D only), decode."""
    return [ENCODER, PREFILL, DECODE] if epd.spec.prefill is not None else [ENCODER, DECODE]


def object_name(epd: EPDDeployment, role: str) -> str:
    """`{name}-{role}`: a tier's Deployment, headless Service, HPA and PDB."""
    return f"{epd.name}-{role}"


def router_service_name(epd: EPDDeployment) -> str:
    # The user's endpoint carries the EPDDeployment's own name: http://{name}.{ns}.svc:{port}.
    return epd.name


def transfer_configmap_name(epd: EPDDeployment) -> str:
    return f"{epd.name}-transfer"


def selector_labels(epd: EPDDeployment, role: str) -> dict[str, str]:
    return {INSTANCE_LABEL: epd.name, ROLE_LABEL: role}


def labels(epd: EPDDeployment, role: str) -> dict[str, str]:
    return {
        NAME_LABEL: APP_NAME,
        INSTANCE_LABEL: epd.name,
        COMPONENT_LABEL: role,
        MANAGED_BY_LABEL: MANAGED_BY,
        ROLE_LABEL: role,
    }


def label_selector(epd: EPDDeployment, role: str) -> str:
    """The selector as a `kubectl -l` string, for the router's discovery flags."""
    return ",".join(f"{key}={value}" for key, value in selector_labels(epd, role).items())


def tier_of(epd: EPDDeployment, role: VllmRole) -> Tier:
    """The spec of a vLLM tier by role."""
    tier = {ENCODER: epd.spec.encoder, PREFILL: epd.spec.prefill, DECODE: epd.spec.decode}.get(role)
    if tier is None:
        raise ValueError(f"{epd.name} has no {role} tier ({epd.spec.topology})")
    return tier

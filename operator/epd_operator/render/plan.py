"""What one `render()` decides about an EPDDeployment before it builds any object, decided once.

The roles present, each vLLM tier's spec and what its transfer connectors add to its pods (arguments,
environment, ports, volumes), the transfer ConfigMap's data, the Mooncake store, and who talks to whom
among the backends on which ports. The builders (the vLLM tiers' workloads, the multi-node groups, the
NetworkPolicies, the ConfigMap) read this plan instead of deriving it from the spec again, so a pod's
ports and the policy that admits them come from one computation. Pure, like the rest of the renderer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api.spec import EPDDeployment
from ..api.tiers import Tier
from .generation import compatibility_generation
from .naming import VllmRole, object_name, tier_of, vllm_roles
from .transfer import (
    TierTransfer,
    TransferIngress,
    configmap_data,
    mooncake_store_config,
    tier_transfer,
    transfer_ingress,
)


@dataclass(frozen=True)
class TierPlan:
    """One vLLM tier (RenderPlan.tiers holds it by role): its spec, object name and what the transfer
    connectors add to its pods."""

    spec: Tier
    name: str
    transfer: TierTransfer


@dataclass(frozen=True)
class RenderPlan:
    epd: EPDDeployment
    router_image: str  # the router's and the janitor's image
    roles: tuple[VllmRole, ...]  # the vLLM tiers in pipeline order
    tiers: dict[VllmRole, TierPlan]
    config: dict[str, str]  # the `{name}-transfer` ConfigMap's data
    mooncake_store: dict[str, Any] | None  # the cross-encoder cache's store config, when one is rendered
    ingress: tuple[TransferIngress, ...]  # the connections between backend pods the transfers open
    generation: str  # the compatibility generation every vLLM pod is labelled with

    def tier(self, role: VllmRole) -> TierPlan:
        return self.tiers[role]


def plan_render(epd: EPDDeployment, router_image: str) -> RenderPlan:
    roles = tuple(vllm_roles(epd))
    return RenderPlan(
        epd=epd,
        router_image=router_image,
        roles=roles,
        tiers={role: TierPlan(tier_of(epd, role), object_name(epd, role), tier_transfer(epd, role)) for role in roles},
        config=configmap_data(epd, list(roles)),
        mooncake_store=mooncake_store_config(epd),
        ingress=tuple(transfer_ingress(epd)),
        generation=compatibility_generation(epd),
    )

"""The router of an `EPDDeployment`: its Service, its trust boundary, spill-over while encoders start, and the
Gateway API route in front of it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..router.contract import EncoderPolicy, PdPolicy
from .autoscaling import DEFAULT_ENCODER_LOAD_PER_POD
from .fields import Resources, Strict
from .tiers import Placement

DEFAULT_ROUTER_IMAGE = "ghcr.io/epd-operator/epd-operator:0.1.0"


class RouterService(Strict):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field("ClusterIP", description="Service type.")
    port: int = Field(8000, ge=1, le=65535, description="Port clients send OpenAI-compatible requests to.")
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Service annotations, e.g. for a cloud load balancer."
    )


def _router_resources() -> Resources:
    return Resources(requests={"cpu": "500m", "memory": "256Mi"}, limits={"memory": "1Gi"})


class RouterTrust(Strict):
    """What the router may take from clients it does not otherwise trust. Everything is off by default:
    transfer parameters are always the router's own, and none of these widen that."""

    clientEmbeds: bool = Field(
        False,
        description="Accept client `*_embeds` content parts and `prompt_embeds` (a "
        "metadata-only part whose embedding is absent can kill a vLLM consumer engine).",
    )
    clientUUIDs: bool = Field(
        False,
        description="Honour a client's media `uuid` as the item's identity (it keys the "
        "encoder cache and the router's reuse: one client could alias another's media).",
    )
    immutableMediaURLs: bool = Field(
        False,
        description="Media URLs never change content, so an http(s) URL may identify "
        "its item for reuse; otherwise only content-addressed items (data: URLs, inline "
        "bytes) are reused.",
    )


# The spill-over bound by default: this many times the encoder tier's `load.targetPerPod`. At the target
# the HPA is content; at twice it the tier is short of encoders (a scale-up is under way) and an item
# waits behind a queue about twice the size the tier was sized for.
SPILL_OVER_TARGET_MULTIPLE = 2


class SpillOver(Strict):
    """While encoders catch up with a load step, the router sends a request's new media items raw to its
    consumer (prefill in E/P/D, the PD tier in E+PD), which encodes them itself, instead of queuing them."""

    enabled: bool = Field(
        True,
        description="Spill over while every encoder is at `encoderInflight` (never to a consumer tier run with "
        "`--language-model-only`, which cannot encode). On GPUs encoding on a consumer slows the decodes sharing "
        "its GPU: it pays while the encoder queue's wait exceeds that (docs/router.md#spill-over).",
    )
    encoderInflight: int | None = Field(
        None,
        ge=1,
        description="Media items in flight per encoder (over every router) at which it counts as full; a "
        f"request spills when every encoder is full. Default: {SPILL_OVER_TARGET_MULTIPLE} x the encoder "
        f"tier's `autoscaling.load.targetPerPod` ({DEFAULT_ENCODER_LOAD_PER_POD} when it has none).",
    )
    consumerInflight: int | None = Field(
        None,
        ge=1,
        description="Spill only to a consumer with fewer requests in flight than this. Default: the consumer "
        "tier's `autoscaling.load.targetPerPod` when it scales on load, else any consumer.",
    )


class GatewayParent(Strict):
    name: str = Field(min_length=1, max_length=253, description="The Gateway's name.")
    namespace: str | None = Field(
        None, min_length=1, max_length=63, description="The Gateway's namespace; default: the EPDDeployment's."
    )
    sectionName: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        description="A listener of that Gateway (e.g. `https`); default: every listener.",
    )


class RouterGateway(Strict):
    """An HTTPRoute (Gateway API, standard channel) attaching the router Service to user-named Gateways."""

    parentRefs: list[GatewayParent] = Field(min_length=1, max_length=32, description="Gateways the route attaches to.")
    hostnames: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Host names the route answers (e.g. `vl.example.com`); empty: any.",
    )
    pathPrefixes: list[str] = Field(
        default_factory=lambda: ["/v1"],
        min_length=1,
        max_length=16,
        description="Path prefixes sent to the router; default `/v1` (the OpenAI-compatible API).",
        json_schema_extra={"default": ["/v1"]},
    )


class Router(Placement):
    replicas: int = Field(2, ge=0, description="Router pods; ignored while `autoscaling` is set.")
    resources: Resources = Field(
        default_factory=_router_resources,
        description="Router container resources; default: requests `cpu: 500m`, `memory: 256Mi`, limit "
        "`memory: 1Gi` (Burstable). The router runs one worker process per CPU of its limit, else "
        "its request.",
        json_schema_extra={"default": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}},
    )
    service: RouterService = Field(
        default_factory=RouterService, description="The Service clients call: the deployment's one endpoint."
    )
    encoderPolicy: EncoderPolicy = Field(
        "cache-aware",
        description="Which encoder gets an image: `cache-aware` hashes the item so repeats land where "
        "it was encoded (bounded load), `least-loaded` picks the fewest in-flight requests.",
    )
    pdPolicy: PdPolicy = Field(
        "least-loaded",
        description="Which prefill/decode instance gets a request: `prefix-aware` hashes the prompt's "
        "prefix for KV prefix-cache hits (bounded load), `least-loaded` picks the fewest in-flight.",
    )
    gateway: RouterGateway | None = Field(
        None,
        description="Also expose the router through a Gateway API "
        "HTTPRoute (needs the Gateway API CRDs in the cluster).",
    )
    trust: RouterTrust = Field(
        default_factory=RouterTrust,
        description="What the router may take from clients (all off by default; see the trust model in docs/router.md).",
    )
    spillOver: SpillOver = Field(
        default_factory=SpillOver,
        description="Raw media to the consumers while every encoder is full (on by default; docs/router.md#spill-over).",
    )

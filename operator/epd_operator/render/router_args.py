"""The `epd-router` command line: where its backends are and what it must know about the connectors.

The flag names and defaults are the router's contract (router/contract.py), which its parser reads
too; a test renders every example and parses these args with that very parser.
"""

from __future__ import annotations

import contextlib
import math

from ..api.autoscaling import DEFAULT_ENCODER_LOAD_PER_POD
from ..api.quantity import parse_quantity
from ..api.router import SPILL_OVER_TARGET_MULTIPLE
from ..api.rules import cannot_encode
from ..api.spec import EPDDeployment
from ..api.tiers import Tier
from ..api.transfer import Mooncake
from ..router import contract
from .naming import DECODE, ENCODER, PREFILL, label_selector
from .tracing import router_tracing_args
from .transfer import cache_ttl_seconds

ROUTER_PORT = 8000
# /metrics on its own container port (named `metrics`), never on the API port the Service exposes.
ROUTER_METRICS_PORT = 9090
ROUTER_HEALTH_PATH = "/health"
ROUTER_LIVENESS_PATH = "/livez"  # answered by the router's event loop, no backend involved
# A router pod going away keeps serving this long before SIGTERM, so that kube-proxy (and any load
# balancer watching the Service's EndpointSlices) stops sending it new connections first.
ROUTER_PRE_STOP_SECONDS = 5
# After SIGTERM the router drains for up to --drain-timeout; then room to stop before the kubelet's SIGKILL.
ROUTER_EXIT_ALLOWANCE_S = 5


def reuse_ttl_seconds(janitor_ttl_seconds: int) -> int:
    """How long the router may reuse an encoded item without asking an encoder again.

    The janitor deletes a cache file once it is older than its TTL (checked every interval), the
    file's clock starts before the router's, and the shared filesystem's clock may differ from
    the janitor's node: half the TTL keeps a wide margin while still sparing most re-encodes.
    """
    return janitor_ttl_seconds // 2


def router_args(epd: EPDDeployment) -> list[str]:
    spec = epd.spec
    args = [
        contract.HOST,
        "0.0.0.0",
        contract.PORT,
        str(ROUTER_PORT),
        contract.METRICS_PORT,
        str(ROUTER_METRICS_PORT),
        contract.DISCOVERY,
        contract.DISCOVERY_KUBERNETES,
        contract.NAMESPACE,
        epd.namespace,
        contract.DEPLOYMENT,
        epd.name,
        contract.ENCODER_SELECTOR,
        label_selector(epd, ENCODER),
    ]
    if spec.prefill is not None:
        args += [contract.PREFILL_SELECTOR, label_selector(epd, PREFILL)]
    else:
        args += [contract.PREFILL_SERVERS_URLS, contract.NO_PREFILL]  # E+PD: the decode tier prefills itself
    args += [
        contract.DECODE_SELECTOR,
        label_selector(epd, DECODE),
        contract.ENCODER_POLICY,
        spec.router.encoderPolicy,
        contract.PD_POLICY,
        spec.router.pdPolicy,
    ]
    args += spill_over_args(epd)
    args += data_parallel_hints(epd)
    args += connector_hints(epd)
    trust = spec.router.trust
    args += [
        flag
        for on, flag in (
            (trust.clientEmbeds, contract.ALLOW_CLIENT_EMBEDS),
            (trust.clientUUIDs, contract.TRUST_CLIENT_UUIDS),
            (trust.immutableMediaURLs, contract.IMMUTABLE_MEDIA_URLS),
        )
        if on
    ]
    args += router_tracing_args(spec)
    workers = router_workers(epd)
    if workers > 1:
        args += [contract.WORKERS, str(workers)]
    args += [contract.DRAIN_TIMEOUT, str(contract.DEFAULT_DRAIN_TIMEOUT_S)]
    return args + spec.router.extraArgs


def router_drain_seconds(epd: EPDDeployment) -> float:
    """The router's drain deadline: ours, or the last `--drain-timeout` in `extraArgs` (which wins,
    as the router's parser reads the last one)."""
    seconds: float = contract.DEFAULT_DRAIN_TIMEOUT_S
    extra = epd.spec.router.extraArgs
    for i, arg in enumerate(extra):
        flag, eq, value = arg.partition("=")
        if flag != contract.DRAIN_TIMEOUT:
            continue
        if not eq:
            value = extra[i + 1] if i + 1 < len(extra) else ""
        with contextlib.suppress(ValueError):
            seconds = max(float(value), 0.0)
    return seconds


def router_termination_grace_seconds(epd: EPDDeployment) -> int:
    """The router pod's terminationGracePeriodSeconds: the preStop sleep, the drain, time to exit."""
    return ROUTER_PRE_STOP_SECONDS + math.ceil(router_drain_seconds(epd)) + ROUTER_EXIT_ALLOWANCE_S


def router_workers(epd: EPDDeployment) -> int:
    """One router process per CPU the pod may use (its limit, else its request)."""
    resources = epd.spec.router.resources
    cpu = resources.limits.get("cpu", resources.requests.get("cpu"))
    return max(1, math.ceil(parse_quantity(cpu))) if cpu is not None else 1


def _load_target(tier: Tier) -> int | None:
    load = tier.autoscaling.load if tier.autoscaling is not None else None
    return load.targetPerPod if load is not None else None


def spill_over_args(epd: EPDDeployment) -> list[str]:
    """The spill-over bounds (router/encoding.py): the spec's, else from the tiers' load targets. None
    when the EC consumer tier runs without the vision encoder: it could not encode what spills."""
    spill, spec = epd.spec.router.spillOver, epd.spec
    if not spill.enabled or cannot_encode([str(a) for a in (spec.prefill or spec.decode).extraArgs]):
        return []
    encoder = spill.encoderInflight or SPILL_OVER_TARGET_MULTIPLE * (
        _load_target(spec.encoder) or DEFAULT_ENCODER_LOAD_PER_POD
    )
    args = [contract.SPILL_ENCODER_INFLIGHT, str(encoder)]
    consumer = spill.consumerInflight or _load_target(spec.prefill or spec.decode)
    if consumer is not None:
        args += [contract.SPILL_CONSUMER_INFLIGHT, str(consumer)]
    return args


def data_parallel_hints(epd: EPDDeployment) -> list[str]:
    """The engines behind each prefill/decode pod, so the router pins every request to one rank and
    balances ranks by load; for Mooncake, the stride between ranks' control ports (the consumer's TP)."""
    spec = epd.spec
    args: list[str] = []
    for tier, flag in ((spec.prefill, contract.PREFILL_DP_SIZE), (spec.decode, contract.DECODE_DP_SIZE)):
        if tier is not None and tier.dataParallelSize != contract.DEFAULT_DP_SIZE:
            args += [flag, str(tier.dataParallelSize)]
    consumer = spec.prefill or spec.decode
    stride = consumer.tensorParallelSize
    if (
        spec.ecTransfer.connector == "Mooncake"
        and consumer.dataParallelSize > 1
        and stride != contract.DEFAULT_EC_CONSUMER_TP_SIZE
    ):
        args += [contract.EC_CONSUMER_TP_SIZE, str(stride)]
    return args


def connector_hints(epd: EPDDeployment) -> list[str]:
    """What the router must know about the EC connector to speak its protocol."""
    ec = epd.spec.ecTransfer
    if ec.connector == "SharedStorage" and ec.sharedStorage is not None:
        # Pinned, not metadata-only: a consumer handed metadata for an embedding that is not on the
        # shared store (evicted by the janitor, or never re-saved by an encoder that served it from
        # its memory cache) kills its engine in vLLM 0.32. Raw media plus the uuid lets it load the
        # stored embedding when present and encode locally when not.
        ttl = reuse_ttl_seconds(cache_ttl_seconds(ec.sharedStorage))
        return [contract.REWRITE, contract.REWRITE_PINNED, contract.REUSE_TTL, str(ttl)]
    if ec.connector == "Mooncake":
        # The router addresses each consumer's control socket as tcp://<pod IP>:<ec_port>.
        return [contract.EC_CONSUMER_PORT, str((ec.mooncake or Mooncake()).ecPort)]
    return []

"""The `epd-router` command line: where its backends are and what it must know about the connectors.

The flag names are those of `epd_operator.router.flags`'s parser; a test renders every example
and parses these args with that very parser.
"""

from __future__ import annotations

import math

from ..api.quantity import parse_quantity
from ..api.spec import EPDDeployment, Mooncake
from ..router.config import RouterConfig
from .naming import DECODE, ENCODER, PREFILL, label_selector
from .tracing import router_tracing_args
from .transfer import cache_ttl_seconds

ROUTER_PORT = 8000
# /metrics on its own container port (named `metrics`), never on the API port the Service exposes.
ROUTER_METRICS_PORT = 9090
ROUTER_HEALTH_PATH = "/health"
ROUTER_LIVENESS_PATH = "/livez"  # answered by the router's event loop, no backend involved


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
        "--host",
        "0.0.0.0",
        "--port",
        str(ROUTER_PORT),
        "--metrics-port",
        str(ROUTER_METRICS_PORT),
        "--discovery",
        "kubernetes",
        "--namespace",
        epd.namespace,
        "--encoder-selector",
        label_selector(epd, ENCODER),
    ]
    if spec.prefill is not None:
        args += ["--prefill-selector", label_selector(epd, PREFILL)]
    else:
        args += ["--prefill-servers-urls", "disable"]  # E+PD: the decode tier prefills itself
    args += [
        "--decode-selector",
        label_selector(epd, DECODE),
        "--encoder-policy",
        spec.router.encoderPolicy,
        "--pd-policy",
        spec.router.pdPolicy,
    ]
    args += data_parallel_hints(epd)
    args += connector_hints(epd)
    trust = spec.router.trust
    args += [
        flag
        for on, flag in (
            (trust.clientEmbeds, "--allow-client-embeds"),
            (trust.clientUUIDs, "--trust-client-uuids"),
            (trust.immutableMediaURLs, "--immutable-media-urls"),
        )
        if on
    ]
    args += router_tracing_args(spec)
    workers = router_workers(epd)
    if workers > 1:
        args += ["--workers", str(workers)]
    return args + spec.router.extraArgs


def router_workers(epd: EPDDeployment) -> int:
    """One router process per CPU the pod may use (its limit, else its request)."""
    resources = epd.spec.router.resources
    cpu = resources.limits.get("cpu", resources.requests.get("cpu"))
    return max(1, math.ceil(parse_quantity(cpu))) if cpu is not None else 1


def data_parallel_hints(epd: EPDDeployment) -> list[str]:
    """The engines behind each prefill/decode pod, so the router pins every request to one rank and
    balances ranks by load; for Mooncake, the stride between ranks' control ports (the consumer's TP)."""
    spec = epd.spec
    args: list[str] = []
    for role, tier in ((PREFILL, spec.prefill), (DECODE, spec.decode)):
        if tier is not None and tier.dataParallelSize != getattr(RouterConfig, f"{role}_dp_size"):
            args += [f"--{role}-dp-size", str(tier.dataParallelSize)]
    consumer = spec.prefill or spec.decode
    stride = consumer.tensorParallelSize
    if (
        spec.ecTransfer.connector == "Mooncake"
        and consumer.dataParallelSize > 1
        and stride != RouterConfig.ec_consumer_tp_size
    ):
        args += ["--ec-consumer-tp-size", str(stride)]
    return args


def connector_hints(epd: EPDDeployment) -> list[str]:
    """What the router must know about the EC connector to speak its protocol."""
    ec = epd.spec.ecTransfer
    if ec.connector == "SharedStorage" and ec.sharedStorage is not None:
        # Pinned, not metadata-only: a consumer handed metadata for an embedding that is not on the
        # shared store (evicted by the janitor, or never re-saved by an encoder that served it from
        # its memory cache) kills its engine in vLLM 0.32. Raw media plus the uuid lets it load the
        # stored embedding when present and encode locally when not.
        return ["--rewrite", "pinned", "--reuse-ttl", str(reuse_ttl_seconds(cache_ttl_seconds(ec.sharedStorage)))]
    if ec.connector == "Mooncake":
        # The router addresses each consumer's control socket as tcp://<pod IP>:<ec_port>.
        return ["--ec-consumer-port", str((ec.mooncake or Mooncake()).ecPort)]
    return []

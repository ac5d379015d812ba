"""What the operator tells `epd-router`: the flags the renderer writes and the router's parser reads,
the defaults at which the renderer leaves a flag out, and the Service port names the router reads
from EndpointSlices.

One home for both sides: render/router_args.py writes these names and router/flags.py parses them,
and the EPDDeployment API (api/spec.py) offers the same policies. Constants and types only, importing
nothing of the router, so the renderer and the API depend on the router's interface, never on its
runtime configuration (router/config.py).
"""

from __future__ import annotations

from typing import Literal, get_args

# The values of the options that take one of a few words.
Discovery = Literal["static", "kubernetes"]
EncoderPolicy = Literal["cache-aware", "round-robin", "least-loaded"]
PdPolicy = Literal["least-loaded", "prefix-aware", "round-robin"]
Rewrite = Literal["metadata", "pinned"]  # how an encoded item reaches the consumer
ReuseMode = Literal["pinned", "metadata"]  # how a reused item reaches the consumer
DISCOVERIES: tuple[Discovery, ...] = get_args(Discovery)
ENCODER_POLICIES: tuple[EncoderPolicy, ...] = get_args(EncoderPolicy)
PD_POLICIES: tuple[PdPolicy, ...] = get_args(PdPolicy)
REWRITES: tuple[Rewrite, ...] = get_args(Rewrite)
REUSE_MODES: tuple[ReuseMode, ...] = get_args(ReuseMode)

# Serving.
HOST = "--host"
PORT = "--port"
METRICS_PORT = "--metrics-port"
WORKERS = "--workers"
# Shutdown: on SIGTERM the router lets the requests in flight finish for up to this many seconds
# (a request still running then is cut). The renderer passes it and sizes the pod's
# terminationGracePeriodSeconds from the same number.
DRAIN_TIMEOUT = "--drain-timeout"
DEFAULT_DRAIN_TIMEOUT_S = 30
# Backends: Kubernetes discovery, or E+PD (no prefill tier).
DISCOVERY = "--discovery"
DISCOVERY_KUBERNETES: Discovery = "kubernetes"
NAMESPACE = "--namespace"
# The EPDDeployment the router serves: the label of its encoder demand, which the autoscalers select on.
DEPLOYMENT = "--deployment"
ENCODER_SELECTOR = "--encoder-selector"
PREFILL_SELECTOR = "--prefill-selector"
DECODE_SELECTOR = "--decode-selector"
PREFILL_SERVERS_URLS = "--prefill-servers-urls"
NO_PREFILL = "disable"  # the PREFILL_SERVERS_URLS value of E+PD: the decode tier prefills itself
# Picking.
ENCODER_POLICY = "--encoder-policy"
PD_POLICY = "--pd-policy"
# Spill-over: while every encoder has this many media items in flight or more, a request's new items go
# raw to its consumer when that one has fewer requests in flight than the second bound (0: no bound).
# Absent (or 0) encoder bound: spill-over is off.
SPILL_ENCODER_INFLIGHT = "--spill-encoder-inflight"
SPILL_CONSUMER_INFLIGHT = "--spill-consumer-inflight"
SPILL_REASON_ENCODERS_BUSY = "encoders_busy"
# Data parallelism: engines per prefill/decode instance, and the Mooncake consumer's TP (the
# stride between its ranks' control ports). The renderer writes each only when it differs from
# its default.
PREFILL_DP_SIZE = "--prefill-dp-size"
DECODE_DP_SIZE = "--decode-dp-size"
EC_CONSUMER_TP_SIZE = "--ec-consumer-tp-size"
DEFAULT_DP_SIZE = 1
DEFAULT_EC_CONSUMER_TP_SIZE = 1
# The EC connector.
EC_CONSUMER_PORT = "--ec-consumer-port"
REWRITE = "--rewrite"
REWRITE_PINNED: Rewrite = "pinned"
REUSE_TTL = "--reuse-ttl"
# The trust boundary (switches, off by default).
ALLOW_CLIENT_EMBEDS = "--allow-client-embeds"
TRUST_CLIENT_UUIDS = "--trust-client-uuids"
IMMUTABLE_MEDIA_URLS = "--immutable-media-urls"
# The encoder tier's demand (router/encoding.py), the one quantity both autoscaling engines read: the
# gauge's name and the label naming the EPDDeployment (the value of DEPLOYMENT) that selects its routers.
ENCODER_DEMAND_METRIC = "epd_router_encoder_demand"
DEMAND_DEPLOYMENT_LABEL = "epd_deployment"
# Traces.
OTLP_TRACES_ENDPOINT = "--otlp-traces-endpoint"
TRACE_SAMPLE_RATIO = "--trace-sample-ratio"

# The Service (and so EndpointSlice) port the router reads a Mooncake EC consumer's DP rank d's control
# address from: `<prefix><d>`. The renderer declares them; the router falls back to ec_port + d * TP.
EC_RANK_PORT_PREFIX = "ec-dp"

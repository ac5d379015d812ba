"""What the operator tells `epd-router`: the flags the renderer writes and the router's parser reads,
the defaults at which the renderer leaves a flag out, and the Service port names the router reads
from EndpointSlices.

One home for both sides: render/router_args.py writes these names and router/flags.py parses them.
Plain constants with no imports, so the renderer depends on the router's interface only, never on
its runtime configuration (router/config.py).
"""

from __future__ import annotations

# Serving.
HOST = "--host"
PORT = "--port"
METRICS_PORT = "--metrics-port"
WORKERS = "--workers"
# Backends: Kubernetes discovery, or E+PD (no prefill tier).
DISCOVERY = "--discovery"
DISCOVERY_KUBERNETES = "kubernetes"
NAMESPACE = "--namespace"
ENCODER_SELECTOR = "--encoder-selector"
PREFILL_SELECTOR = "--prefill-selector"
DECODE_SELECTOR = "--decode-selector"
PREFILL_SERVERS_URLS = "--prefill-servers-urls"
NO_PREFILL = "disable"  # the PREFILL_SERVERS_URLS value of E+PD: the decode tier prefills itself
# Picking.
ENCODER_POLICY = "--encoder-policy"
PD_POLICY = "--pd-policy"
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
REUSE_TTL = "--reuse-ttl"
# The trust boundary (switches, off by default).
ALLOW_CLIENT_EMBEDS = "--allow-client-embeds"
TRUST_CLIENT_UUIDS = "--trust-client-uuids"
IMMUTABLE_MEDIA_URLS = "--immutable-media-urls"
# Traces.
OTLP_TRACES_ENDPOINT = "--otlp-traces-endpoint"
TRACE_SAMPLE_RATIO = "--trace-sample-ratio"

# The Service (and so EndpointSlice) port the router reads a Mooncake EC consumer's DP rank d's control
# address from: `<prefix><d>`. The renderer declares them; the router falls back to ec_port + d * TP.
EC_RANK_PORT_PREFIX = "ec-dp"

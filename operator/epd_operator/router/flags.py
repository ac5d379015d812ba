"""`epd-router`'s command-line flags: the parser (defaults from `RouterConfig`) and the config it gives.

The flags of vLLM's `disagg_epd_proxy.py` work unchanged (`--host`, `--port`,
`--encode-servers-urls`, `--prefill-servers-urls`, `--decode-servers-urls`,
`--ec-consumer-zmq-addrs`); the rest is ours. `router.main` runs the process with what they give.
The flags the operator writes are named in contract.py, which the renderer reads too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from .. import __version__
from . import contract
from .config import RouterConfig
from .discovery import split_urls

D = RouterConfig  # the router's defaults live there, once
# --prefill-servers-urls values that mean E+PD (no prefill tier).
NO_PREFILL = ("", "none", contract.NO_PREFILL)


def _prefill_urls(value: str) -> list[str] | None:
    """--prefill-servers-urls: None (E+PD) for the values that name no prefill tier."""
    return None if value.strip().lower() in NO_PREFILL else split_urls(value)


def _addresses(value: str) -> list[str]:
    return [a.strip() for a in value.split(",") if a.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="epd-router", description="Endpoint-picker router for vLLM Encoder/Prefill/Decode serving."
    )
    a = p.add_argument
    a("--version", action="version", version=f"%(prog)s {__version__}")
    a(contract.HOST, default=D.host, help="address the API listens on")
    a(contract.PORT, type=int, default=D.port, help="port of the OpenAI-compatible API")
    a(contract.METRICS_PORT, type=int, help="serve /metrics on this port only (default: on --port, beside the API)")
    g = p.add_argument_group("static endpoints (vLLM proxy compatible)")
    # argparse passes a string default through `type` too: each list flag's default is its parsed empty value.
    g.add_argument(
        "--encode-servers-urls",
        dest="encode_urls",
        type=split_urls,
        default="",
        metavar="URLS",
        help="comma-separated encoder URLs",
    )
    g.add_argument(
        contract.PREFILL_SERVERS_URLS,
        dest="prefill_urls",
        type=_prefill_urls,
        default="none",
        metavar="URLS",
        help="comma-separated prefill URLs; 'disable'/'none' = E+PD",
    )
    g.add_argument(
        "--decode-servers-urls",
        dest="decode_urls",
        type=split_urls,
        default="",
        metavar="URLS",
        help="comma-separated decode (or PD) URLs",
    )
    g.add_argument(
        "--ec-consumer-zmq-addrs",
        type=_addresses,
        default="",
        metavar="ADDRS",
        help="Mooncake EC: consumer control addresses, one per consumer URL and data-parallel rank",
    )
    g.add_argument(
        "--ec-consumer-dp-size",
        type=int,
        help="data-parallel size of the EC consumer tier (prefill in E/P/D, decode in E+PD)",
    )
    k = p.add_argument_group("Kubernetes discovery")
    k.add_argument(
        contract.DISCOVERY,
        choices=contract.DISCOVERIES,
        default=D.discovery,
        help="where the backends come from: the static URLs above, or EndpointSlices (the flags below)",
    )
    k.add_argument(contract.NAMESPACE, help="default: the pod's own namespace")
    k.add_argument(
        contract.DEPLOYMENT,
        default=D.deployment,
        help="the EPDDeployment this router serves: the epd_deployment label of epd_router_encoder_demand",
    )
    k.add_argument(contract.ENCODER_SELECTOR, help="label selector of the encoder EndpointSlices")
    k.add_argument(contract.PREFILL_SELECTOR, help="label selector of the prefill EndpointSlices (absent = E+PD)")
    k.add_argument(contract.DECODE_SELECTOR, help="label selector of the decode EndpointSlices")
    k.add_argument(
        "--backend-port-name", default=D.backend_port_name, help="EndpointSlice port name of vLLM's HTTP port"
    )
    k.add_argument("--backend-port", type=int, default=D.backend_port, help="port used when a slice names none")
    k.add_argument("--kubeconfig", help="default: in-cluster credentials, else $KUBECONFIG")
    k.add_argument(
        contract.EC_CONSUMER_PORT, type=int, help="Mooncake EC: consumer ec_port; address = tcp://<pod IP>:PORT"
    )
    k.add_argument(
        contract.EC_CONSUMER_TP_SIZE,
        type=int,
        default=D.ec_consumer_tp_size,
        help="Mooncake EC: the consumer's tensor-parallel size; DP rank d listens on PORT + d * this",
    )
    r = p.add_argument_group("picking")
    r.add_argument(
        contract.PREFILL_DP_SIZE,
        type=int,
        default=D.prefill_dp_size,
        help="engines per prefill instance: requests are pinned to one (X-data-parallel-rank), balanced by load",
    )
    r.add_argument(
        contract.DECODE_DP_SIZE,
        type=int,
        default=D.decode_dp_size,
        help="engines per decode (or PD) instance: requests are pinned to one, balanced by load",
    )
    r.add_argument(
        contract.ENCODER_POLICY,
        choices=contract.ENCODER_POLICIES,
        default=D.encoder_policy,
        help="how an image picks its encoder (cache-aware: the encoder that has it, within the load bound)",
    )
    r.add_argument(
        contract.PD_POLICY,
        choices=contract.PD_POLICIES,
        default=D.pd_policy,
        help="how a request picks its prefill and decode instances (prefix-aware: a prompt goes home)",
    )
    r.add_argument(
        "--load-factor",
        type=float,
        default=D.load_factor,
        help=f"hash pickers: max load relative to the mean (>= 1; default {D.load_factor})",
    )
    r.add_argument(
        "--prefix-chars", type=int, default=D.prefix_chars, help="prefix-aware: characters of the prompt hashed"
    )
    r.add_argument(
        "--encoder-max-batch",
        type=int,
        default=int(os.environ.get("ENCODER_MAX_BATCH_SIZE", "0")),
        help="images per encoder sub-request, 0 = unlimited (env ENCODER_MAX_BATCH_SIZE)",
    )
    r.add_argument(
        contract.SPILL_ENCODER_INFLIGHT,
        type=int,
        default=D.spill_encoder_inflight,
        help="spill-over: while every encoder has this many media items in flight or more, a request's new items "
        "go raw to its consumer (which encodes them itself); 0 = off",
    )
    r.add_argument(
        contract.SPILL_CONSUMER_INFLIGHT,
        type=int,
        default=D.spill_consumer_inflight,
        help="spill-over: only to a consumer with fewer requests in flight than this; 0 = any consumer",
    )
    r.add_argument(
        "--demand-window",
        type=int,
        default=D.demand_window,
        help="seconds over which epd_router_encoder_demand shows the most items wanted at once (at least the "
        "Prometheus scrape interval); 0 = the count at the scrape",
    )
    t = p.add_argument_group("timeouts (seconds)")
    t.add_argument("--connect-timeout", type=float, default=D.connect_timeout, help="to open a backend connection")
    t.add_argument("--encode-timeout", type=float, default=D.encode_timeout, help="for an encoder call")
    t.add_argument(
        "--prefill-timeout", type=float, default=D.prefill_timeout, help="for a prefill call (and /v1/models)"
    )
    t.add_argument("--decode-timeout", type=float, default=D.decode_timeout, help="longest silence from decode")
    i = p.add_argument_group("input, reuse, health")
    i.add_argument(
        "--max-body-bytes", type=int, default=D.max_body_bytes, help="largest request body; larger ones get 413"
    )
    i.add_argument(
        "--allow-file-urls", action="store_true", help="pass file:// media through (the router never reads them)"
    )
    c = p.add_argument_group("client connections (seconds)")
    c.add_argument(
        "--header-timeout", type=float, default=D.header_timeout, help="a request head must arrive within this"
    )
    c.add_argument(
        "--body-timeout",
        type=float,
        default=D.body_timeout,
        help="a request body gets this plus 1 s per 64 KiB received",
    )
    c.add_argument(
        "--keepalive-timeout",
        type=float,
        default=D.keepalive_timeout,
        help="idle keep-alive connections close after this",
    )
    c.add_argument(
        "--send-timeout",
        type=float,
        default=D.send_timeout,
        help="a client that stops reading replies is cut after this",
    )
    b = p.add_argument_group("trust boundary (clients are untrusted unless these say otherwise)")
    b.add_argument(
        contract.ALLOW_CLIENT_EMBEDS,
        action="store_true",
        help="accept *_embeds content parts and prompt_embeds from clients (refused by default)",
    )
    b.add_argument(
        contract.TRUST_CLIENT_UUIDS,
        action="store_true",
        help="a client's media uuid names the item in the encoder cache and the reuse cache "
        "(by default it is removed: clients could alias each other's media)",
    )
    b.add_argument(
        contract.IMMUTABLE_MEDIA_URLS,
        action="store_true",
        help="the content behind a media URL never changes: reuse encoder results by URL "
        "(by default only data: URLs and inline audio, which name their content, are reused)",
    )
    i.add_argument(
        contract.REUSE_TTL,
        type=float,
        default=D.reuse_ttl,
        help="SharedStorage connector: reuse an encoded item for this many seconds (keep it well below the janitor TTL); 0 = off",
    )
    i.add_argument(
        "--reuse-max-items", type=int, default=D.reuse_max_items, help="encoded items the reuse cache remembers"
    )
    i.add_argument(
        contract.REWRITE,
        choices=contract.REWRITES,
        default=D.rewrite,
        help="metadata: encoded items reach the consumer as metadata-only *_embeds parts (vLLM 0.32 proxy); "
        "pinned: raw media + uuid, the consumer loads the stored embedding or encodes locally "
        "(SharedStorage; safe when a janitor deletes cache files)",
    )
    i.add_argument(
        "--reuse-mode",
        choices=contract.REUSE_MODES,
        default=D.reuse_mode,
        help="pinned: send a reused item raw with its uuid (the consumer loads the stored embedding, "
        "or encodes if it was evicted); metadata: metadata-only, faster, but a vLLM 0.32 consumer "
        "crashes if the stored embedding is gone — only when the cache evicts by age alone",
    )
    i.add_argument(
        "--health-interval",
        type=float,
        default=D.health_interval,
        help="seconds between probes of every backend's /health and /metrics; 0 = off",
    )
    i.add_argument("--health-timeout", type=float, default=D.health_timeout, help="for one probe")
    i.add_argument(
        "--eject-after", type=int, default=D.eject_after, help="consecutive failures before an endpoint is ejected"
    )
    o = p.add_argument_group("traces (OpenTelemetry; needs epd-operator[tracing])")
    o.add_argument(
        contract.OTLP_TRACES_ENDPOINT,
        help="export a trace per request to this OTLP/HTTP URL (e.g. http://collector:4318/v1/traces) and "
        "send traceparent to every backend; default: off",
    )
    o.add_argument(
        contract.TRACE_SAMPLE_RATIO,
        type=float,
        default=D.trace_sample_ratio,
        help="share of requests traced when the client sent no sampling decision (traceparent)",
    )
    a(contract.WORKERS, type=int, default=D.workers, help="processes sharing the port (SO_REUSEPORT)")
    a(
        contract.DRAIN_TIMEOUT,
        type=float,
        default=D.drain_timeout,
        help="on SIGTERM/SIGINT: stop accepting connections and let the requests in flight finish for up to "
        f"this many seconds, then cut those left and exit (default {D.drain_timeout:g})",
    )
    a("--log-level", default="info", help="Python logging level: debug, info, warning, error")
    a("--log-requests", action="store_true", help="one log line per request: id, route, status, latency")
    return p


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    """The config the flags give: every RouterConfig field is the flag of the same `dest`; vLLM's
    --ec-consumer-dp-size names the EC consumer tier's DP size (prefill in E/P/D, decode in E+PD)."""
    given = vars(args)
    cfg = RouterConfig(**{f.name: given[f.name] for f in dataclasses.fields(RouterConfig)})
    if args.ec_consumer_dp_size is not None:
        if cfg.disaggregated_prefill:
            cfg.prefill_dp_size = args.ec_consumer_dp_size
        else:
            cfg.decode_dp_size = args.ec_consumer_dp_size
    cfg.validate()
    return cfg

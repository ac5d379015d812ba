"""Router settings, filled from the command line (flags.py) or directly by tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import contract
from .pickers import DEFAULT_LOAD_FACTOR

if TYPE_CHECKING:
    from .http_messages import Limits


@dataclass
class RouterConfig:
    host: str = "0.0.0.0"
    port: int = 8000
    # /metrics on its own port (main.py serves it); None: on `port`, beside the API.
    metrics_port: int | None = None
    # Static endpoints (vLLM proxy flags). prefill_urls None means E+PD.
    encode_urls: list[str] = field(default_factory=list)
    prefill_urls: list[str] | None = None
    decode_urls: list[str] = field(default_factory=list)
    # Kubernetes discovery instead of static URLs.
    discovery: contract.Discovery = "static"
    namespace: str | None = None
    # The EPDDeployment this router serves: the `epd_deployment` label of its encoder demand gauge.
    deployment: str = ""
    encoder_selector: str | None = None
    prefill_selector: str | None = None
    decode_selector: str | None = None
    backend_port_name: str = "http"
    backend_port: int = 8000
    kubeconfig: str | None = None
    # Picking.
    encoder_policy: contract.EncoderPolicy = "cache-aware"
    pd_policy: contract.PdPolicy = "least-loaded"
    load_factor: float = DEFAULT_LOAD_FACTOR
    prefix_chars: int = 256
    encoder_max_batch: int = 0
    # Spill-over (encoding.py): 0 turns it off; consumer bound 0: any consumer has headroom.
    spill_encoder_inflight: int = 0
    spill_consumer_inflight: int = 0
    # Seconds over which the encoder demand gauge shows its peak (demand.py); 0: the count at the scrape.
    demand_window: int = 15
    # Timeouts in seconds.
    connect_timeout: float = 5.0
    encode_timeout: float = 60.0
    prefill_timeout: float = 300.0
    decode_timeout: float = 600.0  # longest silence while waiting for decode bytes
    # Input limits.
    max_body_bytes: int = 64 * 1024 * 1024
    allow_file_urls: bool = False
    # Client connections (seconds): a request head must arrive within header_timeout; a body
    # within body_timeout plus 1 s per 64 KiB received; idle keep-alive connections close after
    # keepalive_timeout; a client that leaves the router's send buffer full is cut after send_timeout.
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keepalive_timeout: float = 75.0
    send_timeout: float = 60.0
    # Trust boundary: what the router accepts from clients (all off: clients are untrusted).
    allow_client_embeds: bool = False  # client `*_embeds` parts (and prompt_embeds) reach the consumers
    trust_client_uuids: bool = False  # a client's media `uuid` names the item (EC cache key, reuse key)
    immutable_media_urls: bool = False  # the content behind a media URL never changes: reuse by URL
    # Reuse of encoded items (SharedStorage connector only); 0 disables.
    reuse_ttl: float = 0.0
    reuse_max_items: int = 100_000
    # How an encoded item reaches the consumer. "metadata": a metadata-only `*_embeds` part
    # (vLLM 0.32 proxy protocol). "pinned": raw media + uuid (SharedStorage only): the consumer
    # loads the stored embedding if the file exists and encodes locally if not. vLLM 0.32's
    # ECExampleConnector encoder does not rewrite a file it still holds in its in-memory encoder
    # cache, so once a janitor deleted it a metadata-only request kills the consumer's engine;
    # "pinned" is the safe choice beside a janitor.
    rewrite: contract.Rewrite = "metadata"
    # How a reused item reaches the consumer. "pinned": raw media + uuid, the consumer loads the
    # stored embedding (or encodes locally if it is gone): safe. "metadata": metadata-only, no
    # preprocessing on the consumer, but vLLM 0.32's engine dies if the stored embedding is gone
    # (seen on CPU: "Expected number of multimodal embeddings to match…"), so only with a cache
    # that evicts by age alone.
    reuse_mode: contract.ReuseMode = "pinned"
    # Mooncake EC: consumer control addresses, either static (aligned with the consumer
    # tier's URLs) or derived from each discovered consumer's IP and this port.
    ec_consumer_zmq_addrs: list[str] = field(default_factory=list)
    ec_consumer_port: int | None = None
    # Data-parallel backends: each prefill/decode instance runs this many engines; every request is
    # pinned to one (X-data-parallel-rank), ranks balanced by their own in-flight load. A Mooncake
    # consumer's rank d listens on its ec_port + d * ec_consumer_tp_size (vLLM: ec_port + d*TP + r).
    prefill_dp_size: int = contract.DEFAULT_DP_SIZE
    decode_dp_size: int = contract.DEFAULT_DP_SIZE
    ec_consumer_tp_size: int = contract.DEFAULT_EC_CONSUMER_TP_SIZE
    # Health.
    health_interval: float = 5.0
    health_timeout: float = 2.0
    eject_after: int = 3
    workers: int = 1
    # On SIGTERM or SIGINT: seconds the requests in flight may take to finish before they are cut.
    drain_timeout: float = contract.DEFAULT_DRAIN_TIMEOUT_S
    log_requests: bool = False
    # OpenTelemetry traces over OTLP/HTTP (tracing.py), e.g. http://collector:4318/v1/traces; None: off.
    otlp_traces_endpoint: str | None = None
    trace_sample_ratio: float = 1.0  # share of requests traced that arrive without a client's sampling decision

    @property
    def disaggregated_prefill(self) -> bool:
        if self.discovery == "kubernetes":
            return bool(self.prefill_selector)
        return bool(self.prefill_urls)

    @property
    def ec_consumer_dp_size(self) -> int:
        """The DP size of the EC consumer tier: prefill in E/P/D, the PD tier in E+PD."""
        return self.prefill_dp_size if self.disaggregated_prefill else self.decode_dp_size

    @property
    def mooncake(self) -> bool:
        return bool(self.ec_consumer_zmq_addrs) or self.ec_consumer_port is not None

    def http_limits(self) -> Limits:
        from .http_messages import Limits

        return Limits(
            head_timeout=self.header_timeout,
            body_timeout=self.body_timeout,
            keepalive=self.keepalive_timeout,
            send_timeout=self.send_timeout,
        )

    def validate(self) -> None:
        problems = []
        if self.discovery == "static":
            if not self.decode_urls:
                problems.append("--decode-servers-urls is required")
            consumers = self.prefill_urls if self.disaggregated_prefill else self.decode_urls
            if (
                self.ec_consumer_zmq_addrs
                and len(self.ec_consumer_zmq_addrs) != len(consumers or []) * self.ec_consumer_dp_size
            ):
                problems.append(
                    "--ec-consumer-zmq-addrs needs one address per EC consumer (prefill in E/P/D, decode in E+PD) "
                    "and data-parallel rank, rank-major within each consumer"
                )
        elif self.discovery == "kubernetes":
            if not self.decode_selector:
                problems.append("--decode-selector is required with --discovery kubernetes")
            if self.ec_consumer_zmq_addrs:
                problems.append("use --ec-consumer-port (not --ec-consumer-zmq-addrs) with --discovery kubernetes")
        else:
            problems.append(f"unknown --discovery {self.discovery!r}")
        if self.mooncake and self.reuse_ttl > 0:
            problems.append("--reuse-ttl works with the SharedStorage connector only, not Mooncake push")
        if self.rewrite not in contract.REWRITES:
            problems.append("--rewrite must be metadata or pinned")
        if self.rewrite == "pinned" and self.mooncake:
            problems.append("--rewrite pinned works with the SharedStorage connector only, not Mooncake push")
        if self.reuse_mode not in contract.REUSE_MODES:
            problems.append("--reuse-mode must be pinned or metadata")
        for name in ("header_timeout", "body_timeout", "keepalive_timeout", "send_timeout"):
            if not getattr(self, name) > 0:
                problems.append(f"--{name.replace('_', '-')} must be > 0")
        if not self.drain_timeout >= 0:
            problems.append("--drain-timeout must be >= 0")
        for name in ("prefill_dp_size", "decode_dp_size", "ec_consumer_tp_size"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1")
        for name in ("spill_encoder_inflight", "spill_consumer_inflight"):
            if getattr(self, name) < 0:
                problems.append(f"--{name.replace('_', '-')} must be >= 0 (0: off)")
        if self.demand_window < 0:
            problems.append("--demand-window must be >= 0 (0: the count at the scrape)")
        if self.load_factor < 1:
            problems.append("--load-factor must be >= 1")
        if self.otlp_traces_endpoint is not None:
            from .tracing import MISSING, tracing_available

            if not self.otlp_traces_endpoint.startswith(("http://", "https://")):
                problems.append(
                    "--otlp-traces-endpoint must be an http(s) URL (OTLP/HTTP), e.g. http://collector:4318/v1/traces"
                )
            elif not tracing_available():
                problems.append(MISSING)
        if not 0 <= self.trace_sample_ratio <= 1:
            problems.append("--trace-sample-ratio must be between 0 and 1")
        if problems:
            raise ValueError("; ".join(problems))

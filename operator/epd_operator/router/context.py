"""`RequestContext`: one generation request on its way through the router.

server.py builds it from what the client sent; the pipeline (pipeline.py) and the stages it runs
(encoding.py, calls.py) fill in what the router decided and where the request went.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .backends import Endpoint
from .http_messages import HttpRequest
from .protocol import EncodedItem, MediaItem
from .tracing import RequestTrace


@dataclass(slots=True, eq=False)
class RequestContext:
    """One generation request on its way through the router: what the client sent, what the
    router decided about it, where it went. server.py fills the first block; the pipeline the rest."""

    request: HttpRequest
    route: str  # the OpenAI path; every tier is called on it (encoders on chat)
    rid: str  # x-request-id, the client's or ours; sent to every tier
    t0: float  # perf_counter() at arrival: ttfb and total count from here
    body: dict
    raw: bytes | None  # the client's bytes, forwarded as they are while the body is unchanged; None once altered
    items: list[MediaItem]  # media to encode, in order
    prepared: dict[str, Any]  # the body the consumer gets: the client's until media are rewritten for it
    # Filled by the pipeline:
    common_headers: bytes = b""  # header lines every backend call carries (content type, the client's auth)
    headers: bytes = b""  # common_headers + x-request-id: prefill and decode calls
    key: str | None = None  # prompt prefix for the prefill/decode picker (prefix-aware policy)
    consumer: Endpoint | None = None  # the EC consumer, chosen before encoding: P in E/P/D, PD in E+PD
    generation: str | None = None  # the consumer's compatibility generation: every other tier is picked within it
    consumer_zmq: str | None = None  # where a Mooncake encoder pushes to (the consumer's); None: SharedStorage
    encoded: dict[int, EncodedItem] = field(default_factory=dict)  # EC handles by item index; missing items go raw
    metadata_only: bool = False  # the consumer body references encoder output without the media itself
    kv: dict | None = None  # kv_transfer_params from the prefill that answered
    payload: bytes | None = None  # `prepared` serialized for decode, kept for a retry; None once `prepared` changes
    trace: RequestTrace | None = None  # this request's spans; None while tracing is off
    # Items sent raw instead of to an encoder (encoding.py): encoder demand, held on `demand` (the
    # router's demand gauge) until the consumer answers.
    raw_demand: int = 0
    demand: Any = None

    def release_raw(self) -> None:
        """The consumer answered (its first byte; in E/P/D, prefill's reply) or the request ended: its
        raw items are no longer demand. Idempotent."""
        if self.raw_demand:
            self.demand.dec(self.raw_demand)
            self.raw_demand = 0

"""What vLLM itself says about P->D KV transfer over NIXL in a local E/P/D run (`runner.LocalEPD`).

Every request of a healthy run moves its prompt's KV from prefill to decode: decode counts the
prompt tokens it received (`external_kv_transfer`) and the NIXL reads it made; nothing fails; and
prefill never releases blocks before decode has read them. A lease that expires is the dangerous
case: decode may then read blocks already reused by another request, and answer wrongly with a
200. `make demo` and the e2e tests read these from vLLM's /metrics and prefill's log.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Protocol

from dev.local.client import metric_sum

# Prefill logs this when a lease expires (vLLM 0.32 nixl/base_worker.py); decode reading such
# blocks later makes prefill log "Potentially invalid KV blocks".
EXPIRED_LOG_LINES = ("Releasing expired KV blocks", "Potentially invalid KV blocks")


class RunningEPD(Protocol):
    def url(self, role: str) -> str: ...

    def log_path(self, role: str) -> Path: ...


@dataclass(frozen=True)
class KVTransfer:
    """Counters from vLLM's own /metrics (decode's and prefill's), plus prefill's log."""

    received_tokens: float  # decode: vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}
    transfers: float  # decode: vllm:nixl_xfer_time_seconds_count (one per NIXL read)
    failed: float  # prefill + decode: vllm:nixl_num_failed_transfers_total (handshakes and notifications included)
    expired: float  # prefill: vllm:nixl_num_kv_expired_reqs_total
    read_after_expiry: float  # prefill: vllm:nixl_num_notifications_after_expiry_total
    expired_log_lines: int  # prefill's log lines about expired or invalid KV blocks

    def since(self, before: KVTransfer) -> KVTransfer:
        return KVTransfer(**{f.name: getattr(self, f.name) - getattr(before, f.name) for f in fields(self)})

    def problems(self) -> list[str]:
        """What is wrong with these counts taken as the difference over some requests (empty: healthy)."""
        out = []
        if self.received_tokens <= 0:
            out.append("decode received no prompt tokens over KV transfer")
        if self.transfers <= 0:
            out.append("decode made no NIXL transfer")
        for name in ("failed", "expired", "read_after_expiry", "expired_log_lines"):
            if getattr(self, name):
                out.append(f"{name.replace('_', ' ')}: {getattr(self, name):g}")
        return out

    def line(self) -> str:
        return (
            f"{self.transfers:g} NIXL transfers carried {self.received_tokens:g} prompt tokens to decode; "
            f"{self.failed:g} failed, {self.expired:g} KV leases expired, {self.read_after_expiry:g} reads after expiry"
        )


def read(epd: RunningEPD) -> KVTransfer:
    decode, prefill = epd.url("decode"), epd.url("prefill")
    try:
        log = epd.log_path("prefill").read_text(errors="replace")
    except OSError:
        log = ""
    return KVTransfer(
        received_tokens=metric_sum(decode, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer"),
        transfers=metric_sum(decode, "vllm:nixl_xfer_time_seconds_count"),
        failed=sum(metric_sum(url, "vllm:nixl_num_failed_transfers_total") for url in (prefill, decode)),
        expired=metric_sum(prefill, "vllm:nixl_num_kv_expired_reqs_total"),
        read_after_expiry=metric_sum(prefill, "vllm:nixl_num_notifications_after_expiry_total"),
        expired_log_lines=sum(log.count(line) for line in EXPIRED_LOG_LINES),
    )

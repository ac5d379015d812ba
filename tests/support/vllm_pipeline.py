"""What the e2e tests ask a locally running EPD pipeline (`dev.local.runner.LocalEPD`)."""

from __future__ import annotations

from dev.local.client import Reply, chat, chat_body, metric_sum

MAX_TOKENS = 8


def ask(epd, content, max_tokens: int = MAX_TOKENS, **kwargs) -> Reply:
    """A chat request through the router that must succeed."""
    reply = chat(epd.router_url, chat_body(epd.plan.served_model, content, max_tokens, **kwargs))
    assert reply.ok, f"router: {reply}"
    return reply


def requests_served(epd, role: str) -> float:
    """Requests a vLLM tier has finished, from its own /metrics."""
    return metric_sum(epd.url(role), "vllm:request_success_total")


def prompt_tokens(epd, role: str, source: str) -> float:
    """Prompt tokens of a vLLM tier by where they came from: local_compute, local_cache_hit, external_kv_transfer."""
    return metric_sum(epd.url(role), "vllm:prompt_tokens_by_source_total", source=source)


def router_items(epd, outcome: str) -> float:
    """Media items the router handled by outcome: encoded, reused, fallback."""
    return metric_sum(epd.router_url, "epd_router_items_total", outcome=outcome)

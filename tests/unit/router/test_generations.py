"""Compatibility generations in the router, the pure parts: which consumers can finish a request of a
generation, and what is available within one generation. Requests kept within one generation during a
rollout: tests/loopback/router/test_generations.py."""

from __future__ import annotations

import pytest

from epd_operator.router.backends import DiscoveredEndpoint, Pool, finishing_consumers
from epd_operator.router.metrics import RouterMetrics


@pytest.mark.parametrize(
    ("first", "then", "expected"),
    [
        # (generation of each first-stage consumer, generations with a decode) -> consumers a request may start on
        (["a", "a"], None, ["a0", "a1"]),
        (["a", "b"], ["a"], ["a0"]),
        (["a", "b"], ["a", "b"], ["a0", "b1"]),
        (["a", "b"], [], []),
        ([None, None], [None], ["None0", "None1"]),
    ],
)
def test_finishing_consumers(first, then, expected):
    metrics = RouterMetrics()
    prefills, decodes = Pool("prefill", metrics), Pool("decode", metrics)
    prefills.update([DiscoveredEndpoint(f"http://p{i}", True, f"{g}{i}", None, g) for i, g in enumerate(first)])
    if then is not None:
        decodes.update([DiscoveredEndpoint(f"http://d{i}", True, f"d{i}", None, g) for i, g in enumerate(then)])
    chosen = finishing_consumers(prefills, decodes if then is not None else None)
    assert [ep.pod for ep in chosen] == expected


def test_available_in_one_generation():
    pool = Pool("encoder", RouterMetrics())
    pool.update(
        [
            DiscoveredEndpoint("http://e0", True, "e0", None, "a"),
            DiscoveredEndpoint("http://e1", True, "e1", None, "b"),
            DiscoveredEndpoint("http://e2", False, "e2", None, "a"),
        ]
    )
    assert [ep.pod for ep in pool.available_in("a")] == ["e0"]  # e2 is not ready
    assert [ep.pod for ep in pool.available_in("b")] == ["e1"]
    assert pool.available_in("c") == [] and pool.available_in(None) == []


def test_tiers_not_yet_discovered_offer_no_consumer():
    """Kubernetes discovery whose first list failed leaves the pools as built: a request finds no
    consumer (the router answers 503), and /health calls such a tier empty."""
    metrics = RouterMetrics()
    prefills, decodes = Pool("prefill", metrics), Pool("decode", metrics)
    assert finishing_consumers(prefills, decodes) == []
    assert (prefills.status(), decodes.status()) == ("empty", "empty")

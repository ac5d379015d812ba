"""What RouterConfig.validate refuses (router/config.py), in its own words, all problems at once, and the
client-connection limits a config gives the HTTP server; and the flag reference in docs/router.md being
what the parser says (dev/generate/router_flags.py; the page is generated)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.generate import router_flags
from epd_operator.router.config import RouterConfig
from epd_operator.router.http_messages import Limits

REPO = Path(__file__).resolve().parents[3]


def refusal(**config) -> list[str]:
    with pytest.raises(ValueError) as refused:
        RouterConfig(**config).validate()
    return str(refused.value).split("; ")


def test_every_problem_of_a_static_config_is_named_at_once():
    assert refusal(
        ec_consumer_zmq_addrs=["tcp://a:1"],
        reuse_ttl=1.0,
        rewrite="other",
        reuse_mode="other",
        header_timeout=0,
        body_timeout=0,
        keepalive_timeout=0,
        send_timeout=0,
        drain_timeout=-1,
        prefill_dp_size=0,
        decode_dp_size=0,
        ec_consumer_tp_size=0,
        spill_encoder_inflight=-1,
        spill_consumer_inflight=-1,
        demand_window=-1,
        load_factor=0.5,
        otlp_traces_endpoint="grpc://collector:4317",
        trace_sample_ratio=1.5,
    ) == [
        "--decode-servers-urls is required",
        "--ec-consumer-zmq-addrs needs one address per EC consumer (prefill in E/P/D, decode in E+PD) "
        "and data-parallel rank, rank-major within each consumer",
        "--reuse-ttl works with the SharedStorage connector only, not Mooncake push",
        "--rewrite must be metadata or pinned",
        "--reuse-mode must be pinned or metadata",
        "--header-timeout must be > 0",
        "--body-timeout must be > 0",
        "--keepalive-timeout must be > 0",
        "--send-timeout must be > 0",
        "--drain-timeout must be >= 0",
        "--prefill-dp-size must be >= 1",
        "--decode-dp-size must be >= 1",
        "--ec-consumer-tp-size must be >= 1",
        "--spill-encoder-inflight must be >= 0 (0: off)",
        "--spill-consumer-inflight must be >= 0 (0: off)",
        "--demand-window must be >= 0 (0: the count at the scrape)",
        "--load-factor must be >= 1",
        "--otlp-traces-endpoint must be an http(s) URL (OTLP/HTTP), e.g. http://collector:4318/v1/traces",
        "--trace-sample-ratio must be between 0 and 1",
    ]


def test_consumer_addresses_count_per_consumer_and_rank():
    ok = dict(decode_urls=["http://d0", "http://d1"], decode_dp_size=2)
    RouterConfig(**ok, ec_consumer_zmq_addrs=[f"tcp://a:{i}" for i in range(4)]).validate()  # type: ignore[arg-type]
    assert refusal(**ok, ec_consumer_zmq_addrs=["tcp://a:1", "tcp://a:2"])[0].startswith("--ec-consumer-zmq-addrs")
    # E/P/D: the consumers are the prefill instances
    epd = dict(prefill_urls=["http://p0"], decode_urls=["http://d0", "http://d1"])
    RouterConfig(**epd, ec_consumer_zmq_addrs=["tcp://a:1"]).validate()  # type: ignore[arg-type]


def test_the_bounds_themselves_are_accepted():
    RouterConfig(
        decode_urls=["http://d"],
        drain_timeout=0,
        spill_encoder_inflight=0,
        spill_consumer_inflight=0,
        demand_window=0,
        load_factor=1,
        trace_sample_ratio=0,
    ).validate()
    RouterConfig(decode_urls=["http://d"], trace_sample_ratio=1, otlp_traces_endpoint=None).validate()
    # Client-connection timeouts only have to be positive: below a second is allowed.
    RouterConfig(
        decode_urls=["http://d"], header_timeout=0.5, body_timeout=0.5, keepalive_timeout=0.5, send_timeout=0.5
    ).validate()


@pytest.mark.parametrize("endpoint", ["http://collector:4318/v1/traces", "https://collector:4318/v1/traces"])
def test_traces_go_to_an_http_or_https_collector_when_the_sdk_is_there(endpoint, monkeypatch):
    from epd_operator.router import tracing

    monkeypatch.setattr(tracing, "tracing_available", lambda: True)
    RouterConfig(decode_urls=["http://d"], otlp_traces_endpoint=endpoint).validate()
    monkeypatch.setattr(tracing, "tracing_available", lambda: False)
    assert refusal(decode_urls=["http://d"], otlp_traces_endpoint=endpoint) == [tracing.MISSING]


def test_kubernetes_discovery_and_mooncake_pinned_refusals():
    assert refusal(discovery="kubernetes", ec_consumer_zmq_addrs=["tcp://a:1"]) == [
        "--decode-selector is required with --discovery kubernetes",
        "use --ec-consumer-port (not --ec-consumer-zmq-addrs) with --discovery kubernetes",
    ]
    assert refusal(discovery="kubernetes", decode_selector="x", ec_consumer_port=5, rewrite="pinned") == [
        "--rewrite pinned works with the SharedStorage connector only, not Mooncake push"
    ]
    assert refusal(discovery="other", decode_urls=["http://d"]) == ["unknown --discovery 'other'"]


def test_the_http_limits_are_the_client_connection_settings():
    limits = RouterConfig(header_timeout=1.5, body_timeout=2.5, keepalive_timeout=3.5, send_timeout=4.5).http_limits()
    assert limits == Limits(head_timeout=1.5, body_timeout=2.5, keepalive=3.5, send_timeout=4.5)


def test_the_flag_reference_in_the_docs_is_what_the_parser_says():
    page = (REPO / router_flags.PAGE).read_text(encoding="utf-8")
    assert router_flags.with_table(page) == page, "docs/router.md's flag table is stale: run `make generate`"
    table = router_flags.table()
    assert "| `--demand-window` | int | `15` |" in table
    assert "| **general** | | | |" in table
    assert "| `--log-requests` | (a switch) | `False` |" in table
    assert "| `--discovery` | `static` \\| `kubernetes` | `static` |" in table

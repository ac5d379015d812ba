"""The tracing section of the benchmark, without running it: its traced router's command line is one
epd-router accepts."""

from __future__ import annotations

from bench import contenders as C
from bench import tracing as bench_tracing
from epd_operator.router.main import build_parser, config_from_args


def test_the_traced_contender_is_a_command_line_the_router_accepts():
    topo = C.Topology("E/P/D", encoder="http://127.0.0.1:1", decode="http://127.0.0.1:3", prefill="http://127.0.0.1:2")
    traced = bench_tracing.TracedEpdRouter(
        "t", calls_encoder=True, endpoint="http://127.0.0.1:4/v1/traces", sample_ratio=0.0
    )
    argv = traced.argv(topo, 8000)
    cfg = config_from_args(build_parser().parse_args(argv[1:]))
    assert (cfg.otlp_traces_endpoint, cfg.trace_sample_ratio) == ("http://127.0.0.1:4/v1/traces", 0.0)
    assert cfg.prefill_urls == [topo.prefill] and cfg.workers == 1

"""The router's command line as render/router_args.py derives it from the spec: its worker count from the
pod's CPU, its drain deadline from `--drain-timeout` in `extraArgs` (the last one wins, as in the router's
parser), and the data-parallel stride a Mooncake consumer's ranks need."""

from __future__ import annotations

import pytest

from epd_operator.render.router_args import data_parallel_hints, router_args, router_drain_seconds, router_workers
from tests.support.render_examples import MOONCAKE, SHARED_STORAGE, example


@pytest.mark.parametrize(
    "extra, seconds",
    [
        ([], 30.0),  # the router's own default
        (["--drain-timeout", "10"], 10.0),
        (["--drain-timeout=5"], 5.0),
        (["--drain-timeout=0.5"], 0.5),
        (["--drain-timeout=-3"], 0.0),  # never below zero
        (["--log-requests", "--drain-timeout", "12"], 12.0),  # after another flag, its value after it
        (["--drain-timeout=5", "--log-requests", "--drain-timeout", "7"], 7.0),  # the last one wins
        (["--drain-timeout", "soon"], 30.0),  # the router refuses it at start; ours stays
        (["--log-requests", "--drain-timeout"], 30.0),  # no value at the end
    ],
)
def test_the_drain_deadline_is_the_last_drain_timeout_in_extra_args(extra, seconds):
    assert router_drain_seconds(example(SHARED_STORAGE, **{"spec.router.extraArgs": extra})) == seconds


@pytest.mark.parametrize(
    "resources, workers",
    [
        ({"requests": {"cpu": "1500m"}}, 2),  # the request, without a limit
        ({"requests": {"cpu": "1"}, "limits": {"cpu": "3"}}, 3),  # the limit first
        ({"requests": {"cpu": "250m"}}, 1),
        ({"requests": {"memory": "256Mi"}}, 1),  # no CPU named: one
    ],
)
def test_one_router_process_per_cpu_the_pod_may_use(resources, workers):
    epd = example(SHARED_STORAGE, **{"spec.router.resources": resources})
    assert router_workers(epd) == workers
    args = router_args(epd)
    if workers > 1:
        assert args[args.index("--workers") + 1] == str(workers)
        assert args[:2] == ["--host", "0.0.0.0"]  # beside the rest of the command line
    else:
        assert "--workers" not in args


def test_a_mooncake_consumer_with_two_ranks_gets_its_tensor_parallel_stride():
    two_ranks = example(MOONCAKE, **{"spec.decode.dataParallelSize": 2, "spec.decode.tensorParallelSize": 2})
    assert data_parallel_hints(two_ranks) == ["--decode-dp-size", "2", "--ec-consumer-tp-size", "2"]
    one_rank = example(MOONCAKE, **{"spec.decode.tensorParallelSize": 2})
    assert "--ec-consumer-tp-size" not in data_parallel_hints(one_rank)

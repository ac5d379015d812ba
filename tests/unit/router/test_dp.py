"""Data-parallel consumers, the pure parts: each rank's Mooncake control address, pools with and without DP,
queue depth per engine, the DP flags of the router's command line, and each rank's control port read from an
EndpointSlice. The router pinning requests to ranks: tests/loopback/router/test_dp.py."""

from __future__ import annotations

import pytest

from epd_operator.router.backends import DiscoveredEndpoint, Pool, rank_zmq, scraped_queue_depths
from epd_operator.router.config import RouterConfig
from epd_operator.router.discovery import slice_endpoints
from epd_operator.router.main import build_parser, config_from_args
from epd_operator.router.metrics import RouterMetrics

MOONCAKE_ADDRS = ["tcp://10.0.0.1:14579", "tcp://10.0.0.1:14581", "tcp://10.0.0.2:14579", "tcp://10.0.0.2:14581"]


def test_ranked_mooncake_addresses_follow_ec_port_plus_rank_times_tp():
    pool = Pool("decode", RouterMetrics(), dp_size=3, zmq_rank_stride=2)
    pool.update([DiscoveredEndpoint("http://10.0.0.7:8000", pod="pd-0", ec_zmq="tcp://10.0.0.7:14579")])
    assert [(ep.key, ep.rank, ep.ec_zmq) for ep in pool.endpoints.values()] == [
        ("10.0.0.7:8000#dp0", 0, "tcp://10.0.0.7:14579"),
        ("10.0.0.7:8000#dp1", 1, "tcp://10.0.0.7:14581"),
        ("10.0.0.7:8000#dp2", 2, "tcp://10.0.0.7:14583"),
    ]
    assert [ep.rank_header for ep in pool.endpoints.values()] == [
        b"X-data-parallel-rank: 0\r\n",
        b"X-data-parallel-rank: 1\r\n",
        b"X-data-parallel-rank: 2\r\n",
    ]
    assert rank_zmq("tcp://[fd00::1]:20000", 5, 4) == "tcp://[fd00::1]:20020"
    assert rank_zmq(None, 1, 1) is None


def test_a_pool_without_dp_keeps_one_unpinned_endpoint_per_backend():
    pool = Pool("decode", RouterMetrics())
    pool.update([DiscoveredEndpoint("http://10.0.0.7:8000", ec_zmq="tcp://10.0.0.7:14579")])
    (ep,) = pool.endpoints.values()
    assert (ep.key, ep.rank, ep.rank_header, ep.ec_zmq) == ("10.0.0.7:8000", None, b"", "tcp://10.0.0.7:14579")
    for sizes in ({"dp_size": 0}, {"zmq_rank_stride": 0}):
        with pytest.raises(ValueError, match=r"^dp_size and zmq_rank_stride must be >= 1$"):
            Pool("decode", RouterMetrics(), **sizes)


def test_queue_depth_is_read_per_engine():
    text = (
        b'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        b'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
        b'vllm:num_requests_running{model_name="m",engine="1"} 7.0\n'
        b'vllm:num_requests_waiting_by_reason{engine="1",model_name="m",reason="capacity"} 9.0\n'
        b"vllm:num_requests_running 4.0\n"
    )
    assert scraped_queue_depths(text) == {"0": 3, "1": 7, None: 4}
    assert scraped_queue_depths(b"# nothing\n") == {}


def test_queue_depth_survives_odd_label_values_and_bad_lines():
    """Label values may hold spaces and braces; a line without a value or with a bad one is skipped,
    never the lines after it."""
    text = (
        b"vllm:num_requests_running\n"  # a name alone: no labels, no value
        b'vllm:num_requests_running{model_name="my {big} model",engine="1"} 2.0\n'
        b'vllm:num_requests_waiting{engine="1"} lots\n'
        b'vllm:num_requests_waiting{model_name="a b",engine="1"} 5.0\n'
    )
    assert scraped_queue_depths(text) == {"1": 7}


def test_queue_depth_reads_the_value_before_a_timestamp_and_skips_what_is_no_number():
    text = (
        b'vllm:num_requests_running{engine="0"} 3 1733300000000\n'  # the exposition format's optional timestamp
        b"vllm:num_requests_waiting 2.0 1733300000000\n"
        b'vllm:num_requests_waiting{engine="0"} NaN\n'
        b'vllm:num_requests_running{engine="1"} +Inf\n'
        b'vllm:num_requests_waiting{engine="1"} 1\n'
    )
    assert scraped_queue_depths(text) == {"0": 3, None: 2, "1": 1}


def test_command_line_dp_sizes_and_vllms_consumer_flag():
    cfg = config_from_args(
        build_parser().parse_args(
            [
                "--decode-servers-urls",
                "http://a:8000,http://b:8000",
                "--ec-consumer-dp-size",
                "2",
                "--ec-consumer-zmq-addrs",
                ",".join(MOONCAKE_ADDRS),
                "--ec-consumer-tp-size",
                "2",
            ]
        )
    )
    assert (cfg.decode_dp_size, cfg.prefill_dp_size, cfg.ec_consumer_tp_size) == (2, 1, 2)
    cfg = config_from_args(
        build_parser().parse_args(
            [
                "--decode-servers-urls",
                "http://d:8000",
                "--prefill-servers-urls",
                "http://p:8000",
                "--ec-consumer-dp-size",
                "4",
                "--decode-dp-size",
                "3",
            ]
        )
    )
    assert (cfg.prefill_dp_size, cfg.decode_dp_size) == (4, 3)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"decode_dp_size": 0}, "--decode-dp-size must be >= 1"),
        ({"ec_consumer_tp_size": 0}, "--ec-consumer-tp-size must be >= 1"),
        ({"decode_dp_size": 2, "ec_consumer_zmq_addrs": ["tcp://a:1"]}, "one address per EC consumer"),
    ],
)
def test_bad_dp_settings_are_refused(changes, problem):
    with pytest.raises(ValueError, match=problem):
        RouterConfig(decode_urls=["http://a:8000"], **changes).validate()


def test_kubernetes_discovery_reads_each_ranks_control_port_from_the_slice():
    slice_ = {
        "ports": [{"name": "http", "port": 8000}, {"name": "ec-dp1", "port": 20007}, {"name": "ec-dp0", "port": 20003}],
        "endpoints": [{"addresses": ["10.0.0.9"], "targetRef": {"kind": "Pod", "name": "pd-1"}}],
    }
    (found,) = slice_endpoints(slice_, "http", 8000, ec_port=14579)
    assert (found.url, found.ec_zmq, found.ec_zmq_ranks) == (
        "http://10.0.0.9:8000",
        "tcp://10.0.0.9:20003",
        ("tcp://10.0.0.9:20003", "tcp://10.0.0.9:20007"),
    )
    pool = Pool("decode", RouterMetrics(), dp_size=3, zmq_rank_stride=2)
    pool.update([found])
    # ranks the Service names come from it; a rank it does not name falls back to ec_port + d * TP
    assert [ep.ec_zmq for ep in pool.endpoints.values()] == [
        "tcp://10.0.0.9:20003",
        "tcp://10.0.0.9:20007",
        "tcp://10.0.0.9:20007",
    ]


def test_a_slice_with_a_gap_in_its_rank_ports_is_not_trusted():
    slice_ = {
        "ports": [{"name": "http", "port": 8000}, {"name": "ec-dp1", "port": 20007}],
        "endpoints": [{"addresses": ["10.0.0.9"]}],
    }
    (found,) = slice_endpoints(slice_, "http", 8000, ec_port=14579)
    assert (found.ec_zmq, found.ec_zmq_ranks) == ("tcp://10.0.0.9:14579", ())
    (plain,) = slice_endpoints(slice_, "http", 8000, ec_port=None)  # not Mooncake: no addresses at all
    assert (plain.ec_zmq, plain.ec_zmq_ranks) == (None, ())

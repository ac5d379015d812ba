"""`epd-router` command line: vLLM-proxy-compatible flags, the flags the operator passes, and config errors."""

import pytest

from epd_operator.router.main import build_parser, config_from_args


def parse(*argv):
    return config_from_args(build_parser().parse_args(list(argv)))


def test_vllm_proxy_flags_are_accepted():
    cfg = parse(
        "--host",
        "127.0.0.1",
        "--port",
        "10001",
        "--encode-servers-urls",
        "http://e1:8000,http://e2:8000",
        "--prefill-servers-urls",
        "disable",
        "--decode-servers-urls",
        "http://pd:8000",
        "--log-requests",
    )
    assert (cfg.encode_urls, cfg.prefill_urls, cfg.decode_urls) == (
        ["http://e1:8000", "http://e2:8000"],
        None,
        ["http://pd:8000"],
    )
    assert not cfg.disaggregated_prefill and cfg.log_requests
    epd = parse("--prefill-servers-urls", "p:8000", "--decode-servers-urls", "d:8000", "--pd-policy", "prefix-aware")
    assert epd.disaggregated_prefill and epd.prefill_urls == ["http://p:8000"] and epd.pd_policy == "prefix-aware"


def test_kubernetes_flags_as_the_operator_passes_them():
    cfg = parse(
        "--discovery",
        "kubernetes",
        "--namespace",
        "ns",
        "--encoder-selector",
        "serving.epd.dev/role=encoder,app.kubernetes.io/instance=vl",
        "--decode-selector",
        "serving.epd.dev/role=decode",
        "--ec-consumer-port",
        "14579",
    )
    assert cfg.encoder_selector.endswith("instance=vl") and cfg.mooncake and not cfg.disaggregated_prefill


@pytest.mark.parametrize(
    "argv, message",
    [
        ((), "--decode-servers-urls is required"),
        (("--discovery", "kubernetes"), "--decode-selector is required"),
        (("--decode-servers-urls", "d:1,d:2", "--ec-consumer-zmq-addrs", "tcp://a:1"), "one address per EC consumer"),
        (
            ("--decode-servers-urls", "d:1", "--ec-consumer-zmq-addrs", "tcp://a:1", "--reuse-ttl", "60"),
            "SharedStorage",
        ),
        (("--decode-servers-urls", "d:1", "--load-factor", "0.5"), "--load-factor"),
        (
            ("--decode-servers-urls", "d:1", "--ec-consumer-zmq-addrs", "tcp://a:1", "--rewrite", "pinned"),
            "--rewrite pinned",
        ),
    ],
)
def test_inconsistent_flags_are_refused_with_a_reason(argv, message):
    with pytest.raises(ValueError, match=message):
        parse(*argv)

"""`epd-router` command line: vLLM-proxy-compatible flags, config errors, and worker processes sharing a port."""

import asyncio
import os
import signal
import socket
import subprocess
import sys

import aiohttp
import orjson
import pytest

from epd_operator.router.main import build_parser, config_from_args
from tests.support.fake_vllm import FakeVLLM
from tests.support.prom import sample_values


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_workers_share_the_port_and_report_metrics_together():
    async with FakeVLLM("pd", "d0") as pd:
        port = free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "epd_operator.router.main",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--decode-servers-urls",
                pd.url,
                "--workers",
                "2",
                "--log-level",
                "warning",
            ],
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        try:
            url = f"http://127.0.0.1:{port}"
            async with aiohttp.ClientSession() as session:
                async with asyncio.timeout(60):
                    while True:
                        try:
                            async with session.get(url + "/health") as r:
                                if r.status == 200:
                                    break
                        except aiohttp.ClientError:
                            await asyncio.sleep(0.1)
                body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
                for _ in range(12):
                    # A fresh connection each time so the kernel may hand it to either worker.
                    async with (
                        aiohttp.ClientSession() as one_shot,
                        one_shot.post(url + "/v1/chat/completions", data=body) as r,
                    ):
                        assert r.status == 200
                async with session.get(url + "/metrics") as r:
                    text = await r.read()
            assert sample_values(text, "epd_router_requests_total", route="/v1/chat/completions", status="200") == [12]
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0

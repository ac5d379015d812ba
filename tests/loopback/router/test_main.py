"""`epd-router` as a process: worker processes sharing a port and reporting their metrics together."""

import asyncio
import os
import signal
import subprocess

import aiohttp
import orjson

from dev.ports import free_port
from tests.support.fake_vllm import FakeVLLM
from tests.support.prom import sample_values
from tests.support.router_stack import router_argv


async def test_workers_share_the_port_and_report_metrics_together():
    async with FakeVLLM("pd", "d0") as pd:
        port = free_port()
        proc = subprocess.Popen(
            router_argv(port, "--decode-servers-urls", pd.url, "--workers", "2", "--log-level", "warning"),
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

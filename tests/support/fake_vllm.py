"""Scripted vLLM-shaped backends for router tests and benchmarks.

One aiohttp server per instance, speaking just enough of vLLM 0.32's OpenAI server and
EPD behaviour (what vLLM's own EPD proxy, `disagg_epd_proxy.py`, exchanges with the tiers, and what
real vLLM 0.32 on CPU answers in the e2e tests):

- encoder: replies with empty content and top-level `ec_transfer_params` keyed by mm_hash
  (`metadata`, `item_indices`, and `transfer_id` when the request carried Mooncake `ec_items`);
- prefill: replies to a `do_remote_decode` request with NIXL-shaped `kv_transfer_params`;
- decode / pd: answers with JSON or an SSE stream;
- all: `/health`, `/metrics` (`vllm:num_requests_running/waiting`), `/v1/models`.

Knobs (`Knobs`) script delays, failures, dropped connections and rejected metadata-only
requests; every request's path, body and headers are recorded in `received`.

Standalone: `python -m tests.support.fake_vllm --role encoder --port 9001`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

ROLES = ("encoder", "prefill", "decode", "pd")
METADATA_BY_TYPE: dict[str, dict[str, Any]] = {
    "image_url": {"image_grid_thw": [1, 16, 16]},
    "video_url": {"video_grid_thw": [[2, 16, 16]]},
    "audio_url": {"audio_num_tokens": [50]},
    "input_audio": {"audio_num_tokens": [50]},
}


@dataclass
class Knobs:
    delay: float = 0.0  # seconds before answering a generation request
    fail_status: int = 500  # status used by fail_next / fail_always
    fail_next: int = 0  # the next N generation requests fail with fail_status
    fail_always: bool = False
    drop_next: int = 0  # the next N generation requests get their connection closed, no answer
    reject_embeds: bool = False  # consumer: 500 on metadata-only `*_embeds` parts (cache evicted)
    rehash: bool = False  # encoder: report an mm_hash that differs from the uuid
    omit_metadata: bool = False  # encoder: report no ec_transfer_params at all
    omit_kv_params: bool = False  # prefill: answer without kv_transfer_params (no KV handle for decode)
    stream_chunks: int = 3
    chunk_delay: float = 0.0
    break_stream_after: int | None = None  # decode: drop the connection after this many chunks
    stream_gate: asyncio.Event | None = None  # decode: after the first chunk, wait for this event
    reply_gate: asyncio.Event | None = None  # decode: wait for this event before a whole (not streamed) answer
    health_status: int = 200
    running: int = 0
    waiting: int = 0
    running_by_rank: dict[int, int] | None = None  # with dp_size > 1: each engine's running requests


@dataclass
class Received:
    path: str
    body: dict
    headers: CIMultiDict  # case-insensitive, as HTTP header names are


@dataclass
class FakeVLLM:
    role: str
    name: str = ""
    model: str = "fake-model"
    knobs: Knobs = field(default_factory=Knobs)
    record: bool = True
    received: list[Received] = field(default_factory=list)
    cancelled: int = 0  # requests whose client went away before the answer was complete
    url: str = ""
    # A compatibility generation: the encoder stamps it into what it reports and the prefill into its
    # kv_transfer_params; a consumer refuses (400) transfer parameters stamped by another generation,
    # as a vLLM of another build or connector would fail them, and counts each refusal.
    generation: str | None = None
    foreign_refused: int = 0
    # Data parallelism (prefill, decode, pd): `dp_size` engines behind one API server, as vLLM runs
    # them. With dp_size > 1 a request must name its engine in X-data-parallel-rank (0..dp_size-1);
    # one that does not is refused (400) and counted. `by_rank` counts the requests each engine took.
    dp_size: int = 1
    rank_errors: int = 0
    by_rank: dict[int, int] = field(default_factory=dict)
    # Mooncake push, checked end to end: encoders record in `pushes` (a dict shared with the consumers)
    # the control address each transfer id was pushed to; a consumer with `ec_zmq_by_rank` (its control
    # address per DP rank) refuses (400) and counts a request whose items went to any address but its
    # pinned rank's, since that engine would wait for a push that never comes.
    pushes: dict[str, str] | None = None
    ec_zmq_by_rank: list[str] = field(default_factory=list)
    misrouted: int = 0

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}")
        self._ids = itertools.count()
        self._runner: web.AppRunner | None = None

    # ---- lifecycle ----

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0][1]
        self.url = f"http://{host}:{bound}"
        self.name = self.name or f"{self.role}-{bound}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeVLLM:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # ---- inspection ----

    def bodies(self, path: str | None = None) -> list[dict]:
        return [r.body for r in self.received if path is None or r.path == path]

    # ---- handlers ----

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=self.knobs.health_status, text="")

    async def _metrics(self, request: web.Request) -> web.Response:
        k = self.knobs
        text = ""
        for rank in range(self.dp_size):  # vLLM labels each DP engine's gauges with its rank
            labels = f'engine="{rank}",model_name="{self.model}"'
            running = k.running_by_rank.get(rank, 0) if k.running_by_rank else (k.running if rank == 0 else 0)
            text += (
                "# TYPE vllm:num_requests_running gauge\n"
                f"vllm:num_requests_running{{{labels}}} {float(running)}\n"
                "# TYPE vllm:num_requests_waiting gauge\n"
                f"vllm:num_requests_waiting{{{labels}}} {float(k.waiting if rank == 0 else 0)}\n"
                f'vllm:num_requests_waiting_by_reason{{{labels},reason="capacity"}} 99.0\n'
            )
        return web.Response(text=text, content_type="text/plain")

    async def _models(self, request: web.Request) -> web.Response:
        if self.record:
            self.received.append(Received(request.path, {}, CIMultiDict(request.headers)))
        doc = {
            "object": "list",
            "data": [{"id": self.model, "object": "model", "owned_by": "vllm", "root": self.model}],
        }
        return web.Response(body=orjson.dumps(doc), content_type="application/json")

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if self.record:
            self.received.append(Received(request.path, body, CIMultiDict(request.headers)))
        k = self.knobs
        try:
            if k.drop_next > 0:
                k.drop_next -= 1
                assert request.transport is not None
                request.transport.close()
                await asyncio.sleep(3600)
            if k.delay:
                await asyncio.sleep(k.delay)
            if k.fail_always or k.fail_next > 0:
                k.fail_next = max(0, k.fail_next - 1)
                return _error(k.fail_status, f"{self.name}: scripted failure")
            if self.role == "encoder":
                self._record_pushes(body)
            else:
                refusal = self._rank_refusal(request, body)
                if refusal is not None:
                    return refusal
            foreign = self._foreign_generation(body)
            if foreign is not None:
                self.foreign_refused += 1
                return _error(
                    400, f"{self.name}: transfer parameters of generation {foreign}, this is {self.generation}"
                )
            if self.role == "encoder":
                return self._encode(body)
            if self.role == "prefill":
                return self._prefill(request.path, body)
            if k.reject_embeds and _has_embeds(body):
                return _error(500, f"{self.name}: encoder cache entry not found")
            return await self._answer(request, body)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    def _record_pushes(self, body: dict) -> None:
        params = body.get("ec_transfer_params") or {}
        if self.pushes is not None and params.get("consumer_zmq"):
            for item in params.get("ec_items") or ():
                self.pushes[item["transfer_id"]] = params["consumer_zmq"]

    def _rank_refusal(self, request: web.Request, body: dict) -> web.Response | None:
        """A 400 for a request not pinned to one of our engines, or whose pushes went elsewhere."""
        header = request.headers.get("X-data-parallel-rank")
        if self.dp_size == 1 and header is None:
            rank = 0
        elif header is not None and header.isdigit() and int(header) < self.dp_size:
            rank = int(header)
        else:
            self.rank_errors += 1
            return _error(400, f"{self.name}: X-data-parallel-rank {header!r} names none of {self.dp_size} engines")
        self.by_rank[rank] = self.by_rank.get(rank, 0) + 1
        if self.ec_zmq_by_rank and self.pushes is not None:
            items = (body.get("ec_transfer_params") or {}).get("ec_items") or ()
            wrong = [
                self.pushes.get(item.get("transfer_id"))
                for item in items
                if self.pushes.get(item.get("transfer_id")) != self.ec_zmq_by_rank[rank]
            ]
            if wrong:
                self.misrouted += 1
                return _error(
                    400, f"{self.name}: rank {rank} listens on {self.ec_zmq_by_rank[rank]}, items went to {wrong}"
                )
        return None

    def _encode(self, body: dict) -> web.Response:
        content = body["messages"][0]["content"]
        ec_items = (body.get("ec_transfer_params") or {}).get("ec_items") or []
        params: dict[str, dict] = {}
        for pos, part in enumerate(content):
            if part.get("type") not in METADATA_BY_TYPE:
                continue
            mm_hash = part.get("uuid") or hashlib.sha256(orjson.dumps(part)).hexdigest()
            if self.knobs.rehash:
                mm_hash = hashlib.sha256(f"engine:{mm_hash}".encode()).hexdigest()
            entry = params.get(mm_hash)
            if entry is None:
                metadata = METADATA_BY_TYPE[part["type"]]
                if self.generation is not None:
                    metadata = {**metadata, "generation": [self.generation]}
                entry = params[mm_hash] = {"metadata": metadata, "item_indices": []}
                if pos < len(ec_items):
                    entry["transfer_id"] = ec_items[pos].get("transfer_id")
            entry["item_indices"].append(pos)
        reply = self._completion(body, "", finish="length")
        reply["usage"]["completion_tokens"] = 0
        if params and not self.knobs.omit_metadata:
            reply["ec_transfer_params"] = params
        return _json(reply)

    def _prefill(self, path: str, body: dict) -> web.Response:
        kv = body.get("kv_transfer_params") or {}
        reply = self._completion(body, "x", chat=path.endswith("chat/completions"))
        if kv.get("do_remote_decode") and not self.knobs.omit_kv_params:
            reply["kv_transfer_params"] = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": [1, 2, 3],
                "remote_engine_id": f"engine-{self.name}",
                "remote_request_id": reply["id"],
                "remote_host": "127.0.0.1",
                "remote_port": 5600,
                "tp_size": 1,
            }
            if self.generation is not None:
                reply["kv_transfer_params"]["generation"] = self.generation
        return _json(reply)

    def _foreign_generation(self, body: dict) -> str | None:
        """The generation stamped on the transfer parameters of `body` when it is not ours."""
        if self.generation is None:
            return None
        stamps = {
            gen
            for part in _content_parts(body)
            if str(part.get("type", "")).endswith("_embeds")
            for embeds in [part.get(part["type"])]
            if isinstance(embeds, dict)
            for gen in embeds.get("generation") or ()
        }
        kv = body.get("kv_transfer_params") or {}
        if kv.get("generation"):
            stamps.add(kv["generation"])
        foreign = stamps - {self.generation}
        return min(foreign) if foreign else None

    async def _answer(self, request: web.Request, body: dict) -> web.StreamResponse:
        chat = request.path.endswith("chat/completions")
        text = f"answer from {self.name}"
        k = self.knobs
        if not body.get("stream"):
            if k.reply_gate is not None:
                await k.reply_gate.wait()
            return _json(self._completion(body, text, chat=chat))
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await out.prepare(request)
        rid = f"chatcmpl-{self.name}-{next(self._ids)}"
        for i in range(k.stream_chunks):
            if k.break_stream_after is not None and i >= k.break_stream_after:
                assert request.transport is not None
                request.transport.close()
                return out
            piece = f"{text} [{i}]"
            delta = {"content": piece} if chat else None
            choice = (
                {"index": 0, "delta": delta, "finish_reason": None}
                if chat
                else {"index": 0, "text": piece, "finish_reason": None}
            )
            await out.write(
                b"data: " + orjson.dumps({"id": rid, "object": "chat.completion.chunk", "choices": [choice]}) + b"\n\n"
            )
            if k.chunk_delay:
                await asyncio.sleep(k.chunk_delay)
            if i == 0 and k.stream_gate is not None:
                await k.stream_gate.wait()
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    def _completion(self, body: dict, text: str, finish: str = "stop", chat: bool = True) -> dict:
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            if chat
            else {"index": 0, "text": text, "finish_reason": finish}
        )
        return {
            "id": f"cmpl-{self.name}-{next(self._ids)}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [choice],
            "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
        }


def _content_parts(body: dict) -> list[dict]:
    return [
        part
        for msg in body.get("messages") or ()
        if isinstance(msg.get("content"), list)
        for part in msg["content"]
        if isinstance(part, dict)
    ]


def _has_embeds(body: dict) -> bool:
    return any(
        isinstance(part, dict) and str(part.get("type", "")).endswith("_embeds")
        for msg in body.get("messages") or ()
        if isinstance(msg.get("content"), list)
        for part in msg["content"]
    )


def _json(doc: dict, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": {"message": message, "type": "InternalServerError", "code": status}}, status)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=ROLES, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--name", default="")
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--stream-chunks", type=int, default=3)
    p.add_argument("--chunk-delay", type=float, default=0.0)
    p.add_argument("--no-record", action="store_true", help="do not keep request bodies (long benchmark runs)")
    args = p.parse_args(argv)
    fake = FakeVLLM(
        args.role,
        args.name,
        knobs=Knobs(delay=args.delay, stream_chunks=args.stream_chunks, chunk_delay=args.chunk_delay),
        record=not args.no_record,
    )

    async def serve() -> None:
        await fake.start(args.host, args.port)
        print(f"fake vLLM {args.role} on {fake.url}", flush=True)
        await asyncio.Event().wait()

    try:
        import uvloop

        uvloop.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

"""`epd-router` as a process on SIGTERM: it drains (no new connections, /health 503, the requests in
flight answered, idle keep-alive connections closed) and exits 0; past `--drain-timeout` what is
still running is cut and it exits 0 all the same."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import orjson
import pytest

from dev.ports import free_port
from tests.support.fake_vllm import FakeVLLM
from tests.support.router_stack import router_argv

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
STREAM = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})


def post(body: bytes, path: str = "/v1/chat/completions") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


GET_HEALTH = b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n"


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *fields = head.decode("latin-1").split("\r\n")[:-2]
    headers = {name.lower(): value.strip() for name, _, value in (f.partition(":") for f in fields)}
    return int(status_line.split()[1]), headers


async def read_chunk(reader: asyncio.StreamReader) -> bytes:
    size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
    data = await reader.readexactly(size + 2)
    return data[:-2]


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status, headers = await read_head(reader)
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while chunk := await read_chunk(reader):
            body += chunk
        return status, headers, body
    return status, headers, await reader.readexactly(int(headers["content-length"]))


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    """Whether the router closed (or reset) the connection: nothing more arrives."""
    try:
        return await reader.read(1) == b""
    except ConnectionResetError:
        return True


@contextlib.asynccontextmanager
async def router_process(decode_url: str, log: Path, *args: str) -> AsyncIterator[tuple[subprocess.Popen, int]]:
    port = free_port()
    with log.open("wb") as err:
        proc = subprocess.Popen(
            router_argv(port, "--decode-servers-urls", decode_url, "--health-interval", "0", *args),
            env={**os.environ, "PYTHONPATH": os.getcwd()},
            stderr=err,
        )
    try:
        async with asyncio.timeout(60):
            while True:
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    assert proc.poll() is None, log.read_text()
                    await asyncio.sleep(0.1)
                    continue
                writer.write(GET_HEALTH)
                status, _, _ = await read_reply(reader)
                writer.close()
                if status == 200:
                    break
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        await asyncio.to_thread(proc.wait)


async def refused(port: int) -> None:
    """Until new connections are refused: the router stopped listening."""
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except ConnectionRefusedError:
            return
        except ConnectionResetError:
            # The listener closed with this connection still in its accept queue: the kernel resets it.
            # Closing has begun; the next attempt is refused.
            await asyncio.sleep(0.05)
            continue
        writer.close()
        await asyncio.sleep(0.05)


Connect = Callable[[int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """Client connections to the router, closed when the test ends, whether it passed or not."""
    opened: list[asyncio.StreamWriter] = []

    async def open_(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        opened.append(writer)
        return reader, writer

    yield open_
    for writer in opened:
        writer.close()


async def exit_code(proc: subprocess.Popen, within: float) -> int:
    return await asyncio.to_thread(proc.wait, within)


@pytest.mark.parametrize("workers", [1, 2])
async def test_sigterm_drains_what_is_in_flight_and_exits_0(tmp_path, workers, connect):
    pd = FakeVLLM("pd", "d0")
    pd.knobs.reply_gate = asyncio.Event()  # the whole answer waits for it
    pd.knobs.stream_gate = asyncio.Event()  # the streamed answer waits for it after its first chunk
    async with pd, asyncio.timeout(120):
        log = tmp_path / "router.log"
        async with router_process(pd.url, log, "--drain-timeout", "30", "--workers", str(workers)) as (proc, port):
            # A: a whole reply in flight, and /health pipelined behind it on the same connection.
            a_reader, a_writer = await connect(port)
            a_writer.write(post(CHAT) + GET_HEALTH)
            # B: a streamed reply, its first chunk already out.
            b_reader, b_writer = await connect(port)
            b_writer.write(post(STREAM))
            status, headers = await read_head(b_reader)
            assert status == 200 and headers["transfer-encoding"] == "chunked"
            first = await read_chunk(b_reader)
            assert b"[0]" in first
            # C: an idle keep-alive connection.
            c_reader, c_writer = await connect(port)
            c_writer.write(GET_HEALTH)
            status, headers, _ = await read_reply(c_reader)
            assert status == 200 and headers.get("connection") != "close"
            while len(pd.received) < 2:  # A's request reached the backend too
                await asyncio.sleep(0.02)

            proc.send_signal(signal.SIGTERM)
            await refused(port)  # new connections are refused from here
            assert await closed_by_peer(c_reader)  # the idle keep-alive connection is closed
            assert proc.poll() is None  # still draining: A and B are held by the backend
            pd.knobs.reply_gate.set()
            pd.knobs.stream_gate.set()

            status, headers, body = await read_reply(a_reader)
            assert status == 200, body
            assert orjson.loads(body)["choices"][0]["message"]["content"] == "answer from d0"
            assert headers.get("connection") != "close"  # the pipelined request is still owed its answer
            status, headers, body = await read_reply(a_reader)
            assert status == 503 and orjson.loads(body)["proxy"] == "draining"
            assert headers["connection"] == "close"
            assert await closed_by_peer(a_reader)

            rest = b""
            while chunk := await read_chunk(b_reader):
                rest += chunk
            assert b"[1]" in rest and b"[2]" in rest and rest.endswith(b"data: [DONE]\n\n")
            assert await closed_by_peer(b_reader)  # the stream was the connection's last reply

            assert await exit_code(proc, within=30 + 10) == 0
            for writer in (a_writer, b_writer, c_writer):
                writer.close()
    text = log.read_text()
    assert "draining: not accepting connections" in text and "every request in flight answered" in text, text


async def test_the_drain_deadline_cuts_a_request_too_slow_and_exits_0(tmp_path, connect):
    pd = FakeVLLM("pd", "d0")
    pd.knobs.reply_gate = asyncio.Event()  # never set: the answer never comes
    async with pd, asyncio.timeout(60):
        log = tmp_path / "router.log"
        async with router_process(pd.url, log, "--drain-timeout", "1") as (proc, port):
            reader, writer = await connect(port)
            writer.write(post(CHAT))
            while not pd.received:
                await asyncio.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            assert await closed_by_peer(reader)  # cut at the deadline, unanswered
            assert await exit_code(proc, within=1 + 10) == 0
            writer.close()
            while not pd.cancelled:  # the backend call was aborted with it
                await asyncio.sleep(0.02)
    text = log.read_text()
    assert "drain deadline (1 s) reached: cut 1 requests still in flight" in text, text
